// The readiness validator for OpenAI-compatible engines (the bundled `llmgw engine`,
// llama-server, vLLM): once an attempt's engine answers its health check, GET /v1/models
// with the attempt's engine key must list the model the attempt was started for. It is
// what tells the supervisor that the server on the port is the engine this attempt
// started, as it was configured (DESIGN.md "Engine supervision": "then validate what it
// reports"); a launch names it as its `validate`.
import { Agent, request, type Dispatcher } from "undici";
import { LlmgwError, describeError, errorCode } from "../core/errors.ts";
import { formatHost, printable } from "../core/format.ts";
import type { EngineValidator } from "../agent/supervisor-options.ts";

export interface OpenAiModelsValidatorOptions {
  /** The engine key this attempt gave the engine; sent as `Authorization: Bearer`. Never printed. */
  key: string;
  /** The model id the engine must list (llmgw engine's --model-name, vLLM's --served-model-name). */
  expectedModel: string;
  /** Path of the model list. Default "/v1/models". */
  path?: string;
  /** Deadline of the whole request (connect, headers, body). Default 5 000 ms. */
  timeoutMs?: number;
}

/** A model list is a few hundred bytes; anything far larger is not the engine we started. */
const MODEL_LIST_MAX_BYTES = 1024 * 1024;

/**
 * A validator for OpenAI-compatible engines (llmgw engine, llama-server, vLLM): GET
 * /v1/models with the attempt's engine key must answer 200 with a `data[].id` list that
 * includes the expected model. It catches what a health check cannot: a foreign server on
 * a reused port (no such route, or no key check), an engine started with another key
 * (401), or one serving another model. Plain undici with its own Agent, so no proxy from
 * the environment is ever used.
 */
export function openAiModelsValidator(options: OpenAiModelsValidatorOptions): EngineValidator {
  const path = options.path ?? "/v1/models";
  const timeoutMs = options.timeoutMs ?? 5_000;
  // A server that echoes what it received must not put the key into lastError.
  const redact = (text: string): string => (options.key === "" ? text : text.split(options.key).join("[redacted]"));
  const fail = (message: string): LlmgwError => new LlmgwError({ code: "validation_failed", status: 502, message: redact(message) });
  return async ({ host, port, signal }) => {
    const url = `http://${formatHost(host)}:${port}${path}`;
    const agent = new Agent({ connect: { timeout: timeoutMs } });
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), timeoutMs);
    try {
      let response: Dispatcher.ResponseData;
      try {
        response = await request(url, {
          method: "GET",
          dispatcher: agent,
          headers: { authorization: `Bearer ${options.key}`, accept: "application/json" },
          headersTimeout: timeoutMs,
          bodyTimeout: timeoutMs,
          signal: AbortSignal.any([signal, timeout.signal]),
        });
      } catch (error) {
        const why = timeout.signal.aborted ? `no answer within ${timeoutMs} ms` : (errorCode(error) ?? describeError(error));
        throw fail(`GET ${url} failed (${why}); the engine did not answer its model list.`);
      }
      const chunks: Buffer[] = [];
      let size = 0;
      try {
        for await (const chunk of response.body as AsyncIterable<Buffer>) {
          size += chunk.length;
          if (size > MODEL_LIST_MAX_BYTES) {
            response.body.destroy();
            throw fail(
              `GET ${url} answered more than ${MODEL_LIST_MAX_BYTES} bytes; that is not a model list, so the server on port ${port} is not the engine this attempt started.`,
            );
          }
          chunks.push(chunk);
        }
      } catch (error) {
        if (error instanceof LlmgwError) throw error;
        throw fail(`GET ${url} failed while reading the answer (${errorCode(error) ?? describeError(error)}).`);
      }
      const text = Buffer.concat(chunks).toString("utf8");
      const status = response.statusCode;
      if (status === 401 || status === 403) {
        throw fail(
          `GET ${url} refused this attempt's engine key (HTTP ${status}): the server on port ${port} was started with another key or is not the engine this attempt started.`,
        );
      }
      if (status !== 200) {
        throw fail(
          `GET ${url} answered HTTP ${status} instead of a model list (${printable(redact(text)) || "empty body"}); the server on port ${port} is not the engine this attempt started, or is not serving yet.`,
        );
      }
      let ids: string[];
      try {
        const body = JSON.parse(text) as { data?: unknown };
        if (!Array.isArray(body.data)) throw new Error("no data array");
        ids = body.data.flatMap((entry: unknown) =>
          typeof entry === "object" && entry !== null && typeof (entry as { id?: unknown }).id === "string" ? [(entry as { id: string }).id] : [],
        );
      } catch {
        throw fail(`GET ${url} answered 200 but not with an OpenAI model list ({"data":[{"id":...}]}): ${printable(redact(text)) || "empty body"}.`);
      }
      if (!ids.includes(options.expectedModel)) {
        const found = ids.length === 0 ? "no models" : ids.map((id) => `'${printable(id)}'`).join(", ");
        throw fail(`GET ${url} lists ${found}, not the expected '${printable(options.expectedModel)}': the engine on port ${port} serves another model.`);
      }
    } finally {
      clearTimeout(timer);
      await agent.destroy().catch(() => undefined);
    }
  };
}
