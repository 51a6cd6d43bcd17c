// The shapes of OpenAI's Responses API that llmgw writes and keeps: items (what a
// conversation is made of: messages, function calls and their outputs), the response
// object, and its usage. Only what llmgw produces or reads is typed; the rest of a
// client's item passes as it came.
import { randomUUID } from "node:crypto";

/** An input item as kept and listed by input_items: its type, its id, and its fields. */
export type StoredItem = { id: string; type: string } & Record<string, unknown>;

export interface OutputText {
  type: "output_text";
  text: string;
  annotations: unknown[];
  logprobs: unknown[];
}

export interface MessageItem {
  id: string;
  type: "message";
  status: "in_progress" | "completed" | "incomplete";
  role: "assistant";
  content: OutputText[];
}

export interface FunctionCallItem {
  id: string;
  type: "function_call";
  status: "in_progress" | "completed" | "incomplete";
  call_id: string;
  name: string;
  arguments: string;
}

export type OutputItem = MessageItem | FunctionCallItem;

export interface ResponseUsage {
  input_tokens: number;
  input_tokens_details: { cached_tokens: number };
  output_tokens: number;
  output_tokens_details: { reasoning_tokens: number };
  total_tokens: number;
}

export type ResponseStatus = "in_progress" | "completed" | "incomplete" | "failed";

/** The response object: what the request asked (echoed), what was generated, and its usage. */
export interface ResponseObject {
  id: string;
  object: "response";
  created_at: number;
  status: ResponseStatus;
  error: null;
  incomplete_details: { reason: "max_output_tokens" | "content_filter" } | null;
  output: OutputItem[];
  usage: ResponseUsage | null;
  [echoed: string]: unknown;
}

/**
 * An id in OpenAI's style: a prefix naming the kind, then 32 random hex digits. From
 * randomUUID, which draws on a cached pool: a randomBytes call per id cost ~10 µs of a
 * response's path (bench/gateway/apis.ts's profile).
 */
export function newId(prefix: "resp" | "msg" | "fc" | "fco" | "call"): string {
  return `${prefix}_${randomUUID().replaceAll("-", "")}`;
}
