// kernel-lsp for VS Code: starts `python -m kernel_lsp.cli serve` over stdio and
// turns the server's commands, status and candidate previews into editor UI.
import * as vscode from "vscode";
import {
  ClientCapabilities,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  StaticFeature,
  TransportKind,
} from "vscode-languageclient/node";
import { SECTION, configurationItem, serverSettings } from "./config";
import { CANDIDATE_NOTIFICATION, CandidateRef, PreviewHints, isCandidate, showCandidateDiff } from "./diff";
import {
  API_KEY_SECRET,
  Probe,
  PythonApi,
  SERVE_ARGS,
  apiKey,
  chooseInterpreter,
  installCommand,
  probeInterpreter,
  pythonExtensionApi,
  serverEnv,
} from "./server";
import { STATUS_NOTIFICATION, StatusBar, StatusParams, isServed, lensTooltips } from "./status";

/** Replaceable in tests: whether an interpreter can run the server. */
export const runtime = { probe: probeInterpreter as (python: string) => Promise<Probe> };

/** Settings that need a new server process; every other one is pushed to the running server. */
export const RESTART_SETTINGS = ["python", "serverArgs"];

/** Server commands (docs/architecture.md). */
export const SERVER_COMMANDS = {
  optimize: "kernel-lsp.optimize",
  tune: "kernel-lsp.tune",
  writeKernels: "kernel-lsp.writeKernels",
  benchmark: "kernel-lsp.benchmark",
  cancel: "kernel-lsp.cancel",
  showReport: "kernel-lsp.showReport",
  previewCandidate: "kernel-lsp.previewCandidate",
  applyCandidate: "kernel-lsp.applyCandidate",
} as const;

type Args = Record<string, unknown>;

export class Controller implements vscode.Disposable {
  client?: LanguageClient;
  readonly hints: PreviewHints = {};
  private starting?: Promise<void>;
  private restartTimer?: NodeJS.Timeout;
  private python?: PythonApi;
  /** Why the server is not running, when it could not start (not installed, untrusted...). */
  missing?: { python: string; reason: string };
  private askedInstall = false;

  constructor(
    private readonly context: vscode.ExtensionContext,
    readonly output: vscode.OutputChannel,
    readonly status: StatusBar,
    private readonly makeClient = (id: string, name: string, s: ServerOptions, c: LanguageClientOptions) =>
      new LanguageClient(id, name, s, c),
  ) {}

  private config(): vscode.WorkspaceConfiguration {
    return vscode.workspace.getConfiguration(SECTION);
  }

  private workspaceFolder(): vscode.WorkspaceFolder | undefined {
    const active = vscode.window.activeTextEditor?.document.uri;
    return (active && vscode.workspace.getWorkspaceFolder(active)) || vscode.workspace.workspaceFolders?.[0];
  }

  async start(): Promise<void> {
    if (this.client) return;
    if (this.starting) return this.starting;
    this.starting = this.doStart().finally(() => (this.starting = undefined));
    return this.starting;
  }

