// Counts what an upstream generates, as its answer passes, so the gateway does not have to
// take the upstream's word for it. Two jobs:
// - The output bound. A request whose limits reserved a bounded output (a budget or a
//   tokens-per-minute limit: LimitsPermit.maxOutputTokens) tells the upstream that bound as
//   max_tokens, but an external server may ignore it. On a stream the meter counts output
//   tokens event by event and says when the upstream has gone past the bound; the relay
//   then cuts the stream there (output_limit_exceeded), so no event past the bound reaches
//   the client and the upstream is told to stop. A stream the meter cannot read (no event
//   ends within MAX_PENDING_BYTES, or a compressed body) cannot be held to a bound: with one,
//   it is cut at once; without one, it passes unmetered.
// - The estimate. An answer whose upstream reported no usage still generated something: its
//   usage row and its charge get an estimate rather than nothing (estimatedStreamOutput,
//   estimatedJsonOutput).
//
// How tokens are counted, and why in two directions:
// - To cut, a lower bound. Every data event that carries text (content, reasoning, a
//   refusal, a tool call's name or arguments, a completion's text) came from at least one
//   token, and from at least its bytes / MAX_TOKEN_BYTES; an upstream's own usage count,
//   when an event carries one, counts too. Cutting on that never cuts an honest answer.
// - To estimate, an upper bound: every token of every tokenizer llmgw serves covers at least
//   one byte of text (policy/token-bound.ts argues it), so the UTF-8 bytes of the generated
//   text bound its tokens. It is capped at the reserved output unless the answer is provably
//   longer: an honest upstream that reports no usage is not charged past what it was asked
//   for, and one that went past it is charged in full.
import type { TokenUsage } from "../core/token-usage.ts";
import { readTokenUsage } from "./usage-tap.ts";

const EMPTY = Buffer.alloc(0);
/**
 * The most bytes of text one token can stand for. The longest tokens of the vocabularies we
 * know (cl100k's and Llama 3's runs of spaces or punctuation) are 128 bytes; 256 leaves room.
 */
export const MAX_TOKEN_BYTES = 256;
/** An event not ended within this many bytes makes the stream unreadable (a stream that is not SSE, or one that never ends an event). */
const MAX_PENDING_BYTES = 1024 * 1024;

export class OutputMeter {
  /** Tokens counted from the text of the events that passed (a lower bound of the tokens generated). */
  private textTokens = 0;
  /** UTF-8 bytes of the generated text that passed (an upper bound of its tokens). */
  private textBytes = 0;
  /** The usage the upstream reported in an event that passed, if it did. */
  private reported: TokenUsage | null = null;
  /**
   * An event cut by chunk boundaries, waiting for its rest: its chunks, joined only once its
   * end has come (joining at every chunk would copy a long event again and again).
   */
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private over = false;
  private unreadableReason: string | null = null;

  /** `bound`: the most output tokens the request reserved; null: no bound to hold (the meter only estimates). */
  constructor(private readonly bound: number | null) {}

  /** Whether nothing more of the answer may pass: the upstream went past the bound, or the stream cannot be read to hold it. */
  get exceeded(): boolean {
    return this.over;
  }

  /** Why a bounded stream could not be read (its cut says so); null when it was read. */
  get unreadable(): string | null {
    return this.unreadableReason;
  }

  /** The output tokens of what passed (the larger of the text's count and the upstream's own). */
  countedOutput(): number {
    return Math.max(this.textTokens, this.reported?.completion_tokens ?? 0);
  }

  /** The usage the upstream reported in an event that passed, if it did. */
  reportedUsage(): TokenUsage | null {
    return this.reported;
  }

  /**
   * The body cannot be read (it is compressed, or too large to hold): a bounded stream is
   * cut, an unbounded one passes unmetered.
   */
  cannotRead(reason: string): void {
    if (this.bound !== null) this.over = true;
    this.unreadableReason = reason;
  }

