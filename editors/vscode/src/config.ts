// Settings -> what the server reads. The server gets one object, the same in
// initializationOptions and in answers to workspace/configuration (section "kernelLsp").
// The API key is never part of it: it travels only in the server's environment.

export const SECTION = "kernelLsp";

/** The part of vscode.WorkspaceConfiguration we use (a plain object in tests). */
export interface ConfigReader {
  get<T>(key: string): T | undefined;
}

export interface ServerSettings {
  nvcc?: string;
  arch?: string;
  extraFlags: string[];
  includePaths: string[];
  onSave: string[];
  execution: { enabled: boolean };
  agent: { model?: string; baseUrl?: string; budget?: number; seed?: string };
  occupancyThreshold?: number;
  proposer?: string;
  timeout?: number;
  /** The Workers' interpreter (kernelLsp.workerPython); the server's own is kernelLsp.python. */
  python?: string;
  device?: string;
  slowShare?: number;
  /** Where candidates run: "local" or "ray" (docs/ray.md), and the Ray cluster. */
  executor?: string;
  rayAddress?: string;
  gpu?: string;
  maxGpus?: number;
}

const ON_SAVE = new Set(["compile", "verify", "bench"]);

function str(cfg: ConfigReader, key: string): string | undefined {
  const v = cfg.get<string>(key);
  // Empty means "server default": leave the key out rather than send "".
  return typeof v === "string" && v.trim() !== "" ? v.trim() : undefined;
}

function strList(cfg: ConfigReader, key: string): string[] {
  const v = cfg.get<unknown>(key);
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string") : [];
}

function num(cfg: ConfigReader, key: string): number | undefined {
  const v = cfg.get<unknown>(key);
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

function dropUndefined<T extends object>(o: T): T {
  for (const k of Object.keys(o) as (keyof T)[]) {
    if (o[k] === undefined) delete o[k];
  }
  return o;
}

/** Settings as the server reads them. `trusted=false` forces execution off. */
export function serverSettings(cfg: ConfigReader, trusted: boolean): ServerSettings {
  const execution = cfg.get<boolean>("execution.enabled");
  return dropUndefined({
    nvcc: str(cfg, "nvcc"),
    arch: str(cfg, "arch"),
    extraFlags: strList(cfg, "extraFlags"),
    includePaths: strList(cfg, "includePaths"),
    onSave: strList(cfg, "onSave").filter((s) => ON_SAVE.has(s)),
    execution: { enabled: trusted && execution !== false },
    agent: dropUndefined({
      model: str(cfg, "agent.model"),
      baseUrl: str(cfg, "agent.baseUrl"),
      budget: num(cfg, "agent.budget"),
      seed: str(cfg, "agent.seed"),
    }),
    occupancyThreshold: num(cfg, "occupancyThreshold"),
    proposer: str(cfg, "proposer"),
    timeout: num(cfg, "timeout"),
    python: str(cfg, "workerPython"),
    device: str(cfg, "device"),
    slowShare: num(cfg, "slowShare"),
    executor: str(cfg, "executor"),
    rayAddress: str(cfg, "rayAddress"),
    gpu: str(cfg, "gpu"),
    maxGpus: num(cfg, "maxGpus"),
  });
}

/**
 * The answer to one workspace/configuration item, or `undefined` for sections that
 * are not ours. "kernelLsp" gives the whole object, "kernelLsp.agent" a part of it.
 */
export function configurationItem(
  section: string | undefined,
  cfg: ConfigReader,
  trusted: boolean,
): unknown {
  if (section !== SECTION && !section?.startsWith(SECTION + ".")) return undefined;
  let value: unknown = serverSettings(cfg, trusted);
  for (const part of section.split(".").slice(1)) {
    value = value !== null && typeof value === "object" ? (value as Record<string, unknown>)[part] : undefined;
  }
  return value ?? null;
}
