// Parses a JSON request body with the one message every API gives for an empty, malformed,
// over-deep or ambiguous body (400), so the gateway, the admin API and the mirror routes
// answer alike.
//
// Depth is checked before parsing: a body nested thousands of levels deep parses, but
// overflows the stack wherever it is later walked or re-serialised (a 500 instead of an
// answer), and no real request nests anywhere near the limit.
//
// A key given twice in any object of the body is refused: JSON.parse keeps the last one,
// but the gateway may forward the body as it arrived, and a JSON parser upstream may keep
// the first, so the model, limits and message text llmgw checked would not be the ones
// that run (`"content":"evil","content":"ok"` inside a message is as bad as two models).
// The same one pass that measures depth collects each open object's keys (scanJson), so
// the hot path pays no second parse and allocates little more than the key strings.
import { BadRequestError, describeError } from "./errors.ts";

/** Deepest nesting of arrays and objects accepted (JSON schemas of tools stay far below it). */
export const MAX_JSON_DEPTH = 128;

/** A key named in an error message is cut to this many characters (it is the client's text). */
const MAX_KEY_SHOWN = 64;
/** The place of a nested repeated key is shown by its last this many characters. */
const MAX_PLACE_SHOWN = 160;

export function parseJsonBody(text: string): unknown {
  if (text.trim() === "") throw new BadRequestError("The request body is empty; send a JSON object.", { code: "invalid_json" });
  const scan = scanJson(text);
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
  if (scan !== null) throw duplicateKeyError(scan);
  return parsed;
}

/** A key an object repeats, with the path of the object that holds it (empty at the top level). */
interface DuplicateKey {
  key: string;
  /** Keys and array indexes from the top down to the object, e.g. ["messages", 0]. */
  path: (string | number)[];
}

function duplicateKeyError({ key, path }: DuplicateKey): BadRequestError {
  const shownKey = cut(key);
  if (path.length === 0) {
    return new BadRequestError(`The request body has the key '${shownKey}' twice; send each key once.`, { code: "duplicate_key", param: shownKey });
  }
  // OpenAI's spelling of a field's place ("messages[0].content"), so `param` reads like its own.
  let place = "";
  for (const step of path) place += typeof step === "number" ? `[${step}]` : place === "" ? cut(step) : `.${cut(step)}`;
  if (place.length > MAX_PLACE_SHOWN) place = `…${place.slice(-MAX_PLACE_SHOWN)}`;
  return new BadRequestError(`The request body has the key '${shownKey}' twice in ${place}; send each key once.`, {
    code: "duplicate_key",
    param: `${place}.${shownKey}`,
  });
}

function cut(key: string): string {
  return key.length > MAX_KEY_SHOWN ? `${key.slice(0, MAX_KEY_SHOWN)}…` : key;
}

const TOO_DEEP = Symbol("too deep");

/** An object with up to this many keys is checked by comparing against each; a bigger one by a Set. */
const LINEAR_KEYS = 16;
const DEPTHS = MAX_JSON_DEPTH + 1;

// Per-depth state of the scan, kept between calls so that a body costs no allocation for
// it (the scan is synchronous, so two calls never share it). Index d is the container
// opened at depth d (1 = the outermost value). A key is held as where it lies in the text
// (start after its opening quote, end at its closing quote), not as a string: most keys
// are compared and forgotten without ever being sliced out.
/** Whether the container at depth d is an object (else an array). */
const isObjectAt = new Uint8Array(DEPTHS);
/** The index of the current element of the array at depth d (to name a place). */
const indexAt = new Int32Array(DEPTHS);
/** How many keys the object at depth d has so far (counting on past LINEAR_KEYS). */
const keyCountAt = new Int32Array(DEPTHS);
/** The first LINEAR_KEYS keys of the object at depth d: slot d * LINEAR_KEYS + n. */
const keyStarts = new Int32Array(DEPTHS * LINEAR_KEYS);
const keyEnds = new Int32Array(DEPTHS * LINEAR_KEYS);
/** Whether that key has escapes (so it is compared decoded). */
const keyEscaped = new Uint8Array(DEPTHS * LINEAR_KEYS);
/** The keys, decoded, of an object at depth d that has more than LINEAR_KEYS. */
const keySetAt: (Set<string> | undefined)[] = [];
/** The last key read in the object at depth d: the one whose value is open below it. */
const lastKeyStartAt = new Int32Array(DEPTHS);
const lastKeyEndAt = new Int32Array(DEPTHS);

/**
 * One pass over the text: TOO_DEEP when brackets outside strings nest deeper than
 * MAX_JSON_DEPTH, else the first key that an object repeats (compared decoded, so
 * "mo\u0064el" is "model") with where that object is, or null. Strings are skipped whole
 * (brackets and quotes inside them do not count); a value string is skipped with indexOf,
 * which is most of a chat body's text. Only well-formed JSON's answer matters: the caller
 * parses it, and malformed text only has to end the scan without a wrong TOO_DEEP.
 */