  /**
   * Takes the next bytes of the stream; returns those that may pass now. Events pass once
   * whole (a part of one waits for its rest, so a cut never leaves half an event at the
   * client); once the bound is passed, the event that passed it and everything after stay
   * behind.
   */
  push(chunk: Buffer): Buffer {
    if (this.over) return EMPTY;
    if (this.unreadableReason !== null) return chunk;
    let data = chunk;
    if (this.pendingBytes > 0) {
      // Does an event end in this chunk? The last bytes held are enough to tell (a blank
      // line split by the chunk boundary); only then is the held event joined.
      const last = this.pending[this.pending.length - 1]!;
      const probe = Buffer.concat([last.subarray(Math.max(0, last.length - 3)), chunk.subarray(0, Math.min(chunk.length, 4))]);
      if (eventEnd(probe, 0, 0) === -1 && chunk.indexOf(0x0a) === -1 && chunk.indexOf(0x0d) === -1) return this.hold(chunk, EMPTY);
      data = Buffer.concat([...this.pending, chunk]);
      this.pending = [];
      this.pendingBytes = 0;
    }
    let passed = 0;
    for (;;) {
      const end = eventEnd(data, passed, passed);
      if (end === -1) break;
      if (!this.countEvent(data, passed, end)) {
        this.over = true;
        return data.subarray(0, passed);
      }
      passed = end;
    }
    const ready = passed === data.length ? data : data.subarray(0, passed);
    return passed === data.length ? ready : this.hold(data.subarray(passed), ready);
  }

  /** The upstream ended: what was held of an unterminated last event (counted, and passed unless it passes the bound). */
  end(): Buffer {
    if (this.over || this.pendingBytes === 0) return EMPTY;
    const rest = Buffer.concat(this.pending);
    this.pending = [];
    this.pendingBytes = 0;
    if (!this.countEvent(rest, 0, rest.length)) {
      this.over = true;
      return EMPTY;
    }
    return rest;
  }

  /**
   * The output to record when the upstream reported no usage: the bytes of the text that
   * passed, at most the bound (what the upstream was asked for and the meter held it to).
   */
  estimatedOutput(): number {
    return this.bound === null ? this.textBytes : Math.min(this.textBytes, this.bound);
  }

  /**
   * The output to charge a stream that was cut: what passed, by the upstream's count or the
   * meter's, whichever is more, and never more than the bound (nothing past it reached the client).
   */
  chargedWhenCut(reported: number): number {
    const passed = Math.max(reported, this.textTokens);
    return this.bound === null ? passed : Math.min(passed, this.bound);
  }

  /** Keeps the start of an event that has not ended; an event that never ends within MAX_PENDING_BYTES makes the stream unreadable. */
  private hold(part: Buffer, ready: Buffer): Buffer {
    this.pending.push(part);
    this.pendingBytes += part.length;
    if (this.pendingBytes <= MAX_PENDING_BYTES) return ready;
    this.cannotRead(`no event ended within ${MAX_PENDING_BYTES} bytes: the answer is not a server-sent event stream llmgw can count`);
    if (this.over) return ready;
    // No bound: what was held passes, unmetered from now on.
    const held = Buffer.concat([ready, ...this.pending]);
    this.pending = [];
    this.pendingBytes = 0;
    return held;
  }

  /**
   * One event (data[start, end)): false when it would take the output past the bound (it
   * is not counted: it does not pass). Otherwise its text counts its tokens' lower bound and
   * its bytes, and its usage, if any, is kept. The event is read by scanEvent, not parsed: a
   * JSON.parse per event cost more than the rest of the relay (measured: ~100 µs on a
   * 20-event stream, against ~10 µs).
   */
  private countEvent(data: Buffer, start: number, end: number): boolean {
    const scan = scanEvent(data, start, end);
    const usage = scan.usage ? usageOfEvent(data.subarray(start, end)) : null;
    const tokens = scan.textBytes === 0 ? 0 : Math.max(1, Math.ceil(scan.textBytes / MAX_TOKEN_BYTES));
    if (this.bound !== null && Math.max(this.textTokens + tokens, usage?.completion_tokens ?? this.reported?.completion_tokens ?? 0) > this.bound) return false;
    if (usage !== null) this.reported = usage;
    this.textTokens += tokens;
    this.textBytes += scan.textBytes;
    return true;
  }
}

/**
 * The output of a JSON answer whose upstream reported no usage: the bytes of its text (or,
 * when it cannot be read whole, of the answer), capped at the bound unless even at
 * MAX_TOKEN_BYTES a token the answer is longer than the bound: then it is charged in full.
 */
export function estimatedJsonOutput(whole: Buffer | null, answerBytes: number, bound: number | null): number {
  const text = whole === null ? null : jsonAnswerTextBytes(whole);
  const bytes = text ?? answerBytes;
  if (bound === null || Math.ceil(bytes / MAX_TOKEN_BYTES) > bound) return bytes;
  return Math.min(bytes, bound);
}

