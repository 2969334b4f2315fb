// How the server process is chosen and started: interpreter, arguments, environment.
import * as childProcess from "child_process";
import * as os from "os";
import * as vscode from "vscode";

/** The parts of the Python extension's API (ms-python.python) that we use. */
export interface PythonApi {
  environments?: {
    getActiveEnvironmentPath(resource?: vscode.Uri): { path?: string } | undefined;
    onDidChangeActiveEnvironmentPath?: vscode.Event<unknown>;
  };
  settings?: {
    // Older API, still shipped: execCommand is ["/path/to/python", ...].
    getExecutionDetails?(resource?: vscode.Uri): { execCommand?: string[] } | undefined;
  };
}

export type InterpreterSource = "setting" | "python-extension" | "default";

export async function pythonExtensionApi(): Promise<PythonApi | undefined> {
  const ext = vscode.extensions.getExtension<PythonApi>("ms-python.python");
  if (!ext) return undefined;
  try {
    return ext.isActive ? ext.exports : await ext.activate();
  } catch {
    return undefined; // a broken Python extension must not stop kernel-lsp
  }
}

/** Expands `~` and `${workspaceFolder}` the way users write them in settings. */
export function expandPath(p: string, workspaceFolder?: string): string {
  let out = p.trim();
  if (out === "~" || out.startsWith("~/")) out = os.homedir() + out.slice(1);
  if (workspaceFolder) out = out.split("${workspaceFolder}").join(workspaceFolder);
  return out;
}

/** kernelLsp.python, else the Python extension's active environment, else python3. */
export function chooseInterpreter(
  setting: string | undefined,
  api: PythonApi | undefined,
  resource?: vscode.Uri,
  workspaceFolder?: string,
): { path: string; source: InterpreterSource } {
  if (setting && setting.trim()) return { path: expandPath(setting, workspaceFolder), source: "setting" };
  try {
    const active = api?.environments?.getActiveEnvironmentPath(resource)?.path;
    if (active) return { path: active, source: "python-extension" };
    const exec = api?.settings?.getExecutionDetails?.(resource)?.execCommand?.[0];
    if (exec) return { path: exec, source: "python-extension" };
  } catch {
    // fall through to the default interpreter
  }
  return { path: process.platform === "win32" ? "python" : "python3", source: "default" };
}

export const SERVE_ARGS = ["-m", "kernel_lsp.cli", "serve"];

/**
 * The server's environment: ours, plus the API key when the workspace is trusted.
 * In an untrusted workspace no key reaches the server, even one from our own env.
 */
export function serverEnv(
  base: NodeJS.ProcessEnv,
  apiKey: string | undefined,
  trusted: boolean,
): NodeJS.ProcessEnv {
  const env = { ...base };
  if (!trusted) delete env.OPENAI_API_KEY;
  else if (apiKey) env.OPENAI_API_KEY = apiKey;
  return env;
}

/** Stored key (kernelLsp.setApiKey) first, then OPENAI_API_KEY from VS Code's environment. */
export async function apiKey(
  secrets: vscode.SecretStorage,
  env: NodeJS.ProcessEnv,
): Promise<string | undefined> {
  const stored = await secrets.get(API_KEY_SECRET);
  return stored || env.OPENAI_API_KEY || undefined;
}

export const API_KEY_SECRET = "kernelLsp.apiKey";


/** What `probe` found: the server's version in that interpreter, or why it cannot run there. */
export type Probe = { ok: true; version: string } | { ok: false; reason: string };

// The server's own packages too: kernel_lsp alone imports from a bare interpreter when
// PYTHONPATH points at a checkout, and the server would then crash at start, again and again.
const PROBE_CODE = "import kernel_lsp, pygls, lsprotocol; print(kernel_lsp.__version__)";

/** Whether `python` can run the server (kernel_lsp importable), without starting it. */
export function probeInterpreter(python: string, timeoutMs = 20000): Promise<Probe> {
  return new Promise((resolve) => {
    childProcess.execFile(python, ["-c", PROBE_CODE], { timeout: timeoutMs }, (err, stdout, stderr) => {
      if (!err) return resolve({ ok: true, version: String(stdout).trim() });
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return resolve({ ok: false, reason: `${python} was not found` });
      const last = String(stderr).trim().split("\n").pop() ?? "";
      const missing = /No module named '?([\w.]+)/.exec(last)?.[1];
      if (missing === "kernel_lsp") return resolve({ ok: false, reason: `kernel-lsp is not installed in ${python}` });
      if (missing) return resolve({ ok: false, reason: `kernel-lsp's dependencies are not installed in ${python} (no ${missing})` });
      resolve({ ok: false, reason: last || err.message });
    });
  });
}

/** The command a user runs to install the server from a checkout into `python`. */
export function installCommand(python: string, checkout: string): string {
  const q = (s: string) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);
  return `${q(python)} -m pip install -e ${q(checkout)}`;
}
