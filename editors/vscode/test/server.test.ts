import assert = require("node:assert/strict");
import * as os from "os";
import { test } from "node:test";
import * as fs from "fs";
import * as path from "path";
import { apiKey, chooseInterpreter, probeInterpreter, serverEnv } from "../src/server";

const ext = (p: string | undefined) => ({ environments: { getActiveEnvironmentPath: () => (p ? { path: p } : undefined) } });

test("kernelLsp.python wins over the Python extension", () => {
  assert.deepEqual(chooseInterpreter("/my/python", ext("/venv/bin/python")), { path: "/my/python", source: "setting" });
});

test("then the Python extension's active environment", () => {
  assert.deepEqual(chooseInterpreter("", ext("/venv/bin/python")), { path: "/venv/bin/python", source: "python-extension" });
  const old = { settings: { getExecutionDetails: () => ({ execCommand: ["/conda/bin/python"] }) } };
  assert.deepEqual(chooseInterpreter(undefined, old), { path: "/conda/bin/python", source: "python-extension" });
});

test("then python3", () => {
  const want = process.platform === "win32" ? "python" : "python3";
  assert.deepEqual(chooseInterpreter(undefined, undefined), { path: want, source: "default" });
  assert.deepEqual(chooseInterpreter("", ext(undefined)), { path: want, source: "default" });
  const broken = { environments: { getActiveEnvironmentPath: () => { throw new Error("not ready"); } } };
  assert.deepEqual(chooseInterpreter("", broken), { path: want, source: "default" });
});

test("the setting may use ~ and ${workspaceFolder}", () => {
  assert.equal(chooseInterpreter("${workspaceFolder}/.venv/bin/python", undefined, undefined, "/ws").path, "/ws/.venv/bin/python");
  assert.equal(chooseInterpreter("~/py/bin/python", undefined).path, `${os.homedir()}/py/bin/python`);
});

test("the API key goes into the server's environment only when trusted", () => {
  assert.equal(serverEnv({ PATH: "/bin" }, "sk-1", true).OPENAI_API_KEY, "sk-1");
  assert.equal(serverEnv({ PATH: "/bin", OPENAI_API_KEY: "sk-env" }, undefined, true).OPENAI_API_KEY, "sk-env");
  const untrusted = serverEnv({ PATH: "/bin", OPENAI_API_KEY: "sk-env" }, "sk-1", false);
  assert.equal("OPENAI_API_KEY" in untrusted, false);
  assert.equal(untrusted.PATH, "/bin");
});

test("a stored key beats OPENAI_API_KEY from the environment", async () => {
  const secrets = (v?: string) => ({ get: async () => v }) as never;
  assert.equal(await apiKey(secrets("sk-stored"), { OPENAI_API_KEY: "sk-env" }), "sk-stored");
  assert.equal(await apiKey(secrets(undefined), { OPENAI_API_KEY: "sk-env" }), "sk-env");
  assert.equal(await apiKey(secrets(undefined), {}), undefined);
});

/** A stand-in interpreter: a shell script that fails the way Python does without a module. */
function fakePython(missing: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kernel-lsp-probe-"));
  const file = path.join(dir, "python");
  fs.writeFileSync(file, `#!/bin/sh\necho "ModuleNotFoundError: No module named '${missing}'" >&2\nexit 1\n`, { mode: 0o755 });
  return file;
}

test("the probe tells a missing kernel-lsp from its missing dependencies", { skip: process.platform === "win32" }, async () => {
  const bare = fakePython("kernel_lsp");
  assert.deepEqual(await probeInterpreter(bare), { ok: false, reason: `kernel-lsp is not installed in ${bare}` });
  // PYTHONPATH at a checkout: kernel_lsp imports, the server's packages do not.
  const partial = fakePython("pygls");
  assert.deepEqual(await probeInterpreter(partial), {
    ok: false,
    reason: `kernel-lsp's dependencies are not installed in ${partial} (no pygls)`,
  });
  assert.deepEqual(await probeInterpreter("/no/such/python"), { ok: false, reason: "/no/such/python was not found" });
});
