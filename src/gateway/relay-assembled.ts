// The relay of a non-stream request that the gateway ran as a stream upstream, to hold an
// upstream it does not trust to its output bound (gateway.ts decides when; why, in
// output-meter.ts). The stream is counted as it comes (OutputMeter) and put together into
// one JSON answer (StreamAssembly); past the bound the upstream request is closed and the
// answer ends there, with `finish_reason: "length"`, as an upstream that kept to max_tokens
// would have answered. Nothing reaches the client before the whole answer is made: the
// output check (a guard model) reads the assembled answer, as it reads any JSON answer,
// and the wire format's rewriter (the Anthropic translation) turns it into the client's.
// The rules at the edges:
// - An upstream that answers one JSON body anyway (it ignores `stream`) is relayed as that
//   answer and charged what it reports: it cannot be stopped part-way.
// - What is held is bounded (maxHeldBytes): an upstream that sends more, or that cannot be
//   read (compressed, no event ending), gets the client a 502 `output_limit_exceeded` and is
//   charged no more than the bound.
// - A stream that ends before `[DONE]` without saying why is like a failure before the
//   first byte: nothing was sent, so another replica may answer. An error event of the
//   upstream is relayed as a 502 error answer.
import { performance } from "node:perf_hooks";
import { OutputMeter } from "./output-meter.ts";
import { afterBeforeEnd, forwardedHeaders, type RelayOptions, type RelayOutcome, type RelayResult } from "./relay.ts";
import { StreamAssembly } from "./stream-assembly.ts";
import { readTokenUsage } from "./usage-tap.ts";

/** Held per request at most: enough for an honest answer's events (with log probabilities) at the bound. */
const HELD_BYTES_PER_TOKEN = 8 * 1024;
const MIN_HELD_BYTES = 64 * 1024;
const MAX_HELD_BYTES = 8 * 1024 * 1024;

