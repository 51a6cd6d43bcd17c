// Connections from the gateway to replicas: one undici Pool per replica origin, with the
// timeouts set here rather than undici's 300 s defaults, and the single place where an
// upstream failure is classified. The rule (CONVENTIONS.md): a refused connection, a
// reset before the first byte, and 408/409/429/5xx answers may be retried on another
// replica; anything after the first streamed byte may not.
import { Pool } from "undici";
import { UpstreamError, type LlmgwError, describeError, errorCode } from "../core/errors.ts";

export interface UpstreamTimeouts {
  /** Connect deadline: a replica that does not accept within this is treated as down. */
  connectMs: number;
  /**
   * Wait for response headers. A non-streamed completion only answers when generation is
   * done, so this must cover a whole long generation on a slow CPU.
   */
  headersMs: number;
  /** Longest silence between two body chunks (a stalled engine). */
  bodyIdleMs: number;
}

export const DEFAULT_UPSTREAM_TIMEOUTS: UpstreamTimeouts = { connectMs: 5_000, headersMs: 600_000, bodyIdleMs: 300_000 };

export class UpstreamPools {
  private readonly pools = new Map<string, Pool>();

  constructor(private readonly timeouts: UpstreamTimeouts = DEFAULT_UPSTREAM_TIMEOUTS) {}

  get(origin: string): Pool {
    let pool = this.pools.get(origin);
    if (pool === undefined) {
      pool = new Pool(origin, {
        connections: 256,
        pipelining: 1,
        keepAliveTimeout: 30_000,
        headersTimeout: this.timeouts.headersMs,
        bodyTimeout: this.timeouts.bodyIdleMs,
        connect: { timeout: this.timeouts.connectMs },
      });
      this.pools.set(origin, pool);
    }
    return pool;
  }

  /** Closes the pool of an origin no replica uses any more. */
  async release(origin: string): Promise<void> {
    const pool = this.pools.get(origin);
    if (pool === undefined) return;
    this.pools.delete(origin);
    await pool.destroy().catch(() => undefined);
  }

  async closeAll(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((pool) => pool.destroy().catch(() => undefined)));
  }
}

/** Upstream answers that another replica may well answer better. */
export function isRetryableStatus(status: number): boolean {
  return status === 408 || status === 409 || status === 429 || status >= 500;
}

const RETRYABLE_TRANSPORT_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_CLOSED",
  "UND_ERR_DESTROYED",
]);

/**
 * Turns a failure that happened before any response byte into an UpstreamError that says
 * whether another replica may be tried. Header timeouts are not retried: the engine may
 * still be working on the request, and a second try would double the load.
 */
export function classifyUpstreamFailure(error: unknown, replicaLabel: string): LlmgwError {
  const code = errorCode(error);
  if (code === "UND_ERR_HEADERS_TIMEOUT") {
    return new UpstreamError(`Replica ${replicaLabel} did not start answering in time; the request was cancelled.`, {
      status: 504,
      code: "upstream_timeout",
      cause: error,
    });
  }
  const retryable = code !== undefined && RETRYABLE_TRANSPORT_CODES.has(code);
  return new UpstreamError(`Replica ${replicaLabel} failed before answering (${code ?? describeError(error)}).`, {
    code: "upstream_unreachable",
    retryable,
    cause: error,
  });
}
