// The readiness check that an engine enforces the key it was started with. The engines
// llmgw runs bind to the node's address, where anything on the network can reach them;
// the per-replica engine key is what keeps everyone but the gateway out (DESIGN.md
// "Engine supervision"). Each engine takes its key in its own way (llama-server from
// LLAMA_API_KEY, vLLM from VLLM_API_KEY), and a build that does not read that variable
// starts without any key and serves everyone, silently. So before a replica is ready, a
// guarded route must refuse a request without the key (401) and answer one with it (200).
// It complements `openAiModelsValidator`: llama-server's /v1/models is one of its public
// routes and answers without a key, so listing the model there proves nothing about the key.
import { Agent, request } from "undici";
import { LlmgwError, errorCode } from "../core/errors.ts";
import { formatHost } from "../core/format.ts";
import type { EngineValidator } from "../agent/supervisor-options.ts";

export interface EngineKeyCheckOptions {
  /** The attempt's engine key. Never printed. */
  key: string;
  /** A cheap GET route the engine guards with its key (llama-server: /props; vLLM: /v1/models). */
  path: string;
  /** Deadline of each request. Default 5 000 ms. */
  timeoutMs?: number;
}

/** A validator: GET `path` without a key must answer 401, and with the key 200. */
export function engineKeyCheck(options: EngineKeyCheckOptions): EngineValidator {
  const timeoutMs = options.timeoutMs ?? 5_000;
  const fail = (message: string): LlmgwError => new LlmgwError({ code: "validation_failed", status: 502, message });
  return async ({ host, port, signal }) => {
    const url = `http://${formatHost(host)}:${port}${options.path}`;
    // A plain Agent: never an HTTP(S)_PROXY from the agent's environment.
    const agent = new Agent({ connect: { timeout: timeoutMs } });
    const status = async (headers: Record<string, string>): Promise<number> => {
      try {
        const response = await request(url, {
          method: "GET",
          dispatcher: agent,
          headers,
          headersTimeout: timeoutMs,
          bodyTimeout: timeoutMs,
          signal: AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]),
        });
        await response.body.dump();
        return response.statusCode;
      } catch (error) {
        throw fail(`GET ${url} failed (${errorCode(error) ?? "no answer"}) while checking that the engine enforces its key.`);
      }
    };
    try {
      const without = await status({ accept: "application/json" });
      if (without !== 401) {
        throw fail(
          `GET ${url} without a key answered HTTP ${without} instead of 401: the engine does not enforce the key it was given, so anyone who can reach ` +
            `${formatHost(host)}:${port} could use it. Check that this engine version reads its key from the environment.`,
        );
      }
      const withKey = await status({ accept: "application/json", authorization: `Bearer ${options.key}` });
      if (withKey !== 200) {
        throw fail(
          `GET ${url} with this attempt's engine key answered HTTP ${withKey} instead of 200: the engine was started with another key or is not the engine this attempt started.`,
        );
      }
    } finally {
      await agent.destroy().catch(() => undefined);
    }
  };
}

/** Runs validators one after another; the first failure fails the attempt. */
export function allOf(...validators: EngineValidator[]): EngineValidator {
  return async (context) => {
    for (const validate of validators) await validate(context);
  };
}
