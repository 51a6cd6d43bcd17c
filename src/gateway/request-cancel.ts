// The cancellation of one proxied request: it fires when the client goes away. The gateway
// used an AbortController per request, and Node 20 builds an EventTarget for every
// AbortSignal and for every listener on it: about 10 µs of a request's CPU at the gateway
// benchmark's rate, for a signal that almost never fires. This is an EventEmitter with an
// `aborted` flag, which undici takes as a request's `signal` as it is (it accepts any emitter
// of 'abort'); a real AbortSignal is made only when something asks for one (a request that
// waits in a model's queue, a guard model's call), and it follows this cancellation.
import { EventEmitter } from "node:events";

export class RequestCancel extends EventEmitter {
  aborted = false;
  private controller: AbortController | undefined;

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    this.controller?.abort();
    this.emit("abort");
  }

  /** An AbortSignal that aborts with this cancellation (already aborted if it has fired). */
  get signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort();
    }
    return this.controller.signal;
  }
}