/**
 * Where the event starting at `start` ends (after its blank line), or -1 when it is not whole
 * yet; `from` is where to look (what was searched before need not be again). A line ends with
 * LF, CR LF or CR (all three are SSE); a blank line is two ends in a row. A CR at the very end
 * of the data waits: an LF may follow.
 */
export function eventEnd(data: Buffer, start: number, from: number): number {
  // Back to the first line end of a run that `from` may have split (a CR LF, or a blank line's start).
  let resume = from;
  while (resume > start && (data[resume - 1] === 0x0a || data[resume - 1] === 0x0d)) resume -= 1;
  let afterLineEnd = false;
  for (let i = resume; i < data.length; i += 1) {
    const c = data[i];
    if (c !== 0x0a && c !== 0x0d) {
      afterLineEnd = false;
      continue;
    }
    let next = i + 1;
    if (c === 0x0d) {
      if (next >= data.length) return -1;
      if (data[next] === 0x0a) next += 1;
    }
    if (afterLineEnd) return next;
    afterLineEnd = true;
    i = next - 1;
  }
  return -1;
}

const TEXT = 1;
const USAGE = 2;
/** The keys whose string values are generated text (a delta's or message's, a completion's, a tool call's). */
const TEXT_KEYS = ["content", "reasoning_content", "reasoning", "refusal", "text", "arguments", "name"].map((key) => Buffer.from(key));
const USAGE_KEY = Buffer.from("usage");

/**
 * What one event carries, read in one pass over its bytes: the raw bytes of the string
 * values of the text keys (their escaped length, which is never less than the text's UTF-8
 * bytes: an upper bound still), and whether it has a `usage` object. A key is a string
 * followed by a colon; a quote inside a string is escaped, so no text of the answer can look
 * like a key. Lines other than data (comments, `event:`) hold no quoted keys in practice.
 */
function scanEvent(data: Buffer, start: number, end: number): { textBytes: number; usage: boolean } {
  let textBytes = 0;
  let usage = false;
  let i = start;
  while (i < end) {
    if (data[i] !== 0x22) {
      i += 1;
      continue;
    }
    const keyStart = i + 1;
    const keyEnd = stringEnd(data, keyStart, end);
    if (keyEnd === -1) break;
    let k = skipBlanks(data, keyEnd + 1, end);
    if (data[k] !== 0x3a /* : */) {
      i = keyEnd + 1;
      continue;
    }
    k = skipBlanks(data, k + 1, end);
    const kind = keyKind(data, keyStart, keyEnd);
    if (kind === USAGE && data[k] === 0x7b /* { */) usage = true;
    if (kind === TEXT && data[k] === 0x22) {
      const valueEnd = stringEnd(data, k + 1, end);
      if (valueEnd === -1) break;
      textBytes += valueEnd - (k + 1);
      i = valueEnd + 1;
      continue;
    }
    i = k;
  }
  return { textBytes, usage };
}

/** The index of the quote that ends the string whose first byte is at `from`, or -1. */
function stringEnd(data: Buffer, from: number, end: number): number {
  for (let j = from; j < end; j += 1) {
    const c = data[j];
    if (c === 0x5c /* \ */) j += 1;
    else if (c === 0x22) return j;
  }
  return -1;
}

function skipBlanks(data: Buffer, from: number, end: number): number {
  let k = from;
  while (k < end && (data[k] === 0x20 || data[k] === 0x09 || data[k] === 0x0a || data[k] === 0x0d)) k += 1;
  return k;
}

function keyKind(data: Buffer, start: number, end: number): 0 | typeof TEXT | typeof USAGE {
  const length = end - start;
  if (length === USAGE_KEY.length && sameBytes(data, start, USAGE_KEY)) return USAGE;
  for (const key of TEXT_KEYS) if (length === key.length && sameBytes(data, start, key)) return TEXT;
  return 0;
}

function sameBytes(data: Buffer, start: number, key: Buffer): boolean {
  for (let j = 0; j < key.length; j += 1) if (data[start + j] !== key[j]) return false;
  return true;
}

/** The usage of an event that has a usage object: its data parsed (once or twice a stream). */
function usageOfEvent(event: Buffer): TokenUsage | null {
  const payload = dataOf(event);
  if (payload === null) return null;
  try {
    return readTokenUsage((JSON.parse(payload) as { usage?: unknown } | null)?.usage);
  } catch {
    return null;
  }
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