export function relayAssembled(options: RelayOptions, completions: boolean): Promise<RelayResult> {
  const { res, upstream } = options;
  const body = upstream.body;
  const bound = options.outputBound ?? null;
  const meter = new OutputMeter(bound);
  const encoding = upstream.headers["content-encoding"];
  if (encoding !== undefined && encoding !== "identity") meter.cannotRead(`it came compressed (${String(encoding)})`);
  const assembly = new StreamAssembly(completions);
  const maxHeld = Math.min(MAX_HELD_BYTES, MIN_HELD_BYTES + (bound ?? 0) * HELD_BYTES_PER_TOKEN);
  // The body as it came, while it may still turn out to be one JSON answer rather than a stream.
  const raw: Buffer[] = [];
  let rawBytes = 0;
  let firstByteAt: number | null = null;
  let answerUsage: RelayResult["usage"] = null;

  return new Promise<RelayResult>((resolve) => {
    let settled = false;
    let delivering = false;
    const finish = (outcome: RelayOutcome) => {
      if (settled) return;
      settled = true;
      body.removeListener("data", onData);
      body.removeListener("end", onEnd);
      body.removeListener("error", onError);
      res.removeListener("close", onClientClose);
      body.on("error", () => undefined);
      resolve({ outcome, usage: answerUsage ?? assembly.usage() ?? meter.reportedUsage(), firstByteAt, meter, tap: null });
    };
    /** Checks the answer, translates it and sends it in one piece; `cut`: it was stopped at the bound. */
    const send = (answer: Buffer, status: number, cut: Error | null) => {
      const deliverNow = () => {
        if (settled) return;
        const failed = (error: unknown) => {
          // A translation or a write that fails must not take the server down: the client's connection goes.
          res.destroy();
          finish({ kind: "refused", error: error instanceof Error ? error : new Error(String(error)) });
        };
        try {
          const rewriter = options.rewrite?.({ status, eventStream: false }) ?? null;
          const start = rewriter === null ? answer : rewriter.push(answer);
          afterBeforeEnd(rewriter, () => {
            if (settled) return;
            try {
              const bytes = rewriter === null ? start : Buffer.concat([start, rewriter.end()]);
              answerUsage = rewriter?.usage() ?? answerUsage;
              const head = rewriter?.head?.();
              const headers = forwardedHeaders(upstream.headers, true);
              delete headers["content-encoding"];
              if (options.headers !== undefined) Object.assign(headers, options.headers);
              headers["content-type"] = head?.contentType ?? "application/json";
              res.writeHead(head?.status ?? status, headers);
              res.end(bytes);
              finish(cut === null ? { kind: "answered", status: res.statusCode } : { kind: "cut", error: cut });
            } catch (error) {
              failed(error);
            }
          });
        } catch (error) {
          failed(error);
        }
      };
      const check = status === 200 ? (options.outputCheck ?? null) : null;
      if (check === null) deliverNow();
      else check(answer).then(deliverNow, (error: unknown) => finish({ kind: "refused", error: error instanceof Error ? error : new Error(String(error)) }));
    };
    /** The upstream is done, or was stopped: what the client gets. */
    const deliver = (stopped: boolean) => {
      if (delivering) return;
      delivering = true;
      if (stopped && meter.unreadable !== null) {
        const message = `llmgw cannot hold this answer to the output the key's limits reserved (${meter.unreadable}), so it was stopped.`;
        send(failure(message, "output_limit_exceeded"), 502, new Error(message));
        return;
      }
      const answer = assembly.answer(stopped);
      const outcome = assembly.outcome();
      if (stopped) {
        send(answer, 200, new Error(`the upstream went past the ${bound} output tokens reserved; its answer was stopped there`));
        return;
      }
      if (outcome === "none") {
        // No stream at all: one JSON answer (charged what it reports), or nothing usable.
        const whole = Buffer.concat(raw);
        const usage = jsonAnswerUsage(whole);
        if (usage !== undefined) {
          answerUsage = usage;
          send(whole, 200, null);
        } else send(failure("The upstream's answer was neither a stream nor a JSON answer. Retry the request.", "upstream_failed"), 502, null);
        return;
      }
      if (outcome === "unfinished") {
        finish({ kind: "failed-before-first-byte", error: new Error("the upstream's stream ended before [DONE]") });
        return;
      }
      send(answer, assembly.status(), null);
    };
    const onData = (chunk: Buffer) => {
      firstByteAt ??= performance.now();
      rawBytes += chunk.length;
      if (rawBytes > maxHeld) meter.cannotRead(`it sent more than ${maxHeld} bytes`);
      else if (assembly.outcome() === "none") raw.push(chunk);
      if (!meter.exceeded) assembly.push(meter.push(chunk));
      if (!meter.exceeded) return;
      body.destroy();
      options.onUpstreamEnd?.();
      deliver(true);
    };
    const onEnd = () => {
      options.onUpstreamEnd?.();
      assembly.push(meter.end());
      // One JSON answer (no stream at all) came whole: it is not stopped, and is charged in full.
      deliver(meter.exceeded && !(assembly.outcome() === "none" && meter.unreadable === null));
    };
    const onError = (error: Error) => {
      if (delivering) return;
      finish({ kind: "failed-before-first-byte", error });
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

/** An error answer in OpenAI's shape (the wire format's rewriter translates it like an upstream's). */
function failure(message: string, code: string): Buffer {
  return Buffer.from(JSON.stringify({ error: { message, type: "server_error", param: null, code } }));
}

/** The usage of a body that is one JSON answer (null when it reports none), or undefined when it is not one. */
function jsonAnswerUsage(whole: Buffer): RelayResult["usage"] | undefined {
  try {
    const parsed: unknown = JSON.parse(whole.toString("utf8"));
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return undefined;
    return readTokenUsage((parsed as { usage?: unknown }).usage);
  } catch {
    return undefined;
  }
}
