// Tool calls on node-llama-cpp's LlamaChat (3.21.1): the conversation as its chat
// history (assistant tool calls and the tool messages that answer them become function
// calls with results inside one model response, which is how node-llama-cpp renders
// them, through the model's own template where it defines tool use and its own
// "||call:" syntax otherwise), the functions it may call, a chat wrapper that makes the
// reply start with a call (tool_choice "required" or named), and the collection of the
// calls it makes into OpenAI tool calls, streamed as deltas.
//
// Forcing a call: LlamaChat starts a reply in function-calling mode, with the function
// name under a grammar of the allowed names and then the parameters under their schema's
// grammar, when the wrapper's context state says `functionCall.initiallyEngaged` with no
// triggers to disengage. So even a model that would never call a function makes a
// valid call, from the first sampled token.
import type {
  ChatHistoryItem,
  ChatModelFunctionCall,
  ChatModelFunctions,
  ChatWrapper,
  ChatWrapperGenerateContextStateOptions,
  ChatWrapperGeneratedContextState,
} from "node-llama-cpp";
import { BadRequestError } from "../../core/errors.ts";
import type { ChatMessage } from "./openai-wire.ts";
import { newToolCallId, type ToolCall, type ToolCallDelta, type ToolSpec } from "./structured-wire.ts";

function parseOr<T>(text: string, fallback: T): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return fallback;
  }
}

/**
 * The messages as LlamaChat's history. The calls of an assistant message need their
 * results (node-llama-cpp renders each call with its result), so the tool messages that
 * follow it are folded into it, matched by tool_call_id, as OpenAI requires them to be.
 */
export function toChatHistory(messages: ChatMessage[]): ChatHistoryItem[] {
  const history: ChatHistoryItem[] = [];
  for (let index = 0; index < messages.length; index++) {
    const message = messages[index] as ChatMessage;
    if (message.role === "system") history.push({ type: "system", text: message.content });
    else if (message.role === "user") history.push({ type: "user", text: message.content });
    else if (message.role === "tool") {
      throw new BadRequestError(
        `Invalid request body: field 'messages.${index}': a tool message must follow the assistant message whose tool_calls hold its tool_call_id '${message.toolCallId ?? ""}'.`,
        { code: "invalid_field", param: `messages.${index}.tool_call_id` },
      );
    } else {
      const response: Array<string | ChatModelFunctionCall> = message.content === "" ? [] : [message.content];
      const calls = message.toolCalls ?? [];
      const results = new Map<string, string>();
      while (calls.length > 0 && messages[index + 1]?.role === "tool") {
        const result = messages[++index] as ChatMessage;
        const id = result.toolCallId ?? "";
        if (!calls.some((call) => call.id === id)) {
          throw new BadRequestError(
            `Invalid request body: field 'messages.${index}.tool_call_id': '${id}' is not the id of a tool call of the assistant message before it.`,
            {
              code: "invalid_field",
              param: `messages.${index}.tool_call_id`,
            },
          );
        }
        // A second result for one call would silently replace the first in the prompt.
        if (results.has(id)) {
          throw new BadRequestError(
            `Invalid request body: field 'messages.${index}.tool_call_id': the tool call '${id}' already has its result in an earlier tool message; send one tool message per call.`,
            {
              code: "invalid_field",
              param: `messages.${index}.tool_call_id`,
            },
          );
        }
        results.set(id, result.content);
      }
      for (const [position, call] of calls.entries()) {
        const result = results.get(call.id);
        if (result === undefined) {
          throw new BadRequestError(
            `Invalid request body: field 'messages': the tool call '${call.id}' (${call.name}) has no tool message with its result; send one after the assistant message.`,
            {
              code: "invalid_field",
              param: "messages",
            },
          );
        }
        response.push({
          type: "functionCall",
          name: call.name,
          params: parseOr(call.arguments, call.arguments),
          result: parseOr(result, result),
          startsNewChunk: position === 0,
        });
      }
      history.push({ type: "model", response });
    }
  }
  // LlamaChat generates into the last model item; a trailing assistant message is
  // continued (prefill; after tool results, that is the model answering them), otherwise
  // an empty one starts the reply.
  if (history.at(-1)?.type !== "model") history.push({ type: "model", response: [] });
  return history;
}

export function toChatFunctions(specs: readonly ToolSpec[]): ChatModelFunctions {
  return Object.fromEntries(
    specs.map((spec) => [
      spec.name,
      { ...(spec.description ? { description: spec.description } : {}), ...(spec.parameters ? { params: spec.parameters } : {}) },
    ]),
  );
}

