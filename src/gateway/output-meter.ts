// Counts what an upstream generates, as its answer passes, so the gateway does not have to
// take the upstream's word for it. Two jobs:
// - The output bound. A request whose limits reserved a bounded output (a budget or a
//   tokens-per-minute limit: LimitsPermit.maxOutputTokens) tells the upstream that bound as
//   max_tokens, but an external server may ignore it. On a stream the meter counts output
//   tokens event by event and says when the upstream has gone past the bound; the relay
//   then cuts the stream there (output_limit_exceeded), so no event past the bound reaches
//   the client and the upstream is told to stop.
// - The estimate. An answer whose upstream reported no usage still generated something: its
//   usage row and its charge get an estimate rather than nothing (estimatedUsage).
//
// How tokens are counted, and why in two directions:
// - To cut, a lower bound: every data event that carries text (content, reasoning, a tool
//   call's name or arguments, a completion's text) came from at least one token, and an
//   upstream's own usage count, when an event carries one, counts too. Cutting on that never
//   cuts an honest answer (one that kept to max_tokens sends at most that many such events).
// - To estimate, an upper bound: every token of every tokenizer llmgw serves covers at least
//   one byte of text (policy/token-bound.ts argues it), so the UTF-8 bytes of the generated
//   text bound its tokens. A budget is a hard limit, so an unknown count is charged at most
//   what it can have been, never less.
import type { TokenUsage } from "../core/token-usage.ts";
import { readTokenUsage } from "./usage-tap.ts";

const EMPTY = Buffer.alloc(0);
/** A JSON answer is kept whole to estimate its text up to this size; past it, its bytes are the estimate. */
const MAX_KEPT_JSON_BYTES = 8 * 1024 * 1024;

export interface OutputMeterOptions {
  /** Whether the answer is an event stream (else one JSON document). */
  stream: boolean;
  /** The most output tokens the request reserved; null: no bound to hold (the meter only estimates). */
  bound: number | null;
}

export class OutputMeter {
  /** Text-bearing events so far (a lower bound of the tokens generated). */
  private textEvents = 0;
  /** UTF-8 bytes of the generated text relayed so far (an upper bound of its tokens). */
  private textBytes = 0;
  /** The usage the upstream reported in an event, if it did. */
  private reported: TokenUsage | null = null;
  /** An event cut by a chunk boundary, waiting for its rest. */
  private pending: Buffer = EMPTY;
  /** A JSON answer, kept to read its text at the end. */
  private kept: Buffer[] = [];
  private keptBytes = 0;
  private totalBytes = 0;
  private over = false;

  constructor(private readonly options: OutputMeterOptions) {}

  /** Whether the upstream has gone past the bound: nothing more of its answer may pass. */
  get exceeded(): boolean {
    return this.over;
  }

  /** The output tokens counted so far (the larger of text events and the upstream's own count). */
  countedOutput(): number {
    return Math.max(this.textEvents, this.reported?.completion_tokens ?? 0);
  }

  /**
   * Takes the next bytes of the answer; returns those that may pass now. A stream's events
   * pass once whole (a part of one waits for its rest, so a cut never leaves half an event
   * at the client); once the bound is passed, the event that passed it and everything after
   * stay behind. A JSON answer passes as it comes.
   */
  push(chunk: Buffer): Buffer {
    this.totalBytes += chunk.length;
    if (!this.options.stream) {
      if (this.keptBytes + chunk.length <= MAX_KEPT_JSON_BYTES) this.kept.push(chunk);
      this.keptBytes += chunk.length;
      return chunk;
    }
    if (this.over) return EMPTY;
    const data = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    let passed = 0;
    let start = 0;
    while (start < data.length) {
      const end = eventEnd(data, start);
      if (end === -1) break;
      this.countEvent(data.subarray(start, end));
      if (this.passedBound()) {
        this.over = true;
        this.pending = EMPTY;
        return data.subarray(0, passed);
      }
      passed = end;
      start = end;
    }
    this.pending = passed === data.length ? EMPTY : data.subarray(passed);
    return passed === data.length ? data : data.subarray(0, passed);
  }

  /** The upstream ended: what was held of an unterminated last event (counted, and passed unless it passes the bound). */
  end(): Buffer {
    if (!this.options.stream || this.over || this.pending.length === 0) return EMPTY;
    const rest = this.pending;
    this.pending = EMPTY;
    this.countEvent(rest);
    if (this.passedBound()) {
      this.over = true;
      return EMPTY;
    }
    return rest;
  }

