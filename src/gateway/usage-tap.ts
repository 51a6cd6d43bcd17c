// Finds the token usage in a response the gateway relays, without holding up a byte of
// it. A JSON answer carries `usage` at the top level (last, in practice); a stream carries
// it in its last data event when the client asked for `stream_options.include_usage`. The
// tap keeps only the last 64 KiB of the response and parses what it needs once, after the
// end.
export interface TokenUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

/** Usage sits at the end of an answer (the last JSON field, or the last event of a stream). */
const TAIL_BYTES = 64 * 1024;

export class UsageTap {
  private chunks: Buffer[] = [];
  private size = 0;

  constructor(private readonly stream: boolean) {}

  /** Keeps only the tail of the answer, so a long answer costs no more than a short one. */
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.chunks.length > 1 && this.size - this.chunks[0]!.length >= TAIL_BYTES) {
      this.size -= this.chunks.shift()!.length;
    }
  }

  usage(): TokenUsage | null {
    if (this.chunks.length === 0) return null;
    const text = Buffer.concat(this.chunks).toString("utf8");
    if (!this.stream) return pickUsage(safeParse(usageObjectText(text)));
    const events = text.split("\n");
    for (let i = events.length - 1; i >= 0; i -= 1) {
      const line = events[i]!.trim();
      if (!line.startsWith("data:") || !line.includes('"usage"')) continue;
      const usage = pickUsage(safeParse(line.slice(5).trim()));
      if (usage !== null) return usage;
    }
    return null;
  }
}

/**
 * The `{"usage":{...}}` part of a JSON answer, cut out by matching braces, so that only it
 * is parsed rather than a whole answer that may be long. Falls back to the whole text.
 */
function usageObjectText(text: string): string {
  const key = text.lastIndexOf('"usage"');
  const open = key === -1 ? -1 : text.indexOf("{", key);
  if (open === -1) return text;
  let depth = 0;
  let inString = false;
  for (let i = open; i < text.length; i += 1) {
    const char = text[i];
    if (inString) {
      if (char === "\\") i += 1;
      else if (char === '"') inString = false;
    } else if (char === '"') inString = true;
    else if (char === "{") depth += 1;
    else if (char === "}" && --depth === 0) return `{"usage":${text.slice(open, i + 1)}}`;
  }
  return text;
}

function safeParse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

function pickUsage(value: unknown): TokenUsage | null {
  if (typeof value !== "object" || value === null) return null;
  const usage = (value as { usage?: unknown }).usage;
  if (typeof usage !== "object" || usage === null) return null;
  const { prompt_tokens, completion_tokens } = usage as Record<string, unknown>;
  if (typeof prompt_tokens !== "number") return null;
  return { prompt_tokens, completion_tokens: typeof completion_tokens === "number" ? completion_tokens : 0 };
}
