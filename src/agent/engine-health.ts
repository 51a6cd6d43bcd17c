// Is the engine up, and is it still up? Readiness polls the engine's health path until it
// answers 200 (llama-server and the bundled engine answer 503 while loading; vLLM refuses
// connections until up) and then runs the launch's validation of what the engine reports:
// a bare 200 is not enough, since a foreign server on a reused port, or an engine started
// with another key, answers /health too. Liveness checks the same path at an interval
// once ready, and several failures in a row count as a failure of the engine. Every
// request goes over the caller's plain undici Agent, never a proxy from the environment.
import { type Agent, request } from "undici";
import { describeError, errorCode } from "../core/errors.ts";

type Probe = { ok: true } | { ok: false; detail: string };

export interface HealthTarget {
  /** A plain Agent of the attempt (no HTTP(S)_PROXY from the agent's environment). */
  agent: Agent;
  /** The engine's health URL. */
  url: string;
  /** Timeout of one health request (connect + headers). */
  timeoutMs: number;
}

export type Readiness =
  | { ready: true }
  /** Not ready: the validation failed (validationError), or the signal ended the wait (lastObservation says what the engine last answered). */
  | { ready: false; validationError: string | null; lastObservation: string };

/**
 * Polls `target` every `intervalMs` until it answers 200 and `validate` (if any) resolves,
 * or `signal` aborts (stop, the engine's exit, the attempt's deadline: the caller knows
 * which). Gives up at the first validation failure.
 */
export async function awaitReadiness(options: {
  target: HealthTarget;
  intervalMs: number;
  signal: AbortSignal;
  validate?: (signal: AbortSignal) => Promise<void>;
}): Promise<Readiness> {
  const { target, signal } = options;
  let lastObservation = "no answer yet";
  while (!signal.aborted) {
    const probe = await probeHealth(target, signal);
    if (signal.aborted) break;
    if (probe.ok) {
      if (options.validate === undefined) return { ready: true };
      try {
        await options.validate(signal);
        return { ready: true };
      } catch (error) {
        // Aborted by stop(), the engine's exit or the deadline: the caller says why.
        if (signal.aborted) return { ready: false, validationError: null, lastObservation: `HTTP 200, validation unfinished: ${describeError(error)}` };
        return { ready: false, validationError: describeError(error), lastObservation: "HTTP 200" };
      }
    }
    lastObservation = probe.detail;
    await abortableDelay(options.intervalMs, signal);
  }
  return { ready: false, validationError: null, lastObservation };
}

/**
 * Checks `target` every `intervalMs` while the engine serves. Returns the number of failed
 * checks and the last one's detail once `failuresInARow` checks failed in a row, or null
 * when `signal` aborts first (stop, or the engine's exit).
 */
export async function watchLiveness(options: {
  target: HealthTarget;
  intervalMs: number;
  failuresInARow: number;
  signal: AbortSignal;
}): Promise<{ failedChecks: number; detail: string } | null> {
  const { target, signal } = options;
  let failedChecks = 0;
  while (!signal.aborted) {
    await abortableDelay(options.intervalMs, signal);
    if (signal.aborted) break;
    const probe = await probeHealth(target, signal);
    if (signal.aborted) break;
    if (probe.ok) {
      failedChecks = 0;
      continue;
    }
    failedChecks += 1;
    if (failedChecks >= options.failuresInARow) return { failedChecks, detail: probe.detail };
  }
  return null;
}

/** Waits `ms`, or less when `signal` aborts; its timer is cleared either way. */
export function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolveDelay) => {
    if (signal.aborted) return resolveDelay();
    const done = (): void => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolveDelay();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

async function probeHealth(target: HealthTarget, signal: AbortSignal): Promise<Probe> {
  const { agent, url, timeoutMs } = target;
  try {
    const response = await request(url, { method: "GET", dispatcher: agent, headersTimeout: timeoutMs, bodyTimeout: timeoutMs, signal });
    await response.body.dump();
    if (response.statusCode === 200) return { ok: true };
    return { ok: false, detail: `HTTP ${response.statusCode}` };
  } catch (error) {
    const code = errorCode(error);
    if (code === "ECONNREFUSED") return { ok: false, detail: "connection refused" };
    if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_CONNECT_TIMEOUT") return { ok: false, detail: `no answer within ${timeoutMs} ms` };
    return { ok: false, detail: code ? `${code}: ${describeError(error)}` : describeError(error) };
  }
}
