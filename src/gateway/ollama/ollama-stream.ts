// The streamed answer of /api/chat and /api/generate: chat-completion chunks (OpenAI SSE,
// `data:` lines ending with `data: [DONE]`) turned into Ollama's JSON lines as they arrive:
//   {model, created_at, message: {role: "assistant", content: "<piece>"}, done: false}
//   (/api/generate: `response: "<piece>"`), one line per piece of text;
//   one line with message.tool_calls once the calls are complete (a tool call's arguments
//   come in pieces, and Ollama gives them whole, as an object);
//   the done line on [DONE]: done_reason, the counts of the final usage chunk (the gateway
//   always asks for it) and the durations.
// A stream that ends without [DONE] is not closed here: the relay sees the upstream broke
// and ends the answer with the dialect's `{"error": ...}` line, so the client never sees a
// done line for an answer that was cut. An error event of the upstream itself becomes that
// same line, and nothing after it is translated.
import { eventData, splitEvents } from "../sse-data.ts";
import { StringDecoder } from "node:string_decoder";
import type { TokenUsage } from "../../core/token-usage.ts";
import type { BodyRewriter } from "../relay.ts";
import { readTokenUsage } from "../usage-tap.ts";
import { streamErrorMessage } from "./ollama-errors.ts";
import {
  EMPTY,
  GenerationTiming,
  NDJSON,
  doneLine,
  doneReason,
  linesBytes,
  partLine,
  reasoningOf,
  toOllamaCalls,
  type AnswerRequest,
  type DoneReason,
  type UpstreamCall,
} from "./ollama-lines.ts";

let isoMs = 0;
let isoText = "";
/** The time as an ISO string, made once per millisecond (lines of one chunk share it). */
function isoNow(): string {
  const now = Date.now();
  if (now !== isoMs) {
    isoMs = now;
    isoText = new Date(now).toISOString();
  }
  return isoText;
}

interface CallDelta {
  index?: unknown;
  function?: { name?: unknown; arguments?: unknown };
}

interface ChatChunk {
  choices?: Array<{
    delta?: { content?: unknown; tool_calls?: unknown; reasoning_content?: unknown; reasoning?: unknown };
    finish_reason?: unknown;
  }>;
  usage?: unknown;
  error?: unknown;
}

export class OllamaStream implements BodyRewriter {
  private readonly decoder = new StringDecoder("utf8");
  private readonly timing: GenerationTiming;
  private pending = "";
  private ended = false;
  /** [DONE] came: the done line was written. */
  private done = false;
  private reason: DoneReason = "stop";
  private found: TokenUsage | null = null;
  /** Tool calls being streamed, by their index in the chunks. */
  private readonly calls = new Map<number, UpstreamCall>();
  /** `{"model":…,"created_at":"` of this answer's lines. */
  private linePrefix: string | undefined;

  constructor(private readonly request: AnswerRequest) {
    this.timing = new GenerationTiming(request);
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

  /** The upstream said [DONE] (the relay asks this rather than reading the raw tail). */
  complete(): boolean {
    return this.done;
  }

  head(): { status: number; contentType: string; stream: boolean } {
    return { status: 200, contentType: NDJSON, stream: true };
  }

  /** Translates every complete event (and, at the end, an unterminated last one). */
  private translate(text: string, last: boolean): Buffer {
    const events = splitEvents(this.pending + text);
    this.pending = last ? "" : (events.pop() ?? "");
    const lines: unknown[] = [];
    for (const event of events) this.translateEvent(event, lines);
    return lines.length === 0 ? EMPTY : linesBytes(lines);
  }

  private translateEvent(event: string, lines: unknown[]): void {
    if (this.ended) return;
    const data = eventData(event);
    if (data === "") return;
    if (data === "[DONE]") {
      this.finish(lines);
      return;
    }
    let chunk: ChatChunk;
    try {
      chunk = JSON.parse(data) as ChatChunk;
    } catch {
      return;
    }
    if (typeof chunk !== "object" || chunk === null) return;
    if (chunk.error !== undefined) {
      this.ended = true;
      lines.push({ error: streamErrorMessage(chunk.error) });
      return;
    }
    const usage = readTokenUsage(chunk.usage);
    if (usage !== null) this.found = usage;
    const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : undefined;
    // Whatever an upstream sends (null, a number) must not throw here: see relay.ts's rewrite.
    if (typeof choice !== "object" || choice === null) return;
    const content = typeof choice.delta?.content === "string" ? choice.delta.content : "";
    const thinking = reasoningOf(choice.delta);
    if (content !== "" || thinking !== "") {
      this.timing.output();
      lines.push(thinking === "" ? this.textLine(content) : partLine(this.request, { content, thinking }));
    }
    if (Array.isArray(choice.delta?.tool_calls)) {
      this.timing.output();
      for (const delta of choice.delta.tool_calls as CallDelta[]) this.addCallDelta(delta);
    }
    if (choice.finish_reason !== null && choice.finish_reason !== undefined) {
      this.reason = doneReason(choice.finish_reason);
      this.flushCalls(lines);
    }
  }

  /** A piece of a call: its name comes first, its arguments in pieces. */
  private addCallDelta(delta: CallDelta): void {
    const index = typeof delta?.index === "number" ? delta.index : 0;
    const call = this.calls.get(index) ?? { name: "", arguments: "" };
    if (typeof delta?.function?.name === "string" && call.name === "") call.name = delta.function.name;
    if (typeof delta?.function?.arguments === "string") call.arguments += delta.function.arguments;
    this.calls.set(index, call);
  }

  /**
   * A line of text alone, the same as partLine's, written as text: it is made for every
   * piece of every Ollama stream, and building and serialising its object (with a new
   * date string each time) cost most of what the translation adds (bench/gateway/apis.ts).
   */
  private textLine(content: string): string {
    this.linePrefix ??= `{"model":${JSON.stringify(this.request.model)},"created_at":"`;
    const piece =
      this.request.kind === "chat" ? `"message":{"role":"assistant","content":${JSON.stringify(content)}}` : `"response":${JSON.stringify(content)}`;
    return `${this.linePrefix}${isoNow()}",${piece},"done":false}\n`;
  }

  /** The complete calls as one line (with, as text, any whose arguments are not an object). */
  private flushCalls(lines: unknown[]): void {
    if (this.calls.size === 0) return;
    const ordered = [...this.calls.entries()].sort(([a], [b]) => a - b).map(([, call]) => call);
    this.calls.clear();
    const { calls, text } = toOllamaCalls(ordered);
    lines.push(partLine(this.request, { content: text, toolCalls: calls }));
  }

  private finish(lines: unknown[]): void {
    this.ended = true;
    this.done = true;
    // Calls of an upstream that never said its finish reason.
    this.flushCalls(lines);
    lines.push(doneLine(this.request, { content: "" }, this.reason, this.found, this.timing));
  }
}
