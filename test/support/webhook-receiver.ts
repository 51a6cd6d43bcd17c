// A stand-in for the receivers notifications go to, on loopback: a Standard Webhooks
// receiver that checks each request's signature with the `standardwebhooks` package (the
// reference implementation, not llmgw's signing code) and a Slack incoming-webhook
// stand-in that answers like Slack ("ok"). Tests script the answers (500s, then 200; a
// 410) and read what arrived.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Webhook } from "standardwebhooks";

export interface ReceivedWebhook {
  id: string;
  timestamp: string;
  /** Whether standardwebhooks accepted the signature with the channel's secret. */
  verified: boolean;
  verifyError: string | null;
  body: { type: string; timestamp: string; data: Record<string, unknown> };
}

export interface Receiver {
  url: string;
  /** Every request, in order of arrival, answered or not. */
  requests: Array<{ headers: http.IncomingHttpHeaders; text: string; status: number }>;
  /** The secret to verify with (set once the channel is created). */
  secret: string | null;
  /** The statuses to answer, one per request; 200 when empty; 0: never answer (a hung receiver). */
  answers: number[];
  webhooks(): ReceivedWebhook[];
  /** Slack: the parsed message bodies. */
  messages(): Array<{ text: string; blocks: Array<{ type: string; text?: { type: string; text: string }; elements?: Array<{ type: string; text: string }> }> }>;
  close(): Promise<void>;
}

export async function startReceiver(path = "/hooks/llmgw"): Promise<Receiver> {
  const receiver: Receiver = {
    url: "",
    requests: [],
    secret: null,
    answers: [],
    webhooks() {
      return this.requests
        .filter((request) => request.status >= 200 && request.status < 300)
        .map((request) => {
          let verified = false;
          let verifyError: string | null = null;
          try {
            if (this.secret === null) throw new Error("no secret given to the test receiver");
            new Webhook(this.secret).verify(request.text, request.headers as Record<string, string>);
            verified = true;
          } catch (error) {
            verifyError = error instanceof Error ? error.message : String(error);
          }
          return {
            id: String(request.headers["webhook-id"]),
            timestamp: String(request.headers["webhook-timestamp"]),
            verified,
            verifyError,
            body: JSON.parse(request.text) as ReceivedWebhook["body"],
          };
        });
    },
    messages() {
      return this.requests.filter((request) => request.status === 200).map((request) => JSON.parse(request.text));
    },
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const status = new URL(req.url ?? "/", "http://receiver").pathname === path && req.method === "POST" ? (receiver.answers.shift() ?? 200) : 404;
      receiver.requests.push({ headers: req.headers, text: Buffer.concat(chunks).toString("utf8"), status });
      if (status === 0) return;
      res.writeHead(status, { "content-type": "text/plain" });
      res.end(status === 200 ? "ok" : `status ${status}`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  receiver.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}${path}`;
  return receiver;
}
