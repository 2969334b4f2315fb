// Stand-in for `vscode-languageclient/node`: records how the client was built and what
// it sent, and lets a test play the server (notifications, showDocument, configuration).
export enum TransportKind {
  stdio = 0,
}

export const clients: LanguageClient[] = [];
export const behaviour = {
  failStart: false,
  // What the server answers to workspace/executeCommand.
  executeResult: undefined as unknown,
};

export function resetClients(): void {
  clients.length = 0;
  behaviour.failStart = false;
  behaviour.executeResult = undefined;
}

export class LanguageClient {
  notifications = new Map<string, (params: unknown) => void>();
  requests: { method: string; params: unknown }[] = [];
  sent: { method: string; params: unknown }[] = [];
  running = false;
  stopped = false;
  features: { fillClientCapabilities(c: object): void }[] = [];

  constructor(
    readonly id: string,
    readonly name: string,
    readonly serverOptions: any,
    readonly clientOptions: any,
  ) {
    clients.push(this);
  }

  registerFeature(feature: { fillClientCapabilities(c: object): void }): void {
    this.features.push(feature);
  }

  /** The capabilities the registered features would send in `initialize`. */
  capabilities(): Record<string, any> {
    const caps: Record<string, any> = {};
    for (const f of this.features) f.fillClientCapabilities(caps);
    return caps;
  }

  async start(): Promise<void> {
    if (behaviour.failStart) throw new Error("spawn python3 ENOENT");
    this.running = true;
  }

  async stop(): Promise<void> {
    this.running = false;
    this.stopped = true;
  }

  onNotification(method: string, handler: (params: unknown) => void) {
    this.notifications.set(method, handler);
    return { dispose: () => this.notifications.delete(method) };
  }

  async sendNotification(method: string, params: unknown): Promise<void> {
    this.sent.push({ method, params });
  }

  async sendRequest(method: string, params: unknown): Promise<unknown> {
    this.requests.push({ method, params });
    return behaviour.executeResult;
  }
}
