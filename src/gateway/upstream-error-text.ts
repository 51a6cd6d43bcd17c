// What an upstream's own error answer says (an engine's 400 for a prompt longer than its
// context, say), for the wire formats that answer it in another shape (anthropic/,
// ollama/). OpenAI-compatible servers put it in `error.message` (with `error.code`);
// vLLM's older answers and FastAPI's validation errors put it in `message` or `detail`;
// anything else is described by its status and first bytes.
export function upstreamErrorText(status: number, text: string): { message: string; code: string | null } {
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    // Not JSON: described below.
  }
  const fields = typeof parsed === "object" && parsed !== null ? (parsed as Record<string, unknown>) : {};
  const inner = typeof fields.error === "object" && fields.error !== null ? (fields.error as Record<string, unknown>) : {};
  const message = [inner.message, fields.error, fields.message, fields.detail].find((value): value is string => typeof value === "string" && value !== "");
  return {
    message: message ?? `The model server answered HTTP ${status}${text.trim() === "" ? "" : `: ${text.trim().slice(0, 200)}`}`,
    code: typeof inner.code === "string" ? inner.code : null,
  };
}
