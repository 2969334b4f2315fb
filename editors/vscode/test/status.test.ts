import assert = require("node:assert/strict");
import { beforeEach, test } from "node:test";
import { StatusBar, statusView } from "../src/status";
import * as vscode from "./vscode-mock";

beforeEach(() => vscode.reset());

test("idle, with and without a best speedup", () => {
  assert.equal(statusView({ jobs: [] }).text, "$(zap) kernel-lsp");
  assert.equal(statusView({ jobs: [] }, 1.5).text, "$(zap) kernel-lsp 1.50x");
  assert.equal(statusView({ jobs: [] }).command, "kernelLsp.showReport");
});

test("one running job shows its title, message and best speedup; click cancels", () => {
  const v = statusView({ jobs: [{ id: 1, title: "optimize softmax", uri: "file:///a.cu", message: "candidate 3/20", bestSpeedup: 1.234 }] });
  assert.equal(v.text, "$(sync~spin) optimize softmax: candidate 3/20 · best 1.23x");
  assert.equal(v.command, "kernelLsp.cancel");
});

test("several jobs show a count and the best of them", () => {
  const v = statusView({ jobs: [{ id: 1, title: "a", bestSpeedup: 1.1 }, { id: 2, title: "b", bestSpeedup: 2 }, { id: 3, title: "c", bestSpeedup: null }] });
  assert.equal(v.text, "$(sync~spin) 3 jobs · best 2.00x");
  assert.match(v.tooltip, /^a \(best 1\.10x\)\nb \(best 2\.00x\)\nc\n/);
});

test("the status bar item follows notifications and keeps the best speedup after jobs end", () => {
  const bar = new StatusBar();
  const item = vscode.state.statusItems[0];
  assert.equal(item.visible, true);
  bar.update({ jobs: [{ id: "j1", title: "tune", message: "variant 2", bestSpeedup: 1.8 }] });
  assert.equal(item.text, "$(sync~spin) tune: variant 2 · best 1.80x");
  assert.equal(bar.jobs.length, 1);
  bar.update({ jobs: [] });
  assert.equal(item.text, "$(zap) kernel-lsp 1.80x");
  bar.update({} as never); // a malformed notification must not break the bar
  assert.equal(item.text, "$(zap) kernel-lsp 1.80x");
});
