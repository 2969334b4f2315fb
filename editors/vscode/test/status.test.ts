import assert = require("node:assert/strict");
import { beforeEach, test } from "node:test";
import { StatusBar, isServed, lensTooltips, statusView } from "../src/status";
import * as vscode from "./vscode-mock";

beforeEach(() => vscode.reset());

const CU = { uri: vscode.Uri.file("/ws/a.cu"), languageId: "cuda-cpp" };

test("idle: the active file's measurement in the lens' words, else the name", () => {
  assert.equal(statusView({ jobs: [] }).text, "$(zap) kernel-lsp");
  const doc = { uri: "file:///ws/a.cu", version: 2, stale: false, summary: "correct · 1.50x eager · 0.90x torch.compile · 10.0 us ±1.0%" };
  assert.equal(statusView({ jobs: [] }, doc).text, "$(zap) correct · 1.50x eager · 0.90x torch.compile · 10.0 us ±1.0%");
  assert.match(statusView({ jobs: [] }, doc).tooltip, /measured on version 2/);
  assert.equal(statusView({ jobs: [] }).command, "kernelLsp.showLog");
});

test("one running job shows its title, message and unconfirmed best speedup; click cancels", () => {
  const v = statusView({ jobs: [{ id: 1, title: "optimize softmax", uri: "file:///a.cu", message: "candidate 3/20", bestSpeedup: 1.234 }] });
  assert.equal(v.text, "$(sync~spin) optimize softmax: candidate 3/20 · best 1.23x (unconfirmed)");
  assert.equal(v.command, "kernelLsp.cancel");
  // The server's own message already says "best": not twice.
  const said = statusView({ jobs: [{ id: 1, title: "Optimize a.py", message: "round 2 · best 3.10x (unconfirmed)", bestSpeedup: 3.1 }] });
  assert.equal(said.text, "$(sync~spin) Optimize a.py: round 2 · best 3.10x (unconfirmed)");
});

test("several jobs show a count and the best of them", () => {
  const v = statusView({ jobs: [{ id: 1, title: "a", bestSpeedup: 1.1 }, { id: 2, title: "b", bestSpeedup: 2 }, { id: 3, title: "c", bestSpeedup: null }] });
  assert.equal(v.text, "$(sync~spin) 3 jobs · best 2.00x (unconfirmed)");
  assert.match(v.tooltip, /^a \(best 1\.10x, unconfirmed\)\nb \(best 2\.00x, unconfirmed\)\nc\n/);
});

test("a Search's progress speedup leaves with its job: never kept after it ends", () => {
  const bar = new StatusBar();
  const item = vscode.state.statusItems[0];
  vscode.state.activeTextEditor = { document: CU, selection: { active: new vscode.Position(0, 0) } };
  bar.update({ jobs: [{ id: "j1", title: "tune", message: "variant 2", bestSpeedup: 72.75 }] });
  assert.equal(item.text, "$(sync~spin) tune: variant 2 · best 72.75x (unconfirmed)");
  assert.equal(bar.jobs.length, 1);
  bar.update({ jobs: [], documents: [{ uri: CU.uri.toString(), version: 4, stale: false, summary: "correct · 84.49x eager" }] });
  assert.equal(item.text, "$(zap) correct · 84.49x eager");
  bar.update({} as never); // a malformed notification must not break the bar
  assert.equal(item.text, "$(zap) kernel-lsp");
  assert.equal(item.visible, true);
});

test("served files", () => {
  assert.equal(isServed(CU), true);
  assert.equal(isServed({ uri: vscode.Uri.file("/ws/m.py"), languageId: "python" }), true);
  assert.equal(isServed({ uri: vscode.Uri.file("/ws/README.md"), languageId: "markdown" }), false);
  assert.equal(isServed(undefined), false);
});