/**
 * The wrapper, documenting `functions` in every prompt it renders. LlamaChat documents
 * the functions it may call; OpenAI's models also see the tools they may not call
 * (tool_choice "none", or one named function), so the documented set is fixed here and
 * LlamaChat is given only the callable ones.
 */
export function documentingFunctions(wrapper: ChatWrapper, functions: ChatModelFunctions): ChatWrapper {
  const documenting = Object.create(wrapper) as ChatWrapper;
  documenting.generateContextState = (options: ChatWrapperGenerateContextStateOptions): ChatWrapperGeneratedContextState =>
    wrapper.generateContextState({ ...options, availableFunctions: functions, documentFunctionParams: true });
  return documenting;
}

/** The wrapper, except that every reply starts with a function call. */
export function forcingFunctionCalls(wrapper: ChatWrapper): ChatWrapper {
  const forced = Object.create(wrapper) as ChatWrapper;
  forced.generateContextState = (options: ChatWrapperGenerateContextStateOptions): ChatWrapperGeneratedContextState => {
    const state = wrapper.generateContextState(options);
    // Prefix triggers decide between text and a call; a forced call has no such choice.
    return {
      contextText: state.contextText,
      stopGenerationTriggers: state.stopGenerationTriggers,
      ...(state.ignoreStartText ? { ignoreStartText: state.ignoreStartText } : {}),
      functionCall: { initiallyEngaged: true, disengageInitiallyEngaged: [] },
    };
  };
  return forced;
}

/**
 * Where the JSON value at the start of a text ends: the arguments LlamaChat streams are
 * followed by the wrapper's call suffix and the grammar's end marker, which are not part
 * of the arguments.
 */
class JsonValueEnd {
  private depth = 0;
  private started = false;
  private inString = false;
  private escaped = false;
  done = false;

  /** The part of `text` that belongs to the value (leading whitespace left out). */
  push(text: string): string {
    let from = -1;
    let to = text.length;
    for (let i = 0; i < text.length && !this.done; i++) {
      const char = text[i] as string;
      if (!this.started) {
        if (/\s/.test(char)) continue;
        this.started = true;
        from = i;
      } else if (from < 0) from = i;
      if (this.inString) {
        if (this.escaped) this.escaped = false;
        else if (char === "\\") this.escaped = true;
        else if (char === '"') this.inString = false;
      } else if (char === '"') this.inString = true;
      else if (char === "{" || char === "[") this.depth++;
      else if (char === "}" || char === "]") {
        this.depth--;
        if (this.depth === 0) {
          this.done = true;
          to = i + 1;
        }
      }
    }
    return from < 0 ? "" : text.slice(from, to);
  }
}

/**
 * Turns LlamaChat's function-call callbacks into OpenAI tool calls: an id per call, the
 * arguments exactly as generated, and, for streams, a first delta with id and name and
 * then the arguments in the pieces they were generated in.
 */
export class ToolCallCollector {
  readonly calls: ToolCall[] = [];
  private readonly ends: JsonValueEnd[] = [];
  private finished = 0;

  constructor(private readonly onDelta?: (delta: ToolCallDelta) => void) {}

  /** LlamaChat's onFunctionCallParamsChunk. */
  paramsChunk(chunk: { callIndex: number; functionName: string; paramsChunk: string }): void {
    const call = this.open(chunk.callIndex, chunk.functionName);
    const piece = (this.ends[chunk.callIndex] as JsonValueEnd).push(chunk.paramsChunk);
    if (piece === "") return;
    call.arguments += piece;
    this.onDelta?.({ index: chunk.callIndex, arguments: piece });
  }

  /** LlamaChat's onFunctionCall: the call is complete. */
  functionCall(call: { functionName: string; params: unknown }): void {
    const index = this.finished++;
    const made = this.open(index, call.functionName);
    if (made.arguments === "") {
      // A function without parameters streams none; its arguments are an empty object.
      made.arguments = JSON.stringify(call.params ?? {});
      this.onDelta?.({ index, arguments: made.arguments });
    }
  }

  /**
   * The calls of the reply, a call that max_tokens cut off included, with the arguments
   * generated until then. OpenAI does the same: an answer that ends with finish_reason
   * "length" in the middle of a call carries that call with its truncated arguments, in a
   * stream (as deltas, which cannot be taken back) and without one alike; so the two
   * forms of one request give the same calls, and the finish reason tells the client
   * that the last call's arguments are incomplete.
   */
  made(): ToolCall[] {
    return [...this.calls];
  }

  private open(index: number, name: string): ToolCall {
    const existing = this.calls[index];
    if (existing) return existing;
    const call: ToolCall = { id: newToolCallId(), name, arguments: "" };
    this.calls[index] = call;
    this.ends[index] = new JsonValueEnd();
    this.onDelta?.({ index, id: call.id, name });
    return call;
  }
}
