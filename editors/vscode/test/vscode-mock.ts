// A hand-written stand-in for the `vscode` module (no VS Code can run here):
// just the API surface the extension touches, with state the tests can set and read.
import * as path from "path";

type Listener<T> = (e: T) => unknown;

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  event = (listener: Listener<T>) => {
    this.listeners.push(listener);
    return { dispose: () => (this.listeners = this.listeners.filter((l) => l !== listener)) };
  };
  fire(e: T): void {
    for (const l of [...this.listeners]) l(e);
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly path: string,
  ) {}
  get fsPath(): string {
    return this.path;
  }
  static file(p: string): Uri {
    return new Uri("file", path.resolve(p));
  }
  static parse(s: string): Uri {
    const m = /^([a-z][\w+.-]*):\/\/(.*)$/i.exec(s);
    return m ? new Uri(m[1], decodeURIComponent(m[2])) : new Uri("file", s);
  }
  toString(): string {
    return `${this.scheme}://${this.path.split("/").map(encodeURIComponent).join("/")}`;
  }
}

export class Position {
  constructor(
    readonly line: number,
    readonly character: number,
  ) {}
  private cmp(o: Position): number {
    return this.line - o.line || this.character - o.character;
  }
  isBeforeOrEqual(o: Position): boolean {
    return this.cmp(o) <= 0;
  }
  isAfterOrEqual(o: Position): boolean {
    return this.cmp(o) >= 0;
  }
}

export class Range {
  constructor(
    readonly start: Position,
    readonly end: Position,
  ) {}
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}

export interface Call {
  name: string;
  args: unknown[];
}

/** Everything the tests arrange or inspect. */
export const state = {
  settings: {} as Record<string, unknown>,
  trusted: true,
  workspaceFolders: [] as { uri: Uri; name: string; index: number }[],
  textDocuments: [] as { uri: Uri }[],
  activeTextEditor: undefined as undefined | { document: { uri: Uri; languageId?: string }; selection: { active: Position } },
  extensions: {} as Record<string, unknown>,
  calls: [] as Call[],
  commands: new Map<string, (...args: unknown[]) => unknown>(),
  commandResults: {} as Record<string, unknown>,
  messageChoice: undefined as string | undefined,
  inputBox: undefined as string | undefined,
  quickPick: undefined as ((items: unknown[]) => unknown) | undefined,
  statusItems: [] as StatusBarItem[],
  output: [] as string[],
  configChanged: new EventEmitter<{ affectsConfiguration(s: string): boolean }>(),
  trustGranted: new EventEmitter<void>(),
  activeEditorChanged: new EventEmitter<unknown>(),
  documentOpened: new EventEmitter<{ uri: Uri }>(),
  contexts: {} as Record<string, unknown>,
  openDialog: undefined as undefined | Uri[],
  terminals: [] as { name: string; sent: string[] }[],
};

export function reset(): void {
  state.settings = {};
  state.trusted = true;
  state.workspaceFolders = [];
  state.textDocuments = [];
  state.activeTextEditor = undefined;
  state.extensions = {};
  state.calls = [];
  state.commands = new Map();
  state.commandResults = {};
  state.messageChoice = undefined;
  state.inputBox = undefined;
  state.quickPick = undefined;
  state.statusItems = [];
  state.output = [];
  state.configChanged = new EventEmitter();
  state.trustGranted = new EventEmitter();
  state.activeEditorChanged = new EventEmitter();
  state.documentOpened = new EventEmitter();
  state.contexts = {};
  state.openDialog = undefined;
  state.terminals = [];
}

function record(name: string, args: unknown[]): void {
  state.calls.push({ name, args });
}

export class StatusBarItem {
  text = "";
  tooltip: string | undefined;
  command: string | undefined;
  visible = false;
  show(): void {
    this.visible = true;
  }
  hide(): void {
    this.visible = false;
  }
  dispose(): void {}
}

export const window = {
  get activeTextEditor() {
    return state.activeTextEditor;
  },
  createStatusBarItem(): StatusBarItem {
    const item = new StatusBarItem();
    state.statusItems.push(item);
    return item;
  },
  createOutputChannel(name: string) {
    return {
      name,
      append: (s: string) => state.output.push(s),
      appendLine: (s: string) => state.output.push(s),
      show: () => undefined,
      clear: () => undefined,
      dispose: () => undefined,
    };
  },
  async showInformationMessage(...args: unknown[]) {
    record("showInformationMessage", args);
    return state.messageChoice;
  },
  async showWarningMessage(...args: unknown[]) {
    record("showWarningMessage", args);
    return undefined;
  },
  async showErrorMessage(...args: unknown[]) {
    record("showErrorMessage", args);
    return undefined;
  },
  async showInputBox(options: unknown) {
    record("showInputBox", [options]);
    return state.inputBox;
  },
  async showOpenDialog(options: unknown) {
    record("showOpenDialog", [options]);
    return state.openDialog;
  },
  createTerminal(options: { name: string }) {
    const t = { name: options.name, sent: [] as string[] };
    state.terminals.push(t);
    return { show: () => undefined, sendText: (s: string) => void t.sent.push(s), dispose: () => undefined };
  },
  onDidChangeActiveTextEditor: (l: Listener<unknown>) => state.activeEditorChanged.event(l),
  async showQuickPick(items: unknown[], options: unknown) {
    record("showQuickPick", [items, options]);
    return state.quickPick?.(items);
  },
};

function reader(section: string | undefined) {
  return {
    get<T>(key: string, def?: T): T | undefined {
      const full = section ? `${section}.${key}` : key;
      return full in state.settings ? (state.settings[full] as T) : def;
    },
    has: (key: string) => (section ? `${section}.${key}` : key) in state.settings,
  };
}

export const workspace = {
  get isTrusted() {
    return state.trusted;
  },
  get workspaceFolders() {
    return state.workspaceFolders;
  },
  get textDocuments() {
    return state.textDocuments;
  },
  getConfiguration: (section?: string) => reader(section),
  getWorkspaceFolder: (uri: Uri) => state.workspaceFolders.find((f) => uri.fsPath.startsWith(f.uri.fsPath)),
  onDidChangeConfiguration: (l: Listener<{ affectsConfiguration(s: string): boolean }>) => state.configChanged.event(l),
  onDidGrantWorkspaceTrust: (l: Listener<void>) => state.trustGranted.event(l),
  onDidOpenTextDocument: (l: Listener<{ uri: Uri }>) => state.documentOpened.event(l),
};

export const commands = {
  registerCommand(name: string, handler: (...args: unknown[]) => unknown) {
    state.commands.set(name, handler);
    return { dispose: () => state.commands.delete(name) };
  },
  async executeCommand(name: string, ...args: unknown[]) {
    if (name === "setContext") {
      state.contexts[args[0] as string] = args[1];
      return undefined;
    }
    record(name, args);
    const handler = state.commands.get(name);
    if (handler) return handler(...args);
    return state.commandResults[name];
  },
};

export const extensions = {
  getExtension: (id: string) => state.extensions[id],
};

export const env = {
  async openExternal(uri: Uri) {
    record("openExternal", [uri]);
    return true;
  },
};
