// The relay of a non-stream request that the gateway ran as a stream upstream, to hold an
// upstream it does not trust to its output bound (gateway.ts decides when; why, in
// output-meter.ts). The stream is counted as it comes (OutputMeter) and put together into
// one JSON answer (StreamAssembly); past the bound the upstream request is closed and the
// answer ends there, with `finish_reason: "length"`, as an upstream that kept to max_tokens
// would have answered. Nothing reaches the client before the whole answer is made: the
// output check (a guard model) reads the assembled answer, as it reads any JSON answer,
// and the wire format's rewriter (the Anthropic translation) turns it into the client's.
// A failure of the upstream before the end is like one before its first byte: nothing was
// sent, so another replica may answer.
import { performance } from "node:perf_hooks";
import { OutputMeter } from "./output-meter.ts";
import { forwardedHeaders, type RelayOptions, type RelayOutcome, type RelayResult } from "./relay.ts";
import { StreamAssembly } from "./stream-assembly.ts";

export function relayAssembled(options: RelayOptions, completions: boolean): Promise<RelayResult> {
  const { res, upstream } = options;
  const body = upstream.body;
  const meter = new OutputMeter(options.outputBound ?? null);
  const encoding = upstream.headers["content-encoding"];
  if (encoding !== undefined && encoding !== "identity") meter.cannotRead(`it came compressed (${String(encoding)})`);
  const assembly = new StreamAssembly(completions);
  let firstByteAt: number | null = null;
  let clientUsage: RelayResult["usage"] = null;

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
      resolve({ outcome, usage: clientUsage ?? assembly.usage() ?? meter.reportedUsage(), firstByteAt, meter, tap: null });
    };
    /** The answer is whole (or stopped at the bound): checked, translated, and sent in one piece. */
    const deliver = (stopped: boolean) => {
      if (delivering) return;
      delivering = true;
      const answer = assembly.answer(stopped);
      const status = assembly.status();
      const send = () => {
        if (settled) return;
        const rewriter = options.rewrite?.({ status, eventStream: false }) ?? null;
        const bytes = rewriter === null ? answer : Buffer.concat([rewriter.push(answer), rewriter.end()]);
        clientUsage = rewriter?.usage() ?? null;
        const head = rewriter?.head?.();
        const headers = forwardedHeaders(upstream.headers, true);
        delete headers["content-encoding"];
        if (options.headers !== undefined) Object.assign(headers, options.headers);
        headers["content-type"] = head?.contentType ?? "application/json";
        res.writeHead(head?.status ?? status, headers);
        res.end(bytes);
        finish(
          stopped
            ? {
                kind: "cut",
                error: new Error(
                  meter.unreadable === null
                    ? `the upstream went past the ${options.outputBound} output tokens reserved; its answer was stopped there`
                    : `the upstream's stream could not be counted (${meter.unreadable}); its answer was stopped`,
                ),
              }
            : { kind: "answered", status: res.statusCode },
        );
      };
      const check = status === 200 ? (options.outputCheck ?? null) : null;
      if (check === null) send();
      else check(answer).then(send, (error: unknown) => finish({ kind: "refused", error: error instanceof Error ? error : new Error(String(error)) }));
    };
    const onData = (chunk: Buffer) => {
      firstByteAt ??= performance.now();
      assembly.push(meter.push(chunk));
      if (!meter.exceeded) return;
      body.destroy();
      options.onUpstreamEnd?.();
      deliver(true);
    };
    const onEnd = () => {
      options.onUpstreamEnd?.();
      assembly.push(meter.end());
      deliver(meter.exceeded);
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
