// A stand-in for an OpenAI-compatible server behind an `external` profile (or an engine
// behind a replica): real HTTP on loopback, answering /v1/chat/completions in the wire
// format of protocols.md §4, with knobs for the failures the gateway must handle.
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface FakeUpstreamOptions {
  /** Reply text, sent as one JSON answer or one SSE chunk per word. */
  reply?: string;
  /** Delay between SSE chunks, in ms. */
  chunkDelayMs?: number;
  /** Pad each streamed word to this many characters (a long answer, to fill socket buffers). */
  wordBytes?: number;
  /** Answer every request with this status and an OpenAI error body. */
  failWithStatus?: number;
  /** Required Bearer token, if any. */
  key?: string;
  /** Reset the connection as soon as a request arrives (a crash before the first byte). */
  resetOnRequest?: boolean;
  /** Send 200 and the headers, then reset before any body byte (a crash between the two). */
  resetAfterHeaders?: boolean;
  /** Streams: reset the connection after this many chunks (a crash mid-stream). */
  resetAfterChunks?: number;
  /** Streams: end the response cleanly after the first chunk, without [DONE]: silently, or after an error event of its own (an engine stopping). */
  endStreamEarly?: "silently" | "with-error";
  /** Non-stream answers: send the headers and half the JSON, then reset. */
  resetMidBody?: boolean;
  /** Non-stream answers: wait for this before answering (a busy engine; the test decides when). */
  beforeAnswer?: () => Promise<void>;
  /** Streams: wait for this before sending each chunk after the first (the test decides the pace). */
  beforeNextChunk?: () => Promise<void>;
  /** Report no usage at all: none in a JSON answer, no usage chunk in a stream (an upstream that does not count). */
  omitUsage?: boolean;
  /** Answer with one JSON body even when asked for a stream (some servers ignore `stream`). */
  ignoreStream?: boolean;
}

export interface FakeUpstream {
  url: string;
  port: number;
  /** Bodies of the requests received, parsed. */
  // biome-ignore lint/suspicious/noExplicitAny: tests in src/ and test/ read any field of whatever request body the gateway forwarded (chat, embeddings, or null); a precise type would need edits at every reader.
  requests: Array<{ path: string; authorization: string | undefined; body: any }>;
  /** Resolves with the number of streams whose client went away before the end. */
  cancelledStreams: () => number;
  /** Requests being answered now, and the most there ever were at once. */
  inFlight: () => number;
  maxInFlight: () => number;
  close(): Promise<void>;
}

