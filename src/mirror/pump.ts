// The inner loop of a download: a source body streamed into the partial file with
// backpressure, each chunk handed to the hash right after the writer, and a failure on
// either side settled so that the file and the hash hold the same bytes.
import type { Readable, Writable } from "node:stream";
import { UpstreamError } from "../core/errors.ts";
import { WriteError } from "./mirror-errors.ts";

/**
 * Streams `body` into `sink`, giving each chunk to `onChunk` (the hash) right after
 * handing it to the writer, so hashing on this thread overlaps the write in libuv's
 * thread pool. `onWritten` counts bytes the writer confirmed. When the body fails, what
 * was already received is still written out before the promise rejects, so the file and
 * the running hash hold exactly the same bytes and a retry can continue both.
 */
export function pump(options: {
  body: Readable;
  sink: Writable;
  signal: AbortSignal;
  limit: number | null;
  onChunk: (chunk: Buffer) => void;
  onWritten: (bytes: number) => void;
}): Promise<void> {
  const { body, sink, signal, limit, onChunk, onWritten } = options;
  return new Promise<void>((resolve, reject) => {
    let received = 0;
    let ended = false;
    let sourceError: unknown;
    let settled = false;
    const settle = (error: unknown): void => {
      if (settled) return;
      settled = true;
      body.off("data", onData);
      body.off("end", onEnd);
      body.off("error", onSourceError);
      body.off("close", onClose);
      sink.off("drain", onDrain);
      sink.off("finish", onFinish);
      signal.removeEventListener("abort", onAbort);
      // A late error from either stream after we settled must not become an uncaught one.
      body.on("error", () => undefined);
      sink.on("error", () => undefined);
      if (error === undefined) resolve();
      else reject(error);
    };
    const onData = (chunk: Buffer): void => {
      if (limit !== null && received + chunk.length > limit) {
        onSourceError(new UpstreamError(`The source sent more bytes than the ${limit} expected.`, { code: "mirror_size_mismatch" }));
        return;
      }
      received += chunk.length;
      const length = chunk.length;
      const more = sink.write(chunk, (error) => {
        if (error === null || error === undefined) onWritten(length);
      });
      onChunk(chunk);
      if (!more) body.pause();
    };
    const onDrain = (): void => {
      if (sourceError === undefined) body.resume();
    };
    const onEnd = (): void => {
      ended = true;
      sink.end();
    };
    const onSourceError = (error: unknown): void => {
      if (sourceError !== undefined || settled) return;
      sourceError = error;
      body.off("data", onData);
      body.destroy();
      // Write out what arrived before the failure (end, not destroy, keeps queued chunks).
      sink.end();
    };
    const onClose = (): void => {
      if (!ended) onSourceError(signal.aborted ? signal.reason : new Error("the source stream closed before its end"));
    };
    const onFinish = (): void => settle(sourceError);
    const onSinkError = (error: unknown): void => {
      body.destroy();
      settle(new WriteError(error));
    };
    const onAbort = (): void => onSourceError(signal.reason);
    body.on("data", onData);
    body.on("end", onEnd);
    body.on("error", onSourceError);
    body.on("close", onClose);
    sink.on("drain", onDrain);
    sink.on("finish", onFinish);
    sink.once("error", onSinkError);
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
    // A body that already failed emits nothing more.
    if (body.destroyed && !body.readableEnded) onSourceError(body.errored ?? new Error("the source stream closed before its end"));
  });
}
