// The answers of Ollama's routes when the upstream gave one JSON body: the chat completion
// of /api/chat and /api/generate (held whole and turned into Ollama's answer, or into its
// lines when the client asked for a stream and the upstream answered whole anyway), the
// embeddings of /api/embed and /api/embeddings, and the upstream's error answers, which
// keep their status and become `{"error": message}`. Holding the whole body costs nothing
// here: a non-streamed answer arrives in one piece when it is done, and the translation
// needs all of it (the usage comes last).
import type { TokenUsage } from "../../core/token-usage.ts";
import type { BodyRewriter } from "../relay.ts";
import { readTokenUsage } from "../usage-tap.ts";
import { upstreamErrorBody } from "./ollama-errors.ts";
import {
  EMPTY,
  GenerationTiming,
  NDJSON,
  doneLine,
  doneReason,
  jsonBytes,
  linesBytes,
  monotonicNanos,
  partLine,
  reasoningOf,
  toOllamaCalls,
  type AnswerPiece,
  type AnswerRequest,
  type NanoClock,
  type UpstreamCall,
} from "./ollama-lines.ts";

interface ChatChoice {
  message?: { content?: unknown; tool_calls?: unknown; reasoning_content?: unknown; reasoning?: unknown };
  finish_reason?: unknown;
}

/** The calls of a chat completion's message, as far as they are well-formed. */
function upstreamCalls(value: unknown): UpstreamCall[] {
  if (!Array.isArray(value)) return [];
  const calls: UpstreamCall[] = [];
  for (const call of value as Array<{ function?: { name?: unknown; arguments?: unknown } }>) {
    const name = call?.function?.name;
    if (typeof name !== "string") continue;
    const args = call.function?.arguments;
    calls.push({ name, arguments: typeof args === "string" ? args : args === undefined || args === null ? "" : JSON.stringify(args) });
  }
  return calls;
}

/** What a whole chat completion says, or null when it is not one. */
export function readCompletion(completion: unknown): { piece: AnswerPiece; finishReason: unknown; usage: TokenUsage | null } | null {
  if (typeof completion !== "object" || completion === null) return null;
  const choices = (completion as { choices?: unknown }).choices;
  if (!Array.isArray(choices) || typeof choices[0] !== "object" || choices[0] === null) return null;
  const choice = choices[0] as ChatChoice;
  const { calls, text } = toOllamaCalls(upstreamCalls(choice.message?.tool_calls));
  const content = (typeof choice.message?.content === "string" ? choice.message.content : "") + text;
  const piece: AnswerPiece = { content, thinking: reasoningOf(choice.message), toolCalls: calls };
  return { piece, finishReason: choice.finish_reason, usage: readTokenUsage((completion as { usage?: unknown }).usage) };
}

/** Rewrites one chat completion given whole (or any error answer) into Ollama's shape. */
export class OllamaAnswer implements BodyRewriter {
  private readonly chunks: Buffer[] = [];
  private readonly timing: GenerationTiming;
  private found: TokenUsage | null = null;
  private status: number;
  private readonly asLines: boolean;

  constructor(
    private readonly request: AnswerRequest,
    upstreamStatus: number,
  ) {
    this.timing = new GenerationTiming(request);
    this.status = upstreamStatus;
    // Only a successful answer becomes lines; an error keeps its status and is one JSON body, as Ollama's are.
    this.asLines = request.stream && isSuccess(upstreamStatus);
  }

  push(chunk: Buffer): Buffer {
    this.timing.output();
    this.chunks.push(chunk);
    return EMPTY;
  }

