// Finds the token usage in a response the gateway relays, without holding up a byte of
// it. A JSON answer carries `usage` at the top level (last, in practice); a stream carries
// it in its last data event when the client asked for `stream_options.include_usage`. The
// tap keeps only the last 64 KiB of the response and parses what it needs once, after the
// end. Counts are an upstream's word, not llmgw's: readTokenUsage, the one reader every
// part of the gateway uses, keeps only counts a usage row, a cost and a Prometheus counter
// can take (whole numbers >= 0), and treats anything else as no usage at all.
import type { TokenUsage } from "../core/token-usage.ts";

/** Usage sits at the end of an answer (the last JSON field, or the last event of a stream). */
const TAIL_BYTES = 64 * 1024;

export class UsageTap {
  private chunks: Buffer[] = [];
  private size = 0;
  /** Every byte of the answer, kept or not. */
  private total = 0;

  constructor(private readonly stream: boolean) {}

  /** Keeps only the tail of the answer, so a long answer costs no more than a short one. */
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    this.total += chunk.length;
    while (this.chunks.length > 1 && this.size - this.chunks[0]!.length >= TAIL_BYTES) {
      this.size -= this.chunks.shift()!.length;
    }
  }

  /** The bytes of the whole answer. */
  answerBytes(): number {
    return this.total;
  }

  /** The whole answer when the tap still holds all of it (an answer of up to 64 KiB), else null: for an estimate of its text. */
  wholeAnswer(): Buffer | null {
    return this.size === this.total ? Buffer.concat(this.chunks) : null;
  }

  usage(): TokenUsage | null {
    if (this.chunks.length === 0) return null;
    const text = Buffer.concat(this.chunks).toString("utf8");
    if (!this.stream) return usageOf(safeParse(usageObjectText(text)));
    const events = text.split("\n");
    for (let i = events.length - 1; i >= 0; i -= 1) {
      const line = events[i]!.trim();
      if (!line.startsWith("data:") || !line.includes('"usage"')) continue;
      const usage = usageOf(safeParse(line.slice(5).trim()));
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

function usageOf(value: unknown): TokenUsage | null {
  if (typeof value !== "object" || value === null) return null;
  return readTokenUsage((value as { usage?: unknown }).usage);
}

/**
 * The token counts of an OpenAI `usage` object (a chat or text completion's, a usage
 * chunk's, an embeddings answer's, which has no completion_tokens: 0). Null when there
 * are none, or when a count is not a whole number >= 0 (a negative count would make the
 * Prometheus counters throw at every scrape, a fraction fails an integer column): such
 * usage is unknown, as if the upstream had sent none.
 */
export function readTokenUsage(value: unknown): TokenUsage | null {
  if (typeof value !== "object" || value === null) return null;
  const { prompt_tokens, completion_tokens } = value as Record<string, unknown>;
  if (!isTokenCount(prompt_tokens)) return null;
  if (completion_tokens === undefined || completion_tokens === null) return { prompt_tokens, completion_tokens: 0 };
  return isTokenCount(completion_tokens) ? { prompt_tokens, completion_tokens } : null;
}

/** Whether a usage the gateway holds has counts fit to add up (see readTokenUsage). */
export function isTokenUsage(usage: TokenUsage): boolean {
  return isTokenCount(usage.prompt_tokens) && isTokenCount(usage.completion_tokens);
}

function isTokenCount(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}
