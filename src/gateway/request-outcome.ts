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

/**
 * The settlement of a request that ended. The rule:
 * - Tokens known (the replica reported usage): those tokens are charged, whatever the end.
 * - Tokens unknown, and the replica produced an answer or a part of one (a 2xx status and
 *   a byte of its body) that was answered whole, broken after that byte, cut off by the
 *   client leaving, or refused by the output guard: the reservation stands (answered).
 *   The generation happened, or began, and nothing says how far it went.
 * - Anything else costs nothing: an upstream's own error answer (4xx/5xx) relayed whole
 *   generated nothing, and before a replica's first byte nothing was generated that the
 *   gateway kept (an attempt that failed then is retried elsewhere or fails the request;
 *   a held answer cut before its end is such an attempt, so its retry is not charged twice).
 */
export function settlementOf(outcome: AttemptOutcome, usage: TokenUsage | null): { usage: TokenUsage | null; answered: boolean } {
  if (usage !== null) return { usage, answered: true };
  return { usage: null, answered: replicaProduced(outcome) };
}

function replicaProduced(outcome: AttemptOutcome): boolean {
  if (outcome.upstreamStatus < 200 || outcome.upstreamStatus >= 300 || !outcome.upstreamByte) return false;
  switch (outcome.kind) {
    case "answered":
    case "broken":
    case "client-gone":
    case "refused":
      return true;
    case "failed-before-first-byte":
    case "none":
      return false;
  }
}
