// Parses a JSON request body with the one message every API gives for an empty, malformed
// or over-deep body (400), so the gateway, the admin API and the mirror routes answer
// alike. Depth is checked before parsing: a body nested thousands of levels deep parses,
// but overflows the stack wherever it is later walked or re-serialised (a 500 instead of
// an answer), and no real request nests anywhere near the limit.
import { BadRequestError, describeError } from "./errors.ts";

/** Deepest nesting of arrays and objects accepted (JSON schemas of tools stay far below it). */
export const MAX_JSON_DEPTH = 128;

export function parseJsonBody(text: string): unknown {
  if (text.trim() === "") throw new BadRequestError("The request body is empty; send a JSON object.", { code: "invalid_json" });
  const depth = jsonDepthOver(text, MAX_JSON_DEPTH);
  if (depth) {
    throw new BadRequestError(`The request body nests arrays and objects more than ${MAX_JSON_DEPTH} levels deep; flatten it.`, { code: "json_too_deep" });
  }
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new BadRequestError(`The request body is not valid JSON: ${describeError(error)}.`, { code: "invalid_json", cause: error });
  }
}

/** True when brackets outside strings nest deeper than `limit` (one pass, no allocation). */
function jsonDepthOver(text: string, limit: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i += 1) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92 /* \ */) i += 1;
      else if (c === 34 /* " */) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 123 /* { */ || c === 91 /* [ */) {
      depth += 1;
      if (depth > limit) return true;
    } else if (c === 125 /* } */ || c === 93 /* ] */) depth -= 1;
  }
  return false;
}
