// One JSON answer made of an upstream's event stream: how the gateway holds a non-stream
// request to its output bound when the upstream is not trusted to keep to max_tokens (an
// `external` profile). The gateway asks such an upstream for a stream, counts it as it
// comes (output-meter.ts), and stops it at the bound; this module builds from the events
// the `chat.completion` (or `text_completion`) the client asked for, as the upstream would
// have answered it: the text of each choice joined, tool calls merged by their index,
// log probabilities joined, the last finish reason, the usage chunk's counts. An answer
// stopped at the bound ends with `finish_reason: "length"`, as one that kept to max_tokens.
// An upstream's error event, or a stream that ends before `[DONE]`, becomes an error answer.
import { StringDecoder } from "node:string_decoder";
import type { TokenUsage } from "../core/token-usage.ts";
import { readTokenUsage } from "./usage-tap.ts";

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

/** Where an event ends in the text: a blank line (LF LF, CR LF CR LF or CR CR). */
const EVENT_END = /\r\n\r\n|\n\n|\r\r/;

export class StreamAssembly {
  private readonly decoder = new StringDecoder("utf8");
  private pending = "";
  private id: unknown;
  private created: unknown;
  private model: unknown;
  private systemFingerprint: unknown;
  private readonly choices = new Map<number, ChoiceParts>();
  private found: TokenUsage | null = null;
  private upstreamError: unknown = null;
  private done = false;

  /** `completions`: the client asked /v1/completions (text choices), else a chat completion. */
  constructor(private readonly completions: boolean) {}

  /** Takes the next bytes of the stream (whole events are read at once, the rest waits). */
  push(chunk: Buffer): void {
    this.pending += this.decoder.write(chunk);
    for (;;) {
      const match = EVENT_END.exec(this.pending);
      if (match === null) return;
      this.readEvent(this.pending.slice(0, match.index));
      this.pending = this.pending.slice(match.index + match[0].length);
    }
  }

  /** The usage chunk's counts, once it came. */
  usage(): TokenUsage | null {
    return this.found;
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
    const rest = this.pending + this.decoder.end();
    this.pending = "";
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
      merged = { name: "", arguments: "" };
      parts.toolCalls.set(index, merged);
    }
    if (typeof call.id === "string") merged.id = call.id;
    if (typeof call.type === "string") merged.type = call.type;
    if (typeof call.function?.name === "string") merged.name += call.function.name;
    if (typeof call.function?.arguments === "string") merged.arguments += call.function.arguments;
  }

  private readLogprobs(parts: ChoiceParts, value: unknown): void {
    if (typeof value !== "object" || value === null) return;
    const logprobs = value as Record<string, unknown>;
    if (!this.completions) {
      if (Array.isArray(logprobs.content)) parts.logprobs = [...(parts.logprobs ?? []), ...logprobs.content];
      return;
    }
    parts.textLogprobs ??= {};
    for (const [field, list] of Object.entries(logprobs)) if (Array.isArray(list)) parts.textLogprobs[field] = [...(parts.textLogprobs[field] ?? []), ...list];
  }

  private choiceJson(parts: ChoiceParts, stopped: boolean): Record<string, unknown> {
    const finish_reason = parts.finishReason ?? (stopped ? "length" : null);
    if (this.completions) return { index: parts.index, text: parts.text, logprobs: parts.textLogprobs, finish_reason };
    const message: Record<string, unknown> = { role: parts.role, content: parts.content };
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
