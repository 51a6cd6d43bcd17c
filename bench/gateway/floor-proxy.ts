// The floor of the gateway benchmark: the least a Node.js gateway can do on the same
// stack as llmgw (node:http in front, one undici Pool behind). It reads the request body
// as raw bytes, forwards it to the upstream with the same path and content type, and
// pipes the answer back. It parses nothing, checks no key, picks no replica and records
// nothing, so the difference between it and llmgw is what llmgw's features cost, and the
// difference between it and the upstream alone is what one Node.js hop costs.
//
// The body is read whole before forwarding, as llmgw (and any gateway that routes on the
// `model` field) must; the answer is streamed back chunk by chunk.
//
// Run alone: `npx tsx bench/gateway/floor-proxy.ts --upstream http://127.0.0.1:PORT
// [--port N]`; it prints `LISTENING http://127.0.0.1:PORT` once it accepts connections.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { pathToFileURL } from "node:url";
import { Pool } from "undici";

/** Response headers that describe one hop, not the message (RFC 9110 §7.6.1). */
const HOP_HEADERS = new Set(["connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"]);

export function startFloor(options: { upstream: string; port?: number; host?: string }): Promise<{ server: http.Server; pool: Pool }> {
  // The same pool settings as llmgw's UpstreamPools, so both hold the same connections.
  const pool = new Pool(options.upstream, { connections: 256, pipelining: 1, keepAliveTimeout: 30_000, headersTimeout: 60_000, bodyTimeout: 60_000 });

  const handle = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      size += chunk.length;
    });
    req.on("end", () => {
      const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size);
      const abort = new AbortController();
      res.once("close", () => {
        if (!res.writableFinished) abort.abort();
      });
      const headers: Record<string, string> = { "content-type": req.headers["content-type"] ?? "application/json", "content-length": String(body.length) };
      if (typeof req.headers.accept === "string") headers.accept = req.headers.accept;
      pool.request({ path: req.url ?? "/", method: (req.method ?? "POST") as "POST", headers, body, signal: abort.signal }).then(
        (upstream) => {
          res.statusCode = upstream.statusCode;
          for (const [name, value] of Object.entries(upstream.headers)) {
            if (value !== undefined && !HOP_HEADERS.has(name)) res.setHeader(name, value);
          }
          upstream.body.on("error", () => res.destroy());
          upstream.body.pipe(res);
        },
        () => {
          if (res.headersSent) {
            res.destroy();
          } else {
            res.writeHead(502, { "content-type": "application/json" });
            res.end('{"error":{"message":"upstream failed","type":"server_error","param":null,"code":"upstream_failed"}}');
          }
        },
      );
    });
  };

  const server = http.createServer({ keepAliveTimeout: 65_000, requestTimeout: 0 }, handle);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => resolve({ server, pool }));
  });
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const argument = (name: string) => {
    const index = process.argv.indexOf(name);
    return index === -1 ? undefined : process.argv[index + 1];
  };
  const upstream = argument("--upstream");
  if (upstream === undefined) {
    process.stderr.write("floor-proxy: --upstream http://HOST:PORT is required (the stub upstream's URL).\n");
    process.exit(2);
  }
  const { server } = await startFloor({ upstream, port: Number(argument("--port") ?? 0) });
  const address = server.address() as AddressInfo;
  process.stdout.write(`LISTENING http://127.0.0.1:${address.port}\n`);
  // Nothing to flush: exit at once (a --cpu-prof profile is still written on exit).
  const stop = () => process.exit(0);
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
