// Guard models on the request path: the RequestGuards the gateway asks before a replica
// gets a request (the serving model's `guards.input`) and, for answers that are not
// streamed, before the client gets the answer (`guards.output`). Each guard is a catalog
// model with role guard, asked through the gateway's own admission (internal-call.ts) in its
// format (guards-formats.ts). The outcomes:
// - unsafe: 400 content_policy_violation naming the guard and the categories;
// - the guard failed, timed out or answered garbage: 503 guard_unavailable (fail closed), or,
//   when that guard says `guard_on_error: allow`, the request passes with a logged warning.
// Several guards on one side are asked at once; an unsafe verdict wins over a failure.
import { performance } from "node:perf_hooks";
import { BadRequestError, ClientClosedError, LlmgwError, UnavailableError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { InternalCaller } from "../gateway/internal-call.ts";
import { GarbledVerdictError, guardRequestBody, parseVerdict, type GuardQuestion, type Turn, type Verdict } from "./guards-formats.ts";
import type { OutputCheck, PolicyRequest, RequestGuards } from "./request-policy.ts";

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

type Outcome = { guard: string; kind: "safe" } | { guard: string; kind: "unsafe"; categories: string[] } | { guard: string; kind: "failed"; reason: string; allow: boolean };

export class GuardModels implements RequestGuards {
  private readonly timeoutMs: number;

  constructor(private readonly options: GuardModelsOptions) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_GUARD_TIMEOUT_MS;
  }

  async checkInput(request: PolicyRequest, signal: AbortSignal): Promise<{ guardMs: number | null; output: OutputCheck | null }> {
    const names = this.namesFor(request);
    // Embeddings have no text answer to judge, and streams are never held back.
    const outputNames = request.endpoint === "/v1/embeddings" || request.body.stream === true ? [] : names.output;
    if (names.input.length === 0 && outputNames.length === 0) return { guardMs: null, output: null };
    const turns = clientTurns(request);
    let guardMs: number | null = null;
    if (names.input.length > 0) {
      const started = performance.now();
      await this.judge(names.input, { check: "input", turns }, request, signal);
      guardMs = Math.round(performance.now() - started);
    }
    const output: OutputCheck | null =
      outputNames.length === 0
        ? null
        : async (answer) => {
            const reply = replyText(answer, request.endpoint);
            // A reply without text (tool calls only) gives a text guard nothing to judge.
            if (reply === null || reply.trim() === "") return;
            await this.judge(outputNames, { check: "output", turns: [...turns, { role: "assistant", text: reply }] }, request, signal);
          };
    return { guardMs, output };
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
    try {
      const answer = await this.options.ask({ model: guard, body: guardRequestBody(format, question), timeoutMs: this.timeoutMs, signal });
      const text = answerText(answer);
      if (text === null) return { guard: guard.name, kind: "failed", reason: "its answer has no message text", allow };
      const verdict: Verdict = parseVerdict(format, text);
      return verdict.safe ? { guard: guard.name, kind: "safe" } : { guard: guard.name, kind: "unsafe", categories: verdict.categories };
    } catch (error) {
      if (signal.aborted || (error instanceof LlmgwError && error.code === "client_closed")) throw new ClientClosedError();
      if (!(error instanceof LlmgwError) && !(error instanceof GarbledVerdictError)) this.options.logger.error({ err: error, guard: guard.name }, "unexpected error asking a guard model");
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
 * What the client sent, as the conversation a guard reads: chat messages in order (the
 * assistant's turns as the model's side, every other role as the client's: system,
 * developer and tool text is client-controlled too), a completions prompt or embeddings
 * input as one client turn. Token ids cannot be read by a text guard, so a guarded model
 * refuses them rather than let them pass unchecked; image and audio parts are not judged.
 */
function clientTurns(request: PolicyRequest): Turn[] {
  const body = request.body as Record<string, unknown>;
  if (request.endpoint === "/v1/chat/completions") {
    const turns: Turn[] = [];
    for (const message of (body.messages as { role: string; content?: unknown }[] | undefined) ?? []) {
      const text = contentText(message.content);
      if (text !== "") turns.push({ role: message.role === "assistant" ? "assistant" : "user", text });
    }
    return turns;
  }
  const field = request.endpoint === "/v1/embeddings" ? "input" : "prompt";
  const value = body[field];
  const texts = typeof value === "string" ? [value] : Array.isArray(value) && value.every((item) => typeof item === "string") ? (value as string[]) : null;
  if (texts === null) {
    throw new BadRequestError(`Model '${request.model.name}' is checked by guard models, which read text: send '${field}' as a string or an array of strings, not token ids.`, {
      code: "invalid_field",
      param: field,
    });
  }
  return [{ role: "user", text: texts.join("\n\n") }];
}

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((part) => ((part as { type?: unknown }).type === "text" && typeof (part as { text?: unknown }).text === "string" ? (part as { text: string }).text : ""))
    .filter((text) => text !== "")
    .join("\n");
}

/** The generated text of a whole JSON answer (chat or completions), or null when there is none. */
function replyText(answer: Buffer, endpoint: string): string | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(answer.toString("utf8"));
  } catch {
    // Not JSON: nothing a guard could judge, and a broken answer is the client's to see.
    return null;
  }
  const choice = (parsed as { choices?: { message?: { content?: unknown }; text?: unknown }[] } | null)?.choices?.[0];
  const text = endpoint === "/v1/completions" ? choice?.text : choice?.message?.content;
  return typeof text === "string" ? text : null;
}
