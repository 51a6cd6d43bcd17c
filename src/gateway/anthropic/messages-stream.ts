// The streamed answer of /v1/messages: chat-completion chunks (OpenAI SSE, `data:` lines
// ending with `data: [DONE]`) turned into the Messages API's named events as they arrive
// (protocols.md §8):
//   message_start, content_block_start (at the first text), content_block_delta per text
//   piece, content_block_stop, message_delta {stop_reason, stop_sequence, usage},
//   message_stop.
// Token counts: a chat stream gives them only in its last chunk (the gateway always asks
// for it), so message_start carries zeros and message_delta the real input_tokens and
// output_tokens. Anthropic's own message_delta carries input_tokens too, and the SDK's
// stream helper takes them from there, so finalMessage() has the right usage.
// An answer without text has no content block, as the JSON answer has none.
// A stream that ends without [DONE] is not closed here: the relay sees the upstream broke
// and ends it with Anthropic's `event: error`. An error event of the upstream itself
// becomes that same `event: error`.
import { StringDecoder } from "node:string_decoder";
import { sseNamedEvent } from "../../core/http.ts";
import type { BodyRewriter } from "../relay.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";
import type { TokenUsage } from "../../core/token-usage.ts";
import { readTokenUsage } from "../usage-tap.ts";
import { anthropicErrorBody, anthropicErrorType } from "./anthropic-errors.ts";
import { anthropicUsage, newMessageId, stopOutcome, stopsOf, type StopOutcome } from "./messages-answer.ts";

const EVENT_END = /\r?\n\r?\n/;

interface ChatChunk {
  choices?: Array<{ delta?: { content?: unknown }; finish_reason?: unknown; stop_reason?: unknown }>;
  usage?: unknown;
  error?: unknown;
}

export class MessagesStream implements BodyRewriter {
  private readonly decoder = new StringDecoder("utf8");
  private readonly stops: string[];
  private readonly id = newMessageId();
  private pending = "";
  private started = false;
  private blockOpen = false;
  private ended = false;
  private outcome: StopOutcome = { stop_reason: "end_turn", stop_sequence: null };
  private found: TokenUsage | null = null;

  constructor(private readonly request: GatewayRequestBody) {
    this.stops = stopsOf(request);
  }

  push(chunk: Buffer): Buffer {
    return this.translate(this.decoder.write(chunk), false);
  }

  end(): Buffer {
    return this.translate(this.decoder.end(), true);
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  /** Translates every complete event (and, at the end, an unterminated last one). */
  private translate(text: string, last: boolean): Buffer {
    const events = (this.pending + text).split(EVENT_END);
    this.pending = last ? "" : events.pop()!;
    let out = "";
    for (const event of events) out += this.translateEvent(event);
    return out === "" ? EMPTY : Buffer.from(out, "utf8");
  }

  private translateEvent(event: string): string {
    if (this.ended) return "";
    // Only `data:` lines matter; `event:`, `id:` and `:` comment lines of some servers are dropped.
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
    if (data === "") return "";
    if (data === "[DONE]") return this.finish();
    let chunk: ChatChunk;
    try {
      chunk = JSON.parse(data) as ChatChunk;
    } catch {
      return "";
    }
    if (typeof chunk !== "object" || chunk === null) return "";
    if (chunk.error !== undefined) return this.fail(chunk.error);
    let out = this.start();
    const usage = readTokenUsage(chunk.usage);
    if (usage !== null) this.found = usage;
    const choice = chunk.choices?.[0];
    if (choice === undefined) return out;
    const piece = choice.delta?.content;
    if (typeof piece === "string" && piece !== "") {
      if (!this.blockOpen) {
        this.blockOpen = true;
        out += sseNamedEvent("content_block_start", { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } });
      }
      out += sseNamedEvent("content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: piece } });
    }
    if (choice.finish_reason !== null && choice.finish_reason !== undefined) this.outcome = stopOutcome(choice.finish_reason, choice.stop_reason, this.stops);
    return out;
  }

  private start(): string {
    if (this.started) return "";
    this.started = true;
    return sseNamedEvent("message_start", {
      type: "message_start",
      message: {
        id: this.id,
        type: "message",
        role: "assistant",
        model: this.request.model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        // Not known before the last chunk: message_delta has the real counts.
        usage: anthropicUsage(null),
      },
    });
  }

  private finish(): string {
    let out = this.start();
    this.ended = true;
    if (this.blockOpen) out += sseNamedEvent("content_block_stop", { type: "content_block_stop", index: 0 });
    out += sseNamedEvent("message_delta", { type: "message_delta", delta: this.outcome, usage: anthropicUsage(this.found) });
    out += sseNamedEvent("message_stop", { type: "message_stop" });
    return out;
  }

  /** The upstream's own failure event (OpenAI's `{"error": {...}}`), told the Anthropic way. */
  private fail(error: unknown): string {
    this.ended = true;
    const fields = typeof error === "object" && error !== null ? (error as Record<string, unknown>) : {};
    const message =
      typeof fields.message === "string" ? fields.message : typeof error === "string" ? error : "The model server failed in the middle of the answer.";
    const code = typeof fields.code === "string" ? fields.code : null;
    return sseNamedEvent("error", anthropicErrorBody(anthropicErrorType(500, code), message));
  }
}

const EMPTY = Buffer.alloc(0);
