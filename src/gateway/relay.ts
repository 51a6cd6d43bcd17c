// Copies one upstream answer to the client, and says how that ended. The rules:
// - The client gets the status and headers only with its first body byte (or the
//   upstream's end). Until then nothing is committed, so an upstream that fails after
//   its headers but before any byte is retried on another replica like a refused
//   connection (outcome `failed-before-first-byte`).
// - After the first byte a broken upstream cannot be retried: a stream ends with the one
//   failure event of core/http (the OpenAI SDKs raise an APIError), never `[DONE]`; a
//   JSON answer cut mid-way closes the connection, so it never looks complete.
// - A client that leaves cancels the upstream request.
// - A body rewriter (BodyRewriter) may change what passes: the usage filter of streams,
//   the translation into another wire format. The first byte is then the first one it
//   lets through, so one that holds back a whole answer can still choose its status.
// - With an output check (a guard model on the answer), a JSON answer is held whole until
//   the check passes, and the check sees it as the upstream sent it (before any rewriter);
//   a check that throws sends its error instead, and nothing of the answer. The held answer
//   is capped (MAX_HELD_BYTES): a larger one is refused, never sent unchecked. The replica is
//   done once its body has ended, so `onUpstreamEnd` frees its slot before the check runs.
// - The usage of every JSON answer is read as it passes (a UsageTap), whatever rewrites
//   it: an answer the output check refused, or one a rewriter never finished, still says
//   what its generation cost.
// - With an output meter (output-meter.ts), the answer passes through it first: a stream
//   whose upstream goes past the reserved output is cut there, with the failure event
//   `output_limit_exceeded` (outcome `cut`), and the upstream request is closed so it stops.
import type { ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";
import { UnavailableError } from "../core/errors.ts";
import { OPENAI_ERRORS, endBrokenResponse, startEventStream, type ErrorDialect, type StreamFailure } from "../core/http.ts";
import type { OutputCheck } from "../policy/request-policy.ts";
import type { TokenUsage } from "../core/token-usage.ts";
import { UsageTap } from "./usage-tap.ts";
import { OutputMeter } from "./output-meter.ts";
import { relayAssembled } from "./relay-assembled.ts";

export interface UpstreamAnswer {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: NodeJS.ReadableStream & { destroy(error?: Error): void };
}

export type RelayOutcome =
  /** The whole answer reached the client. */
  | { kind: "answered"; status: number }
  /** The upstream failed after the client got its first byte. */
  | { kind: "broken"; error: Error }
  /** The upstream failed before sending a byte: nothing reached the client; try another replica. */
  | { kind: "failed-before-first-byte"; error: Error }
  /** The client left first. */
  | { kind: "client-gone" }
  /** The output check refused the whole answer; nothing of it reached the client. */
  | { kind: "refused"; error: Error }
  /** The upstream went past the output the request reserved: the stream was cut there (output_limit_exceeded). */
  | { kind: "cut"; error: Error };

export interface RelayResult {
  outcome: RelayOutcome;
  usage: TokenUsage | null;
  /** performance.now() when the first body byte arrived, if it did. */
  firstByteAt: number | null;
  /** What counted a metered stream's output (for an estimate, when it reported no usage). */
  meter: OutputMeter | null;
  /** What read a JSON answer's usage (it holds the answer, for an estimate, when it reported none). */
  tap: UsageTap | null;
}

/** Changes an answer on its way to the client, and reads its token usage as it passes. */
export interface BodyRewriter {
  /** Takes the next bytes from the upstream; returns what the client gets now (maybe nothing yet). */
  push(chunk: Buffer): Buffer;
  /** The upstream ended: the rest of what the client gets. */
  end(): Buffer;
  usage(): TokenUsage | null;
  /** Status and content type for the client, when the rewriter changes them; asked when the headers go out. */
  head?(): { status: number; contentType: string /** A stream of events (JSON lines) that a failure event can end. */; stream?: boolean };
  /**
   * Work that must be done before the client gets the answer's end (the Responses API keeps
   * the response it is about to complete, so a client that chains on it at once finds it):
   * a promise to wait for, or null when it is done already (nothing to wait for costs no
   * turn of the event loop). It never rejects: it handles its own failures.
   */
  beforeEnd?(): Promise<void> | null;
  /** The failure event of this answer, when it depends on what was sent (a sequence number); else the dialect's. */
  failureEvent?(failure: StreamFailure): string;
  /** An event stream's translator: whether the upstream said [DONE] (asked after end()); the relay reads the raw tail otherwise. */
  complete?(): boolean;
}

/** The error dialect of one answer: the route's, with its rewriter's failure event where it has one. */
export function answerErrors(rewriter: BodyRewriter | null, errors: ErrorDialect | undefined): ErrorDialect | undefined {
  if (rewriter?.failureEvent === undefined) return errors;
  return { render: (errors ?? OPENAI_ERRORS).render, streamFailureEvent: (failure) => rewriter.failureEvent!(failure) };
}

/** Runs `then` once the rewriter's work before the end is done (at once when it has none). */
export function afterBeforeEnd(rewriter: BodyRewriter | null, then: () => void): void {
  let waiting: Promise<void> | null = null;
  try {
    waiting = rewriter?.beforeEnd?.() ?? null;
  } catch {
    // It must not throw; if it does, the answer ends without what it would have done.
  }
  if (waiting === null) then();
  else waiting.then(then, then);
}

/** What is known of an answer when its rewriter is chosen. */
export interface AnswerHead {
  status: number;
  eventStream: boolean;
}

export interface RelayOptions {
  res: ServerResponse;
  upstream: UpstreamAnswer;
  /**
   * Reads the usage from an event stream's data events as they pass: when the client asked
   * for it, so no rewriter takes it out. JSON answers are always read.
   */
  tapEventStream: boolean;
  /** Makes the rewriter of this answer (the usage filter, a wire-format translation); null passes it as it is. */
  rewrite: ((answer: AnswerHead) => BodyRewriter | null) | null;
  /** How a failure is told once the answer has begun (OpenAI's failure event by default). */
  errors?: ErrorDialect;
  /** What the failure event says when the upstream breaks mid-stream. */
  brokenMessage: string;
  /**
   * A client that reads nothing for this long while the answer waits for it is cut off:
   * it would otherwise hold its replica slot for as long as it keeps the connection open
   * (undici's body timeout does not run while the upstream is paused for it).
   */
  stalledReaderMs: number;
  /** Headers of llmgw's own that every answer carries (a limited key's x-ratelimit-*). */
  headers?: Readonly<Record<string, string>> | undefined;
  /** Looks at a whole successful JSON answer before any of it is sent (event streams are never held). */
  outputCheck?: OutputCheck | null;
  /** The most bytes held for the output check (default MAX_HELD_BYTES). */
  maxHeldBytes?: number;
  /** The upstream body has ended (or was given up): its replica has no more work for it. */
  onUpstreamEnd?: () => void;
  /**
   * The answer is a stream to meter (the client asked for one): its output is counted as it
   * passes, and cut past `outputBound` (output-meter.ts). Decided by the request, not by the
   * answer's content type, so an upstream cannot opt out by naming it otherwise.
   */
  meterStream?: boolean;
  /** The most output tokens the request reserved; null: none to hold (the meter only counts). */
  outputBound?: number | null;
  /**
   * The client asked for one JSON answer, and the gateway asked the upstream for a stream to
   * hold it to `outputBound` (relay-assembled.ts): an event stream is made into that answer.
   */
  assemble?: { completions: boolean } | null;
}

/** A held answer larger than this is refused rather than buffered: a guard reads far less, and memory is per request. */
export const MAX_HELD_BYTES = 8 * 1024 * 1024;

/**
 * Upstream response headers passed to the client. Everything else stays behind: hop-by-hop
 * headers, and what an external server says about itself (cookies, auth challenges, CORS,
 * its own rate limits) which would mislead a client of the gateway.
 */
const FORWARDED_HEADERS = new Set(["content-type", "content-length", "content-encoding", "cache-control", "retry-after", "retry-after-ms", "x-request-id"]);

export function forwardedHeaders(headers: UpstreamAnswer["headers"], rewritten: boolean): Record<string, string | string[]> {
  const kept: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    // A rewritten body no longer has the upstream's length.
    if (rewritten && name === "content-length") continue;
    if (FORWARDED_HEADERS.has(name) || name.startsWith("openai-")) kept[name] = value;
  }
  return kept;
}

