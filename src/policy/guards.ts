// Guard models on the request path: the RequestGuards the gateway asks before a replica
// gets a request (the serving model's `guards.input`) and, for answers that are not
// streamed, before the client gets the answer (`guards.output`). Each guard is a catalog
// model with role guard, asked through the gateway's own admission (internal-call.ts) in its
// format (guards-formats.ts). The outcomes:
// - unsafe: 400 content_policy_violation naming the guard and the categories;
// - the guard failed, timed out or answered garbage: 503 guard_unavailable (fail closed), or,
//   when that guard says `guard_on_error: allow`, the request passes with a logged warning;
// - the text is longer than the guard can read (its context, known up front or said by its
//   HTTP 400): 400 guard_input_too_long whatever guard_on_error says, since a client could
//   otherwise make the guard fail on purpose and pass under allow;
// - a stream with output guards: 400 output_guard_needs_whole_answer, unless the model says
//   `output_guard_streams: unchecked`.
// Several guards on one side are asked at once; unsafe wins over too long, which wins over a
// failure.
import { performance } from "node:perf_hooks";
import { BadRequestError, ClientClosedError, LlmgwError, UPSTREAM_REFUSED_INPUT, UnavailableError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { GarbledVerdictError, guardRequestBody, parseVerdict, type GuardQuestion, type Verdict } from "./guards-formats.ts";
import type { InternalCaller, OutputCheck, PolicyRequest, RequestGuards } from "./request-policy.ts";

/** How long one guard model may take on one check (a wait in its queue included) unless the server says otherwise. */
export const DEFAULT_GUARD_TIMEOUT_MS = 10_000;

/** The guard model names that apply to a request, on each side. */
export interface GuardNames {
  input: readonly string[];
  output: readonly string[];
}

export interface GuardModelsOptions {
  /** Resolves guard names (and aliases) to catalog models, at the time of each request. */
  catalog: { resolve(nameOrAlias: string): CatalogModel | undefined };
  /** Sends a guard its question (the gateway's callModel). */
  ask: InternalCaller;
  logger: Logger;
  timeoutMs?: number;
  /** Guards a key adds to its models' own (the key's `guards`); none when absent. */
  keyGuards?: (request: PolicyRequest) => GuardNames | null;
}

type Outcome =
  | { guard: string; kind: "safe" }
  | { guard: string; kind: "unsafe"; categories: string[] }
  | { guard: string; kind: "too-long"; contextTokens: number | null; detail: string }
  | { guard: string; kind: "failed"; reason: string; allow: boolean };

/**
 * The most UTF-8 bytes one token covers in text a client would send, for the up-front
 * length check: English averages about 4 bytes a token and code about 3; 16 leaves room
 * for runs of spaces or dashes that some vocabularies keep as one token, so a prompt this
 * check refuses cannot fit. Shorter prompts that still do not fit get the guard's own 400.
 */
const MAX_BYTES_PER_TOKEN = 16;

export class GuardModels implements RequestGuards {
  private readonly timeoutMs: number;

  constructor(private readonly options: GuardModelsOptions) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_GUARD_TIMEOUT_MS;
  }

  async checkInput(request: PolicyRequest, signal: AbortSignal): Promise<{ guardMs: number | null; output: OutputCheck | null }> {
    const names = this.namesFor(request);
    // Embeddings have no text answer to judge.
    let outputNames = request.endpoint === "/v1/embeddings" ? [] : names.output;
    if (outputNames.length > 0 && request.body.stream === true) {
      // The model's administrator may choose streams without the model's own output check
      // (README); a key's output guards are the key's policy, which a model's setting must
      // not weaken, so they still refuse streams.
      const keyOutput = this.options.keyGuards?.(request)?.output ?? [];
      const unchecked = request.model.definition.output_guard_streams === "unchecked";
      const refusing = unchecked ? outputNames.filter((name) => keyOutput.includes(name)) : outputNames;
      if (refusing.length > 0) {
        const whose = unchecked ? `The key '${request.principal.name}' has output guards` : `Model '${request.model.name}' has output guards`;
        throw new BadRequestError(
          `${whose} (${refusing.map((name) => `'${name}'`).join(", ")}), which check the whole answer before any of it is sent, so its answers cannot be streamed. Send "stream": false.`,
          { code: "output_guard_needs_whole_answer", param: "stream" },
        );
      }
      outputNames = [];
    }
    if (names.input.length === 0 && outputNames.length === 0) return { guardMs: null, output: null };
    const client = clientTexts(request);
    let guardMs: number | null = null;
    // A request with no text at all (an empty message list) gives a guard nothing to judge.
    if (names.input.length > 0 && client.some((text) => text.trim() !== "")) {
      const started = performance.now();
      await this.judge(names.input, { check: "input", client }, request, signal);
      guardMs = Math.round(performance.now() - started);
    }
    const output: OutputCheck | null =
      outputNames.length === 0
        ? null
        : async (answer) => {
            const reply = replyText(answer, request.endpoint);
            // An answer without any text gives a text guard nothing to judge.
            if (reply === null) return;
            await this.judge(outputNames, { check: "output", client, answer: reply }, request, signal);
          };
    return { guardMs, output };
  }

  applies(request: PolicyRequest): boolean {
    const own = request.model.definition.guards;
    const key = this.options.keyGuards?.(request);
    return (own?.input?.length ?? 0) + (own?.output?.length ?? 0) + (key?.input?.length ?? 0) + (key?.output?.length ?? 0) > 0;
  }

  private namesFor(request: PolicyRequest): GuardNames {
    const own = request.model.definition.guards;
    const key = this.options.keyGuards?.(request) ?? null;
    const merge = (a: readonly string[] = [], b: readonly string[] = []) => [...new Set([...a, ...b])];
    return { input: merge(own?.input, key?.input), output: merge(own?.output, key?.output) };
  }

  /** Asks every guard at once; throws the refusal (unsafe first) or passes. */
  private async judge(names: readonly string[], question: GuardQuestion, request: PolicyRequest, signal: AbortSignal): Promise<void> {
    const outcomes = await Promise.all(names.map((name) => this.ask(name, question, signal)));
    if (signal.aborted) throw new ClientClosedError();
    const unsafe = outcomes.find((outcome) => outcome.kind === "unsafe");
    if (unsafe !== undefined) {
      const what = question.check === "input" ? "the request has unsafe content" : "the answer has unsafe content";
      const categories = unsafe.categories.length === 0 ? "no category given" : unsafe.categories.join(", ");
      throw new BadRequestError(`Refused by guard model '${unsafe.guard}': ${what} (${categories}).`, { code: "content_policy_violation" });
    }
    const tooLong = outcomes.find((outcome) => outcome.kind === "too-long");
    if (tooLong !== undefined) {
      const what = question.check === "input" ? "request" : "answer";
      const limit = tooLong.contextTokens === null ? "" : ` (its context is ${tooLong.contextTokens} tokens)`;
      const nextStep = question.check === "input" ? "Send a shorter request (fewer or shorter messages)" : "Ask for a shorter answer (a lower max_tokens)";
      throw new BadRequestError(
        `Guard model '${tooLong.guard}' cannot read the whole ${what}: it is longer than the guard can judge${limit}; ${tooLong.detail}. ${nextStep}, or ask an administrator for a guard with a longer context.`,
        { code: "guard_input_too_long" },
      );
    }
    for (const outcome of outcomes) {
      if (outcome.kind !== "failed") continue;
      const detail = { guard: outcome.guard, model: request.model.name, check: question.check, reason: outcome.reason };
      if (outcome.allow) {
        this.options.logger.warn(detail, "guard model failed; the request passes (guard_on_error allow)");
        continue;
      }
      this.options.logger.warn(detail, "guard model failed; the request is refused (fail closed)");
      throw new UnavailableError(
        `Guard model '${outcome.guard}' could not check the ${question.check === "input" ? "request" : "answer"} (${outcome.reason}), so it was refused. Retry shortly; if it persists, tell an administrator.`,
        { code: "guard_unavailable", retryAfterSeconds: 5 },
      );
    }
  }

  /** One guard's verdict, or why it gave none. Never throws, except when the client left. */
  private async ask(name: string, question: GuardQuestion, signal: AbortSignal): Promise<Outcome> {
    const guard = this.options.catalog.resolve(name);
    if (guard === undefined || guard.definition.role !== "guard" || guard.definition.guard_format === undefined) {
      // The catalog refuses such references; another server's change may still race it.
      return { guard: name, kind: "failed", reason: guard === undefined ? "it is not in the catalog" : "it is no longer a guard model", allow: false };
    }
    const format = guard.definition.guard_format;
    const allow = guard.definition.guard_on_error === "allow";
    const body = guardRequestBody(format, question);
    const contextTokens = guardContextTokens(guard);
    if (contextTokens !== null) {
      const promptBytes = body.messages.reduce((sum, message) => sum + Buffer.byteLength(message.content), 0);
      const fewestTokens = Math.ceil(promptBytes / MAX_BYTES_PER_TOKEN);
      if (fewestTokens > contextTokens) {
        return { guard: guard.name, kind: "too-long", contextTokens, detail: `its prompt would be ${promptBytes} bytes, at least ${fewestTokens} tokens` };
      }
    }
    try {
      const answer = await this.options.ask({ model: guard, body, timeoutMs: this.timeoutMs, signal });
      const text = answerText(answer);
      if (text === null) return { guard: guard.name, kind: "failed", reason: "its answer has no message text", allow };
      const verdict: Verdict = parseVerdict(format, text);
      return verdict.safe ? { guard: guard.name, kind: "safe" } : { guard: guard.name, kind: "unsafe", categories: verdict.categories };
    } catch (error) {
      if (signal.aborted || (error instanceof LlmgwError && error.code === "client_closed")) throw new ClientClosedError();
      // The guard refused the question (HTTP 400/413): the client's text is more than it
      // can read. Whatever guard_on_error says, this is the client's to fix, not an outage.
      if (error instanceof LlmgwError && error.code === UPSTREAM_REFUSED_INPUT)
        return { guard: guard.name, kind: "too-long", contextTokens, detail: `the guard said: ${error.message}` };
      if (!(error instanceof LlmgwError) && !(error instanceof GarbledVerdictError))
        this.options.logger.error({ err: error, guard: guard.name }, "unexpected error asking a guard model");
      return { guard: guard.name, kind: "failed", reason: describeError(error), allow };
    }
  }
}

