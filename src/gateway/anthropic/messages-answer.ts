// The answer side of /v1/messages when it is not streamed: the upstream's whole
// chat-completion JSON, held back and turned into one Anthropic `message` (protocols.md
// §8), or the upstream's error answer turned into Anthropic's error shape. Holding the
// whole body costs nothing here: a non-streamed completion arrives in one piece when the
// generation is done, and the translation needs all of it (usage comes last).
// A client that asked for a stream of an upstream that answered with one JSON body anyway
// (some servers ignore `stream`) gets the message as the full event sequence: the SDK's
// stream reader accepts nothing else.
import { randomBytes } from "node:crypto";
import { sseNamedEvent } from "../../core/http.ts";
import type { BodyRewriter } from "../relay.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";
import type { TokenUsage } from "../../core/token-usage.ts";
import { readTokenUsage } from "../usage-tap.ts";
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

/**
 * Anthropic's usage: an upstream that gave no counts (an external server) leaves zeros.
 * Prompt caching is Anthropic's own and no engine reports it, so its two counts are null,
 * as Anthropic's API sends them when nothing was cached (the SDKs type them number | null).
 */
export function anthropicUsage(usage: TokenUsage | null) {
  return {
    input_tokens: usage?.prompt_tokens ?? 0,
    output_tokens: usage?.completion_tokens ?? 0,
    cache_creation_input_tokens: null,
    cache_read_input_tokens: null,
  };
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
    usage: anthropicUsage(readTokenUsage((completion as { usage?: unknown }).usage)),
  };
}

const EMPTY = Buffer.alloc(0);

type Message = NonNullable<ReturnType<typeof messageFromChatCompletion>>;

/**
 * A whole message as the events of a stream (protocols.md §8): message_start with the
 * input tokens, the text in one content_block_delta, message_delta with the stop reason
 * and the usage, message_stop. An empty answer has no content block, as in a stream.
 */
export function messageAsEvents(message: Message): string {
  const { content, stop_reason, stop_sequence, usage, ...head } = message;
  let out = sseNamedEvent("message_start", {
    type: "message_start",
    message: { ...head, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 0 } },
  });
  const text = content[0]?.text;
  if (text !== undefined) {
    out += sseNamedEvent("content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } });
    out += sseNamedEvent("content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text } });
    out += sseNamedEvent("content_block_stop", { type: "content_block_stop", index: 0 });
  }
  out += sseNamedEvent("message_delta", { type: "message_delta", delta: { stop_reason, stop_sequence }, usage });
  out += sseNamedEvent("message_stop", { type: "message_stop" });
  return out;
}

/** Rewrites one non-streamed answer (or any error answer) into the Messages API's shape. */
export class MessagesAnswer implements BodyRewriter {
  private readonly chunks: Buffer[] = [];
  private found: TokenUsage | null = null;
  private status: number;
  private readonly asEvents: boolean;

  constructor(
    private readonly request: GatewayRequestBody,
    upstreamStatus: number,
  ) {
    this.status = upstreamStatus;
    // Only a successful answer becomes events; an error keeps its status and JSON body, as Anthropic's do.
    this.asEvents = request.stream === true && upstreamStatus >= 200 && upstreamStatus < 300;
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
      return json(
        anthropicErrorBody(
          "api_error",
          `The model server's answer was not a chat completion, so it cannot be given as a message (it began: ${JSON.stringify(text.slice(0, 120))}). Retry; if it persists, tell an administrator.`,
        ),
      );
    }
    this.found = readTokenUsage((completion as { usage?: unknown }).usage);
    return this.asEvents ? Buffer.from(messageAsEvents(message), "utf8") : json(message);
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  head(): { status: number; contentType: string } {
    // Asked when the first bytes go out, after end(): a 502 for an answer that was no chat completion is JSON.
    const events = this.asEvents && this.status >= 200 && this.status < 300;
    return { status: this.status, contentType: events ? "text/event-stream" : "application/json" };
  }
}

function json(value: unknown): Buffer {
  return Buffer.from(JSON.stringify(value), "utf8");
}
