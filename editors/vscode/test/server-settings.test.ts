// The settings object the extension sends, read by the real server's config code
// (kernel_lsp.config.Settings.merged), so a renamed key on either side fails here.
import assert = require("node:assert/strict");
import { spawnSync } from "child_process";
import * as fs from "fs";
import * as path from "path";
import { test } from "node:test";
import { serverSettings } from "../src/config";

const REPO = path.resolve(__dirname, "..", "..", "..", "..");
const python = process.env.KERNEL_LSP_PYTHON || path.join(REPO, ".venv", "bin", "python");

const VALUES: Record<string, unknown> = {
  nvcc: "/usr/local/cuda/bin/nvcc",
  arch: "sm_89",
  extraFlags: ["-lineinfo"],
  includePaths: ["/opt/cutlass/include"],
  onSave: ["compile", "bench"],
  "execution.enabled": true,
  "agent.model": "gpt-5",
  "agent.baseUrl": "http://localhost:8000/v1",
  "agent.budget": 5,
  "agent.seed": "none",
  occupancyThreshold: 0.4,
  proposer: "llm",
  timeout: 30,
  workerPython: "/gpu/bin/python",
  device: "1",
  slowShare: 0.2,
  executor: "ray",
  rayAddress: "ray://gpu-box:10001",
  gpu: "H100",
  maxGpus: 4,
};

test("the server reads every setting the extension sends", { skip: !fs.existsSync(python) && `no ${python}: set KERNEL_LSP_PYTHON` }, () => {
  const sent = serverSettings({ get: <T>(k: string) => VALUES[k] as T }, false);
  const script =
    "import dataclasses, json, sys\n" +
    "from kernel_lsp.config import Settings\n" +
    "print(json.dumps(dataclasses.asdict(Settings().merged(json.load(sys.stdin)))))\n";
  const run = spawnSync(python, ["-c", script], { input: JSON.stringify(sent), encoding: "utf8", cwd: REPO, timeout: 60000 });
  assert.equal(run.status, 0, run.stderr);
  const got = JSON.parse(run.stdout);
  assert.deepEqual(
    {
      nvcc: got.nvcc, arch: got.arch, extra_flags: got.extra_flags, include_paths: got.include_paths,
      on_save: got.on_save, execution_enabled: got.execution_enabled, agent_model: got.agent_model,
      agent_base_url: got.agent_base_url, agent_budget: got.agent_budget, agent_seed: got.agent_seed,
      occupancy_threshold: got.occupancy_threshold,
      proposer: got.proposer, timeout: got.timeout, python: got.python, device: got.device, slow_share: got.slow_share,
      executor: got.executor, ray_address: got.ray_address, gpu: got.gpu, max_gpus: got.max_gpus,
    },
    {
      nvcc: "/usr/local/cuda/bin/nvcc", arch: "sm_89", extra_flags: ["-lineinfo"], include_paths: ["/opt/cutlass/include"],
      on_save: ["compile", "bench"], execution_enabled: false, agent_model: "gpt-5",
      agent_base_url: "http://localhost:8000/v1", agent_budget: 5, agent_seed: "none", occupancy_threshold: 0.4,
      proposer: "llm", timeout: 30, python: "/gpu/bin/python", device: "1", slow_share: 0.2,
      executor: "ray", ray_address: "ray://gpu-box:10001", gpu: "H100", max_gpus: 4,
    },
  );
});