/** The text of a chat completion's first choice, or null when it has none. */
function answerText(answer: unknown): string | null {
  const content = (answer as { choices?: { message?: { content?: unknown } }[] } | null)?.choices?.[0]?.message?.content;
  return typeof content === "string" ? content : null;
}

/**
 * The tokens a guard can read in one request, when the catalog says: the model's
 * context_length, else the smallest per-request context of its llama.cpp profiles that set
 * ctx_size (shared by `parallel` requests). Null when unknown (an external server).
 */
function guardContextTokens(guard: CatalogModel): number | null {
  if (guard.definition.context_length !== undefined) return guard.definition.context_length;
  const perRequest = guard.definition.profiles.flatMap((profile) =>
    profile.ctx_size === undefined ? [] : [Math.floor(profile.ctx_size / (profile.parallel ?? 1))],
  );
  return perRequest.length === 0 ? null : Math.min(...perRequest);
}

/** Content part types whose text a guard reads, and the field that holds it (OpenAI's and vLLM's). */
const TEXT_PARTS: Readonly<Record<string, string>> = { text: "text", input_text: "text", output_text: "text", refusal: "refusal" };

/**
 * Every piece of text of the request that the client controls and the model reads, in
 * order. For chat that is every message whatever its role: system, developer, user and tool
 * text, and assistant turns too, since a client can write the model's past turns (a
 * prefilled "Step 1:" is the model's voice but the client's words); with them the tool
 * definitions, tool-call arguments, reasoning text and a JSON schema's text. A completions
 * prompt (and suffix) or an embeddings input is the client's text as it is.
 *
 * All of it is judged as one message (GuardQuestion.client), not one guard question per
 * turn: per-turn questions cost a guard call per turn, each re-reading the earlier turns as
 * context (quadratic in the conversation), and a harmful request split across turns
 * ("Explain how to kill a person." … "go on") is judged better whole than turn by turn. The
 * price is a longer prompt, which a guard with a short context refuses
 * (guard_input_too_long).
 *
 * A guard reads only text: token ids, and image, audio or file parts, are refused on a
 * guarded model (400 invalid_field) rather than let through unjudged.
 */
