// Parses a JSON request body with the one message every API gives for an empty, malformed,
// over-deep or ambiguous body (400), so the gateway, the admin API and the mirror routes
// answer alike.
//
// Depth is checked before parsing: a body nested thousands of levels deep parses, but
// overflows the stack wherever it is later walked or re-serialised (a 500 instead of an
// answer), and no real request nests anywhere near the limit.
//
// A key given twice at the top level is refused: JSON.parse keeps the last one, but the
// gateway may forward the body as it arrived, and a JSON parser upstream may keep the
// first, so the model and limits llmgw checked would not be the ones that run. The same
// one pass that measures depth finds the top-level keys, so the hot path pays no second
// parse. Nested objects keep JSON.parse's rule (the last wins): see findDuplicateKey.
import { BadRequestError, describeError } from "./errors.ts";

/** Deepest nesting of arrays and objects accepted (JSON schemas of tools stay far below it). */
export const MAX_JSON_DEPTH = 128;

/** A key named in an error message is cut to this many characters (it is the client's text). */
const MAX_KEY_SHOWN = 64;

export function parseJsonBody(text: string): unknown {
  if (text.trim() === "") throw new BadRequestError("The request body is empty; send a JSON object.", { code: "invalid_json" });
  const scan = scanJson(text, MAX_JSON_DEPTH);
  if (scan === TOO_DEEP) {
    throw new BadRequestError(`The request body nests arrays and objects more than ${MAX_JSON_DEPTH} levels deep; flatten it.`, { code: "json_too_deep" });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new BadRequestError(`The request body is not valid JSON: ${describeError(error)}.`, { code: "invalid_json", cause: error });
  }
  // After the parse: malformed JSON is reported as such, whatever keys it repeats.
  if (scan !== null) {
    const shown = scan.length > MAX_KEY_SHOWN ? `${scan.slice(0, MAX_KEY_SHOWN)}…` : scan;
    throw new BadRequestError(`The request body has the key '${shown}' twice; send each key once.`, { code: "duplicate_key", param: shown });
  }
  return parsed;
}

const TOO_DEEP = Symbol("too deep");

/**
 * One pass over the text, without allocating for anything but top-level keys: TOO_DEEP
 * when brackets outside strings nest deeper than `limit`, else the first key that the
 * top-level object repeats (compared decoded, so "mo\u0064el" is "model"), or null.
 * Strings are skipped whole (brackets and quotes inside them do not count), and so are
 * nested values, by depth. Only well-formed JSON's answer matters: the caller parses it.
 */
function scanJson(text: string, limit: number): typeof TOO_DEEP | string | null {
  let depth = 0;
  let inString = false;
  /** Whether the outermost value is an object (so that depth-1 strings can be its keys). */
  let topIsObject = false;
  /** At depth 1 of the top object, after "{" or ",": the next string is a key. */
  let expectKey = false;
  /** Where the key being read starts (after its quote), or -1 when the string is not a key. */
  let keyStart = -1;
  let keyEscaped = false;
  let keys: Set<string> | null = null;
  let duplicate: string | null = null;
  for (let i = 0; i < text.length; i += 1) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92 /* \ */) {
        keyEscaped = true;
        i += 1;
      } else if (c === 34 /* " */) {
        inString = false;
        if (keyStart >= 0 && duplicate === null) {
          const key = keyEscaped ? decodeKey(text, keyStart, i) : text.slice(keyStart, i);
          keys ??= new Set();
          if (keys.has(key)) duplicate = key;
          else keys.add(key);
        }
        keyStart = -1;
      }
    } else if (c === 34) {
      inString = true;
      if (expectKey) {
        keyStart = i + 1;
        keyEscaped = false;
        expectKey = false;
      }
    } else if (c === 123 /* { */ || c === 91 /* [ */) {
      depth += 1;
      if (depth > limit) return TOO_DEEP;
      if (depth === 1) {
        topIsObject = c === 123;
        expectKey = topIsObject;
      }
    } else if (c === 125 /* } */ || c === 93 /* ] */) {
      depth -= 1;
      expectKey = false;
    } else if (c === 44 /* , */ && depth === 1 && topIsObject) expectKey = true;
  }
  return duplicate;
}

/** A key with escapes, decoded as JSON decodes it; as written when it is malformed (the parse then fails anyway). */
function decodeKey(text: string, start: number, end: number): string {
  try {
    return JSON.parse(text.slice(start - 1, end + 1)) as string;
  } catch {
    return text.slice(start, end);
  }
}