export async function startFakeUpstream(options: FakeUpstreamOptions = {}): Promise<FakeUpstream> {
  const requests: FakeUpstream["requests"] = [];
  let cancelled = 0;
  let inFlight = 0;
  let maxInFlight = 0;
  const words = (options.reply ?? "hello from the fake upstream")
    .split(" ")
    .map((word) => (options.wordBytes === undefined ? word : word.padEnd(options.wordBytes, ".")));
  const server = http.createServer((req, res) => {
    if (options.resetOnRequest === true) {
      requests.push({ path: req.url ?? "", authorization: req.headers.authorization, body: null });
      req.socket.destroy();
      return;
    }
    const chunks: Buffer[] = [];
    inFlight += 1;
    maxInFlight = Math.max(maxInFlight, inFlight);
    res.on("close", () => {
      inFlight -= 1;
    });
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : null;
      requests.push({ path: req.url ?? "", authorization: req.headers.authorization, body });
      if (options.resetAfterHeaders === true) {
        res.writeHead(200, { "content-type": body?.stream === true ? "text/event-stream" : "application/json" });
        res.flushHeaders();
        setTimeout(() => req.socket.destroy(), 20);
        return;
      }
      if (options.key !== undefined && req.headers.authorization !== `Bearer ${options.key}`) {
        res
          .writeHead(401, { "content-type": "application/json" })
          .end(JSON.stringify({ error: { message: "bad engine key", type: "authentication_error", param: null, code: null } }));
        return;
      }
      if (options.failWithStatus !== undefined) {
        res
          .writeHead(options.failWithStatus, { "content-type": "application/json" })
          .end(JSON.stringify({ error: { message: "upstream failure", type: "server_error", param: null, code: null } }));
        return;
      }
      if (req.url === "/v1/embeddings") {
        const inputs: unknown[] = Array.isArray(body?.input) ? body.input : [body?.input];
        res.writeHead(200, { "content-type": "application/json", "set-cookie": "upstream-session=1" }).end(
          JSON.stringify({
            object: "list",
            data: inputs.map((_, index) => ({ object: "embedding", index, embedding: [0.25, -0.5, 0.75] })),
            model: body?.model,
            usage: { prompt_tokens: inputs.length * 3, total_tokens: inputs.length * 3 },
          }),
        );
        return;
      }
      const id = "chatcmpl-fake";
      const created = 1764500000;
      const usage = { prompt_tokens: 7, completion_tokens: words.length, total_tokens: 7 + words.length };
      if (body?.stream !== true || options.ignoreStream === true) {
        const answer = JSON.stringify({
          id,
          object: "chat.completion",
          created,
          model: body?.model,
          choices: [{ index: 0, message: { role: "assistant", content: words.join(" ") }, finish_reason: "stop", logprobs: null }],
          ...(options.omitUsage === true ? {} : { usage }),
        });
        const send = () => {
          if (res.destroyed) return;
          if (options.resetMidBody === true) {
            res.writeHead(200, { "content-type": "application/json", "content-length": String(Buffer.byteLength(answer)) });
            res.write(answer.slice(0, Math.floor(answer.length / 2)), () => setTimeout(() => req.socket.destroy(), 20));
            return;
          }
          res.writeHead(200, { "content-type": "application/json" }).end(answer);
        };
        if (options.beforeAnswer === undefined) send();
        else void options.beforeAnswer().then(send);
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      let index = 0;
      let finished = false;
      res.on("close", () => {
        if (!finished) cancelled += 1;
      });
      const includeUsage = body?.stream_options?.include_usage === true && options.omitUsage !== true;
      const send = () => {
        if (res.destroyed) return;
        if (options.resetAfterChunks !== undefined && index === options.resetAfterChunks) {
          req.socket.destroy();
          return;
        }
        if (options.endStreamEarly !== undefined && index === 1) {
          finished = true;
          if (options.endStreamEarly === "silently") res.end();
          else
            res.end(
              `data: ${JSON.stringify({ error: { message: "The engine is shutting down.", type: "server_error", param: null, code: "engine_stopping" } })}\n\n`,
            );
          return;
        }
        if (index < words.length) {
          const delta = index === 0 ? { role: "assistant", content: words[index] } : { content: ` ${words[index]}` };
          const flowing = res.write(
            `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: body.model, choices: [{ index: 0, delta, finish_reason: null }], ...(includeUsage ? { usage: null } : {}) })}\n\n`,
          );
          index += 1;
          // Like an engine, it waits for a reader that falls behind instead of piling up chunks.
          if (!flowing) res.once("drain", send);
          else if (options.beforeNextChunk !== undefined) void options.beforeNextChunk().then(send);
          else setTimeout(send, options.chunkDelayMs ?? 0);
          return;
        }
        res.write(
          `data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: body.model, choices: [{ index: 0, delta: {}, finish_reason: "stop" }], ...(includeUsage ? { usage: null } : {}) })}\n\n`,
        );
        if (includeUsage) res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: body.model, choices: [], usage })}\n\n`);
        res.write("data: [DONE]\n\n");
        finished = true;
        res.end();
      };
      send();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    cancelledStreams: () => cancelled,
    inFlight: () => inFlight,
    maxInFlight: () => maxInFlight,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Fake upstreams a test file starts as it goes, closed together at its end. */
export function fakeUpstreams(): { start(options?: FakeUpstreamOptions): Promise<FakeUpstream>; closeAll(): Promise<void> } {
  const started: FakeUpstream[] = [];
  return {
    start: async (options = {}) => {
      const upstream = await startFakeUpstream(options);
      started.push(upstream);
      return upstream;
    },
    closeAll: async () => {
      await Promise.all(started.splice(0).map((upstream) => upstream.close()));
    },
  };
}