  /** The usage an event of the stream reported (a cut stream's last word may be in the event that was held back). */
  reportedUsage(): TokenUsage | null {
    return this.reported;
  }

  /**
   * The usage to record when the upstream reported none: the prompt's bound (what the
   * request's bytes allow, from token-bound.ts) and the generated text's bytes. A JSON
   * answer too large to keep, or not readable as one (cut mid-way), counts all its bytes,
   * but no more than the output bound: its text is unknown, and an answer cut short says
   * nothing of an upstream going past max_tokens.
   */
  estimatedUsage(promptBound: number): TokenUsage {
    if (this.options.stream) return { prompt_tokens: promptBound, completion_tokens: this.textBytes };
    const text = this.keptBytes <= MAX_KEPT_JSON_BYTES ? jsonAnswerTextBytes(Buffer.concat(this.kept)) : null;
    return { prompt_tokens: promptBound, completion_tokens: text ?? Math.min(this.totalBytes, this.options.bound ?? this.totalBytes) };
  }

  private passedBound(): boolean {
    const bound = this.options.bound;
    return bound !== null && this.countedOutput() > bound;
  }

  /** One event: its text (if any) counts one token and its bytes; its usage, if any, is kept. */
  private countEvent(event: Buffer): void {
    const payload = dataOf(event);
    if (payload === null || payload === "[DONE]") return;
    let parsed: unknown;
    try {
      parsed = JSON.parse(payload);
    } catch {
      return;
    }
    if (typeof parsed !== "object" || parsed === null) return;
    const chunk = parsed as { usage?: unknown; choices?: unknown };
    const usage = readTokenUsage(chunk.usage);
    if (usage !== null) this.reported = usage;
    if (!Array.isArray(chunk.choices)) return;
    let bytes = 0;
    for (const choice of chunk.choices) bytes += choiceTextBytes(choice, "delta");
    if (bytes === 0) return;
    this.textEvents += 1;
    this.textBytes += bytes;
  }
}

/** Where the event starting at `start` ends (after its blank line), or -1 when it is not whole yet. */
function eventEnd(data: Buffer, start: number): number {
  const lf = data.indexOf("\n\n", start);
  const crlf = data.indexOf("\r\n\r\n", start);
  if (lf === -1 && crlf === -1) return -1;
  if (crlf === -1 || (lf !== -1 && lf < crlf)) return lf + 2;
  return crlf + 4;
}

/** The data of one event (its `data:` lines joined), or null when it has none. */
function dataOf(event: Buffer): string | null {
  const text = event.toString("utf8");
  let data: string | null = null;
  for (const line of text.split(/\r?\n/)) {
    if (!line.startsWith("data:")) continue;
    const value = line.slice(line[5] === " " ? 6 : 5);
    data = data === null ? value : `${data}\n${value}`;
  }
  return data;
}

/** The bytes of generated text in one choice: its message (a JSON answer) or delta (a stream event), or a completion's text. */
function choiceTextBytes(choice: unknown, field: "delta" | "message"): number {
  if (typeof choice !== "object" || choice === null) return 0;
  const { text } = choice as { text?: unknown };
  const part = (choice as Record<string, unknown>)[field];
  let bytes = textBytes(text);
  if (typeof part !== "object" || part === null) return bytes;
  const { content, reasoning_content, reasoning, tool_calls } = part as Record<string, unknown>;
  bytes += textBytes(content) + textBytes(reasoning_content) + textBytes(reasoning);
  if (Array.isArray(tool_calls)) {
    for (const call of tool_calls) {
      const fn = (call as { function?: { name?: unknown; arguments?: unknown } } | null)?.function;
      bytes += textBytes(fn?.name) + textBytes(fn?.arguments);
    }
  }
  return bytes;
}

/** A string's UTF-8 bytes; content given as parts (an array) counts as its JSON. */
function textBytes(value: unknown): number {
  if (typeof value === "string") return Buffer.byteLength(value, "utf8");
  if (Array.isArray(value)) return Buffer.byteLength(JSON.stringify(value), "utf8");
  return 0;
}

/** The generated text's bytes in a whole JSON answer (chat or text completion), or null when it is not one. */
function jsonAnswerTextBytes(answer: Buffer): number | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(answer.toString("utf8"));
  } catch {
    return null;
  }
  const choices = (parsed as { choices?: unknown } | null)?.choices;
  if (!Array.isArray(choices)) return null;
  let bytes = 0;
  for (const choice of choices) bytes += choiceTextBytes(choice, "message");
  return bytes;
}
