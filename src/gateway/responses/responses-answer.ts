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

const EMPTY = Buffer.alloc(0);
const EVENT_END = /\r?\n\r?\n/;

/** What every answer to one request shares: the response's identity and echo, and where a finished one is kept. */
export interface ResponseTarget {
  head: ResponseHead;
  /** Keeps the finished response (never rejects); null when the request said store: false. */
  keep: ((response: ResponseObject) => Promise<void>) | null;
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
  if (part === undefined || part === null) return;
  if (typeof part.content === "string") builder.text(part.content);
  if (!Array.isArray(part.tool_calls)) return;
  part.tool_calls.forEach((call, position) => {
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

  write = (event: ResponseEvent): void => {
    this.out += sseNamedEvent(event.type, { ...event, sequence_number: this.sequence++ });
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
  private settled: { body: Buffer; final: ResponseObject | null } | null = null;
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

  async beforeEnd(): Promise<void> {
    const { final } = this.settle();
    if (final !== null && this.target.keep !== null) await this.target.keep(final);
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

  head(): { status: number; contentType: string } {
    const events = this.events !== null && this.status >= 200 && this.status < 300;
    return { status: this.status, contentType: events ? "text/event-stream" : "application/json" };
  }

  /** Reads the held answer once. */
  private settle(): { body: Buffer; final: ResponseObject | null } {
    if (this.settled !== null) return this.settled;
    const raw = Buffer.concat(this.chunks);
    this.chunks.length = 0;
    if (this.status < 200 || this.status >= 300) {
      this.settled = { body: raw, final: null };
      return this.settled;
    }
    const completion = parseCompletion(raw);
    const choice = Array.isArray(completion?.choices) ? completion.choices[0] : undefined;
    if (completion === null || typeof choice !== "object" || choice === null) {
      this.status = 502;
      const message = `The model server's answer was not a chat completion, so it cannot be given as a response (it began: ${JSON.stringify(raw.toString("utf8").slice(0, 120))}). Retry; if it persists, tell an administrator.`;
      this.settled = { body: Buffer.from(JSON.stringify({ error: { message, type: "server_error", param: null, code: "upstream_bad_answer" } })), final: null };
      return this.settled;
    }
    this.found = readTokenUsage(completion.usage);
    const builder = new ResponseBuilder(this.target.head, this.events?.write);
    if (this.events !== null) builder.start();
    feed(builder, choice.message);
    const final = builder.finish(choice.finish_reason, this.found, cachedTokensOf(completion.usage));
    this.settled = { body: this.events === null ? Buffer.from(JSON.stringify(final), "utf8") : this.events.take(), final };
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

  constructor(private readonly target: ResponseTarget) {
    this.builder = new ResponseBuilder(target.head, this.events.write);
  }

  push(chunk: Buffer): Buffer {
    return this.translate(this.decoder.write(chunk), false);
  }

  async beforeEnd(): Promise<void> {
    if (this.final !== null && this.target.keep !== null) await this.target.keep(this.final);
  }

  end(): Buffer {
    this.translate(this.decoder.end(), true);
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

  private translate(text: string, last: boolean): Buffer {
    const events = (this.pending + text).split(EVENT_END);
    this.pending = last ? "" : events.pop()!;
    for (const event of events) this.translateEvent(event);
    return last ? EMPTY : this.events.take();
  }

  private translateEvent(event: string): void {
    if (this.ended) return;
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
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
    if (choice === undefined || choice === null) return;
    feed(this.builder, choice.delta);
    if (choice.finish_reason != null) this.finishReason = choice.finish_reason;
  }
}