function clientTexts(request: PolicyRequest): string[] {
  const body = request.body as Record<string, unknown>;
  if (request.endpoint === "/v1/chat/completions") {
    const texts: string[] = [];
    const messages = Array.isArray(body.messages) ? (body.messages as Record<string, unknown>[]) : [];
    messages.forEach((message, index) => {
      texts.push(...contentTexts(request, message.content, `messages.${index}.content`));
      for (const field of ["reasoning_content", "reasoning"]) {
        const value = message[field];
        if (typeof value === "string") texts.push(value);
      }
      if (Array.isArray(message.tool_calls)) for (const call of message.tool_calls) texts.push(jsonText((call as { function?: unknown }).function));
      texts.push(jsonText(message.function_call));
    });
    if (Array.isArray(body.tools)) for (const tool of body.tools) texts.push(jsonText((tool as { function?: unknown }).function ?? tool));
    if (Array.isArray(body.functions)) for (const fn of body.functions) texts.push(jsonText(fn));
    texts.push(jsonText((body.response_format as { json_schema?: unknown } | null | undefined)?.json_schema));
    return texts.filter((text) => text !== "");
  }
  const field = request.endpoint === "/v1/embeddings" ? "input" : "prompt";
  const value = body[field];
  const texts = typeof value === "string" ? [value] : Array.isArray(value) && value.every((item) => typeof item === "string") ? [...(value as string[])] : null;
  if (texts === null) {
    throw new BadRequestError(
      `Model '${request.model.name}' is checked by guard models, which read text: send '${field}' as a string or an array of strings, not token ids.`,
      {
        code: "invalid_field",
        param: field,
      },
    );
  }
  if (field === "prompt" && typeof body.suffix === "string") texts.push(body.suffix);
  return texts;
}

