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
): Promise<{ success: boolean } | undefined> {
  if (params.external || !isCandidate(params.uri)) return undefined;
  const candidate = vscode.Uri.parse(params.uri);
  const original = originalFor(
    candidate,
    hints,
    vscode.workspace.textDocuments.map((d) => d.uri),
  );
  if (!original) return undefined; // nothing to compare with: let it open as a plain file
  const title = `${path.basename(original.fsPath)} ↔ candidate`;
  await vscode.commands.executeCommand("vscode.diff", original, candidate, title, {
    preview: true,
    preserveFocus: params.takeFocus === false,
  });
  void vscode.window
    .showInformationMessage(`kernel-lsp: apply this candidate to ${path.basename(original.fsPath)}?`, "Apply", "Discard")
    .then((choice) => {
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