  private async doStart(): Promise<void> {
    const trusted = vscode.workspace.isTrusted;
    this.python ??= await pythonExtensionApi();
    const folder = this.workspaceFolder();
    const interpreter = chooseInterpreter(this.config().get<string>("python"), this.python, folder?.uri, folder?.uri.fsPath);
    // Start only an interpreter that has kernel-lsp: a Python project that does not use it
    // gets no server, no crash loop and no error popup.
    const probe = await runtime.probe(interpreter.path);
    if (!probe.ok) {
      this.missing = { python: interpreter.path, reason: probe.reason };
      this.output.appendLine(`[kernel-lsp] not started: ${probe.reason}`);
      this.status.offline(probe.reason, "kernelLsp.installServer");
      if (this.servesOpenCuda()) void this.offerInstall();
      return;
    }
    this.missing = undefined;
    const extra = (this.config().get<string[]>("serverArgs") ?? []).filter((a) => typeof a === "string");
    const key = await apiKey(this.context.secrets, process.env);
    const serverOptions: ServerOptions = {
      command: interpreter.path,
      args: [...SERVE_ARGS, ...extra],
      transport: TransportKind.stdio,
      options: { env: serverEnv(process.env, key, trusted), cwd: folder?.uri.fsPath },
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: [
        { scheme: "file", language: "cuda-cpp" },
        { scheme: "file", language: "python" },
        { scheme: "file", pattern: "**/*.{cu,cuh}" },
      ],
      outputChannel: this.output,
      initializationOptions: serverSettings(this.config(), trusted),
      middleware: {
        // Candidates shown in the diff are not user files: the server need not compile them.
        didOpen: (doc, next) => (isCandidate(doc.uri.toString()) ? Promise.resolve() : next(doc)),
        didChange: (e, next) => (isCandidate(e.document.uri.toString()) ? Promise.resolve() : next(e)),
        didSave: (doc, next) => (isCandidate(doc.uri.toString()) ? Promise.resolve() : next(doc)),
        didClose: (doc, next) => (isCandidate(doc.uri.toString()) ? Promise.resolve() : next(doc)),
        // The numbers lens says where they were measured (Ray node, GPU) in its tooltip.
        provideCodeLenses: async (doc, token, next) =>
          lensTooltips(await next(doc, token), this.status.documents.get(doc.uri.toString())),
        workspace: {
          // Answer our section ourselves so that trust is applied; others go the usual way.
          configuration: async (params, token, next) => {
            const theirs = await next(params, token);
            if (!Array.isArray(theirs)) return theirs;
            return params.items.map((item, i) => {
              const ours = configurationItem(
                item.section,
                vscode.workspace.getConfiguration(SECTION, item.scopeUri ? vscode.Uri.parse(item.scopeUri) : undefined),
                vscode.workspace.isTrusted,
              );
              return ours === undefined ? theirs[i] : ours;
            });
          },
        },
        window: {
          // The client calls `next` with params only, despite its declared type.
          showDocument: async (params, next) =>
            (await this.showDiff(params)) ??
            ((await next(params, undefined as never)) as { success: boolean }),
        },
        // Code lenses and code actions run server commands through here: remember
        // which document and search a later candidate preview belongs to.
        executeCommand: async (command, args, next) => {
          this.remember(command, args?.[0]);
          const result = await next(command, args);
          this.rememberResult(result);
          return result;
        },
      },
    };
    this.output.appendLine(
      `[kernel-lsp] starting ${interpreter.path} ${[...SERVE_ARGS, ...extra].join(" ")} (interpreter from ${interpreter.source}; ` +
        `workspace ${trusted ? "trusted" : "untrusted: execution off"}; API key ${key && trusted ? "set" : "not set"})`,
    );
    const client = this.makeClient("kernelLsp", "kernel-lsp", serverOptions, clientOptions);
    // We show the candidate diff and ask ourselves; without this the server asks as well.
    client.registerFeature(candidatePreviewFeature);
    this.client = client;
    try {
      await client.start();
    } catch (err) {
      this.client = undefined;
      this.status.offline("the server did not start");
      void this.startFailed(interpreter.path, err);
      return;
    }
    client.onNotification(CANDIDATE_NOTIFICATION, (params: { uri?: string; gain?: string; search?: number; candidate?: string }) => {
      this.hints.gain = typeof params?.gain === "string" ? params.gain : undefined;
      if (typeof params?.uri === "string" && !isCandidate(params.uri)) this.hints.lastUri = params.uri;
      if (params?.search !== undefined && params.search !== null) {
        this.hints.lastPreview = { search: params.search, candidate: params.candidate ?? undefined };
      }
    });
    client.onNotification(STATUS_NOTIFICATION, (params: StatusParams) => {
      this.status.update(params);
      // A job's document is the file its later preview belongs to.
      const job = params?.jobs?.find((j) => typeof j.uri === "string" && !isCandidate(j.uri));
      if (job?.uri) this.hints.lastUri = job.uri;
    });
    this.status.update({ jobs: [] });
  }

  private async showDiff(params: { uri: string; external?: boolean; takeFocus?: boolean }) {
    // The prompt outlives an Apply from the diff's title bar (a notification cannot be
    // closed from here): its own Apply then says so instead of applying a second time.
    const prompt = { applied: false };
    this.prompt = prompt;
    const shown = await showCandidateDiff(
      params,
      this.hints,
      (ref) => {
        if (!prompt.applied) return this.apply(ref);
        void vscode.window.showInformationMessage("kernel-lsp: this candidate is applied already.");
        return Promise.resolve(undefined);
      },
      () => this.discard(),
    );
    if (shown) this.diffOpen = true;
    return shown;
  }

