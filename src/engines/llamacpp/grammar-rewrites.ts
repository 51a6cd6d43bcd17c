// Keeps what every grammar the bundled engine compiles generates inside what JSON parsers
// and schema validators accept. node-llama-cpp 3.21.1 builds JSON-schema grammars and the
// function-call parameter grammars LlamaChat uses itself, from rules with reserved names
// (GbnfNumber, GbnfInsideStringChar), and every grammar goes through the binding's
// AddonGrammar constructor, so the runner rewrites those rules there:
// - Numbers: up to 16 digits with an optional exponent of up to 16 digits. A random-weight
//   model writes "3E1164562573333333" within a few answers, which JSON.parse reads as
//   Infinity (and LlamaChat then throws while validating a tool call). Rewritten: no
//   exponent, at most 15 integer digits, inside the safe-integer range zod's .int() checks.
// - String characters: "anything but a quote, a backslash or a control character", as
//   code points. llama.cpp decodes byte tokens into code points without checking the
//   range, so a model that emits the bytes F5..F7 or an encoded surrogate gets a
//   "character" that UTF-8 decoders turn into up to four U+FFFD, and a string then
//   exceeds its maxLength. Rewritten to the valid ranges only (overlong encodings, which
//   decode to small code points, are still possible from byte tokens, though rare).
import type { Llama } from "node-llama-cpp";

const INTEGER = '"-"? ("0" | [1-9] [0-9]{0,14})';
/** A character inside a JSON string: valid code points except '"', '\\' and controls, or an escape. */
export const JSON_STRING_CHAR = '[\\x20-\\x21\\x23-\\x5B\\x5D-\\x7E\\x80-\\uD7FF\\uE000-\\U0010FFFF] | "\\\\" ["\\\\/bfnrt] | "\\\\u" [0-9a-fA-F]{4}';
const RULES: Record<string, string> = {
  "integer-number-rule": INTEGER,
  "fractional-number-rule": `${INTEGER} ("." [0-9]{1,16})?`,
  "string-char-rule": JSON_STRING_CHAR,
};

/** The grammar text with its JSON number and string-character rules bounded (idempotent). */
export function rewriteGrammarRules(grammar: string): string {
  return grammar.replace(/^(integer-number-rule|fractional-number-rule|string-char-rule) ::= .*$/gm, (_line, name: string) => `${name} ::= ${RULES[name]}`);
}

type GrammarConstructor = new (grammar: string, options: unknown) => object;
interface GrammarBindings {
  AddonGrammar: GrammarConstructor;
}

// The bindings are shared by every Llama of the process; patch them once.
const patched = new WeakSet<GrammarBindings>();

/** Routes every grammar this llama compiles through rewriteGrammarRules. */
export function rewriteCompiledGrammars(llama: Llama): void {
  // `_bindings` is node-llama-cpp's internal handle on the native addon; the check keeps a
  // library upgrade that renames it from failing silently.
  const bindings = (llama as unknown as { _bindings?: GrammarBindings })._bindings;
  if (typeof bindings?.AddonGrammar !== "function")
    throw new Error("node-llama-cpp no longer exposes _bindings.AddonGrammar; grammar-rewrites.ts needs updating");
  if (patched.has(bindings)) return;
  patched.add(bindings);
  const Original = bindings.AddonGrammar;
  bindings.AddonGrammar = class extends Original {
    constructor(grammar: string, options: unknown) {
      super(rewriteGrammarRules(grammar), options);
    }
  };
}
