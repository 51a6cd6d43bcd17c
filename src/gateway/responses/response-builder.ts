// One response of the Responses API put together from a chat completion's pieces, and the
// stream events that say so as it goes (OpenAI's sequence, which the official SDK's
// stream helper checks as it accumulates):
//   response.created, response.in_progress,
//   per message: response.output_item.added, response.content_part.added,
//     response.output_text.delta..., response.output_text.done, response.content_part.done,
//     response.output_item.done;
//   per function call: response.output_item.added, response.function_call_arguments.delta...,
//     response.function_call_arguments.done, response.output_item.done;
//   response.completed (or response.incomplete when max_output_tokens cut it).
// Text and calls become items in the order they come: a change from one to the other
// closes the open item. The JSON answer (responses-answer.ts) is built by the same steps,
// with nobody listening to the events.
import type { TokenUsage } from "../../core/token-usage.ts";
import { newId, type FunctionCallItem, type MessageItem, type OutputItem, type ResponseObject, type ResponseUsage } from "./response-types.ts";

export type ResponseEvent = { type: string } & Record<string, unknown>;

/** The request's fields a response echoes, and its identity. */
export interface ResponseHead {
  id: string;
  createdAt: number;
  /** instructions, model, tools, tool_choice, text, ... as the response object shows them. */
  echo: Record<string, unknown>;
}

/** A piece of a tool call in a chat stream: the first names the call, the rest add to its arguments. */
export interface ToolCallPiece {
  index: number;
  id?: string | undefined;
  name?: string | undefined;
  arguments?: string | undefined;
}

export class ResponseBuilder {
  private readonly output: OutputItem[] = [];
  /** The item text or arguments are being added to, and its place in output. */
  private open: { item: OutputItem; index: number } | null = null;
  /** Chat tool-call index → its item (a stream's pieces name the call by its index). */
  private readonly calls = new Map<number, FunctionCallItem>();
  private final: ResponseObject | null = null;

  constructor(
    private readonly head: ResponseHead,
    private readonly emit: (event: ResponseEvent) => void = () => undefined,
  ) {}

  /** The response as it stands, with `status`. */
  snapshot(status: ResponseObject["status"], usage: ResponseUsage | null = null, incomplete: ResponseObject["incomplete_details"] = null): ResponseObject {
    return {
      id: this.head.id,
      object: "response",
      created_at: this.head.createdAt,
      status,
      background: false,
      error: null,
      incomplete_details: incomplete,
      ...this.head.echo,
      output: status === "in_progress" ? [] : this.output,
      usage,
    };
  }

  start(): void {
    const response = this.snapshot("in_progress");
    this.emit({ type: "response.created", response });
    this.emit({ type: "response.in_progress", response });
  }

  text(delta: string): void {
    if (delta === "") return;
    let open = this.open;
    if (open === null || open.item.type !== "message") {
      this.close();
      const item: MessageItem = { id: newId("msg"), type: "message", status: "in_progress", role: "assistant", content: [] };
      open = this.add(item);
      const part = { type: "output_text" as const, text: "", annotations: [], logprobs: [] };
      item.content.push(part);
      this.emit({ type: "response.content_part.added", item_id: item.id, output_index: open.index, content_index: 0, part: { ...part } });
    }
    const item = open.item as MessageItem;
    item.content[0]!.text += delta;
    this.emit({ type: "response.output_text.delta", item_id: item.id, output_index: open.index, content_index: 0, delta, logprobs: [] });
  }

  toolCall(piece: ToolCallPiece): void {
    let item = this.calls.get(piece.index);
    if (item === undefined) {
      this.close();
      item = { id: newId("fc"), type: "function_call", status: "in_progress", call_id: piece.id || newId("call"), name: piece.name ?? "", arguments: "" };
      this.calls.set(piece.index, item);
      this.add(item);
    } else if (this.open?.item !== item) {
      // Pieces of an earlier call after another began: chat streams send each call whole in turn, so this is only a late name.
      if (piece.name) item.name = piece.name;
    }
    const delta = piece.arguments ?? "";
    if (delta === "") return;
    item.arguments += delta;
    const index = this.output.indexOf(item);
    this.emit({ type: "response.function_call_arguments.delta", item_id: item.id, output_index: index, delta });
  }

  /**
   * The generation ended: open items close, and the response is final (completed, or
   * incomplete when it stopped at max_output_tokens). Its completion event waits for
   * `completedEvent`, so that a kept response is written before the client hears of it.
   */
  finish(finishReason: unknown, usage: TokenUsage | null, cachedTokens = 0): ResponseObject {
    if (this.final !== null) return this.final;
    const incomplete: ResponseObject["incomplete_details"] =
      finishReason === "length" ? { reason: "max_output_tokens" } : finishReason === "content_filter" ? { reason: "content_filter" } : null;
    this.close(incomplete === null ? "completed" : "incomplete");
    this.final = this.snapshot(incomplete === null ? "completed" : "incomplete", responseUsage(usage, cachedTokens), incomplete);
    return this.final;
  }

  /** The last event: response.completed, or response.incomplete. */
  completedEvent(): ResponseEvent | null {
    if (this.final === null) return null;
    return { type: this.final.status === "completed" ? "response.completed" : "response.incomplete", response: this.final };
  }

  private add<T extends OutputItem>(item: T): { item: T; index: number } {
    const index = this.output.push(item) - 1;
    this.open = { item, index };
    this.emit({ type: "response.output_item.added", output_index: index, item: item.type === "message" ? { ...item, content: [] } : { ...item } });
    return { item, index };
  }

  /** Closes the open item with its done events. */
  private close(status: "completed" | "incomplete" = "completed"): void {
    const open = this.open;
    if (open === null) return;
    this.open = null;
    const { item, index } = open;
    item.status = status;
    if (item.type === "message") {
      const part = item.content[0]!;
      this.emit({ type: "response.output_text.done", item_id: item.id, output_index: index, content_index: 0, text: part.text, logprobs: [] });
      this.emit({ type: "response.content_part.done", item_id: item.id, output_index: index, content_index: 0, part });
    } else {
      this.emit({ type: "response.function_call_arguments.done", item_id: item.id, output_index: index, name: item.name, arguments: item.arguments });
    }
    this.emit({ type: "response.output_item.done", output_index: index, item });
  }
}

/** A chat completion's usage in the Responses API's words. */
export function responseUsage(usage: TokenUsage | null, cachedTokens = 0): ResponseUsage | null {
  if (usage === null) return null;
  return {
    input_tokens: usage.prompt_tokens,
    input_tokens_details: { cached_tokens: cachedTokens },
    output_tokens: usage.completion_tokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: usage.prompt_tokens + usage.completion_tokens,
  };
}

/** The cached prompt tokens a chat completion's usage reports (llama-server and vLLM say so in prompt_tokens_details). */
export function cachedTokensOf(usage: unknown): number {
  const details = (usage as { prompt_tokens_details?: { cached_tokens?: unknown } } | null | undefined)?.prompt_tokens_details;
  const cached = details?.cached_tokens;
  return typeof cached === "number" && Number.isSafeInteger(cached) && cached >= 0 ? cached : 0;
}
