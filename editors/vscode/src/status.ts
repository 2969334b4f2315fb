// Status bar fed by the server's `kernel-lsp/status` notification (docs/architecture.md):
// {jobs: [{id, title, uri, message, bestSpeedup, unconfirmed}], documents: [{uri, version,
// stale, summary, ...}]}. While a job runs it shows the job; otherwise the measurement of the
// active file, in the lens' words. A Search's unconfirmed best leaves with its job.
// `cluster` (null with the local Executor) says whether the Ray cluster is connected or lost.
import * as vscode from "vscode";

export const STATUS_NOTIFICATION = "kernel-lsp/status";

export interface StatusJob {
  id: string | number;
  title?: string;
  uri?: string;
  message?: string;
  bestSpeedup?: number | null;
  unconfirmed?: boolean;
}

export interface StatusDocument {
  uri: string;
  version?: number | null;
  stale?: boolean;
  summary?: string;
  /** Where it ran: "ran on the Ray cluster, node ... · on NVIDIA H100 · measured on version 3". */
  where?: string;
}

/** The Ray cluster the server evaluates on (`executor = "ray"`, docs/ray.md). */
export interface StatusCluster {
  executor?: string;
  state?: string; // connecting | connected | lost | unreachable
  address?: string | null;
  gpus?: number;
  nodes?: string[];
  message?: string;
}

export interface StatusParams {
  jobs?: StatusJob[];
  documents?: StatusDocument[];
  cluster?: StatusCluster | null;
}

export interface StatusView {
  text: string;
  tooltip: string;
  command: string;
}

function speedup(x: number | null | undefined): string | undefined {
  return typeof x === "number" && Number.isFinite(x) ? `${x.toFixed(2)}x` : undefined;
}

/** The cluster's part of the status bar; undefined with the local Executor. */
export function clusterView(c: StatusCluster | null | undefined): { text: string; tooltip: string } | undefined {
  if (!c || typeof c !== "object" || c.executor !== "ray") return undefined;
  const at = `Ray cluster at ${c.address || "auto"}`;
  const why = typeof c.message === "string" && c.message ? `: ${c.message}` : "";
  const gpus = typeof c.gpus === "number" ? c.gpus : 0;
  const nodes = Array.isArray(c.nodes) && c.nodes.length ? `\n${c.nodes.map((n) => `  ${n}`).join("\n")}` : "";
  switch (c.state) {
    case "connected":
      return { text: `$(cloud) ray ${gpus} GPU${gpus === 1 ? "" : "s"}`, tooltip: `${at}: connected${why}${nodes}` };
    case "connecting":
      return { text: "$(cloud-upload) ray connecting", tooltip: `${at}: connecting (evaluations wait for it)` };
    case "lost":
      return { text: "$(warning) ray lost", tooltip: `${at}: lost${why}; evaluations run on this machine until it answers again` };
    default:
      return { text: "$(warning) ray unreachable", tooltip: `${at}: not connected${why}` };
  }
}

/** What the status bar shows: the running jobs, else `doc`'s measurement; then the cluster. */
export function statusView(params: StatusParams, doc?: StatusDocument): StatusView {
  const view = jobsView(params, doc);
  const cluster = clusterView(params?.cluster);
  if (!cluster) return view;
  return { ...view, text: `${view.text} · ${cluster.text}`, tooltip: `${view.tooltip}\n${cluster.tooltip}` };
}