/** A message's text parts; any part a text guard cannot read is refused. */
function contentTexts(request: PolicyRequest, content: unknown, param: string): string[] {
  if (typeof content === "string") return [content];
  if (!Array.isArray(content)) return [];
  return content.map((part: unknown, index) => {
    const type = (part as { type?: unknown } | null)?.type;
    const field = typeof type === "string" ? TEXT_PARTS[type] : undefined;
    const text = field === undefined ? undefined : (part as Record<string, unknown>)[field];
    if (typeof text === "string") return text;
    throw new BadRequestError(
      `Model '${request.model.name}' is checked by guard models, which read text only: part ${index} of ${param.replace(/\.content$/, "")} is of type ${JSON.stringify(type ?? null)}, which they cannot judge. Send only text parts (type "text"), or use a model without guards.`,
      { code: "invalid_field", param: `${param}.${index}` },
    );
  });
}

/** Structured client text (tool definitions, call arguments, a schema) as the text a model reads. */
function jsonText(value: unknown): string {
  if (value === undefined || value === null) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

/**
 * All the generated text of a whole JSON answer the client would get, or null when there is
 * none: every choice (llmgw asks for one, but the client gets all an upstream sends), and in chat the content,
 * a refusal, reasoning text and tool-call arguments, which the client reads as well.
 */
function replyText(answer: Buffer, endpoint: string): string | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(answer.toString("utf8"));
  } catch {
    // Not JSON: nothing a guard could judge, and a broken answer is the client's to see.
    return null;
  }
  const choices = (parsed as { choices?: unknown } | null)?.choices;
  if (!Array.isArray(choices)) return null;
  const texts: string[] = [];
  for (const choice of choices as { message?: Record<string, unknown>; text?: unknown }[]) {
    if (endpoint === "/v1/completions") {
      if (typeof choice?.text === "string") texts.push(choice.text);
      continue;
    }
    const message = choice?.message ?? {};
    for (const field of ["content", "refusal", "reasoning_content", "reasoning"]) {
      const value = message[field];
      if (typeof value === "string") texts.push(value);
    }
    if (Array.isArray(message.tool_calls)) for (const call of message.tool_calls) texts.push(jsonText((call as { function?: unknown }).function));
  }
  const text = texts.filter((piece) => piece.trim() !== "").join("\n");
  return text === "" ? null : text;
}
