// A stand-in for an OpenAI-compatible server behind an `external` profile that answers
// every chat completion with one JSON body whatever the request says: a server that does
// not stream answers `stream: true` with a plain completion, and its usage is its own
// word, which may be nonsense (a negative count). Real HTTP on loopback.
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface JsonOnlyUpstream {
  url: string;
  /** Bodies of the requests received, parsed. */
  requests: unknown[];
  close(): Promise<void>;
}

export async function startJsonOnlyUpstream(options: { reply: string; usage: Record<string, unknown> }): Promise<JsonOnlyUpstream> {
  const requests: unknown[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { model?: unknown };
      requests.push(body);
      const answer = {
        id: "chatcmpl-json-only",
        object: "chat.completion",
        created: 1764500000,
        model: body.model,
        choices: [{ index: 0, message: { role: "assistant", content: options.reply }, finish_reason: "stop", logprobs: null }],
        usage: options.usage,
      };
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(answer));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
