import assert = require("node:assert/strict");
import { beforeEach, test } from "node:test";
import { isCandidate, originalFor, refFromPath, sameFile, showCandidateDiff } from "../src/diff";
import * as vscode from "./vscode-mock";

beforeEach(() => vscode.reset());

const ORIGINAL = vscode.Uri.file("/ws/softmax.cu");
const CANDIDATE = vscode.Uri.file("/ws/.kernel-lsp/candidates/7/c12/softmax.cu");

test("candidate documents are recognised by their folder", () => {
  assert.equal(isCandidate(CANDIDATE.toString()), true);
  assert.equal(isCandidate(ORIGINAL.toString()), false);
  assert.equal(isCandidate("file:///ws/candidates/softmax.cu"), false);
});

test("search and candidate ids come from the path when it has them", () => {
  assert.deepEqual(refFromPath(CANDIDATE.fsPath), { search: "7", candidate: "c12" });
  assert.deepEqual(refFromPath("/ws/.kernel-lsp/candidates/7/softmax.cu"), { search: "7" });
  assert.deepEqual(refFromPath("/ws/.kernel-lsp/candidates/softmax.cu"), {});
});

test("the original is the last command's document, else an open file of the same name", () => {
  assert.equal(originalFor(CANDIDATE as never, { lastUri: "file:///ws/other.cu" }, [])?.fsPath, "/ws/other.cu");
  assert.equal(originalFor(CANDIDATE as never, {}, [CANDIDATE, vscode.Uri.file("/x/a.cu"), ORIGINAL] as never)?.fsPath, "/ws/softmax.cu");
  assert.equal(originalFor(CANDIDATE as never, {}, [CANDIDATE] as never), undefined);
});

test("a candidate opens as a diff against the user's file, and Apply applies it", async () => {
  vscode.state.messageChoice = "Apply";
  const applied: unknown[] = [];
  const result = await showCandidateDiff(
    { uri: CANDIDATE.toString(), takeFocus: true },
    { lastUri: ORIGINAL.toString(), lastPreview: { search: 9 } },
    async (ref) => applied.push(ref),
  );
  assert.deepEqual(result, { success: true });
  const diff = vscode.state.calls.find((c) => c.name === "vscode.diff");
  assert.ok(diff, "vscode.diff was not opened");
  assert.equal((diff.args[0] as vscode.Uri).fsPath, "/ws/softmax.cu");
  assert.equal((diff.args[1] as vscode.Uri).fsPath, CANDIDATE.fsPath);
  await new Promise((r) => setImmediate(r)); // the Apply question does not block the reply
  assert.deepEqual(applied, [{ search: 9, candidate: "c12" }]);
});

test("Discard applies nothing; other documents go to the default handler", async () => {
  vscode.state.messageChoice = "Discard";
  const applied: unknown[] = [];
  await showCandidateDiff({ uri: CANDIDATE.toString() }, { lastUri: ORIGINAL.toString() }, async (r) => applied.push(r));
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(applied, []);
  assert.equal(await showCandidateDiff({ uri: ORIGINAL.toString() }, {}, async () => 0), undefined);
  assert.equal(await showCandidateDiff({ uri: CANDIDATE.toString(), external: true }, {}, async () => 0), undefined);
});

test("a server-named candidate (stem-id.ext) stands for stem.ext, and only that", () => {
  assert.equal(sameFile("softmax-c9.cu", "softmax.cu"), true);
  assert.equal(sameFile("softmax.cu", "softmax.cu"), true);
  assert.equal(sameFile("softmax-c9.py", "softmax.cu"), false);
  assert.equal(sameFile("softmax2-c9.cu", "softmax.cu"), false);
  assert.equal(sameFile("layer-norm-c9.cu", "layer-norm.cu"), true);
});