  /** A .cu/.cuh is open: the user expects kernel-lsp here, so say why it is not running. */
  private servesOpenCuda(): boolean {
    return vscode.workspace.textDocuments.some((d) => isUsersCuda(d.uri.toString()));
  }

  /** A document opened: the workspace may have started us before any .cu was open (activation
   *  on `workspaceContains`), so the first .cu opened later is when to say why we are not running. */
  documentOpened(doc: vscode.TextDocument): void {
    if (this.missing && isUsersCuda(doc.uri.toString())) void this.offerInstall();
  }

  /** Once per session (or when a command needs the server): what to do about a missing server. */
  async offerInstall(force = false): Promise<void> {
    if (!this.missing || (this.askedInstall && !force)) return;
    this.askedInstall = true;
    const untrusted = !vscode.workspace.isTrusted;
    const why = untrusted
      ? `${this.missing.reason}. This workspace is not trusted, so kernelLsp.python is ignored and ${this.missing.python} is used.`
      : `${this.missing.reason}.`;
    const actions = untrusted ? ["Manage Workspace Trust", "Install…"] : ["Install…", "Choose Interpreter", "Show Log"];
    const choice = await vscode.window.showInformationMessage(`kernel-lsp: ${why}`, ...actions);
    if (choice === "Install…") await vscode.commands.executeCommand("kernelLsp.installServer");
    if (choice === "Choose Interpreter") await vscode.commands.executeCommand("workbench.action.openSettings", "kernelLsp.python");
    if (choice === "Manage Workspace Trust") await vscode.commands.executeCommand("workbench.trust.manage");
    if (choice === "Show Log") this.output.show();
  }

  /** Settings changed: push them to the running server (a Search keeps running). */
  pushSettings(): void {
    if (!this.client) return;
    void this.client.sendNotification("workspace/didChangeConfiguration", {
      settings: { [SECTION]: serverSettings(this.config(), vscode.workspace.isTrusted) },
    });
  }

