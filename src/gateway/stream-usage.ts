// Token counts for streams whose client did not ask for them. The gateway then asks the
// upstream itself (`stream_options.include_usage: true`), and this filter takes back out
// what that adds, so the client receives exactly the events it would have received
// without llmgw: OpenAI's wire format adds a last chunk with `choices: []` and the usage,
// and a `"usage": null` field on every other chunk (protocols.md, streaming). The usage
// chunk's figures are kept for the usage row.
//
// Events are forwarded as soon as they are complete; only an event cut by a chunk
// boundary waits for its rest. Events without the text `"usage"` pass untouched and
// unparsed, so the cost on a long stream is a substring search per chunk.
import { isUtf8 } from "node:buffer";
import type { BodyRewriter } from "./relay.ts";
import type { TokenUsage } from "../core/token-usage.ts";
import { readTokenUsage } from "./usage-tap.ts";

const USAGE_MARK = Buffer.from('"usage"');
const EMPTY = Buffer.alloc(0);

export class StreamUsageFilter implements BodyRewriter {
  private pending: Buffer = EMPTY;
  private found: TokenUsage | null = null;

  /** The usage the upstream reported, once its usage chunk has passed. */
  usage(): TokenUsage | null {
    return this.found;
  }

  /** Takes the next bytes from the upstream; returns what the client gets now. */
  push(chunk: Buffer): Buffer {
    // The usual case: whole events, nothing held back. Two byte reads, no search.
    if (this.pending.length === 0 && endsWithBlankLine(chunk)) return chunk.includes(USAGE_MARK) ? this.rewrite(chunk) : chunk;
    const data = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    const end = completeEventsEnd(data);
    this.pending = end === data.length ? EMPTY : data.subarray(end);
    if (end === 0) return EMPTY;
    const complete = data.subarray(0, end);
    return complete.includes(USAGE_MARK) ? this.rewrite(complete) : complete;
  }

  /** What is left when the upstream ends (an unterminated last event passes as it is). */
  end(): Buffer {
    const rest = this.pending;
    this.pending = EMPTY;
    return rest.includes(USAGE_MARK) ? this.rewrite(rest) : rest;
  }

  private rewrite(events: Buffer): Buffer {
    const parts = events.toString("utf8").split(/(?<=\r?\n\r?\n)/);
    return Buffer.from(parts.map((event) => this.rewriteEvent(event)).join(""), "utf8");
  }

  /** One event: the usage-only chunk goes (its figures kept); `"usage": null` fields go. */
  private rewriteEvent(event: string): string {
    if (!event.includes('"usage"')) return event;
    const match = /^data:\s?(.*?)(\r?\n\r?\n)?$/s.exec(event);
    if (match === null) return event;
    let payload: unknown;
    try {
      payload = JSON.parse(match[1]!);
    } catch {
      return event;
    }
    if (typeof payload !== "object" || payload === null || !("usage" in payload)) return event;
    const chunk = payload as { usage?: unknown; choices?: unknown };
    const usage = readTokenUsage(chunk.usage);
    if (usage !== null) this.found = usage;
    if (Array.isArray(chunk.choices) && chunk.choices.length === 0) return "";
    delete chunk.usage;
    return `data: ${JSON.stringify(chunk)}${match[2] ?? ""}`;
  }
}

function endsWithBlankLine(data: Buffer): boolean {
  const n = data.length;
  return n >= 2 && data[n - 1] === 0x0a && (data[n - 2] === 0x0a || (n >= 4 && data[n - 2] === 0x0d && data[n - 3] === 0x0a && data[n - 4] === 0x0d));
}

/** Where the last complete event ends (after its blank line), or 0. */
function completeEventsEnd(data: Buffer): number {
  const lf = data.lastIndexOf("\n\n");
  const crlf = data.lastIndexOf("\r\n\r\n");
  return Math.max(lf === -1 ? 0 : lf + 2, crlf === -1 ? 0 : crlf + 4);
}

const INCLUDE_USAGE = Buffer.from('{"stream_options":{"include_usage":true},');

/**
 * The request body as it arrived, with `stream_options.include_usage` asked for: spliced in
 * after the opening brace instead of serialising the parsed body again, which cost ~8 µs a
 * stream request at the gateway benchmark's size. Only for a body that has no
 * stream_options (so no field appears twice) and whose first non-blank byte opens the
 * object; null otherwise, and the caller serialises the parsed body.
 */
export function withUsageRequested(raw: Buffer, body: Record<string, unknown>): Buffer | null {
  // Invalid UTF-8 was replaced when the body was parsed; serialising the parsed body sends
  // the upstream the repaired text, as before (llama-server and vLLM refuse invalid bytes).
  if (body.stream_options !== undefined || !isUtf8(raw)) return null;
  let start = 0;
  // JSON's blanks: space, tab, line feed, carriage return.
  while (start < raw.length && (raw[start] === 0x20 || raw[start] === 0x09 || raw[start] === 0x0a || raw[start] === 0x0d)) start += 1;
  if (raw[start] !== 0x7b) return null;
  // A request body always has fields (model at least), so a comma after the new one is right.
  return Buffer.concat([INCLUDE_USAGE, raw.subarray(start + 1)]);
}
