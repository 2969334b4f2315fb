// activate() end to end against the mocked vscode and a recording LanguageClient.
import assert = require("node:assert/strict");
import { beforeEach, test } from "node:test";
import { activate } from "../src/extension";
import * as lc from "./languageclient-mock";
import * as vscode from "./vscode-mock";

function context(secret?: string) {
  const secrets = new Map<string, string>();
  if (secret) secrets.set("kernelLsp.apiKey", secret);
  return {
    subscriptions: [] as { dispose(): unknown }[],
    secrets: {
      get: async (k: string) => secrets.get(k),
      store: async (k: string, v: string) => void secrets.set(k, v),
      delete: async (k: string) => void secrets.delete(k),
    },
  };
}

const DOC = vscode.Uri.file("/ws/softmax.cu");
const SECRET = "sk-test-do-not-leak";

beforeEach(() => {
  vscode.reset();
  lc.resetClients();
  vscode.state.workspaceFolders = [{ uri: vscode.Uri.file("/ws"), name: "ws", index: 0 }];
  vscode.state.settings = {
    "kernelLsp.python": "/venv/bin/python",
    "kernelLsp.serverArgs": ["--log-level", "debug"],
    "kernelLsp.arch": "sm_90",
    "kernelLsp.agent.model": "gpt-5",
  };
});

async function started(secret?: string) {
  const ctx = context(secret);
  const ctl = await activate(ctx as never);
  assert.equal(lc.clients.length, 1);
  return { ctx, ctl, client: lc.clients[0] };
}

test("starts `python -m kernel_lsp.cli serve` with the chosen interpreter and settings", async () => {
  const { client } = await started();
  assert.equal(client.serverOptions.command, "/venv/bin/python");
  assert.deepEqual(client.serverOptions.args, ["-m", "kernel_lsp.cli", "serve", "--log-level", "debug"]);
  assert.equal(client.serverOptions.transport, lc.TransportKind.stdio);
  assert.equal(client.serverOptions.options.cwd, "/ws");
  assert.equal(client.clientOptions.initializationOptions.arch, "sm_90");
  assert.deepEqual(client.clientOptions.initializationOptions.execution, { enabled: true });
  assert.equal(client.running, true);
});

test("the API key reaches the server's environment, never initializationOptions", async () => {
  const { client } = await started(SECRET);
  assert.equal(client.serverOptions.options.env.OPENAI_API_KEY, SECRET);
  assert.equal(JSON.stringify(client.clientOptions.initializationOptions).includes(SECRET), false);
  const answer = await client.clientOptions.middleware.workspace.configuration(
    { items: [{ section: "kernelLsp" }] },
    undefined,
    async () => [null],
  );
  assert.equal(JSON.stringify(answer).includes(SECRET), false);
  assert.equal(vscode.state.output.join("\n").includes(SECRET), false);
});

test("an untrusted workspace gets execution off, in both init options and configuration", async () => {
  vscode.state.trusted = false;
  vscode.state.settings["kernelLsp.execution.enabled"] = true;
  const { client } = await started(SECRET);
  assert.deepEqual(client.clientOptions.initializationOptions.execution, { enabled: false });
  const answer = await client.clientOptions.middleware.workspace.configuration(
    { items: [{ section: "kernelLsp.execution" }, { section: "editor" }] },
    undefined,
    async () => ["theirs-0", "theirs-1"],
  );
  assert.deepEqual(answer, [{ enabled: false }, "theirs-1"]);
  assert.equal("OPENAI_API_KEY" in client.serverOptions.options.env, false);
});

test("granting trust restarts the server with execution on", async () => {
  vscode.state.trusted = false;
  const { client } = await started();
  vscode.state.trusted = true;
  vscode.state.trustGranted.fire();
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(client.stopped, true);
  assert.equal(lc.clients.length, 2);
  assert.deepEqual(lc.clients[1].clientOptions.initializationOptions.execution, { enabled: true });
});

test("a changed interpreter setting restarts the server with the new interpreter", async () => {
  const { ctl, client } = await started();
  vscode.state.settings["kernelLsp.python"] = "/other/python";
  vscode.state.configChanged.fire({ affectsConfiguration: (s: string) => s === "kernelLsp" });
  ctl.restartSoon(0); // skip the debounce wait
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(client.stopped, true);
  assert.equal(lc.clients.at(-1)!.serverOptions.command, "/other/python");
});