function scanJson(text: string): typeof TOO_DEEP | DuplicateKey | null {
  let depth = 0;
  /** In an object, after "{" or ",": the next string is a key. */
  let expectKey = false;
  let duplicate: DuplicateKey | null = null;
  const end = text.length;
  for (let i = 0; i < end; i += 1) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      if (!expectKey) {
        i = closingQuote(text, i + 1);
        if (i < 0) break;
        continue;
      }
      expectKey = false;
      // A key: read char by char (keys are short), noting whether it has escapes to decode.
      const start = i + 1;
      let escaped = false;
      let j = start;
      for (; j < end; j += 1) {
        const k = text.charCodeAt(j);
        if (k === 34) break;
        if (k === 92 /* \ */) {
          escaped = true;
          j += 1;
        }
      }
      if (j >= end) break;
      i = j;
      if (duplicate === null && !addKey(text, depth, start, j, escaped)) duplicate = { key: keyText(text, start, j), path: pathTo(text, depth) };
    } else if (c === 123 /* { */ || c === 91 /* [ */) {
      depth += 1;
      if (depth > MAX_JSON_DEPTH) {
        forgetKeys(depth - 1);
        return TOO_DEEP;
      }
      if (c === 123) {
        isObjectAt[depth] = 1;
        keyCountAt[depth] = 0;
        expectKey = true;
      } else {
        isObjectAt[depth] = 0;
        indexAt[depth] = 0;
        expectKey = false;
      }
    } else if (c === 125 /* } */ || c === 93 /* ] */) {
      // More closing than opening brackets: malformed, the parse says so.
      if (depth === 0) break;
      if (isObjectAt[depth] === 1 && (keyCountAt[depth] ?? 0) > LINEAR_KEYS) keySetAt[depth]?.clear();
      depth -= 1;
      expectKey = false;
    } else if (c === 44 /* , */ && depth > 0) {
      if (isObjectAt[depth] === 1) expectKey = true;
      else indexAt[depth] = (indexAt[depth] ?? 0) + 1;
    }
  }
  // Malformed text can end with objects still open.
  forgetKeys(depth);
  return duplicate;
}

/** Records a key of the object at `depth`; false when that object already has it. */
function addKey(text: string, depth: number, start: number, end: number, escaped: boolean): boolean {
  lastKeyStartAt[depth] = start;
  lastKeyEndAt[depth] = end;
  const count = keyCountAt[depth] ?? 0;
  keyCountAt[depth] = count + 1;
  if (count < LINEAR_KEYS) {
    const first = depth * LINEAR_KEYS;
    for (let slot = first; slot < first + count; slot += 1) {
      if (sameKey(text, slot, start, end, escaped)) return false;
    }
    keyStarts[first + count] = start;
    keyEnds[first + count] = end;
    keyEscaped[first + count] = escaped ? 1 : 0;
    return true;
  }
  let set = keySetAt[depth];
  if (set === undefined) {
    set = new Set();
    keySetAt[depth] = set;
  }
  if (count === LINEAR_KEYS) {
    // The object outgrew comparing each key: its first keys move into the Set.
    set.clear();
    const first = depth * LINEAR_KEYS;
    for (let slot = first; slot < first + LINEAR_KEYS; slot += 1) set.add(slotText(text, slot));
  }
  const key = escaped ? keyText(text, start, end) : text.slice(start, end);
  if (set.has(key)) return false;
  set.add(key);
  return true;
}

/** Whether the key in `slot` is the key text[start, end), compared decoded when either has escapes. */
function sameKey(text: string, slot: number, start: number, end: number, escaped: boolean): boolean {
  const otherStart = keyStarts[slot] ?? 0;
  const otherEnd = keyEnds[slot] ?? 0;
  if (escaped || keyEscaped[slot] === 1) return keyText(text, start, end) === slotText(text, slot);
  if (otherEnd - otherStart !== end - start) return false;
  for (let n = 0; n < end - start; n += 1) {
    if (text.charCodeAt(start + n) !== text.charCodeAt(otherStart + n)) return false;
  }
  return true;
}

function slotText(text: string, slot: number): string {
  return keyText(text, keyStarts[slot] ?? 0, keyEnds[slot] ?? 0);
}

/** Empties the Sets of objects still open at depths 1..depth, so no body's keys stay referenced. */
function forgetKeys(depth: number): void {
  for (let d = 1; d <= depth; d += 1) keySetAt[d]?.clear();
}

/** Where the string whose text starts at `start` ends (its closing quote), or -1 when it never does. */
function closingQuote(text: string, start: number): number {
  let quote = text.indexOf('"', start);
  while (quote > 0 && text.charCodeAt(quote - 1) === 92) {
    // An odd run of backslashes escapes the quote; an even one is escaped backslashes.
    let backslashes = 1;
    while (quote - backslashes - 1 >= start && text.charCodeAt(quote - backslashes - 1) === 92) backslashes += 1;
    if (backslashes % 2 === 0) break;
    quote = text.indexOf('"', quote + 1);
  }
  return quote;
}

/** The keys and indexes that lead to the object at `depth`. */
function pathTo(text: string, depth: number): (string | number)[] {
  const path: (string | number)[] = [];
  for (let d = 1; d < depth; d += 1) {
    path.push(isObjectAt[d] === 1 ? keyText(text, lastKeyStartAt[d] ?? 0, lastKeyEndAt[d] ?? 0) : (indexAt[d] ?? 0));
  }
  return path;
}

/** The key text[start, end) as JSON decodes it; as written when it is malformed (the parse then fails anyway). */
function keyText(text: string, start: number, end: number): string {
  const raw = text.slice(start, end);
  if (!raw.includes("\\")) return raw;
  try {
    return JSON.parse(`"${raw}"`) as string;
  } catch {
    return raw;
  }
}
