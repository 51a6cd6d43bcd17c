// Keeps the numbers of every grammar the bundled engine compiles inside what JSON parsers
// and schema validators accept. node-llama-cpp 3.21.1 writes JSON numbers into its
// grammars (JSON-schema grammars and the function-call parameter grammars LlamaChat
// builds itself) as up to 16 digits with an optional exponent of up to 16 digits: a
// random-weight model writes "3E1164562573333333" within a few answers, which JSON.parse
// reads as Infinity, and LlamaChat then throws while validating a tool call. The number
// rules have reserved names (GbnfNumber: integer-number-rule, fractional-number-rule), and
// every grammar goes through the binding's AddonGrammar constructor, so the runner
// rewrites those two rules there: no exponent, and at most 15 integer digits, which stay
// inside the safe-integer range that zod's .int() checks.
import type { Llama } from "node-llama-cpp";

const INTEGER = '"-"? ("0" | [1-9] [0-9]{0,14})';
const NUMBER_RULES: Record<string, string> = {
  "integer-number-rule": INTEGER,
  "fractional-number-rule": `${INTEGER} ("." [0-9]{1,16})?`,
};

/** The grammar text with its JSON number rules bounded (idempotent). */
export function boundNumberRules(grammar: string): string {
  return grammar.replace(/^(integer-number-rule|fractional-number-rule) ::= .*$/gm, (_line, name: string) => `${name} ::= ${NUMBER_RULES[name]}`);
}

type GrammarConstructor = new (grammar: string, options: unknown) => object;
interface GrammarBindings {
  AddonGrammar: GrammarConstructor;
}

// The bindings are shared by every Llama of the process; patch them once.
const patched = new WeakSet<GrammarBindings>();

/** Routes every grammar this llama compiles through boundNumberRules. */
export function boundGrammarNumbers(llama: Llama): void {
  // `_bindings` is node-llama-cpp's internal handle on the native addon; the check keeps a
  // library upgrade that renames it from failing silently.
  const bindings = (llama as unknown as { _bindings?: GrammarBindings })._bindings;
  if (typeof bindings?.AddonGrammar !== "function") throw new Error("node-llama-cpp no longer exposes _bindings.AddonGrammar; bounded-numbers.ts needs updating");
  if (patched.has(bindings)) return;
  patched.add(bindings);
  const Original = bindings.AddonGrammar;
  bindings.AddonGrammar = class extends Original {
    constructor(grammar: string, options: unknown) {
      super(boundNumberRules(grammar), options);
    }
  };
}