function jobsView(params: StatusParams, doc?: StatusDocument): StatusView {
  const jobs = Array.isArray(params?.jobs) ? params.jobs : [];
  if (jobs.length === 0) {
    const summary = typeof doc?.summary === "string" ? doc.summary : undefined;
    return {
      text: summary ? `$(zap) ${summary.length > 60 ? summary.slice(0, 59) + "…" : summary}` : "$(zap) kernel-lsp",
      tooltip: summary
        ? `kernel-lsp: ${summary}${typeof doc?.version === "number" ? ` (measured on version ${doc.version})` : ""}` +
          (typeof doc?.where === "string" && doc.where ? `\n${doc.where}` : "")
        : "kernel-lsp: idle",
      command: "kernelLsp.showLog",
    };
  }
  const bests = jobs.map((j) => j.bestSpeedup).filter((x): x is number => typeof x === "number");
  const best = speedup(bests.length ? Math.max(...bests) : undefined);
  const first = jobs[0];
  const label = jobs.length === 1 ? first.title || "job" : `${jobs.length} jobs`;
  const detail = jobs.length === 1 && first.message ? `: ${first.message}` : "";
  const said = detail.includes("best ") ? "" : best ? ` · best ${best} (unconfirmed)` : "";
  const text = `$(sync~spin) ${label}${detail}${said}`;
  const tooltip = jobs
    .map((j) => `${j.title || j.id}${j.message ? `: ${j.message}` : ""}${speedup(j.bestSpeedup) ? ` (best ${speedup(j.bestSpeedup)}, unconfirmed)` : ""}`)
    .join("\n");
  return { text, tooltip: `${tooltip}\nClick to cancel`, command: "kernelLsp.cancel" };
}

/**
 * The numbers lens' tooltip (where it ran, on what GPU): the server sets it on the lens' Command,
 * which vscode-languageclient 9 drops, so it is taken from the status of the lens' document.
 */
export function lensTooltips<L extends { command?: { title: string; tooltip?: string } }>(
  lenses: L[] | null | undefined,
  doc: StatusDocument | undefined,
): L[] | null | undefined {
  if (!Array.isArray(lenses) || typeof doc?.where !== "string" || !doc.where) return lenses;
  for (const lens of lenses) {
    if (lens.command && lens.command.title === doc.summary && !lens.command.tooltip) lens.command.tooltip = doc.where;
  }
  return lenses;
}

/** Files the server serves: the status item shows only on these. */
export function isServed(doc: { uri: { toString(): string }; languageId?: string } | undefined): boolean {
  if (!doc) return false;
  return /\.(cu|cuh|py)$/i.test(doc.uri.toString()) || doc.languageId === "cuda-cpp";
}

/** Owns the status bar item; remembers the running jobs for the Cancel picker. */
export class StatusBar implements vscode.Disposable {
  readonly item: vscode.StatusBarItem;
  jobs: StatusJob[] = [];
  documents = new Map<string, StatusDocument>();
  private last: StatusParams = { jobs: [] };
  private online = true;

  constructor() {
    this.item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
    this.update({ jobs: [] });
  }

  update(params: StatusParams): void {
    this.last = params ?? { jobs: [] };
    this.online = true;
    this.jobs = Array.isArray(params?.jobs) ? params.jobs : [];
    this.documents = new Map(
      (Array.isArray(params?.documents) ? params.documents : []).filter((d) => typeof d?.uri === "string").map((d) => [d.uri, d]),
    );
    // Cancel is offered (command palette) only while something runs.
    void vscode.commands.executeCommand("setContext", "kernelLsp.jobsRunning", this.jobs.length > 0);
    this.render();
  }

  /** Re-render for the active editor: shown on served files only. */
  render(): void {
    if (!this.online) return;
    const editor = vscode.window.activeTextEditor;
    const uri = editor?.document.uri.toString();
    const view = statusView(this.last, uri ? this.documents.get(uri) : undefined);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.command = view.command;
    if (isServed(editor?.document) || this.jobs.length > 0) this.item.show();
    else this.item.hide();
  }

  /** Shown while no server runs (starting, crashed, stopped, not installed). */
  offline(reason: string, command = "kernelLsp.restart"): void {
    this.online = false;
    this.jobs = [];
    void vscode.commands.executeCommand("setContext", "kernelLsp.jobsRunning", false);
    this.item.text = "$(circle-slash) kernel-lsp";
    this.item.tooltip = `kernel-lsp: ${reason}\nClick to ${command === "kernelLsp.restart" ? "restart" : "fix"}`;
    this.item.command = command;
    if (isServed(vscode.window.activeTextEditor?.document)) this.item.show();
    else this.item.hide();
  }

  dispose(): void {
    this.item.dispose();
  }
}
