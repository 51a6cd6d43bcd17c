// The pieces of Ollama's generation answers that the JSON answer (ollama-answer.ts) and the
// stream (ollama-stream.ts) share: the lines, the done line's counts and durations, and
// the reading of a chat completion's tool calls and finish reason.
//
// Durations are integers in nanoseconds, as Ollama gives them. llmgw knows when it took
// the request (`startedAt`: the translation, before admission, so the total counts a
// wait in the queue as Ollama's counts one for its own), when the first output arrived
// and when the answer ended; the prompt's share is until the first output, the
// generation's the rest. An answer the upstream gave whole arrives when its generation is
// over, so there nearly all of it is counted as the prompt's. Nothing is loaded per
// request (replicas are started beforehand), so load_duration is 0.
import { performance } from "node:perf_hooks";
import type { TokenUsage } from "../../core/token-usage.ts";
import { ndjsonLine } from "./ollama-errors.ts";

/** Nanoseconds on a monotonic clock. */
export type NanoClock = () => number;

export const monotonicNanos: NanoClock = () => Math.round(performance.now() * 1e6);

export type GenerationKind = "chat" | "generate";

/** What an answer's translation needs to know of its request. */
export interface AnswerRequest {
  kind: GenerationKind;
  /** The model name the client asked for, which every line echoes. */
  model: string;
  /** Whether the client asked for a stream of lines. */
  stream: boolean;
  /** When llmgw took the request, on `clock`. */
  startedAt: number;
  clock?: NanoClock;
}

export interface OllamaToolCall {
  function: { name: string; arguments: Record<string, unknown> };
}

export type DoneReason = "stop" | "length";

/** Ollama says `length` when the answer hit its token limit, else `stop` (a tool call's end included). */
export function doneReason(finishReason: unknown): DoneReason {
  return finishReason === "length" ? "length" : "stop";
}

/** Measures the prompt's and the generation's shares of one answer. */
export class GenerationTiming {
  private readonly clock: NanoClock;
  private readonly startedAt: number;
  private firstOutputAt: number | null = null;

  constructor(request: Pick<AnswerRequest, "startedAt" | "clock">) {
    this.clock = request.clock ?? monotonicNanos;
    this.startedAt = request.startedAt;
  }

  /** The first output arrived (the first call counts). */
  output(): void {
    if (this.firstOutputAt === null) this.firstOutputAt = this.clock();
  }

  durations(): { total_duration: number; prompt_eval_duration: number; eval_duration: number } {
    const end = this.clock();
    const first = this.firstOutputAt ?? end;
    return {
      total_duration: Math.max(0, Math.round(end - this.startedAt)),
      prompt_eval_duration: Math.max(0, Math.round(first - this.startedAt)),
      eval_duration: Math.max(0, Math.round(end - first)),
    };
  }
}

/** What a piece of the answer carries. */
export interface AnswerPiece {
  content: string;
  thinking?: string;
  toolCalls?: OllamaToolCall[];
}

/** One line (or the JSON answer) before its done fields: `message` for /api/chat, `response` for /api/generate. */
export function pieceFields(kind: GenerationKind, piece: AnswerPiece): Record<string, unknown> {
  const thinking = piece.thinking === undefined || piece.thinking === "" ? {} : { thinking: piece.thinking };
  if (kind === "generate") return { response: piece.content, ...thinking };
  const calls = piece.toolCalls === undefined || piece.toolCalls.length === 0 ? {} : { tool_calls: piece.toolCalls };
  return { message: { role: "assistant", content: piece.content, ...thinking, ...calls } };
}

/** A line that is not the last. */
export function partLine(request: AnswerRequest, piece: AnswerPiece): Record<string, unknown> {
  return { model: request.model, created_at: new Date().toISOString(), ...pieceFields(request.kind, piece), done: false };
}

/** The last line (or the whole JSON answer): the counts, the durations and why it ended. */
export function doneLine(
  request: AnswerRequest,
  piece: AnswerPiece,
  reason: DoneReason,
  usage: TokenUsage | null,
  timing: GenerationTiming,
): Record<string, unknown> {
  const { total_duration, prompt_eval_duration, eval_duration } = timing.durations();
  return {
    model: request.model,
    created_at: new Date().toISOString(),
    ...pieceFields(request.kind, piece),
    done: true,
    done_reason: reason,
    total_duration,
    load_duration: 0,
    // An upstream that gave no counts (some external servers) leaves zeros.
    prompt_eval_count: usage?.prompt_tokens ?? 0,
    prompt_eval_duration,
    eval_count: usage?.completion_tokens ?? 0,
    eval_duration,
  };
}

/** A chat completion's call, arguments as its JSON text. */
export interface UpstreamCall {
  name: string;
  arguments: string;
}

/** The arguments of a call as an object, or null when they are not one. An empty text is no arguments. */
function argumentsObject(text: string): Record<string, unknown> | null {
  if (text.trim() === "") return {};
  try {
    const parsed: unknown = JSON.parse(text);
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/**
 * Upstream calls as Ollama's, whose arguments are an object. A call whose arguments are
 * not a JSON object cannot be one; it is given as text after the content, as Ollama gives
 * a model's tool call its parser could not read, so nothing the model wrote is lost.
 */
export function toOllamaCalls(calls: readonly UpstreamCall[]): { calls: OllamaToolCall[]; text: string } {
  const out: OllamaToolCall[] = [];
  let text = "";
  for (const call of calls) {
    const args = argumentsObject(call.arguments);
    if (args === null) text += JSON.stringify({ name: call.name, arguments: call.arguments });
    else out.push({ function: { name: call.name, arguments: args } });
  }
  return { calls: out, text };
}

/** The reasoning an upstream gave apart (vLLM's and llama-server's reasoning parsers), in either field name. */
export function reasoningOf(fields: { reasoning_content?: unknown; reasoning?: unknown } | undefined): string {
  const value = fields?.reasoning_content ?? fields?.reasoning;
  return typeof value === "string" ? value : "";
}

export function jsonBytes(value: unknown): Buffer {
  return Buffer.from(JSON.stringify(value), "utf8");
}

export function linesBytes(values: readonly unknown[]): Buffer {
  let text = "";
  // A line already written as text (OllamaStream's text lines) is taken as it is.
  for (const value of values) text += typeof value === "string" ? value : ndjsonLine(value);
  return Buffer.from(text, "utf8");
}

export const EMPTY = Buffer.alloc(0);

export const NDJSON = "application/x-ndjson";
