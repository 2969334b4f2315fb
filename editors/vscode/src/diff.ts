// The diff before apply: when the server asks window/showDocument for a file under
// `.kernel-lsp/candidates/`, show it as a diff against the user's file and offer
// Apply (kernel-lsp.applyCandidate) instead of opening it as a plain editor.
import * as path from "path";
import * as vscode from "vscode";

export const CANDIDATE_DIR = ".kernel-lsp/candidates/";

export interface CandidateRef {
  search?: string | number;
  candidate?: string | number;
}

/** What the extension last asked for, so a candidate can be tied to its file and search. */
export interface PreviewHints {
  /** uri of the document of the last optimize/tune/benchmark/preview command */
  lastUri?: string;
  /** arguments of the last kernel-lsp.previewCandidate, or the result of the last search */
  lastPreview?: CandidateRef;
  /** the verified gain in words, both baselines (kernel-lsp/candidate) */
  gain?: string;
}

/** kernel-lsp/candidate: sent just before the server shows a verified winner. */
export const CANDIDATE_NOTIFICATION = "kernel-lsp/candidate";

/** The question next to the diff: the gain against your code and both baselines. */
export function applyPrompt(name: string, gain?: string): string {
  return `kernel-lsp: apply this verified candidate to ${name}?${gain ? ` ${gain}` : ""}`;
}

export function isCandidate(uri: string): boolean {
  return uri.replace(/\\/g, "/").includes("/" + CANDIDATE_DIR);
}

/**
 * Search and candidate ids from the path, for servers that lay candidates out as
 * `.kernel-lsp/candidates/<search>/<candidate>/<file>` (or `<search>/<file>`).
 */
export function refFromPath(candidatePath: string): CandidateRef {
  const p = candidatePath.replace(/\\/g, "/");
  const rest = p.slice(p.indexOf(CANDIDATE_DIR) + CANDIDATE_DIR.length).split("/");
  const dirs = rest.slice(0, -1);
  if (dirs.length >= 2) return { search: dirs[0], candidate: dirs[1] };
  if (dirs.length === 1) return { search: dirs[0] };
  return {};
}

/** Whether a candidate file name stands for `name`: `softmax.cu` or `softmax-<id>.cu`. */
export function sameFile(candidateName: string, name: string): boolean {
  if (candidateName === name) return true;
  const ext = path.extname(name);
  const stem = name.slice(0, name.length - ext.length);
  return ext !== "" && candidateName.startsWith(stem + "-") && candidateName.endsWith(ext);
}

/** The user's file a candidate stands for: last command's document, else same file name. */
export function originalFor(
  candidate: vscode.Uri,
  hints: PreviewHints,
  openDocuments: readonly vscode.Uri[],
): vscode.Uri | undefined {
  if (hints.lastUri && !isCandidate(hints.lastUri)) return vscode.Uri.parse(hints.lastUri);
  const name = path.basename(candidate.fsPath);
  return openDocuments.find((u) => !isCandidate(u.toString()) && sameFile(name, path.basename(u.fsPath)));
}

export interface ShowDocumentParamsLike {
  uri: string;
  external?: boolean;
  takeFocus?: boolean;
}

/**
 * Handles a showDocument for a candidate: opens `vscode.diff` (user's file left,
 * candidate right) and, without holding up the reply, asks whether to apply.
 * Returns undefined for documents that are not candidates (the default handler runs).
 */
export async function showCandidateDiff(
  params: ShowDocumentParamsLike,
  hints: PreviewHints,
  apply: (ref: CandidateRef) => Thenable<unknown>,
  discard: () => Thenable<unknown> = async () => undefined,
): Promise<{ success: boolean } | undefined> {
  if (params.external || !isCandidate(params.uri)) return undefined;
  const candidate = vscode.Uri.parse(params.uri);
  const original = originalFor(
    candidate,
    hints,
    vscode.workspace.textDocuments.map((d) => d.uri),
  );
  if (!original) return undefined; // nothing to compare with: let it open as a plain file
  const title = `${path.basename(original.fsPath)} ↔ verified candidate`;
  await vscode.commands.executeCommand("vscode.diff", original, candidate, title, {
    preview: true,
    preserveFocus: params.takeFocus === false,
  });
  // Apply / Discard in the diff's title bar (package.json menus) and in the palette.
  await vscode.commands.executeCommand("setContext", "kernelLsp.candidateDiffOpen", true);
  await vscode.commands.executeCommand("setContext", "kernelLsp.candidatePending", true);
  void vscode.window
    .showInformationMessage(applyPrompt(path.basename(original.fsPath), hints.gain), "Apply", "Discard")
    .then((choice) => {
      if (choice === "Discard") return discard();
      if (choice !== "Apply") return undefined;
      // Read at answer time: the server shows the preview before its command returns the
      // search id. Ids from the last previewCandidate / search result beat the path's.
      const fromPath = refFromPath(candidate.fsPath);
      return apply({
        search: hints.lastPreview?.search ?? fromPath.search,
        candidate: hints.lastPreview?.candidate ?? fromPath.candidate,
      });
    });
  return { success: true };
}
