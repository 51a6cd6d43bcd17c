// The `stop` parameter on generated text, with llama-server's semantics: the reply ends
// before the first occurrence of any stop sequence, the stop text itself is never sent,
// and text that may be the start of a stop sequence is held back until the next text
// settles it. It works on decoded text (whole characters), so a stop sequence made of
// multi-byte characters spread over byte tokens matches like any other, and nothing
// depends on how the tokenizer split the text. Engine-neutral: no llama.cpp here.

export interface StopScan {
  /** Text that can go to the client now. */
  text: string;
  /** A stop sequence was found: `text` is the last of the reply. */
  stopped: boolean;
}

export class StopSequences {
  private readonly stops: string[];
  private held = "";
  private done = false;
  /** The stop sequence that ended the reply, once one did (reported as vLLM's `stop_reason`). */
  matched: string | null = null;

  constructor(stops: readonly string[]) {
    this.stops = stops.filter((stop) => stop !== "");
  }

  /** Feeds the next generated text. After a stop was found, nothing more is sent. */
  push(text: string): StopScan {
    if (this.done) return { text: "", stopped: true };
    if (this.stops.length === 0) return { text, stopped: false };
    const buffer = this.held + text;
    // The held text contained no whole stop sequence, so searching it again with the new
    // text only finds stop sequences that end in the new text (or span both).
    let first = -1;
    for (const stop of this.stops) {
      const at = buffer.indexOf(stop);
      if (at >= 0 && (first < 0 || at < first)) {
        first = at;
        this.matched = stop;
      }
    }
    if (first >= 0) {
      this.done = true;
      this.held = "";
      return { text: buffer.slice(0, first), stopped: true };
    }
    const keep = this.partialStopLength(buffer);
    let cut = buffer.length - keep;
    // Never split a surrogate pair between what is sent and what is held.
    if (cut > 0 && cut < buffer.length && isHighSurrogate(buffer.charCodeAt(cut - 1))) cut -= 1;
    this.held = buffer.slice(cut);
    return { text: buffer.slice(0, cut), stopped: false };
  }

  /** The generation ended without a stop sequence: what was held back is part of the reply. */
  flush(): string {
    const rest = this.done ? "" : this.held;
    this.held = "";
    return rest;
  }

  /** Length of the longest end of `text` that is the beginning of a stop sequence. */
  private partialStopLength(text: string): number {
    let longest = 0;
    for (const stop of this.stops) {
      for (let length = Math.min(stop.length - 1, text.length); length > longest; length--) {
        if (text.endsWith(stop.slice(0, length))) {
          longest = length;
          break;
        }
      }
    }
    return longest;
  }
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
