// One JSON answer made of an upstream's event stream: how the gateway holds a non-stream
// request to its output bound when the upstream is not trusted to keep to max_tokens (an
// `external` profile). The gateway asks such an upstream for a stream, counts it as it
// comes (output-meter.ts), and stops it at the bound; this module builds from the events
// the `chat.completion` (or `text_completion`) the client asked for, as the upstream would
// have answered it: the text of each choice joined, tool calls merged by their index,
// log probabilities joined, the last finish reason, the usage chunk's counts. An answer
// stopped at the bound ends with `finish_reason: "length"`, as one that kept to max_tokens.
// An upstream's error event, or a stream that ends before `[DONE]`, becomes an error answer.
import type { TokenUsage } from "../core/token-usage.ts";
import { eventEnd } from "./output-meter.ts";
import { readTokenUsage } from "./usage-tap.ts";

/** Tool calls kept per choice: more is no answer a client can use, and each costs memory. */
const MAX_TOOL_CALLS = 128;

interface ToolCallParts {
  id?: string;
  type?: string;
  name: string;
  arguments: string;
}

interface ChoiceParts {
  index: number;
  role: string;
  content: string | null;
  reasoning: string | null;
  refusal: string | null;
  text: string;
  toolCalls: Map<number, ToolCallParts>;
  /** Chat: the tokens' log probabilities (`logprobs.content`), joined. */
  logprobs: unknown[] | null;
  /** Completions: the arrays of `logprobs` (tokens, token_logprobs, top_logprobs, text_offset), joined. */
  textLogprobs: Record<string, unknown[]> | null;
  finishReason: string | null;
}

export class StreamAssembly {
  /** The start of an event whose end has not come (events end where the meter's do: output-meter.ts eventEnd). */
  private pending: Buffer = Buffer.alloc(0);
  private id: unknown;
  private created: unknown;
  private model: unknown;
  private systemFingerprint: unknown;
  private readonly choices = new Map<number, ChoiceParts>();
  private found: TokenUsage | null = null;
  private upstreamError: unknown = null;
  private done = false;
  private events = 0;

  /** `completions`: the client asked /v1/completions (text choices), else a chat completion. */
  constructor(private readonly completions: boolean) {}

