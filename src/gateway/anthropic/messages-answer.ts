// The answer side of /v1/messages when it is not streamed: the upstream's whole
// chat-completion JSON, held back and turned into one Anthropic `message` (protocols.md
// §8), or the upstream's error answer turned into Anthropic's error shape. Holding the
// whole body costs nothing here: a non-streamed completion arrives in one piece when the
// generation is done, and the translation needs all of it (usage comes last).
import { randomBytes } from "node:crypto";
import type { BodyRewriter } from "../relay.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";
import type { TokenUsage } from "../usage-tap.ts";
import { anthropicErrorBody, upstreamErrorBody } from "./anthropic-errors.ts";

export type StopReason = "end_turn" | "max_tokens" | "stop_sequence";

export interface StopOutcome {
  stop_reason: StopReason;
  stop_sequence: string | null;
}

/** Anthropic's message ids are `msg_` and a random part; the upstream's chatcmpl id is not reused. */
export function newMessageId(): string {
  return `msg_${randomBytes(12).toString("hex")}`;
}

/**
 * finish_reason → stop_reason. `length` is `max_tokens`. A chat completion says `stop`
 * both for the end of a turn and for a stop sequence; which sequence matched is known
 * only when the server says so in the choice's `stop_reason` (vLLM does, and so does
 * llmgw's bundled engine): a string that is one of the request's stop sequences gives
 * `stop_sequence` with that string. Anything else is `end_turn` with no sequence, since
 * naming one would be a guess.
 */
export function stopOutcome(finishReason: unknown, matched: unknown, stops: readonly string[]): StopOutcome {
  if (finishReason === "length") return { stop_reason: "max_tokens", stop_sequence: null };
  if (typeof matched === "string" && stops.includes(matched)) return { stop_reason: "stop_sequence", stop_sequence: matched };
  return { stop_reason: "end_turn", stop_sequence: null };
}

/** The stop sequences of a translated request (`stop` of its chat body). */
export function stopsOf(request: GatewayRequestBody): string[] {
  const stop = request.stop;
  if (typeof stop === "string") return [stop];
  return Array.isArray(stop) ? stop.filter((s): s is string => typeof s === "string") : [];
}

/** Token counts of a chat completion's (or usage chunk's) `usage`, when it has them. */
export function readUsage(value: unknown): TokenUsage | null {
  if (typeof value !== "object" || value === null) return null;
  const { prompt_tokens, completion_tokens } = value as Record<string, unknown>;
  if (typeof prompt_tokens !== "number") return null;
  return { prompt_tokens, completion_tokens: typeof completion_tokens === "number" ? completion_tokens : 0 };
}

/** Anthropic's usage: an upstream that gave no counts (an external server) leaves zeros. */
export function anthropicUsage(usage: TokenUsage | null): { input_tokens: number; output_tokens: number } {
  return { input_tokens: usage?.prompt_tokens ?? 0, output_tokens: usage?.completion_tokens ?? 0 };
}

interface ChatChoice {
  message?: { content?: unknown };
  finish_reason?: unknown;
  stop_reason?: unknown;
}

/** A whole chat completion as an Anthropic message, or null when it is not one. */
export function messageFromChatCompletion(completion: unknown, request: GatewayRequestBody, id = newMessageId()) {
  if (typeof completion !== "object" || completion === null) return null;
  const choices = (completion as { choices?: unknown }).choices;
  if (!Array.isArray(choices) || typeof choices[0] !== "object" || choices[0] === null) return null;
  const choice = choices[0] as ChatChoice;
  const text = typeof choice.message?.content === "string" ? choice.message.content : "";
  return {
    id,
    type: "message" as const,
    role: "assistant" as const,
    // The name the client asked for, as Anthropic echoes it (not the replica's own name).
    model: request.model,
    // An empty answer has no content block, as with Anthropic.
    content: text === "" ? [] : [{ type: "text" as const, text }],
    ...stopOutcome(choice.finish_reason, choice.stop_reason, stopsOf(request)),
    usage: anthropicUsage(readUsage((completion as { usage?: unknown }).usage)),
  };
}

const EMPTY = Buffer.alloc(0);

/** Rewrites one non-streamed answer (or any error answer) into the Messages API's shape. */
export class MessagesAnswer implements BodyRewriter {
  private readonly chunks: Buffer[] = [];
  private found: TokenUsage | null = null;
  private status: number;

  constructor(
    private readonly request: GatewayRequestBody,
    upstreamStatus: number,
  ) {
    this.status = upstreamStatus;
  }

  push(chunk: Buffer): Buffer {
    this.chunks.push(chunk);
    return EMPTY;
  }

  end(): Buffer {
    const text = Buffer.concat(this.chunks).toString("utf8");
    this.chunks.length = 0;
    if (this.status < 200 || this.status >= 300) return json(upstreamErrorBody(this.status, text));
    let completion: unknown = null;
    try {
      completion = JSON.parse(text);
    } catch {
      // Not JSON: refused below.
    }
    const message = messageFromChatCompletion(completion, this.request);
    if (message === null) {
      this.status = 502;
      return json(anthropicErrorBody("api_error", `The model server's answer was not a chat completion, so it cannot be given as a message (it began: ${JSON.stringify(text.slice(0, 120))}). Retry; if it persists, tell an administrator.`));
    }
    this.found = readUsage((completion as { usage?: unknown }).usage);
    return json(message);
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  head(): { status: number; contentType: string } {
    return { status: this.status, contentType: "application/json" };
  }
}

function json(value: unknown): Buffer {
  return Buffer.from(JSON.stringify(value), "utf8");
}
