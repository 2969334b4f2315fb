// Status bar fed by the server's `kernel-lsp/status` notification
// ({jobs: [{id, title, uri, message, bestSpeedup}]}, see docs/architecture.md).
import * as vscode from "vscode";

export const STATUS_NOTIFICATION = "kernel-lsp/status";

export interface StatusJob {
  id: string | number;
  title?: string;
  uri?: string;
  message?: string;
  bestSpeedup?: number | null;
  search?: string | number;
}

export interface StatusParams {
  jobs?: StatusJob[];
}

export interface StatusView {
  text: string;
  tooltip: string;
  command: string;
}

function speedup(x: number | null | undefined): string | undefined {
  return typeof x === "number" && Number.isFinite(x) ? `${x.toFixed(2)}x` : undefined;
}

/** What the status bar shows for one notification; `lastBest` is remembered across jobs. */
export function statusView(params: StatusParams, lastBest?: number): StatusView {
  const jobs = Array.isArray(params?.jobs) ? params.jobs : [];
  if (jobs.length === 0) {
    const best = speedup(lastBest);
    return {
      text: best ? `$(zap) kernel-lsp ${best}` : "$(zap) kernel-lsp",
      tooltip: best ? `kernel-lsp: idle; best speedup so far ${best}` : "kernel-lsp: idle",
      command: "kernelLsp.showReport",
    };
  }
  const bests = jobs.map((j) => j.bestSpeedup).filter((x): x is number => typeof x === "number");
  const best = speedup(bests.length ? Math.max(...bests) : undefined);
  const first = jobs[0];
  const label = jobs.length === 1 ? first.title || "job" : `${jobs.length} jobs`;
  const detail = jobs.length === 1 && first.message ? `: ${first.message}` : "";
  const text = `$(sync~spin) ${label}${detail}${best ? ` · best ${best}` : ""}`;
  const tooltip = jobs
    .map((j) => `${j.title || j.id}${j.message ? `: ${j.message}` : ""}${speedup(j.bestSpeedup) ? ` (best ${speedup(j.bestSpeedup)})` : ""}`)
    .join("\n");
  return { text, tooltip: `${tooltip}\nClick to cancel`, command: "kernelLsp.cancel" };
}

/** Owns the status bar item; remembers the running jobs for the Cancel picker. */
export class StatusBar implements vscode.Disposable {
  readonly item: vscode.StatusBarItem;
  jobs: StatusJob[] = [];
  private best?: number;

  constructor() {
    this.item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
    this.update({ jobs: [] });
    this.item.show();
  }

  update(params: StatusParams): void {
    this.jobs = Array.isArray(params?.jobs) ? params.jobs : [];
    for (const j of this.jobs) {
      if (typeof j.bestSpeedup === "number" && (this.best === undefined || j.bestSpeedup > this.best)) {
        this.best = j.bestSpeedup;
      }
    }
    const view = statusView(params, this.best);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.command = view.command;
  }

  /** Shown while no server runs (starting, crashed, stopped). */
  offline(reason: string): void {
    this.jobs = [];
    this.item.text = "$(circle-slash) kernel-lsp";
    this.item.tooltip = `kernel-lsp: ${reason}\nClick to restart`;
    this.item.command = "kernelLsp.restart";
  }

  dispose(): void {
    this.item.dispose();
  }
}