  /** Takes the next bytes of the stream (whole events are read at once, the rest waits). */
  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    const data = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    let start = 0;
    for (;;) {
      const end = eventEnd(data, start, start);
      if (end === -1) break;
      this.readEvent(data.toString("utf8", start, end));
      start = end;
    }
    this.pending = data.subarray(start);
  }

  /** The usage chunk's counts, once it came. */
  usage(): TokenUsage | null {
    return this.found;
  }

  /**
   * How the stream went: `done` ([DONE] came), `error` (an error event), `unfinished` (it
   * ended before either), or `none` (no data event at all: not a stream).
   */
  outcome(): "done" | "error" | "unfinished" | "none" {
    if (this.upstreamError !== null) return "error";
    if (this.done) return "done";
    return this.events === 0 ? "none" : "unfinished";
  }

  /** The HTTP status of the answer: 200, or 502 when the upstream failed in its stream. */
  status(): number {
    return this.upstreamError !== null || !this.done ? 502 : 200;
  }

  /**
   * The whole answer as JSON. `stopped`: the gateway stopped the stream at the output bound,
   * so every choice still open ends with `length`, and the stream's end is not awaited.
   */
  answer(stopped: boolean): Buffer {
    const rest = this.pending.toString("utf8");
    this.pending = Buffer.alloc(0);
    if (rest.trim() !== "") this.readEvent(rest);
    if (stopped) this.done = true;
    if (this.upstreamError !== null) return Buffer.from(JSON.stringify({ error: this.upstreamError }));
    if (!this.done) {
      return Buffer.from(
        JSON.stringify({
          error: {
            message: "The upstream's stream ended before it finished, so the answer is incomplete. Retry the request.",
            type: "server_error",
            param: null,
            code: "upstream_failed",
          },
        }),
      );
    }
    // A stream stopped before its first choice still answers one, empty and ended at the bound.
    if (stopped && this.choices.size === 0) this.readChoice({ index: 0 });
    const choices = [...this.choices.values()].sort((a, b) => a.index - b.index).map((choice) => this.choiceJson(choice, stopped));
    const answer: Record<string, unknown> = {
      id: this.id ?? "llmgw-assembled",
      object: this.completions ? "text_completion" : "chat.completion",
      created: this.created ?? Math.floor(Date.now() / 1000),
      model: this.model ?? null,
      choices,
      ...(this.systemFingerprint === undefined ? {} : { system_fingerprint: this.systemFingerprint }),
      ...(this.found === null ? {} : { usage: { ...this.found, total_tokens: this.found.prompt_tokens + this.found.completion_tokens } }),
    };
    return Buffer.from(JSON.stringify(answer));
  }

  private readEvent(event: string): void {
    let data: string | null = null;
    for (const line of event.split(/\r\n|\n|\r/)) {
      if (!line.startsWith("data:")) continue;
      const value = line.slice(line[5] === " " ? 6 : 5);
      data = data === null ? value : `${data}\n${value}`;
    }
    if (data === null) return;
    this.events += 1;
    if (data.trim() === "[DONE]") {
      this.done = true;
      return;
    }
    let chunk: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(data);
      if (typeof parsed !== "object" || parsed === null) return;
      chunk = parsed as Record<string, unknown>;
    } catch {
      return;
    }
    if (chunk.error !== undefined) {
      this.upstreamError = chunk.error;
      return;
    }
    this.id ??= chunk.id;
    this.created ??= chunk.created;
    this.model ??= chunk.model;
    if (chunk.system_fingerprint !== undefined && chunk.system_fingerprint !== null) this.systemFingerprint = chunk.system_fingerprint;
    const usage = readTokenUsage(chunk.usage);
    if (usage !== null) this.found = usage;
    if (Array.isArray(chunk.choices)) for (const choice of chunk.choices) this.readChoice(choice);
  }

  private readChoice(value: unknown): void {
    if (typeof value !== "object" || value === null) return;
    const choice = value as Record<string, unknown>;
    const index = typeof choice.index === "number" ? choice.index : 0;
    // Requests ask for one choice (n is 1): another index is no part of the answer.
    if (index !== 0) return;
    let parts = this.choices.get(index);
    if (parts === undefined) {
      parts = {
        index,
        role: "assistant",
        content: null,
        reasoning: null,
        refusal: null,
        text: "",
        toolCalls: new Map(),
        logprobs: null,
        textLogprobs: null,
        finishReason: null,
      };
      this.choices.set(index, parts);
    }
    if (typeof choice.finish_reason === "string") parts.finishReason = choice.finish_reason;
    if (typeof choice.text === "string") parts.text += choice.text;
    this.readLogprobs(parts, choice.logprobs);
    const delta = choice.delta;
    if (typeof delta !== "object" || delta === null) return;
    const { role, content, reasoning_content, reasoning, refusal, tool_calls } = delta as Record<string, unknown>;
    if (typeof role === "string") parts.role = role;
    if (typeof content === "string") parts.content = (parts.content ?? "") + content;
    const thought = typeof reasoning_content === "string" ? reasoning_content : typeof reasoning === "string" ? reasoning : null;
    if (thought !== null) parts.reasoning = (parts.reasoning ?? "") + thought;
    if (typeof refusal === "string") parts.refusal = (parts.refusal ?? "") + refusal;
    if (Array.isArray(tool_calls)) for (const call of tool_calls) this.readToolCall(parts, call);
  }

  private readToolCall(parts: ChoiceParts, value: unknown): void {
    if (typeof value !== "object" || value === null) return;
    const call = value as { index?: unknown; id?: unknown; type?: unknown; function?: { name?: unknown; arguments?: unknown } };
    const index = typeof call.index === "number" ? call.index : parts.toolCalls.size;
    let merged = parts.toolCalls.get(index);
    if (merged === undefined) {
      if (parts.toolCalls.size >= MAX_TOOL_CALLS) return;
      merged = { name: "", arguments: "" };
      parts.toolCalls.set(index, merged);
    }
    if (typeof call.id === "string") merged.id = call.id;
    if (typeof call.type === "string") merged.type = call.type;
    // The name comes whole (some servers repeat it in every delta): it is set, not joined.
    if (typeof call.function?.name === "string" && call.function.name !== "") merged.name = call.function.name;
    if (typeof call.function?.arguments === "string") merged.arguments += call.function.arguments;
  }

  private readLogprobs(parts: ChoiceParts, value: unknown): void {
    if (typeof value !== "object" || value === null) return;
    const logprobs = value as Record<string, unknown>;
    // Appended in place: copying the list at every event would cost the square of its length.
    if (!this.completions) {
      if (Array.isArray(logprobs.content)) {
        parts.logprobs ??= [];
        for (const entry of logprobs.content) parts.logprobs.push(entry);
      }
      return;
    }
    parts.textLogprobs ??= {};
    for (const [field, list] of Object.entries(logprobs)) {
      if (!Array.isArray(list)) continue;
      const joined = parts.textLogprobs[field] ?? [];
      parts.textLogprobs[field] = joined;
      for (const entry of list) joined.push(entry);
    }
  }

  private choiceJson(parts: ChoiceParts, stopped: boolean): Record<string, unknown> {
    const finish_reason = parts.finishReason ?? (stopped ? "length" : null);
    if (this.completions) return { index: parts.index, text: parts.text, logprobs: parts.textLogprobs, finish_reason };
    // Stopped before any text or tool call: an empty text, as a server that kept to max_tokens answers.
    const content = parts.content ?? (stopped && parts.toolCalls.size === 0 ? "" : null);
    const message: Record<string, unknown> = { role: parts.role, content };
    if (parts.reasoning !== null) message.reasoning_content = parts.reasoning;
    if (parts.refusal !== null) message.refusal = parts.refusal;
    if (parts.toolCalls.size > 0) {
      message.tool_calls = [...parts.toolCalls.entries()]
        .sort(([a], [b]) => a - b)
        .map(([, call]) => ({ id: call.id ?? "", type: call.type ?? "function", function: { name: call.name, arguments: call.arguments } }));
    }
    return { index: parts.index, message, logprobs: parts.logprobs === null ? null : { content: parts.logprobs }, finish_reason };
  }
}
