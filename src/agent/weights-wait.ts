// Waiting for weights that cannot be had right now. A replica's weights come from the
// server's mirror (weight-cache.ts); when no server can send them at the moment (the
// server answers 503 because no holder runs and it is fetching the file from its origin,
// the server cannot be reached, the link drops mid-file), nothing is wrong with the
// engine, and counting that as an engine failure would park a model whose engine never
// ran. So the agent waits instead: it tries again with backoff (src/core/backoff.ts), says
// why in the replica's state ("waiting for weights: …", what `ctl model show` and the
// console show), and resumes a partial file where it stopped. Only what a later try cannot
// change ends the wait as a failure (a sha256 mismatch, a full disk, a refused credential,
// a file the server no longer has): those count, back off and park as before.
import { backoffDelay, type BackoffPolicy } from "../core/backoff.ts";
import { UpstreamError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { abortableDelay } from "./engine-health.ts";
import type { WaitingNote } from "./supervisor-options.ts";

/** Tries again after 1 s, doubling to 10 s, ±20%: a node hears within seconds that weights can be had again. */
export const WEIGHTS_WAIT_BACKOFF: BackoffPolicy = { baseMs: 1_000, maxMs: 10_000, jitter: 0.2 };

/** Weights that no server can send right now, although nothing says they are gone: wait and try again. */
export class WeightsUnavailableError extends UpstreamError {
  constructor(message: string, detail: { code: string; cause?: unknown }) {
    super(message, { ...detail, status: 503, retryable: true });
  }
}

/** The prefix of a replica's last error while it waits. */
export const WAITING_FOR_WEIGHTS = "waiting for weights: ";

/**
 * Runs `prepare` until it resolves; a `WeightsUnavailableError` is reported through
 * `waiting` and tried again after a backoff, anything else is thrown. `waiting(null)` once
 * the weights are there (after at least one wait). Rejects with the abort reason when
 * `signal` aborts.
 */
export async function prepareWaitingForWeights<T>(input: {
  prepare: () => Promise<T>;
  signal: AbortSignal;
  waiting: (note: WaitingNote | null) => void;
  logger: Logger;
  backoff?: BackoffPolicy;
  clock?: () => number;
}): Promise<T> {
  const clock = input.clock ?? Date.now;
  for (let waits = 0; ; ) {
    input.signal.throwIfAborted();
    try {
      const prepared = await input.prepare();
      if (waits > 0) input.waiting(null);
      return prepared;
    } catch (error) {
      if (!(error instanceof WeightsUnavailableError) || input.signal.aborted) throw error;
      waits += 1;
      const delayMs = backoffDelay(waits, input.backoff ?? WEIGHTS_WAIT_BACKOFF);
      input.logger.warn({ code: error.code, waits, retryInMs: delayMs, err: error.message }, "waiting for weights");
      input.waiting({ code: error.code, message: `${WAITING_FOR_WEIGHTS}${error.message}`, retryAt: clock() + delayMs });
      await abortableDelay(delayMs, input.signal);
    }
  }
}
