// activate() end to end against the mocked vscode and a recording LanguageClient.
import assert = require("node:assert/strict");
import { beforeEach, test } from "node:test";
import { activate, runtime } from "../src/extension";
import { CANDIDATE_DIR } from "../src/diff";
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
  runtime.probe = async () => ({ ok: true, version: "0.1.0" });
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
  vscode.state.configChanged.fire({ affectsConfiguration: (s: string) => s === "kernelLsp" || s === "kernelLsp.python" });
  ctl.restartSoon(0); // skip the debounce wait
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(client.stopped, true);
  assert.equal(lc.clients.at(-1)!.serverOptions.command, "/other/python");
});

test("kernel-lsp/status notifications drive the status bar", async () => {
  const { client } = await started();
  const item = vscode.state.statusItems[0];
  client.notifications.get("kernel-lsp/status")!({ jobs: [{ id: 4, title: "optimize softmax_kernel", message: "evaluating 2/20", bestSpeedup: 1.42 }] });
  assert.equal(item.text, "$(sync~spin) optimize softmax_kernel: evaluating 2/20 · best 1.42x (unconfirmed)");
});

test("Optimize sends {uri}: the server finds the document's Task", async () => {
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
    params: { command: "kernel-lsp.optimize", arguments: [{ uri: DOC.toString() }] },
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
  assert.deepEqual(client.requests.at(-1)!.params, { command: "kernel-lsp.applyCandidate", arguments: [{ search: 3 }] });
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
  assert.deepEqual(client.requests.at(-1)!.params, { command: "kernel-lsp.applyCandidate", arguments: [{ search: 12 }] });
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


// -- issue 14: native behaviour ------------------------------------------------------------

const CU = { uri: vscode.Uri.file("/ws/softmax.cu"), languageId: "cuda-cpp" };
const PY = { uri: vscode.Uri.file("/ws/train.py"), languageId: "python" };
const MD = { uri: vscode.Uri.file("/ws/README.md"), languageId: "markdown" };
const missing = async (python: string) => ({ ok: false as const, reason: `kernel-lsp is not installed in ${python}` });

test("a Python workspace without kernel-lsp gets no server and no popup", async () => {
  runtime.probe = missing;
  vscode.state.textDocuments = [PY];
  vscode.state.activeTextEditor = { document: PY, selection: { active: new vscode.Position(0, 0) } };
  await activate(context() as never);
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(lc.clients.length, 0);
  const popups = vscode.state.calls.filter((c) => /^show(Error|Warning|Information)Message$/.test(c.name));
  assert.deepEqual(popups, []);
  assert.match(vscode.state.output.join("\n"), /not started: kernel-lsp is not installed in \/venv\/bin\/python/);
});

test("with a .cu open, a missing server is one message that offers to install it", async () => {
  runtime.probe = missing;
  vscode.state.textDocuments = [CU];
  vscode.state.messageChoice = "Install…";
  vscode.state.openDialog = [vscode.Uri.file("/src/kernel-lsp")];
  await activate(context() as never);
  await new Promise((r) => setTimeout(r, 10));
  const asked = vscode.state.calls.filter((c) => c.name === "showInformationMessage");
  assert.equal(asked.length, 1);
  assert.match(String(asked[0].args[0]), /kernel-lsp is not installed in \/venv\/bin\/python/);
  assert.deepEqual(asked[0].args.slice(1), ["Install…", "Choose Interpreter", "Show Log"]);
  assert.deepEqual(vscode.state.terminals[0].sent, ["/venv/bin/python -m pip install -e /src/kernel-lsp"]);
  assert.equal(vscode.state.statusItems[0].command, "kernelLsp.installServer");
  // A command that needs the server asks again instead of failing with an error.
  vscode.state.messageChoice = undefined;
  vscode.state.activeTextEditor = { document: CU, selection: { active: new vscode.Position(0, 0) } };
  await vscode.commands.executeCommand("kernelLsp.optimize");
  assert.equal(vscode.state.calls.filter((c) => c.name === "showInformationMessage").length, 2);
  assert.equal(vscode.state.calls.filter((c) => c.name === "showErrorMessage").length, 0);
});

test("in an untrusted workspace the message says why the interpreter setting was not used", async () => {
  runtime.probe = missing;
  vscode.state.trusted = false;
  vscode.state.textDocuments = [CU];
  await activate(context() as never);
  await new Promise((r) => setTimeout(r, 10));
  const asked = vscode.state.calls.find((c) => c.name === "showInformationMessage")!;
  assert.match(String(asked.args[0]), /not trusted, so kernelLsp.python is ignored/);
  assert.equal(asked.args[1], "Manage Workspace Trust");
});

test("a .cu opened after a start without one still says why the server is missing, once", async () => {
  // Activation on `workspaceContains:**/*.cu` probes before any .cu is open.
  runtime.probe = missing;
  vscode.state.trusted = false;
  await activate(context() as never);
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(vscode.state.calls.filter((c) => c.name === "showInformationMessage").length, 0);
  vscode.state.documentOpened.fire(MD);
  vscode.state.documentOpened.fire({ uri: vscode.Uri.file(`/ws/${CANDIDATE_DIR}s1/c2/softmax.cu`) });
  assert.equal(vscode.state.calls.filter((c) => c.name === "showInformationMessage").length, 0);
  vscode.state.documentOpened.fire(CU);
  vscode.state.documentOpened.fire({ uri: vscode.Uri.file("/ws/other.cuh") });
  await new Promise((r) => setTimeout(r, 10));
  const asked = vscode.state.calls.filter((c) => c.name === "showInformationMessage");
  assert.equal(asked.length, 1);
  assert.match(String(asked[0].args[0]), /not trusted, so kernelLsp.python is ignored/);
});

test("setting changes are pushed to the running server, not a restart", async () => {
  const { ctl, client } = await started();
  vscode.state.settings["kernelLsp.arch"] = "sm_80";
  vscode.state.configChanged.fire({ affectsConfiguration: (s: string) => s === "kernelLsp" || s === "kernelLsp.arch" });
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(client.stopped, false);
  assert.equal(lc.clients.length, 1);
  const push = client.sent.at(-1)! as { method: string; params: any };
  assert.equal(push.method, "workspace/didChangeConfiguration");
  assert.equal(push.params.settings.kernelLsp.arch, "sm_80");
  assert.ok(ctl.client);
});

test("the candidate diff has Apply and Discard, and the prompt gives the verified gain", async () => {
  const { client } = await started();
  vscode.state.activeTextEditor = { document: CU, selection: { active: new vscode.Position(0, 0) } };
  client.notifications.get("kernel-lsp/candidate")!({
    uri: DOC.toString(), search: 5, candidate: "c9",
    gain: "2.31x faster than your code, verified · 5.20x PyTorch eager · 0.61x torch.compile",
  });
  await client.clientOptions.middleware.window.showDocument(
    { uri: vscode.Uri.file("/ws/.kernel-lsp/candidates/softmax-c9.cu").toString() }, async () => ({ success: false }));
  assert.equal(vscode.state.contexts["kernelLsp.candidateDiffOpen"], true);
  assert.equal(vscode.state.contexts["kernelLsp.candidatePending"], true);
  const asked = vscode.state.calls.find((c) => c.name === "showInformationMessage")!;
  assert.equal(asked.args[0], "kernel-lsp: apply this verified candidate to softmax.cu? 2.31x faster than your code, verified · 5.20x PyTorch eager · 0.61x torch.compile");
  await vscode.commands.executeCommand("kernelLsp.discardCandidate");
  assert.equal(vscode.state.contexts["kernelLsp.candidateDiffOpen"], false);
  assert.equal(client.requests.filter((r) => (r.params as any).command === "kernel-lsp.applyCandidate").length, 0);
  // Apply Last Candidate still applies it later.
  lc.behaviour.executeResult = { applied: true };
  await vscode.commands.executeCommand("kernelLsp.applyCandidate");
  assert.deepEqual(client.requests.at(-1)!.params, { command: "kernel-lsp.applyCandidate", arguments: [{ search: 5 }] });
  assert.equal(vscode.state.contexts["kernelLsp.candidatePending"], false);
});

test("Cancel is offered only while a job runs; the status shows only on served files", async () => {
  const { client } = await started();
  const item = vscode.state.statusItems[0];
  const status = client.notifications.get("kernel-lsp/status")!;
  vscode.state.activeTextEditor = { document: MD, selection: { active: new vscode.Position(0, 0) } };
  status({ jobs: [], documents: [] });
  assert.equal(vscode.state.contexts["kernelLsp.jobsRunning"], false);
  assert.equal(item.visible, false);
  status({ jobs: [{ id: "job-1", title: "Optimize softmax.cu" }] });
  assert.equal(vscode.state.contexts["kernelLsp.jobsRunning"], true);
  vscode.state.activeTextEditor = { document: CU, selection: { active: new vscode.Position(0, 0) } };
  status({ jobs: [], documents: [{ uri: CU.uri.toString(), version: 3, stale: false, summary: "correct · 1.84x eager · 0.97x torch.compile · 41.2 us ±1.2%" }] });
  assert.equal(item.visible, true);
  assert.equal(item.text, "$(zap) correct · 1.84x eager · 0.97x torch.compile · 41.2 us ±1.2%");
  assert.match(String(item.tooltip), /measured on version 3/);
  vscode.state.activeTextEditor = { document: MD, selection: { active: new vscode.Position(0, 0) } };
  vscode.state.activeEditorChanged.fire(undefined);
  assert.equal(item.visible, false);
});

test("Show Log opens the output channel", async () => {
  await started();
  await vscode.commands.executeCommand("kernelLsp.showLog");
  assert.ok(vscode.state.commands.has("kernelLsp.showLog"));
});

test("after an Apply from the diff's title bar, the prompt's own Apply does not apply again", async (t) => {
  const { client } = await started();
  vscode.state.activeTextEditor = { document: CU, selection: { active: new vscode.Position(0, 0) } };
  let answer!: (choice: string) => void;
  const asked = new Promise<string>((r) => (answer = r));
  const shown = vscode.window.showInformationMessage;
  const said: string[] = [];
  (vscode.window as any).showInformationMessage = async (msg: string) => {
    said.push(msg);
    return msg.includes("apply this verified candidate") ? asked : undefined;
  };
  t.after(() => void ((vscode.window as any).showInformationMessage = shown));
  client.notifications.get("kernel-lsp/candidate")!({ uri: DOC.toString(), search: 8, candidate: "c2" });
  await client.clientOptions.middleware.window.showDocument(
    { uri: vscode.Uri.file("/ws/.kernel-lsp/candidates/softmax-c2.cu").toString() }, async () => ({ success: false }));
  lc.behaviour.executeResult = { applied: true };
  await vscode.commands.executeCommand("kernelLsp.applyCandidate"); // the title bar's button
  const applies = () => client.requests.filter((r) => (r.params as any).command === "kernel-lsp.applyCandidate").length;
  assert.equal(applies(), 1);
  answer("Apply"); // the notification, still on screen
  await new Promise((r) => setTimeout(r, 10));
  assert.equal(applies(), 1);
  assert.ok(said.includes("kernel-lsp: this candidate is applied already."), said.join(" | "));
});