test("kernel-lsp/status notifications drive the status bar", async () => {
  const { client } = await started();
  const item = vscode.state.statusItems[0];
  client.notifications.get("kernel-lsp/status")!({ jobs: [{ id: 4, title: "optimize softmax_kernel", message: "evaluating 2/20", bestSpeedup: 1.42 }] });
  assert.equal(item.text, "$(sync~spin) optimize softmax_kernel: evaluating 2/20 · best 1.42x");
});

test("Optimize sends {uri, target} with the symbol under the cursor", async () => {
  const { client } = await started();
  vscode.state.activeTextEditor = { document: { uri: DOC }, selection: { active: new vscode.Position(12, 4) } };
  const range = (a: number, b: number) => new vscode.Range(new vscode.Position(a, 0), new vscode.Position(b, 0));
  vscode.state.commandResults["vscode.executeDocumentSymbolProvider"] = [
    { name: "helper", range: range(0, 5), children: [] },
    { name: "softmax_kernel", range: range(10, 30), children: [] },
  ];
  lc.behaviour.executeResult = { search: 3, improved: true };
  await vscode.commands.executeCommand("kernelLsp.optimize");
  assert.deepEqual(client.requests.at(-1), {
    method: "workspace/executeCommand",
    params: { command: "kernel-lsp.optimize", arguments: [{ uri: DOC.toString(), target: "softmax_kernel" }] },
  });
});

test("the server's showDocument for a candidate opens a diff, and Apply calls applyCandidate", async () => {
  const { client } = await started();
  vscode.state.activeTextEditor = { document: { uri: DOC }, selection: { active: new vscode.Position(0, 0) } };
  lc.behaviour.executeResult = { search: 3, improved: true };
  await vscode.commands.executeCommand("kernelLsp.optimize");
  vscode.state.messageChoice = "Apply";
  let defaultCalled = false;
  const candidate = vscode.Uri.file("/ws/.kernel-lsp/candidates/3/17/softmax.cu");
  const result = await client.clientOptions.middleware.window.showDocument({ uri: candidate.toString(), takeFocus: true }, async () => {
    defaultCalled = true;
    return { success: true };
  });
  assert.deepEqual(result, { success: true });
  assert.equal(defaultCalled, false);
  const diff = vscode.state.calls.find((c) => c.name === "vscode.diff")!;
  assert.equal((diff.args[0] as vscode.Uri).fsPath, DOC.fsPath);
  assert.equal((diff.args[1] as vscode.Uri).fsPath, candidate.fsPath);
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(client.requests.at(-1)!.params, { command: "kernel-lsp.applyCandidate", arguments: [{ search: 3, candidate: "17" }] });
});

test("Cancel with one running job cancels that job", async () => {
  const { client } = await started();
  client.notifications.get("kernel-lsp/status")!({ jobs: [{ id: "job-1", title: "tune" }] });
  await vscode.commands.executeCommand("kernelLsp.cancel");
  assert.deepEqual(client.requests.at(-1)!.params, { command: "kernel-lsp.cancel", arguments: [{ job: "job-1" }] });
});

test("Set API Key stores the key and restarts the server with it in its environment", async () => {
  const { ctx, client } = await started();
  assert.equal("OPENAI_API_KEY" in client.serverOptions.options.env && client.serverOptions.options.env.OPENAI_API_KEY === SECRET, false);
  vscode.state.inputBox = SECRET;
  await vscode.commands.executeCommand("kernelLsp.setApiKey");
  assert.equal(await ctx.secrets.get("kernelLsp.apiKey"), SECRET);
  assert.equal(client.stopped, true);
  const next = lc.clients.at(-1)!;
  assert.equal(next.serverOptions.options.env.OPENAI_API_KEY, SECRET);
  assert.equal(JSON.stringify(next.clientOptions).includes(SECRET), false);
});