  private async startFailed(python: string, err: unknown): Promise<void> {
    const msg = err instanceof Error ? err.message : String(err);
    this.output.appendLine(`[kernel-lsp] start failed: ${msg}`);
    const choice = await vscode.window.showErrorMessage(
      `kernel-lsp could not start with ${python}. Install it there (pip install kernel-lsp) or set kernelLsp.python.`,
      "Open Settings",
      "Show Log",
    );
    if (choice === "Open Settings") await vscode.commands.executeCommand("workbench.action.openSettings", "kernelLsp.python");
    if (choice === "Show Log") this.output.show();
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client) {
      try {
        await client.stop(5000);
      } catch (err) {
        this.output.appendLine(`[kernel-lsp] stop: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    this.status.offline("stopped");
  }

  async restart(): Promise<void> {
    await this.starting;
    await this.stop();
    await this.start();
  }

  /** Settings UIs fire a change per keystroke: restart once they settle. */
  restartSoon(delayMs = 500): void {
    if (this.restartTimer) clearTimeout(this.restartTimer);
    this.restartTimer = setTimeout(() => void this.restart(), delayMs);
  }

  watchPythonExtension(): vscode.Disposable | undefined {
    return this.python?.environments?.onDidChangeActiveEnvironmentPath?.(() => {
      if (!this.config().get<string>("python")) this.restartSoon();
    });
  }

  private remember(command: string, arg: unknown): void {
    if (!arg || typeof arg !== "object") return;
    const a = arg as Args;
    if (typeof a.uri === "string" && !isCandidate(a.uri)) this.hints.lastUri = a.uri;
    if (command === SERVER_COMMANDS.previewCandidate || command === SERVER_COMMANDS.applyCandidate) {
      this.hints.lastPreview = { search: a.search as CandidateRef["search"], candidate: a.candidate as CandidateRef["candidate"] };
    } else if (command === SERVER_COMMANDS.optimize || command === SERVER_COMMANDS.tune) {
      this.hints.lastPreview = undefined; // a new search: the last one's ids would apply the wrong result
    }
  }

  /** `{search, best}` of an optimize/tune result (SearchResult.to_dict on the server). */
  private rememberResult(result: unknown): void {
    if (!result || typeof result !== "object") return;
    const r = result as Args;
    if (r.search === undefined || r.search === null) return;
    const candidate = (r.candidate ?? r.best ?? undefined) as CandidateRef["candidate"] | null;
    this.hints.lastPreview = { search: r.search as CandidateRef["search"], candidate: candidate ?? undefined };
  }

  /** workspace/executeCommand on the server (starting it first if needed). */
  async exec(command: string, arg: Args): Promise<unknown> {
    await this.start();
    if (!this.client) {
      if (this.missing) {
        void this.offerInstall(true);
        return undefined; // said why, with what to do
      }
      throw new Error("kernel-lsp is not running");
    }
    this.remember(command, arg);
    const result = await this.client.sendRequest("workspace/executeCommand", { command, arguments: [arg] });
    this.rememberResult(result);
    return result;
  }

  apply(ref: CandidateRef): Thenable<unknown> {
    const arg: Args = {};
    if (ref.search !== undefined) arg.search = ref.search;
    return this.exec(SERVER_COMMANDS.applyCandidate, arg).then(async (result) => {
      await this.closeDiff();
      const r = (result ?? {}) as Args;
      if (r.applied === true) {
        if (this.prompt) this.prompt.applied = true;
        await vscode.commands.executeCommand("setContext", "kernelLsp.candidatePending", false);
      } else if (typeof r.reason === "string" || typeof r.error === "string") {
        void vscode.window.showWarningMessage(`kernel-lsp: not applied: ${String(r.reason ?? r.error)}`);
      }
      return result;
    }, (err) => report(err));
  }

  /** Discard: close the diff; the result stays in the store and in Apply Last Candidate. */
  async discard(): Promise<void> {
    await this.closeDiff();
  }

  private async closeDiff(): Promise<void> {
    if (!this.diffOpen) return;
    this.diffOpen = false;
    await vscode.commands.executeCommand("setContext", "kernelLsp.candidateDiffOpen", false);
    const tab = vscode.window.activeTextEditor?.document.uri.toString();
    if (tab && isCandidate(tab)) await vscode.commands.executeCommand("workbench.action.closeActiveEditor");
  }

  diffOpen = false;
  /** The Apply prompt of the last diff shown. */
  private prompt?: { applied: boolean };

  dispose(): void {
    if (this.restartTimer) clearTimeout(this.restartTimer);
    void this.stop();
  }
}

function report(err: unknown): void {
  const msg = err instanceof Error ? err.message : String(err);
  void vscode.window.showErrorMessage(`kernel-lsp: ${msg}`);
}

/** `{uri}` from explicit arguments (code lens) or the active editor: a document has one
 * Task, which the server finds itself. */
export async function documentArgs(arg: unknown): Promise<Args | undefined> {
  if (arg && typeof arg === "object" && typeof (arg as Args).uri === "string") return arg as Args;
  if (arg instanceof vscode.Uri) return { uri: arg.toString() };
  const editor = vscode.window.activeTextEditor;
  if (!editor || !isServed(editor.document)) {
    void vscode.window.showWarningMessage("kernel-lsp: open a .cu or .py file first");
    return undefined;
  }
  return { uri: editor.document.uri.toString() };
}

export async function activate(context: vscode.ExtensionContext): Promise<Controller> {
  const output = vscode.window.createOutputChannel("kernel-lsp");
  const status = new StatusBar();
  const ctl = new Controller(context, output, status);
  context.subscriptions.push(output, status, ctl);

  const onDocument = (serverCommand: string) => async (arg?: unknown) => {
    const args = await documentArgs(arg);
    if (!args) return;
    try {
      return await ctl.exec(serverCommand, args);
    } catch (err) {
      report(err);
    }
  };

  context.subscriptions.push(
    vscode.commands.registerCommand("kernelLsp.optimize", onDocument(SERVER_COMMANDS.optimize)),
    vscode.commands.registerCommand("kernelLsp.tune", onDocument(SERVER_COMMANDS.tune)),
    vscode.commands.registerCommand("kernelLsp.writeKernels", onDocument(SERVER_COMMANDS.writeKernels)),
    vscode.commands.registerCommand("kernelLsp.benchmark", onDocument(SERVER_COMMANDS.benchmark)),
    vscode.commands.registerCommand("kernelLsp.cancel", async (arg?: unknown) => {
      let job = arg && typeof arg === "object" ? (arg as Args).job : undefined;
      const jobs = status.jobs;
      if (job === undefined && jobs.length > 1) {
        const pick = await vscode.window.showQuickPick(
          [{ label: "All jobs", id: undefined as unknown }, ...jobs.map((j) => ({ label: j.title || String(j.id), description: j.message, id: j.id as unknown }))],
          { placeHolder: "Cancel which kernel-lsp job?" },
        );
        if (!pick) return;
        job = pick.id;
      } else if (job === undefined && jobs.length === 1) {
        job = jobs[0].id;
      }
      try {
        return await ctl.exec(SERVER_COMMANDS.cancel, job === undefined ? {} : { job });
      } catch (err) {
        report(err);
      }
    }),
    vscode.commands.registerCommand("kernelLsp.showReport", async (arg?: unknown) => {
      try {
        const search = arg && typeof arg === "object" ? (arg as Args).search : ctl.hints.lastPreview?.search;
        // The server opens the report itself (window/showDocument, external).
        return await ctl.exec(SERVER_COMMANDS.showReport, search === undefined ? {} : { search });
      } catch (err) {
        report(err);
      }
    }),
    vscode.commands.registerCommand("kernelLsp.applyCandidate", (arg?: CandidateRef) =>
      ctl.apply(arg && typeof arg === "object" && "search" in arg ? arg : (ctl.hints.lastPreview ?? {})),
    ),
    vscode.commands.registerCommand("kernelLsp.discardCandidate", () => ctl.discard()),
    vscode.commands.registerCommand("kernelLsp.showLog", () => output.show()),
    vscode.commands.registerCommand("kernelLsp.installServer", async () => {
      const python = ctl.missing?.python ?? "python3";
      const picked = await vscode.window.showOpenDialog({
        canSelectFolders: true,
        canSelectFiles: false,
        openLabel: "Install from this kernel-lsp checkout",
        title: `Install kernel-lsp into ${python}`,
      });
      const folder = picked?.[0]?.fsPath;
      if (!folder) return;
      const terminal = vscode.window.createTerminal({ name: "kernel-lsp install" });
      terminal.show();
      terminal.sendText(installCommand(python, folder));
      output.appendLine(`[kernel-lsp] install: ${installCommand(python, folder)}; then run kernel-lsp: Restart Server`);
    }),
    vscode.window.onDidChangeActiveTextEditor(() => status.render()),
    vscode.workspace.onDidOpenTextDocument((doc) => ctl.documentOpened(doc)),
    vscode.commands.registerCommand("kernelLsp.restart", () => ctl.restart()),
    vscode.commands.registerCommand("kernelLsp.setApiKey", async () => {
      const key = await vscode.window.showInputBox({
        prompt: "API key for the OpenAI-compatible endpoint (stored in VS Code's secret storage; empty to remove)",
        password: true,
        ignoreFocusOut: true,
      });
      if (key === undefined) return; // dismissed
      if (key.trim()) await context.secrets.store(API_KEY_SECRET, key.trim());
      else await context.secrets.delete(API_KEY_SECRET);
      // The key lives in the server's environment: a new process picks it up.
      await ctl.restart();
    }),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (!e.affectsConfiguration(SECTION)) return;
      // A new interpreter or server arguments need a new process; everything else is pushed
      // with workspace/didChangeConfiguration, so a running Search is not killed.
      if (RESTART_SETTINGS.some((k) => e.affectsConfiguration(`${SECTION}.${k}`)) || !ctl.client) ctl.restartSoon();
      else ctl.pushSettings();
    }),
    vscode.workspace.onDidGrantWorkspaceTrust(() => void ctl.restart()),
  );

  await ctl.start();
  const watch = ctl.watchPythonExtension();
  if (watch) context.subscriptions.push(watch);
  return ctl;
}

/** A .cu/.cuh of the user's, not a candidate preview of ours. */
function isUsersCuda(uri: string): boolean {
  return /\.(cu|cuh)$/i.test(uri) && !isCandidate(uri);
}

/** Declares `experimental.kernelLsp.candidatePreview` in the client capabilities. */
export const candidatePreviewFeature: StaticFeature = {
  fillClientCapabilities(capabilities: ClientCapabilities): void {
    const experimental = (capabilities.experimental ??= {}) as Record<string, unknown>;
    experimental.kernelLsp = { ...((experimental.kernelLsp as object) ?? {}), candidatePreview: true };
  },
  initialize(): void {},
  getState: () => ({ kind: "static" as const }),
  clear(): void {},
};

export function deactivate(): void {
  // Controller.dispose (a subscription) stops the client.
}
