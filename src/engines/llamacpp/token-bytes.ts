// The UTF-8 bytes of one vocabulary token, for logprobs (OpenAI's `bytes`, and the
// "bytes:\xNN" name of a token that is not text on its own). node-llama-cpp only
// detokenizes to JS strings, where a token holding part of a multi-byte character comes
// back as U+FFFD; the bytes of such a token are read from its vocabulary piece instead:
// SentencePiece vocabularies spell a byte token "<0xE2>", and GPT-2-style byte-level BPE
// vocabularies map every byte to a printable character (bytes_to_unicode) and back.

/** GPT-2's byte-level alphabet, inverted: printable character → the byte it stands for. */
const GPT2_CHAR_TO_BYTE: ReadonlyMap<string, number> = (() => {
  const printable: number[] = [];
  for (let b = 0x21; b <= 0x7e; b += 1) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b += 1) printable.push(b);
  for (let b = 0xae; b <= 0xff; b += 1) printable.push(b);
  const map = new Map<string, number>();
  for (const b of printable) map.set(String.fromCodePoint(b), b);
  let shifted = 0;
  for (let b = 0; b < 256; b += 1) {
    if (printable.includes(b)) continue;
    map.set(String.fromCodePoint(256 + shifted), b);
    shifted += 1;
  }
  return map;
})();

const BYTE_PIECE = /^<0x([0-9A-Fa-f]{2})>$/;

export interface TokenPieces {
  /** The vocabulary's pieces (`tokenizer.ggml.tokens`), by token id. */
  pieces: readonly string[];
  /** `tokenizer.ggml.model`: "llama" (SentencePiece), "gpt2" (byte-level BPE), ... */
  kind: string;
}

/**
 * The raw bytes of a token's vocabulary piece, or null when the piece does not spell
 * them in a way known here (the caller then keeps the detokenized text's bytes).
 */
export function pieceBytes(vocabulary: TokenPieces, token: number): number[] | null {
  const piece = vocabulary.pieces[token];
  if (piece === undefined) return null;
  const byte = BYTE_PIECE.exec(piece);
  if (byte?.[1] !== undefined) return [Number.parseInt(byte[1], 16)];
  if (vocabulary.kind === "gpt2") {
    const bytes: number[] = [];
    for (const char of piece) {
      const value = GPT2_CHAR_TO_BYTE.get(char);
      if (value === undefined) return null;
      bytes.push(value);
    }
    return bytes;
  }
  return null;
}

/** OpenAI's name for a token that is not valid UTF-8 on its own: "bytes:\xe2\x80". */
export function bytesName(bytes: readonly number[]): string {
  return `bytes:${bytes.map((b) => `\\x${b.toString(16).padStart(2, "0")}`).join("")}`;
}