test("a server that does not start says how to fix it", async () => {
  lc.behaviour.failStart = true;
  await activate(context() as never);
  const err = vscode.state.calls.find((c) => c.name === "showErrorMessage");
  assert.ok(err);
  assert.match(String(err.args[0]), /could not start with \/venv\/bin\/python/);
  assert.equal(vscode.state.statusItems[0].command, "kernelLsp.restart");
});

test("candidate documents are not synced to the server", async () => {
  const { client } = await started();
  const mw = client.clientOptions.middleware;
  const sent: string[] = [];
  const next = async (d: { uri: vscode.Uri }) => void sent.push(d.uri.fsPath);
  await mw.didOpen({ uri: vscode.Uri.file("/ws/.kernel-lsp/candidates/3/17/softmax.cu") }, next);
  await mw.didOpen({ uri: DOC }, next);
  await mw.didChange({ document: { uri: vscode.Uri.file("/ws/.kernel-lsp/candidates/3/17/softmax.cu") } }, next);
  assert.deepEqual(sent, ["/ws/softmax.cu"]);
});

test("the client declares that it shows candidate previews itself", async () => {
  const { client } = await started();
  assert.deepEqual(client.capabilities().experimental, { kernelLsp: { candidatePreview: true } });
});

test("a preview shown before the search's result is applied with the result's ids", async (t) => {
  // As kernel_lsp/server does it: showDocument first, then the optimize answer {search, best}.
  const { client } = await started();
  vscode.state.activeTextEditor = { document: { uri: DOC }, selection: { active: new vscode.Position(0, 0) } };
  let answer!: (choice: string) => void;
  const asked = new Promise<string>((r) => (answer = r));
  const shown = vscode.window.showInformationMessage;
  (vscode.window as any).showInformationMessage = async () => asked;
  t.after(() => void ((vscode.window as any).showInformationMessage = shown));
  const mw = client.clientOptions.middleware;
  const optimize = mw.executeCommand("kernel-lsp.optimize", [{ uri: DOC.toString(), target: "softmax_kernel" }], async () => {
    await mw.window.showDocument({ uri: vscode.Uri.file("/ws/.kernel-lsp/candidates/softmax-c9.cu").toString(), takeFocus: false }, async () => ({ success: false }));
    return { search: 12, best: "c9", improved: true, speedup: 1.7 };
  });
  await optimize;
  const diff = vscode.state.calls.find((c) => c.name === "vscode.diff")!;
  assert.equal((diff.args[0] as vscode.Uri).fsPath, DOC.fsPath);
  answer("Apply");
  await new Promise((r) => setTimeout(r, 10));
  assert.deepEqual(client.requests.at(-1)!.params, { command: "kernel-lsp.applyCandidate", arguments: [{ search: 12, candidate: "c9" }] });
});

test("the original is found from a server-style candidate name when no command named it", async () => {
  const { client } = await started();
  vscode.state.textDocuments = [{ uri: vscode.Uri.file("/ws/other.cu") }, { uri: DOC }];
  vscode.state.messageChoice = "Discard";
  await client.clientOptions.middleware.window.showDocument({ uri: vscode.Uri.file("/ws/.kernel-lsp/candidates/softmax-c9.cu").toString() }, async () => ({ success: false }));
  const diff = vscode.state.calls.find((c) => c.name === "vscode.diff")!;
  assert.equal((diff.args[0] as vscode.Uri).fsPath, DOC.fsPath);
});

test("without kernelLsp.python the Python extension's environment is used, and followed", async () => {
  const changed = new vscode.EventEmitter<unknown>();
  let active = "/conda/envs/gpu/bin/python";
  vscode.state.extensions["ms-python.python"] = {
    isActive: true,
    exports: {
      environments: {
        getActiveEnvironmentPath: () => ({ path: active }),
        onDidChangeActiveEnvironmentPath: changed.event,
      },
    },
  };
  delete vscode.state.settings["kernelLsp.python"];
  const { client } = await started();
  assert.equal(client.serverOptions.command, "/conda/envs/gpu/bin/python");
  active = "/venv2/bin/python";
  changed.fire({});
  await new Promise((r) => setTimeout(r, 700)); // restartSoon's debounce
  assert.equal(client.stopped, true);
  assert.equal(lc.clients.at(-1)!.serverOptions.command, "/venv2/bin/python");
});
