// What a /v1 request costs when it ends: the one rule that turns how its last replica
// attempt ended (relay.ts's outcome) and the usage the replica reported into what the
// limits settle (LimitsPermit.settle). The HTTP status the client got cannot decide it:
// a 499 (the client left) may follow a generation, and a 502 is both an answer broken
// mid-way and an upstream's own 502 relayed whole, which generated nothing.
import type { RelayOutcome } from "./relay.ts";
import type { TokenUsage } from "../core/token-usage.ts";

/** How a request's last replica attempt ended, as the relay saw it. */
export interface AttemptOutcome {
  /** "none": no replica's answer was relayed (refused by policy, no replica, a connection that failed, the client gone while waiting). */
  kind: RelayOutcome["kind"] | "none";
  /** The replica's HTTP status (0 when none answered). */
  upstreamStatus: number;
  /** Whether the replica sent a byte of its body, whether or not the client got it. */
  upstreamByte: boolean;
}

export const NO_ATTEMPT: AttemptOutcome = { kind: "none", upstreamStatus: 0, upstreamByte: false };

/** What a request that ended is charged and recorded at. */
export interface Settlement {
  /** The tokens charged: the replica's own count, or the gateway's estimate; null: none (see `answered`). */
  usage: TokenUsage | null;
  /** With no usage: whether the replica produced something, so the reservation stands. */
  answered: boolean;
  /** The usage is the gateway's estimate: the replica reported none. */
  estimated: boolean;
}

/**
 * The settlement of a request that ended. The rule:
 * - Tokens known (the replica reported usage): those tokens are charged, whatever the end.
 * - Tokens unknown, and the replica produced an answer or a part of one (a 2xx status and
 *   a byte of its body) that was answered whole, broken after that byte, cut at its output
 *   bound, cut off by the client leaving, or refused by the output guard: the gateway's
 *   estimate is charged (output-meter.ts: an upper bound, never 0), or, where it has none,
 *   the reservation stands. The generation happened, or began, and the replica did not say
 *   how far it went.
 * - Anything else costs nothing: an upstream's own error answer (4xx/5xx) relayed whole
 *   generated nothing, and before a replica's first byte nothing was generated that the
 *   gateway kept (an attempt that failed then is retried elsewhere or fails the request;
 *   a held answer cut before its end is such an attempt, so its retry is not charged twice).
 */
export function settlementOf(outcome: AttemptOutcome, usage: TokenUsage | null, estimate: (() => TokenUsage) | null): Settlement {
  if (usage !== null) return { usage, answered: true, estimated: false };
  if (!replicaProduced(outcome)) return { usage: null, answered: false, estimated: false };
  if (estimate === null) return { usage: null, answered: true, estimated: false };
  return { usage: estimate(), answered: true, estimated: true };
}

function replicaProduced(outcome: AttemptOutcome): boolean {
  if (outcome.upstreamStatus < 200 || outcome.upstreamStatus >= 300 || !outcome.upstreamByte) return false;
  switch (outcome.kind) {
    case "answered":
    case "broken":
    case "client-gone":
    case "refused":
    case "cut":
      return true;
    case "failed-before-first-byte":
    case "none":
      return false;
  }
}