  end(): Buffer {
    const text = Buffer.concat(this.chunks).toString("utf8");
    this.chunks.length = 0;
    if (!isSuccess(this.status)) return jsonBytes(upstreamErrorBody(this.status, text));
    const read = readCompletion(parseOrNull(text));
    if (read === null) {
      this.status = 502;
      return jsonBytes({
        error: `The model server's answer was not a chat completion, so it cannot be given in Ollama's shape (it began: ${JSON.stringify(text.slice(0, 120))}). Retry; if it persists, tell an administrator.`,
      });
    }
    this.found = read.usage;
    const reason = doneReason(read.finishReason);
    if (!this.asLines) return jsonBytes(doneLine(this.request, read.piece, reason, read.usage, this.timing));
    // The whole answer in one line, then the done line, as a stream of it would end.
    const { content, thinking, toolCalls } = read.piece;
    const lines: unknown[] = [];
    if (content !== "" || (thinking ?? "") !== "" || (toolCalls ?? []).length > 0) lines.push(partLine(this.request, read.piece));
    lines.push(doneLine(this.request, { content: "" }, reason, read.usage, this.timing));
    return linesBytes(lines);
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  head(): { status: number; contentType: string; stream?: boolean } {
    // Asked when the first bytes go out, after end(): a 502 for an answer that was no chat completion is JSON.
    if (this.asLines && isSuccess(this.status)) return { status: this.status, contentType: NDJSON, stream: true };
    return { status: this.status, contentType: "application/json" };
  }
}

export type EmbeddingKind = "embed" | "embeddings";

/**
 * Rewrites an embeddings answer (`{data: [{embedding, index}], usage}`) into /api/embed's
 * `{model, embeddings, ...}` (every input's vector, in the inputs' order) or the legacy
 * /api/embeddings' `{embedding}`. llmgw never asks for base64, so a vector that is not an
 * array of numbers is the upstream's fault (502).
 */
export class OllamaEmbedAnswer implements BodyRewriter {
  private readonly chunks: Buffer[] = [];
  private readonly clock: NanoClock;
  private found: TokenUsage | null = null;
  private status: number;

  constructor(
    private readonly request: { kind: EmbeddingKind; model: string; startedAt: number; clock?: NanoClock },
    upstreamStatus: number,
  ) {
    this.clock = request.clock ?? monotonicNanos;
    this.status = upstreamStatus;
  }

  push(chunk: Buffer): Buffer {
    this.chunks.push(chunk);
    return EMPTY;
  }

  end(): Buffer {
    const text = Buffer.concat(this.chunks).toString("utf8");
    this.chunks.length = 0;
    if (!isSuccess(this.status)) return jsonBytes(upstreamErrorBody(this.status, text));
    const parsed = parseOrNull(text);
    const embeddings = readEmbeddings(parsed);
    if (embeddings === null) {
      this.status = 502;
      return jsonBytes({
        error: `The model server's answer was not a list of embeddings (it began: ${JSON.stringify(text.slice(0, 120))}). Retry; if it persists, tell an administrator.`,
      });
    }
    this.found = readTokenUsage((parsed as { usage?: unknown }).usage);
    if (this.request.kind === "embeddings") return jsonBytes({ embedding: embeddings[0] ?? [] });
    return jsonBytes({
      model: this.request.model,
      embeddings,
      total_duration: Math.max(0, Math.round(this.clock() - this.request.startedAt)),
      load_duration: 0,
      prompt_eval_count: this.found?.prompt_tokens ?? 0,
    });
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  head(): { status: number; contentType: string } {
    return { status: this.status, contentType: "application/json" };
  }
}

/** The vectors of an embeddings answer in index order, or null when it is not one. */
export function readEmbeddings(answer: unknown): number[][] | null {
  if (typeof answer !== "object" || answer === null) return null;
  const data = (answer as { data?: unknown }).data;
  if (!Array.isArray(data)) return null;
  const items: Array<{ index: number; embedding: number[] }> = [];
  for (const [position, item] of (data as unknown[]).entries()) {
    if (typeof item !== "object" || item === null) return null;
    const { embedding, index } = item as { embedding?: unknown; index?: unknown };
    if (!Array.isArray(embedding) || !embedding.every((value) => typeof value === "number")) return null;
    items.push({ index: typeof index === "number" ? index : position, embedding: embedding as number[] });
  }
  return items.sort((a, b) => a.index - b.index).map((item) => item.embedding);
}

function isSuccess(status: number): boolean {
  return status >= 200 && status < 300;
}

function parseOrNull(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
