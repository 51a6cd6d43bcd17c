// The answer side of /v1/responses: a chat completion (one JSON answer, or a stream of
// chunks) rewritten into a response object or the Responses API's event stream, through
// one ResponseBuilder. A response to keep (`store`) is written before the client gets its
// end (BodyRewriter.beforeEnd): a client that chains on it at once finds it. An error
// answer of the upstream passes as it is: the Responses API shares chat completions'
// error shape. A stream that breaks ends with the Responses API's `error` event, in the
// stream's own sequence.
import { StringDecoder } from "node:string_decoder";
import { sseNamedEvent, type StreamFailure } from "../../core/http.ts";
import type { TokenUsage } from "../../core/token-usage.ts";
import type { BodyRewriter } from "../relay.ts";
import { readTokenUsage } from "../usage-tap.ts";
import { ResponseBuilder, cachedTokensOf, type ResponseEvent, type ResponseHead } from "./response-builder.ts";
import type { ResponseObject } from "./response-types.ts";
import { eventData, splitEvents } from "../sse-data.ts";

const EMPTY = Buffer.alloc(0);
const TEXT_DELTA = "response.output_text.delta";

/** What every answer to one request shares: the response's identity and echo, and where a finished one is kept. */
export interface ResponseTarget {
  head: ResponseHead;
  /** Keeps the finished response, given with its JSON: a promise to wait for, or nothing when it is kept already (never rejects); null when the request said store: false. */
  keep: ((response: ResponseObject, json: string) => Promise<void> | undefined) | null;
}

interface ChatToolCall {
  index?: unknown;
  id?: unknown;
  function?: { name?: unknown; arguments?: unknown };
}

interface ChatChoice {
  message?: { content?: unknown; tool_calls?: ChatToolCall[] };
  delta?: { content?: unknown; tool_calls?: ChatToolCall[] };
  finish_reason?: unknown;
}

/** Feeds a chat message (or a stream chunk's delta) to the builder. */
function feed(builder: ResponseBuilder, part: ChatChoice["message"] | undefined): void {
  if (typeof part !== "object" || part === null) return;
  if (typeof part.content === "string") builder.text(part.content);
  if (!Array.isArray(part.tool_calls)) return;
  part.tool_calls.forEach((call, position) => {
    if (typeof call !== "object" || call === null) return;
    builder.toolCall({
      index: typeof call.index === "number" ? call.index : position,
      id: typeof call.id === "string" ? call.id : undefined,
      name: typeof call.function?.name === "string" ? call.function.name : undefined,
      arguments: typeof call.function?.arguments === "string" ? call.function.arguments : undefined,
    });
  });
}

/** Numbers and frames the events of one stream. */
class EventWriter {
  private sequence = 0;
  out = "";
  private cached: { response: ResponseObject; json: string } | null = null;

  /** A response object's JSON, made once for the events (created and in_progress share one) and the store that carry it. */
  json(response: ResponseObject): string {
    if (this.cached?.response !== response) this.cached = { response, json: JSON.stringify(response) };
    return this.cached.json;
  }

  write = (event: ResponseEvent): void => {
    if (event.type === TEXT_DELTA) {
      // Written as text: one per piece of every streamed answer.
      this.out += `event: ${TEXT_DELTA}\ndata: {"type":"${TEXT_DELTA}","item_id":"${event.item_id}","output_index":${event.output_index},"content_index":0,"delta":${JSON.stringify(event.delta)},"logprobs":[],"sequence_number":${this.sequence++}}\n\n`;
      return;
    }
    const response = event.response as ResponseObject | undefined;
    // The sequence number spliced into the event's JSON rather than spread into a copy of it: this runs per delta.
    const json = response === undefined ? JSON.stringify(event).slice(0, -1) : `{"type":"${event.type}","response":${this.json(response)}`;
    this.out += `event: ${event.type}\ndata: ${json},"sequence_number":${this.sequence++}}\n\n`;
  };

  take(): Buffer {
    const bytes = this.out === "" ? EMPTY : Buffer.from(this.out, "utf8");
    this.out = "";
    return bytes;
  }

  /** The `error` event that ends a broken stream. */
  failure(failure: StreamFailure): string {
    return sseNamedEvent("error", { type: "error", code: failure.code, message: failure.message, param: null, sequence_number: this.sequence++ });
  }
}

/** A whole chat completion (or an error answer) as a response object, or as the whole event stream a stream request expects. */
export class ResponsesAnswer implements BodyRewriter {
  private readonly chunks: Buffer[] = [];
  private status: number;
  private found: TokenUsage | null = null;
  private settled: { body: Buffer; final: ResponseObject | null; json: string } | null = null;
  private readonly events: EventWriter | null;

  constructor(
    private readonly target: ResponseTarget,
    upstreamStatus: number,
    asEvents: boolean,
  ) {
    this.status = upstreamStatus;
    this.events = asEvents && upstreamStatus >= 200 && upstreamStatus < 300 ? new EventWriter() : null;
  }

  push(chunk: Buffer): Buffer {
    this.chunks.push(chunk);
    return EMPTY;
  }

  beforeEnd(): Promise<void> | null {
    const { final, json } = this.settle();
    if (final === null || this.target.keep === null) return null;
    return this.target.keep(final, json) ?? null;
  }

