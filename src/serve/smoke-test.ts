// The smoke test: one short chat request sent straight to a new replica (not through the
// gateway, so it is that replica that answers, with its engine key), asking for a
// one-sentence hello. The reply and the decode speed are what `ctl model serve` prints at
// the end; an empty or failed answer fails the job before traffic relies on the replica.
import { request, type Dispatcher } from "undici";
import { UpstreamError, describeError } from "../core/errors.ts";
import type { JobResult } from "./job-rows.ts";

export const SMOKE_PROMPT = "Say hello in one short sentence.";
/** Enough for a sentence; a small cap keeps the test quick on a CPU. */
const SMOKE_MAX_TOKENS = 32;
const SMOKE_TIMEOUT_MS = 120_000;

export interface SmokeTarget {
  id: string;
  nodeNames: string[];
  endpoint: { origin: string; basePath: string };
  engineKey: string | null;
}

export type SmokeTest = (target: SmokeTarget, modelName: string, signal: AbortSignal) => Promise<JobResult>;

/** Streams the answer, so tokens/s is measured from the first token to the last (the load and prompt are not counted). */
export const smokeTestReplica: SmokeTest = async (target, modelName, signal) => {
  const url = `${target.endpoint.origin}${target.endpoint.basePath}/v1/chat/completions`;
  const started = performance.now();
  let response: Dispatcher.ResponseData;
  try {
    response = await request(url, {
      method: "POST",
      headers: { "content-type": "application/json", ...(target.engineKey === null ? {} : { authorization: `Bearer ${target.engineKey}` }) },
      body: JSON.stringify({
        model: modelName,
        messages: [{ role: "user", content: SMOKE_PROMPT }],
        max_tokens: SMOKE_MAX_TOKENS,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      }),
      signal: AbortSignal.any([signal, AbortSignal.timeout(SMOKE_TIMEOUT_MS)]),
      headersTimeout: SMOKE_TIMEOUT_MS,
      bodyTimeout: SMOKE_TIMEOUT_MS,
    });
  } catch (error) {
    signal.throwIfAborted();
    throw new UpstreamError(`The smoke test could not reach replica ${target.id}: ${describeError(error)}.`, { cause: error });
  }
  if (response.statusCode !== 200) {
    const text = (await response.body.text()).slice(0, 300);
    throw new UpstreamError(`Replica ${target.id} answered the smoke test with HTTP ${response.statusCode}: ${text}`);
  }
  let reply = "";
  let pieces = 0;
  let completionTokens: number | null = null;
  let firstAt: number | null = null;
  let lastAt = started;
  let buffered = "";
  for await (const chunk of response.body) {
    buffered += (chunk as Buffer).toString("utf8");
    for (let end = buffered.indexOf("\n\n"); end >= 0; end = buffered.indexOf("\n\n")) {
      const event = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") continue;
        const parsed = JSON.parse(data) as {
          choices?: Array<{ delta?: { content?: string } }>;
          usage?: { completion_tokens?: number } | null;
          error?: { message?: string };
        };
        if (parsed.error !== undefined) throw new UpstreamError(`Replica ${target.id} failed the smoke test: ${parsed.error.message ?? "an error event"}.`);
        const text = parsed.choices?.[0]?.delta?.content ?? "";
        if (text !== "") {
          firstAt ??= performance.now();
          lastAt = performance.now();
          reply += text;
          pieces += 1;
        }
        if (parsed.usage?.completion_tokens !== undefined) completionTokens = parsed.usage.completion_tokens;
      }
    }
  }
  const tokens = completionTokens ?? pieces;
  if (reply.trim() === "" || tokens === 0) throw new UpstreamError(`Replica ${target.id} answered the smoke test with no text.`);
  // Decode speed: the tokens after the first over the time they took. One token alone has no interval; count it over the whole answer.
  const decodeSeconds = firstAt !== null && tokens > 1 && lastAt > firstAt ? (lastAt - firstAt) / 1000 : (lastAt - started) / 1000;
  const perSecond = decodeSeconds > 0 ? (tokens > 1 && firstAt !== null && lastAt > firstAt ? tokens - 1 : tokens) / decodeSeconds : 0;
  return {
    reply: reply.trim(),
    tokens_per_second: Math.round(perSecond * 10) / 10,
    completion_tokens: tokens,
    replica: target.id,
    node: target.nodeNames.join(","),
  };
};
