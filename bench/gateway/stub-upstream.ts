// The upstream of the gateway benchmark: a tiny, fast stand-in for an OpenAI-compatible
// engine. It answers every POST with the same chat.completion JSON, or, when the body
// asks for `"stream":true`, with the same 20-chunk SSE stream ending in `data: [DONE]`,
// without delays. It parses no JSON (a substring test finds `stream`), so its own cost
// stays small and equal for every target; the benchmark measures what sits in front.
//
// With `--delay-ms D --slots S` it paces itself like an engine (overload benchmark).
//
// Run alone: `npx tsx bench/gateway/stub-upstream.ts [--port N] [--delay-ms D --slots S]`; it prints
// `LISTENING http://127.0.0.1:PORT` once it accepts connections.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { pathToFileURL } from "node:url";

export const STREAM_CHUNKS = 20;
const CREATED = 1_700_000_000;
const MODEL = "bench";

/** The fixed non-streamed answer, shaped like OpenAI's chat.completion object. */
export const COMPLETION_BODY = Buffer.from(
  JSON.stringify({
    id: "chatcmpl-bench0000000000000000000000",
    object: "chat.completion",
    created: CREATED,
    model: MODEL,
    system_fingerprint: "fp_bench",
    choices: [
      {
        index: 0,
        message: { role: "assistant", content: "Hello! This is a fixed answer from the benchmark's upstream stub, twenty tokens or so long.", refusal: null },
        logprobs: null,
        finish_reason: "stop",
      },
    ],
    usage: { prompt_tokens: 12, completion_tokens: STREAM_CHUNKS, total_tokens: 12 + STREAM_CHUNKS },
  }),
);

/**
 * The fixed stream: the first chunk carries the role, the next ones one word each, the
 * last one the finish reason; each is one `data:` event, then `data: [DONE]`.
 */
export const STREAM_EVENTS: readonly Buffer[] = (() => {
  const events: Buffer[] = [];
  for (let i = 0; i < STREAM_CHUNKS; i += 1) {
    const last = i === STREAM_CHUNKS - 1;
    const delta = i === 0 ? { role: "assistant", content: "" } : last ? {} : { content: `word${i} ` };
    const chunk = {
      id: "chatcmpl-bench0000000000000000000000",
      object: "chat.completion.chunk",
      created: CREATED,
      model: MODEL,
      system_fingerprint: "fp_bench",
      choices: [{ index: 0, delta, logprobs: null, finish_reason: last ? "stop" : null }],
    };
    events.push(Buffer.from(`data: ${JSON.stringify(chunk)}\n\n`));
  }
  return events;
})();
export const STREAM_DONE = Buffer.from("data: [DONE]\n\n");
export const STREAM_BYTES = STREAM_EVENTS.reduce((sum, event) => sum + event.length, 0) + STREAM_DONE.length;

const STREAM_FLAG = /"stream"\s*:\s*true/;

/**
 * An engine's pace, for the overload benchmark: it works on at most `slots` requests at
 * once, each for `delayMs`, and queues the rest itself (as llama-server queues requests
 * beyond its slots), so a client that sends more than that waits longer.
 */
export interface StubPace {
  delayMs: number;
  slots: number;
}

function createHandler(pace: StubPace | undefined): (req: http.IncomingMessage, res: http.ServerResponse) => void {
  if (pace === undefined) return handle;
  let busy = 0;
  const waiting: Array<() => void> = [];
  const finished = () => {
    const next = waiting.shift();
    if (next !== undefined) next();
    else busy -= 1;
  };
  return (req, res) => {
    const work = () =>
      setTimeout(() => {
        finished();
        handle(req, res);
      }, pace.delayMs);
    if (busy < pace.slots) {
      busy += 1;
      work();
    } else waiting.push(work);
  };
}

function handle(req: http.IncomingMessage, res: http.ServerResponse): void {
  const chunks: Buffer[] = [];
  req.on("data", (chunk: Buffer) => chunks.push(chunk));
  req.on("end", () => {
    if (req.method !== "POST") {
      res.writeHead(200, { "content-type": "application/json", "content-length": 2 });
      res.end("{}");
      return;
    }
    const body = chunks.length === 1 ? chunks[0]!.toString("latin1") : Buffer.concat(chunks).toString("latin1");
    if (!STREAM_FLAG.test(body)) {
      res.writeHead(200, { "content-type": "application/json", "content-length": COMPLETION_BODY.length });
      res.end(COMPLETION_BODY);
      return;
    }
    // One write per event, as an engine emits them; chunked transfer encoding, no length.
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    for (const event of STREAM_EVENTS) res.write(event);
    res.end(STREAM_DONE);
  });
}

export function startStub(port = 0, host = "127.0.0.1", pace?: StubPace): Promise<http.Server> {
  const server = http.createServer({ keepAliveTimeout: 65_000, requestTimeout: 0 }, createHandler(pace));
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve(server));
  });
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const argument = (name: string) => {
    const index = process.argv.indexOf(name);
    return index === -1 ? undefined : Number(process.argv[index + 1]);
  };
  const delayMs = argument("--delay-ms");
  const server = await startStub(argument("--port") ?? 0, "127.0.0.1", delayMs === undefined ? undefined : { delayMs, slots: argument("--slots") ?? 1 });
  const address = server.address() as AddressInfo;
  process.stdout.write(`LISTENING http://127.0.0.1:${address.port}\n`);
  // Nothing to flush: exit at once (a --cpu-prof profile is still written on exit).
  const stop = () => process.exit(0);
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
