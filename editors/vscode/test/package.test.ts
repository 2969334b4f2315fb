// The manifest and the code must agree: commands, settings, the bundle VS Code loads.
import assert = require("node:assert/strict");
import * as fs from "fs";
import Module = require("module");
import * as path from "path";
import { beforeEach, test } from "node:test";
import { activate } from "../src/extension";
import * as lc from "./languageclient-mock";
import * as vscode from "./vscode-mock";

const ROOT = path.resolve(__dirname, "..", "..");
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8"));

beforeEach(() => {
  vscode.reset();
  lc.resetClients();
});

test("every contributed command is registered by activate, and the other way round", async () => {
  const ctx = { subscriptions: [], secrets: { get: async () => undefined } };
  await activate(ctx as never);
  const contributed = pkg.contributes.commands.map((c: { command: string }) => c.command).sort();
  const registered = [...vscode.state.commands.keys()].filter((c) => c !== "kernelLsp.applyCandidate").sort();
  assert.deepEqual(registered, contributed);
});

test("every setting the server reads is contributed", () => {
  const props = Object.keys(pkg.contributes.configuration.properties).sort();
  assert.deepEqual(props, [
    "kernelLsp.agent.baseUrl",
    "kernelLsp.agent.budget",
    "kernelLsp.agent.model",
    "kernelLsp.arch",
    "kernelLsp.device",
    "kernelLsp.execution.enabled",
    "kernelLsp.extraFlags",
    "kernelLsp.includePaths",
    "kernelLsp.nvcc",
    "kernelLsp.occupancyThreshold",
    "kernelLsp.onSave",
    "kernelLsp.proposer",
    "kernelLsp.python",
    "kernelLsp.serverArgs",
    "kernelLsp.slowShare",
    "kernelLsp.timeout",
    "kernelLsp.workerPython",
  ]);
  assert.equal(pkg.capabilities.untrustedWorkspaces.supported, "limited");
  assert.ok(pkg.capabilities.untrustedWorkspaces.restrictedConfigurations.includes("kernelLsp.python"));
  assert.ok(pkg.activationEvents.includes("onLanguage:cuda-cpp"));
  assert.ok(pkg.activationEvents.includes("onLanguage:python"));
});

test("the bundle VS Code loads (dist/extension.js) resolves all its modules", () => {
  const bundle = path.join(ROOT, pkg.main);
  assert.ok(fs.existsSync(bundle), `${bundle} missing: run npm run compile first`);
  // The real vscode-languageclient is inside the bundle; it subclasses vscode classes at load.
  const stub = new Proxy(vscode, { get: (t, p) => (p in t ? (t as never)[p] : class Stub {}) });
  const M = Module as unknown as { _load: (r: string, ...a: unknown[]) => unknown };
  const load = M._load;
  M._load = function (request: string, ...rest: unknown[]) {
    return request === "vscode" ? stub : load.call(this, request, ...rest);
  };
  try {
    const ext = require(bundle);
    assert.equal(typeof ext.activate, "function");
    assert.equal(typeof ext.deactivate, "function");
  } finally {
    M._load = load;
  }
});
