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
  /** Answer every request with this status and an OpenAI error body. */
  failWithStatus?: number;
  /** Required Bearer token, if any. */
  key?: string;
  /** Reset the connection as soon as a request arrives (a crash before the first byte). */
  resetOnRequest?: boolean;
}

export interface FakeUpstream {
  url: string;
  port: number;
  /** Bodies of the requests received, parsed. */
  requests: Array<{ path: string; authorization: string | undefined; body: any }>;
  /** Resolves with the number of streams whose client went away before the end. */
  cancelledStreams: () => number;
  close(): Promise<void>;
}

export async function startFakeUpstream(options: FakeUpstreamOptions = {}): Promise<FakeUpstream> {
  const requests: FakeUpstream["requests"] = [];
  let cancelled = 0;
  const words = (options.reply ?? "hello from the fake upstream").split(" ");
  const server = http.createServer((req, res) => {
    if (options.resetOnRequest === true) {
      requests.push({ path: req.url ?? "", authorization: req.headers.authorization, body: null });
      req.socket.destroy();
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : null;
      requests.push({ path: req.url ?? "", authorization: req.headers.authorization, body });
      if (options.key !== undefined && req.headers.authorization !== `Bearer ${options.key}`) {
        res.writeHead(401, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "bad engine key", type: "authentication_error", param: null, code: null } }));
        return;
      }
      if (options.failWithStatus !== undefined) {
        res.writeHead(options.failWithStatus, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "upstream failure", type: "server_error", param: null, code: null } }));
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
      if (body?.stream !== true) {
        res.writeHead(200, { "content-type": "application/json" }).end(
          JSON.stringify({ id, object: "chat.completion", created, model: body?.model, choices: [{ index: 0, message: { role: "assistant", content: words.join(" ") }, finish_reason: "stop", logprobs: null }], usage }),
        );
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
      let index = 0;
      let finished = false;
      res.on("close", () => {
        if (!finished) cancelled += 1;
      });
      const includeUsage = body?.stream_options?.include_usage === true;
      const send = () => {
        if (res.destroyed) return;
        if (index < words.length) {
          const delta = index === 0 ? { role: "assistant", content: words[index] } : { content: ` ${words[index]}` };
          res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: body.model, choices: [{ index: 0, delta, finish_reason: null }], ...(includeUsage ? { usage: null } : {}) })}\n\n`);
          index += 1;
          setTimeout(send, options.chunkDelayMs ?? 0);
          return;
        }
        res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: body.model, choices: [{ index: 0, delta: {}, finish_reason: "stop" }], ...(includeUsage ? { usage: null } : {}) })}\n\n`);
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
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
