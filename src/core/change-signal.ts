// A signal with no payload that any number of listeners hear: "something you depend on
// changed; look again". The key service and the console sessions raise it when a key is
// revoked or a session ends (here, or on another server, heard through the change feed),
// so long-lived answers such as the event stream check their caller again at once
// instead of at their next periodic check.
export class ChangeSignal {
  private readonly listeners = new Set<() => void>();

  /** Calls `listener` at each change until the returned function is called. */
  subscribe(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  /** Tells every listener now, synchronously; listeners only note the change and return. */
  notify(): void {
    for (const listener of [...this.listeners]) listener();
  }
}