/** Enough of a stream's last bytes to find `data: [DONE]` or the start of an error event. */
const TAIL_CHARS = 512;
const SSE_DONE_TEXT = "data: [DONE]";

function streamTail(chunks: [Buffer | null, Buffer | null]): string {
  const [before, last] = chunks;
  const bytes = before === null ? (last ?? Buffer.alloc(0)) : Buffer.concat([before, last ?? Buffer.alloc(0)]);
  return bytes.subarray(Math.max(0, bytes.length - TAIL_CHARS)).toString("latin1");
}

function isEventStream(headers: UpstreamAnswer["headers"]): boolean {
  const type = headers["content-type"];
  // Media types are case-insensitive (RFC 9110).
  return typeof type === "string" && type.toLowerCase().startsWith("text/event-stream");
}

export function relay(options: RelayOptions): Promise<RelayResult> {
  const { res, upstream } = options;
  // Whatever its content type says: an upstream cannot opt out of being held to the bound by
  // naming its stream otherwise (one that answers with one JSON body is relayed as that).
  if (options.assemble != null && upstream.statusCode >= 200 && upstream.statusCode < 300) {
    return relayAssembled(options, options.assemble.completions);
  }
  const body = upstream.body;
  let firstByteAt: number | null = null;
  let headersOut = false;
  // An event stream that ends without `[DONE]` did not finish: the upstream stopped (an
  // engine shutting down, say). Its last bytes tell whether it said so itself.
  const eventStream = isEventStream(upstream.headers);
  const tap = !eventStream ? new UsageTap(false) : options.tapEventStream ? new UsageTap(true) : null;
  const rewriter = options.rewrite?.({ status: upstream.statusCode, eventStream }) ?? null;
  const errors = answerErrors(rewriter, options.errors);
  // Only a successful answer is metered: an error answer generated nothing.
  const meter = options.meterStream === true && upstream.statusCode >= 200 && upstream.statusCode < 300 ? new OutputMeter(options.outputBound ?? null) : null;
  const encoding = upstream.headers["content-encoding"];
  if (meter !== null && encoding !== undefined && encoding !== "identity") meter.cannotRead(`it came compressed (${String(encoding)})`);
  const sendHeaders = () => {
    if (headersOut) return;
    headersOut = true;
    const headers = forwardedHeaders(upstream.headers, rewriter !== null);
    if (options.headers !== undefined) Object.assign(headers, options.headers);
    const head = rewriter?.head?.();
    if (head !== undefined) headers["content-type"] = head.contentType;
    const status = head?.status ?? upstream.statusCode;
    if ((eventStream && head === undefined) || head?.stream === true) startEventStream(res, status, headers);
    else res.writeHead(status, headers);
  };
  // The last two chunks, kept as they are: decoding every chunk to find the end would cost
  // more than the whole rest of the relay.
  let lastChunks: [Buffer | null, Buffer | null] = [null, null];
  const outputCheck = options.outputCheck ?? null;
  const holding = outputCheck !== null && !eventStream && upstream.statusCode >= 200 && upstream.statusCode < 300;
  const held: Buffer[] = [];
  let heldBytes = 0;
  const maxHeldBytes = options.maxHeldBytes ?? MAX_HELD_BYTES;
  let stalled: NodeJS.Timeout | undefined;
  const write = (bytes: Buffer) => {
    if (bytes.length === 0) return;
    sendHeaders();
    if (res.write(bytes)) return;
    body.pause();
    stalled = setTimeout(() => res.destroy(), options.stalledReaderMs);
    res.once("drain", () => {
      clearTimeout(stalled);
      body.resume();
    });
  };

  return new Promise<RelayResult>((resolve) => {
    let settled = false;
    const finish = (outcome: RelayOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(stalled);
      body.removeListener("data", onData);
      body.removeListener("end", onEnd);
      res.removeListener("close", onClientClose);
      // Late errors of a body we stopped caring about must not become unhandled.
      body.removeListener("error", onError);
      body.on("error", () => undefined);
      resolve({ outcome, usage: rewriter?.usage() ?? tap?.usage() ?? meter?.reportedUsage() ?? null, firstByteAt, meter, tap });
    };
    const onData = (chunk: Buffer) => {
      if (firstByteAt === null) firstByteAt = performance.now();
      tap?.push(chunk);
      if (holding) {
        heldBytes += chunk.length;
        if (heldBytes > maxHeldBytes) {
          const mib = Math.round((maxHeldBytes / (1024 * 1024)) * 10) / 10;
          finish({
            kind: "refused",
            error: new UnavailableError(
              `The answer is over ${mib} MiB, more than llmgw holds for its output guards to check, so it was not sent. Ask for a shorter answer (a lower max_tokens).`,
              {
                code: "guard_unavailable",
              },
            ),
          });
          body.destroy();
          options.onUpstreamEnd?.();
          return;
        }
        held.push(chunk);
        return;
      }
      if (eventStream) lastChunks = [lastChunks[1], chunk];
      const passing = meter === null ? chunk : meter.push(chunk);
      if (rewriter === null) write(passing);
      else if (!rewrite(() => write(rewriter.push(passing)))) return;
      if (meter?.exceeded === true) cut?.(false);
    };
    /**
     * Runs a step of the rewriter; false when it threw (an upstream's chunk it could not
     * read, say): a listener of the upstream's stream that throws would take the server
     * down. The answer is broken there, as if the upstream had failed: before the first
     * byte another replica may answer; after it, the stream ends with the failure event.
     */
    const rewrite = (step: () => void): boolean => {
      try {
        step();
        return true;
      } catch (error) {
        body.destroy();
        options.onUpstreamEnd?.();
        onError(new Error(`the answer could not be translated (${error instanceof Error ? error.message : String(error)})`));
        return false;
      }
    };
    // The upstream went past the reserved output: what passed stays, the failure event ends
    // the stream, and the upstream request is closed so it stops generating.
    // Made only for a metered answer: a closure per request is a measurable cost on the hot path.
    const cut =
      meter === null
        ? null
        : (upstreamEnded: boolean) => {
            sendHeaders();
            const reason = meter.unreadable;
            const message =
              reason === null
                ? `The upstream went past the ${options.outputBound} output tokens this request reserved (its max_tokens under the key's limits), so llmgw cut the answer here.`
                : `llmgw cannot count this answer's output against the key's limits (${reason}), so it was cut.`;
            endBrokenResponse(res, { message, code: "output_limit_exceeded" }, errors);
            if (!upstreamEnded) {
              body.destroy();
              options.onUpstreamEnd?.();
            }
            finish({ kind: "cut", error: new Error(message) });
          };
    const onEnd = () => {
      options.onUpstreamEnd?.();
      if (holding) {
        const answer = Buffer.concat(held);
        outputCheck(answer).then(
          () => {
            if (settled) return;
            if (rewriter === null) write(answer);
            else if (!rewrite(() => write(rewriter.push(answer)))) return;
            afterBeforeEnd(rewriter, () => {
              if (settled) return;
              if (rewriter !== null && !rewrite(() => write(rewriter.end()))) return;
              sendHeaders();
              res.end();
              finish({ kind: "answered", status: res.statusCode });
            });
          },
          (error: unknown) => finish({ kind: "refused", error: error instanceof Error ? error : new Error(String(error)) }),
        );
        return;
      }
      if (meter !== null) {
        const rest = meter.end();
        if (rewriter === null) write(rest);
        else if (!rewrite(() => write(rewriter.push(rest)))) return;
        if (meter.exceeded) {
          cut?.(true);
          return;
        }
      }
      afterBeforeEnd(rewriter, endAnswer);
    };
    /** The upstream ended and what the rewriter had to do first is done: the end of the answer. */
    const endAnswer = () => {
      // The client left while the rewriter's work ran.
      if (settled) return;
      if (rewriter !== null && !rewrite(() => write(rewriter.end()))) return;
      sendHeaders();
      const tail = eventStream ? streamTail(lastChunks) : "";
      // A translating rewriter read every event and knows whether [DONE] came; else the raw tail says.
      const done = rewriter?.complete?.() ?? tail.includes(SSE_DONE_TEXT);
      if (eventStream && upstream.statusCode === 200 && !done) {
        const error = new Error("the upstream ended its event stream without [DONE]");
        // Its own error event already told the client; otherwise say it here.
        if (tail.includes('{"error"')) res.end();
        else endBrokenResponse(res, { message: options.brokenMessage, code: "upstream_failed" }, errors);
        finish({ kind: "broken", error });
        return;
      }
      res.end();
      // The status the client got: a rewriter may have changed it.
      finish({ kind: "answered", status: res.statusCode });
    };
    const onError = (error: Error) => {
      if (!headersOut) {
        finish({ kind: "failed-before-first-byte", error });
        return;
      }
      endBrokenResponse(res, { message: options.brokenMessage, code: "upstream_failed" }, errors);
      finish({ kind: "broken", error });
    };
    const onClientClose = () => {
      if (res.writableFinished) return;
      body.destroy();
      finish({ kind: "client-gone" });
    };
    body.on("data", onData);
    body.on("end", onEnd);
    body.on("error", onError);
    res.on("close", onClientClose);
  });
}
