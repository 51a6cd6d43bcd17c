// One attempt to hand one notification to a receiver, and what its answer means. The
// notifier decides what happens next from the outcome alone:
// - any 2xx: delivered.
// - 410 Gone: the receiver says this address is retired (Standard Webhooks, Slack for a
//   removed hook): the channel is disabled rather than retried for a day.
// - anything else (another status, a redirect, a refused or reset connection, no answer
//   within the timeout): tried again later. Redirects are not followed: a signed message
//   goes to the address the operator gave and nowhere else. A connection to a private
//   address is refused by the dispatcher (webhook-address.ts) and is such a failure too.
import { type Dispatcher, request } from "undici";
import { describeError } from "../core/errors.ts";
import { slackBody, webhookBody, type NotifyEvent } from "./messages.ts";
import { signWebhook } from "./webhook-signing.ts";

export interface SendTarget {
  kind: "webhook" | "slack";
  url: string;
  /** webhook: the secret's key bytes. */
  key: Buffer | null;
}

export interface SendOutcome {
  result: "delivered" | "retry" | "gone";
  status: number | null;
  /** Why it was not delivered, in a line; null when it was. */
  error: string | null;
}

export interface SendOptions {
  /** The webhook-id: the same for every attempt of one delivery. */
  messageId: string;
  timeoutMs: number;
  consoleUrl: string;
  now: () => number;
  /** Aborted when the server stops: the attempt ends at once and is tried again later. */
  stopping?: AbortSignal;
  /** What connects to the receiver: the notifier's, which refuses private addresses unless they are allowed. */
  dispatcher?: Dispatcher;
}

export async function sendNotification(target: SendTarget, event: NotifyEvent, options: SendOptions): Promise<SendOutcome> {
  const body = target.kind === "slack" ? slackBody(event, options.consoleUrl) : webhookBody(event);
  const headers: Record<string, string> = { "content-type": "application/json", "user-agent": "llmgw-notify" };
  if (target.kind === "webhook" && target.key !== null) Object.assign(headers, signWebhook(target.key, options.messageId, options.now() / 1000, body));
  try {
    const answer = await request(target.url, {
      ...(options.dispatcher === undefined ? {} : { dispatcher: options.dispatcher }),
      method: "POST",
      headers,
      body,
      headersTimeout: options.timeoutMs,
      bodyTimeout: options.timeoutMs,
      signal:
        options.stopping === undefined ? AbortSignal.timeout(options.timeoutMs) : AbortSignal.any([AbortSignal.timeout(options.timeoutMs), options.stopping]),
    });
    const text = await firstBytes(answer.body, 4096);
    if (answer.statusCode >= 200 && answer.statusCode < 300) return { result: "delivered", status: answer.statusCode, error: null };
    const said = text.trim().slice(0, 200);
    const error = `the receiver answered ${answer.statusCode}${said === "" ? "" : `: ${said}`}`;
    return { result: answer.statusCode === 410 ? "gone" : "retry", status: answer.statusCode, error };
  } catch (failure) {
    if (options.stopping?.aborted === true) return { result: "retry", status: null, error: "the server stopped during the attempt" };
    const timedOut =
      failure instanceof Error && (failure.name === "TimeoutError" || failure.name === "HeadersTimeoutError" || failure.name === "BodyTimeoutError");
    return {
      result: "retry",
      status: null,
      error: timedOut ? `no answer within ${options.timeoutMs / 1000} s` : `could not reach the receiver: ${describeError(failure)}`,
    };
  }
}

/** The start of an answer's body, for the log line; the rest is not read (a receiver may send anything). */
async function firstBytes(body: AsyncIterable<Buffer> & { destroy(): unknown }, limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of body) {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= limit) break;
    }
  } catch {
    // An answer cut short still has its status; the body is only for the log.
  } finally {
    body.destroy();
  }
  return Buffer.concat(chunks).subarray(0, limit).toString("utf8");
}
