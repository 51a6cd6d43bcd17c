// The data of one server-sent event, for the translators of chat streams into other wire
// formats (responses/, ollama/, anthropic/). Only `data:` lines matter; `event:`, `id:`
// and `:` comment lines of some servers are dropped, and a multi-line data field is joined
// with newlines, as the SSE format says.
/** The common case, one `data: ` line, costs a slice: this runs for every chunk of every translated stream. */
export function eventData(event: string): string {
  if (event.startsWith("data: ") && !event.includes("\n")) return event.slice(6);
  return event
    .split(/\r?\n/)
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).replace(/^ /, ""))
    .join("\n");
}

/** The events of a stream's text (the last one may be unfinished): a plain split where no \r is, the common case. */
export function splitEvents(text: string): string[] {
  return text.includes("\r") ? text.split(/\r?\n\r?\n/) : text.split("\n\n");
}
