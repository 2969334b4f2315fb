// The manifest and the code must agree: commands, settings, the bundle VS Code loads.
import assert = require("node:assert/strict");
import * as fs from "fs";
import Module = require("module");
import * as path from "path";
import { beforeEach, test } from "node:test";
import { activate, runtime } from "../src/extension";
import * as lc from "./languageclient-mock";
import * as vscode from "./vscode-mock";

const ROOT = path.resolve(__dirname, "..", "..");
const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8"));

beforeEach(() => {
  vscode.reset();
  lc.resetClients();
  runtime.probe = async () => ({ ok: true, version: "0.1.0" });
});

test("every contributed command is registered by activate, and the other way round", async () => {
  const ctx = { subscriptions: [], secrets: { get: async () => undefined } };
  await activate(ctx as never);
  const contributed = pkg.contributes.commands.map((c: { command: string }) => c.command).sort();
  const registered = [...vscode.state.commands.keys()].sort();
  assert.deepEqual(registered, contributed);
});

test("every setting the server reads is contributed", () => {
  const props = Object.keys(pkg.contributes.configuration.properties).sort();
  assert.deepEqual(props, [
    "kernelLsp.agent.baseUrl",
    "kernelLsp.agent.budget",
    "kernelLsp.agent.model",
    "kernelLsp.agent.seed",
    "kernelLsp.arch",
    "kernelLsp.buildWhileTyping",
    "kernelLsp.device",
    "kernelLsp.execution.enabled",
    "kernelLsp.executor",
    "kernelLsp.extraFlags",
    "kernelLsp.gpu",
    "kernelLsp.includePaths",
    "kernelLsp.maxGpus",
    "kernelLsp.nvcc",
    "kernelLsp.occupancyThreshold",
    "kernelLsp.onSave",
    "kernelLsp.proposer",
    "kernelLsp.python",
    "kernelLsp.rayAddress",
    "kernelLsp.serverArgs",
    "kernelLsp.slowShare",
    "kernelLsp.timeout",
    "kernelLsp.trace.server",
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


test("integer settings are integers and every enum value is described", () => {
  const props = pkg.contributes.configuration.properties;
  assert.equal(props["kernelLsp.agent.budget"].type, "integer");
  assert.equal(props["kernelLsp.timeout"].type, "integer");
  for (const [name, p] of Object.entries<any>(props)) {
    const spec = p.items?.enum ? p.items : p;
    if (spec.enum) assert.equal(spec.enumDescriptions?.length, spec.enum.length, name);
  }
  assert.deepEqual(props["kernelLsp.trace.server"].enum, ["off", "messages", "verbose"]);
});

test("activation on the files it serves; Cancel, Apply and Discard only when they can act", () => {
  assert.ok(pkg.activationEvents.includes("workspaceContains:**/*.cu"));
  const palette = Object.fromEntries(pkg.contributes.menus.commandPalette.map((m: any) => [m.command, m.when]));
  assert.equal(palette["kernelLsp.cancel"], "kernelLsp.jobsRunning");
  assert.equal(palette["kernelLsp.applyCandidate"], "kernelLsp.candidatePending");
  const title = pkg.contributes.menus["editor/title"].map((m: any) => m.command);
  assert.deepEqual(title, ["kernelLsp.applyCandidate", "kernelLsp.discardCandidate"]);
});

test("a walkthrough whose media exist, and no placeholder repository", () => {
  const steps = pkg.contributes.walkthroughs[0].steps;
  assert.ok(steps.length >= 3);
  for (const step of steps) assert.ok(fs.existsSync(path.join(ROOT, step.media.markdown)), step.media.markdown);
  assert.ok(fs.readFileSync(path.join(ROOT, ".vscodeignore"), "utf8").includes("!walkthrough/*.md"), "walkthrough not packaged");
  assert.equal(pkg.repository, undefined);
  assert.ok(!/pip install kernel-lsp\b/.test(fs.readFileSync(path.join(ROOT, "README.md"), "utf8")));
});
