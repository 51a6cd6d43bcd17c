// Parses a JSON request body with the one message every API gives for an empty or
// malformed body (400, code invalid_json), so the gateway, the admin API and the mirror
// routes answer alike.
import { BadRequestError, describeError } from "./errors.ts";

export function parseJsonBody(text: string): unknown {
  if (text.trim() === "") throw new BadRequestError("The request body is empty; send a JSON object.", { code: "invalid_json" });
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new BadRequestError(`The request body is not valid JSON: ${describeError(error)}.`, { code: "invalid_json", cause: error });
  }
}