  end(): Buffer {
    const { body, final } = this.settle();
    if (this.events === null || final === null) return body;
    this.events.write({ type: final.status === "completed" ? "response.completed" : "response.incomplete", response: final });
    return Buffer.concat([body, this.events.take()]);
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  head(): { status: number; contentType: string; stream: boolean } {
    const events = this.events !== null && this.status >= 200 && this.status < 300;
    return { status: this.status, contentType: events ? "text/event-stream" : "application/json", stream: events };
  }

  /** Reads the held answer once. */
  private settle(): { body: Buffer; final: ResponseObject | null; json: string } {
    if (this.settled !== null) return this.settled;
    const raw = Buffer.concat(this.chunks);
    this.chunks.length = 0;
    if (this.status < 200 || this.status >= 300) {
      this.settled = { body: raw, final: null, json: "" };
      return this.settled;
    }
    const completion = parseCompletion(raw);
    const choice = Array.isArray(completion?.choices) ? completion.choices[0] : undefined;
    if (completion === null || typeof choice !== "object" || choice === null) {
      this.status = 502;
      const message = `The model server's answer was not a chat completion, so it cannot be given as a response (it began: ${JSON.stringify(raw.toString("utf8").slice(0, 120))}). Retry; if it persists, tell an administrator.`;
      this.settled = {
        body: Buffer.from(JSON.stringify({ error: { message, type: "server_error", param: null, code: "upstream_bad_answer" } })),
        final: null,
        json: "",
      };
      return this.settled;
    }
    this.found = readTokenUsage(completion.usage);
    const builder = new ResponseBuilder(this.target.head, this.events?.write);
    if (this.events !== null) builder.start();
    feed(builder, choice.message);
    const final = builder.finish(choice.finish_reason, this.found, cachedTokensOf(completion.usage));
    const json = this.events === null ? JSON.stringify(final) : this.events.json(final);
    this.settled = { body: this.events === null ? Buffer.from(json, "utf8") : this.events.take(), final, json };
    return this.settled;
  }
}

function parseCompletion(raw: Buffer): { choices?: ChatChoice[]; usage?: unknown } | null {
  try {
    const parsed = JSON.parse(raw.toString("utf8")) as unknown;
    return typeof parsed === "object" && parsed !== null ? (parsed as { choices?: ChatChoice[]; usage?: unknown }) : null;
  } catch {
    return null;
  }
}

/** A chat stream translated chunk by chunk into the Responses API's events. */
export class ResponsesStream implements BodyRewriter {
  private readonly decoder = new StringDecoder("utf8");
  private readonly events = new EventWriter();
  private readonly builder: ResponseBuilder;
  private pending = "";
  private started = false;
  /** The upstream said [DONE] (the response is final) or sent an error (nothing more is translated). */
  private ended = false;
  private final: ResponseObject | null = null;
  private finishReason: unknown = null;
  private found: TokenUsage | null = null;
  private cached = 0;
  private restRead = false;

  constructor(private readonly target: ResponseTarget) {
    this.builder = new ResponseBuilder(target.head, this.events.write);
  }

  push(chunk: Buffer): Buffer {
    return this.translate(this.decoder.write(chunk), false);
  }

  beforeEnd(): Promise<void> | null {
    // An unterminated last event (`data: [DONE]` without its blank line) counts before deciding what to keep.
    this.readRest();
    if (this.final === null || this.target.keep === null) return null;
    return this.target.keep(this.final, this.events.json(this.final)) ?? null;
  }

  end(): Buffer {
    this.readRest();
    // Without [DONE] the stream broke: the relay ends it with the failure event, and nothing is kept.
    const completed = this.builder.completedEvent();
    if (this.final !== null && completed !== null) this.events.write(completed);
    return this.events.take();
  }

  usage(): TokenUsage | null {
    return this.found;
  }

  failureEvent(failure: StreamFailure): string {
    return this.events.failure(failure);
  }

  complete(): boolean {
    return this.final !== null;
  }

  /** Translates what the upstream left without an event's end, once. */
  private readRest(): void {
    if (this.restRead) return;
    this.restRead = true;
    this.translate(this.decoder.end(), true);
  }

  private translate(text: string, last: boolean): Buffer {
    const events = splitEvents(this.pending + text);
    this.pending = last ? "" : events.pop()!;
    for (const event of events) this.translateEvent(event);
    return last ? EMPTY : this.events.take();
  }

  private translateEvent(event: string): void {
    if (this.ended) return;
    const data = eventData(event);
    if (data === "") return;
    if (!this.started) {
      this.started = true;
      this.builder.start();
    }
    if (data === "[DONE]") {
      this.ended = true;
      this.final = this.builder.finish(this.finishReason, this.found, this.cached);
      return;
    }
    let chunk: { choices?: ChatChoice[]; usage?: unknown; error?: unknown };
    try {
      chunk = JSON.parse(data) as typeof chunk;
    } catch {
      return;
    }
    // Whatever an upstream sends (null, a number) must not throw here: see relay.ts's rewrite.
    if (typeof chunk !== "object" || chunk === null) return;
    if (chunk.error !== undefined) {
      // The upstream's own error event: said in the Responses API's words, and the stream is over.
      this.ended = true;
      const inner = chunk.error as { message?: unknown; code?: unknown } | null;
      const message =
        typeof inner?.message === "string" ? inner.message : typeof chunk.error === "string" ? chunk.error : "The model server reported an error.";
      this.events.out += this.events.failure({ message, code: typeof inner?.code === "string" ? inner.code : "upstream_failed" });
      return;
    }
    const usage = readTokenUsage(chunk.usage);
    if (usage !== null) {
      this.found = usage;
      this.cached = cachedTokensOf(chunk.usage);
    }
    const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : undefined;
    if (typeof choice !== "object" || choice === null) return;
    feed(this.builder, choice.delta);
    if (choice.finish_reason != null) this.finishReason = choice.finish_reason;
  }
}
