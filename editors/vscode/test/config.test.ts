import assert = require("node:assert/strict");
import { test } from "node:test";
import { configurationItem, serverSettings } from "../src/config";

function reader(values: Record<string, unknown>) {
  return { get: <T>(key: string) => values[key] as T | undefined };
}

const FULL = {
  python: "/opt/py/bin/python",
  serverArgs: ["--log-level", "debug"],
  nvcc: "/usr/local/cuda/bin/nvcc",
  arch: "sm_90",
  extraFlags: ["-lineinfo"],
  includePaths: ["/opt/cutlass/include"],
  onSave: ["compile", "verify"],
  "execution.enabled": true,
  "agent.model": "gpt-5",
  "agent.baseUrl": "http://localhost:8000/v1",
  "agent.budget": 12,
  occupancyThreshold: 0.25,
  proposer: "tuner",
  timeout: 60,
  workerPython: "/gpu-env/bin/python",
  device: "1",
  slowShare: 0.4,
};

test("settings map to the server's initializationOptions", () => {
  assert.deepEqual(serverSettings(reader(FULL), true), {
    nvcc: "/usr/local/cuda/bin/nvcc",
    arch: "sm_90",
    extraFlags: ["-lineinfo"],
    includePaths: ["/opt/cutlass/include"],
    onSave: ["compile", "verify"],
    execution: { enabled: true },
    agent: { model: "gpt-5", baseUrl: "http://localhost:8000/v1", budget: 12 },
    occupancyThreshold: 0.25,
    proposer: "tuner",
    timeout: 60,
    python: "/gpu-env/bin/python",
    device: "1",
    slowShare: 0.4,
  });
});

test("the server's interpreter and arguments stay out of the server's options", () => {
  const s = serverSettings(reader(FULL), true) as unknown as Record<string, unknown>;
  assert.notEqual(s.python, FULL.python); // `python` there means the Workers' interpreter
  assert.equal("serverArgs" in s, false);
  assert.equal("python" in serverSettings(reader({ python: "/opt/py/bin/python" }), true), false);
});

test("empty strings mean server default and are left out; bad onSave entries dropped", () => {
  const s = serverSettings(reader({ nvcc: "  ", arch: "", "agent.model": "", onSave: ["compile", "deploy", 3] }), true);
  assert.equal("nvcc" in s, false);
  assert.equal("arch" in s, false);
  assert.deepEqual(s.agent, {});
  assert.deepEqual(s.onSave, ["compile"]);
  assert.deepEqual(s.execution, { enabled: true }); // unset means on in a trusted workspace
});

test("an untrusted workspace turns execution off whatever the setting says", () => {
  assert.deepEqual(serverSettings(reader(FULL), false).execution, { enabled: false });
  assert.deepEqual(serverSettings(reader({ "execution.enabled": false }), true).execution, { enabled: false });
});

test("workspace/configuration answers our sections, and only ours", () => {
  const cfg = reader(FULL);
  assert.deepEqual(configurationItem("kernelLsp", cfg, true), serverSettings(cfg, true));
  assert.deepEqual(configurationItem("kernelLsp.agent", cfg, true), {
    model: "gpt-5",
    baseUrl: "http://localhost:8000/v1",
    budget: 12,
  });
  assert.equal(configurationItem("kernelLsp.execution.enabled", cfg, false), false);
  assert.equal(configurationItem("kernelLsp.nope", cfg, true), null);
  assert.equal(configurationItem("python", cfg, true), undefined);
  assert.equal(configurationItem(undefined, cfg, true), undefined);
});