test("the Ray cluster: connected with its GPUs, connecting, lost and unreachable say so", () => {
  const doc = { uri: "file:///ws/a.py", version: 3, stale: false, summary: "correct · 2.00x eager" };
  const local = statusView({ jobs: [], cluster: null }, doc);
  assert.equal(local.text, "$(zap) correct · 2.00x eager"); // the local Executor adds nothing
  const up = statusView({ jobs: [], cluster: { executor: "ray", state: "connected", address: "ray://gpu-box:10001", gpus: 2, nodes: ["10.0.0.5 (node 1a2b, GPU 0)"], message: "2 GPU actor(s) on 1 node(s)" } }, doc);
  assert.equal(up.text, "$(zap) correct · 2.00x eager · $(cloud) ray 2 GPUs");
  assert.match(up.tooltip, /Ray cluster at ray:\/\/gpu-box:10001: connected: 2 GPU actor\(s\) on 1 node\(s\)\n  10\.0\.0\.5 \(node 1a2b, GPU 0\)/);
  const connecting = statusView({ jobs: [], cluster: { executor: "ray", state: "connecting", address: "ray://gpu-box:10001" } });
  assert.equal(connecting.text, "$(zap) kernel-lsp · $(cloud-upload) ray connecting");
  const lost = statusView({ jobs: [{ id: 1, title: "Benchmark a.py" }], cluster: { executor: "ray", state: "lost", address: "ray://gpu-box:10001", message: "the Ray cluster at ray://gpu-box:10001 stopped answering: no answer" } });
  assert.equal(lost.text, "$(sync~spin) Benchmark a.py · $(warning) ray lost");
  assert.match(lost.tooltip, /stopped answering: no answer; evaluations run on this machine until it answers again/);
  assert.equal(lost.command, "kernelLsp.cancel");
  const down = statusView({ jobs: [], cluster: { executor: "ray", state: "unreachable", address: "ray://gpu-box:10001", message: "cannot reach the Ray cluster at ray://gpu-box:10001: Connection refused" } });
  assert.equal(down.text, "$(zap) kernel-lsp · $(warning) ray unreachable");
  assert.match(down.tooltip, /Connection refused/);
});

test("the status bar item follows the cluster's state", () => {
  const bar = new StatusBar();
  const item = vscode.state.statusItems[0];
  vscode.state.activeTextEditor = { document: CU, selection: { active: new vscode.Position(0, 0) } };
  bar.update({ jobs: [], cluster: { executor: "ray", state: "connected", address: "ray://127.0.0.1:10001", gpus: 1 } });
  assert.equal(item.text, "$(zap) kernel-lsp · $(cloud) ray 1 GPU");
  bar.update({ jobs: [], cluster: { executor: "ray", state: "lost", address: "ray://127.0.0.1:10001" } });
  assert.equal(item.text, "$(zap) kernel-lsp · $(warning) ray lost");
  bar.update({ jobs: [], cluster: null });
  assert.equal(item.text, "$(zap) kernel-lsp");
});

test("the numbers lens and the status tooltip say where the numbers were measured", () => {
  const doc = { uri: "file:///ws/a.py", version: 3, summary: "correct · 2.00x eager", where: "ran on the Ray cluster, node 10.0.0.5 (node 1a2b, GPU 0) · on NVIDIA H100 · measured on version 3" };
  const lenses = [
    { command: { title: "correct · 2.00x eager", command: "kernel-lsp.benchmark" } },
    { command: { title: "Benchmark", command: "kernel-lsp.benchmark" } },
    {},
  ];
  lensTooltips(lenses, doc);
  assert.equal((lenses[0].command as { tooltip?: string }).tooltip, doc.where);
  assert.equal((lenses[1].command as { tooltip?: string }).tooltip, undefined);
  assert.equal(lensTooltips(undefined, doc), undefined);
  assert.match(statusView({ jobs: [] }, doc).tooltip, /\nran on the Ray cluster, node 10\.0\.0\.5/);
});
