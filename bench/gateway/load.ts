// Closed-loop load for the gateway benchmark: N workers, each sending its next request as
// soon as the previous answer has been read to the end, for a warm-up and then a fixed
// measured window. Every answer is checked (status 200 and the expected number of body
// bytes, which for the benchmark's fixed upstream is the whole of its content), so a run
// that measured errors says so instead of looking fast.
//
// Closed loop means the offered load follows the target's speed: throughput is what the
// target sustains with N requests in flight, and latency is what each of them saw.
//
// Run alone: `npx tsx bench/gateway/load.ts --url http://127.0.0.1:PORT [--key K]
// [--stream] [--concurrency 16] [--duration 3] [--warmup 1]`.
import { performance } from "node:perf_hooks";
import { pathToFileURL } from "node:url";
import { Pool } from "undici";

export interface LoadTargetOptions {
  /** Origin of the target, e.g. http://127.0.0.1:8700. */
  url: string;
  path?: string;
  /** Sent as `Authorization: Bearer`; omitted when absent. */
  key?: string;
  body: Buffer;
  concurrency: number;
  /** Body length of a correct answer; null accepts any length. */
  expectedBytes: number | null;
}

export interface LoadResult {
  concurrency: number;
  /** Correct answers completed inside the measured window. */
  requests: number;
  /**
   * Correct answers completed during the whole run, settle time and the requests still in
   * flight at the end included. A run starts and ends with nothing in flight, so the
   * target's CPU time over the run divided by this is its CPU time per request.
   */
  completed: number;
  errors: number;
  /** The first few error descriptions, for the report. */
  errorSamples: string[];
  /** Length of the measured window in seconds. */
  seconds: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  /** Latencies of the measured requests in milliseconds (for merging windows). */
  latenciesMs: Float64Array;
}

/** Reads a response body to its end and returns its length, without keeping it. */
function drain(body: NodeJS.ReadableStream): Promise<number> {
  return new Promise((resolve, reject) => {
    let bytes = 0;
    body.on("data", (chunk: Buffer) => {
      bytes += chunk.length;
    });
    body.on("end", () => resolve(bytes));
    body.on("error", reject);
  });
}

/**
 * One target under closed-loop load. Its connections stay open between runs, so a caller
 * can measure several targets in short alternating windows (the way run.ts spreads a
 * noisy machine's bursts over all of them) without paying connection setup each time.
 */
export class LoadTarget {
  private readonly pool: Pool;
  private readonly headers: Record<string, string>;
  private readonly path: string;

  constructor(private readonly options: LoadTargetOptions) {
    // One connection per worker: a closed loop never has more requests in flight than that.
    this.pool = new Pool(new URL(options.url).origin, {
      connections: options.concurrency,
      pipelining: 1,
      keepAliveTimeout: 60_000,
      headersTimeout: 30_000,
      bodyTimeout: 30_000,
    });
    this.headers = { "content-type": "application/json" };
    if (options.key !== undefined) this.headers.authorization = `Bearer ${options.key}`;
    this.path = options.path ?? "/v1/chat/completions";
  }

  /**
   * Runs the workers for `settleMs + durationMs` and measures the answers that complete in
   * the last `durationMs`. The settle time lets all workers reach their steady pace, so a
   * short window is not dominated by the first, simultaneous requests.
   */
  async run(window: { durationMs: number; settleMs?: number }): Promise<LoadResult> {
    const { concurrency, expectedBytes } = this.options;
    const measureFrom = performance.now() + (window.settleMs ?? 0);
    const measureUntil = measureFrom + window.durationMs;
    let latencies = new Float64Array(1 << 12);
    let count = 0;
    let completed = 0;
    let errors = 0;
    const errorSamples: string[] = [];
    const noteError = (description: string, completedAt: number) => {
      if (completedAt < measureFrom || completedAt > measureUntil) return;
      errors += 1;
      if (errorSamples.length < 5) errorSamples.push(description);
    };

    const worker = async () => {
      while (performance.now() < measureUntil) {
        const sentAt = performance.now();
        try {
          const { statusCode, body } = await this.pool.request({ path: this.path, method: "POST", headers: this.headers, body: this.options.body });
          const bytes = await drain(body);
          const doneAt = performance.now();
          if (statusCode !== 200) {
            noteError(`HTTP ${statusCode}`, doneAt);
            continue;
          }
          if (expectedBytes !== null && bytes !== expectedBytes) {
            noteError(`body of ${bytes} bytes, expected ${expectedBytes}`, doneAt);
            continue;
          }
          completed += 1;
          if (doneAt < measureFrom || doneAt > measureUntil) continue;
          if (count === latencies.length) {
            const grown = new Float64Array(latencies.length * 2);
            grown.set(latencies);
            latencies = grown;
          }
          latencies[count] = doneAt - sentAt;
          count += 1;
        } catch (error) {
          noteError(error instanceof Error ? `${error.name}: ${error.message}` : String(error), performance.now());
          // A refused or broken connection fails at once; don't spin on it.
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));

    const measured = latencies.slice(0, count);
    const seconds = window.durationMs / 1000;
    return { concurrency, requests: count, completed, errors, errorSamples, seconds, rps: count / seconds, ...summarize(measured), latenciesMs: measured };
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}

/** A warm-up, then one measured window, on fresh connections. */
export async function runLoad(options: LoadTargetOptions & { warmupMs: number; durationMs: number }): Promise<LoadResult> {
  const target = new LoadTarget(options);
  try {
    if (options.warmupMs > 0) await target.run({ durationMs: options.warmupMs });
    return await target.run({ durationMs: options.durationMs });
  } finally {
    await target.close();
  }
}

/** p50, p99 (nearest rank) and mean of latencies in milliseconds. */
export function summarize(latenciesMs: Float64Array): { p50Ms: number; p99Ms: number; meanMs: number } {
  if (latenciesMs.length === 0) return { p50Ms: NaN, p99Ms: NaN, meanMs: NaN };
  const sorted = Float64Array.from(latenciesMs).sort();
  const rank = (p: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!;
  let sum = 0;
  for (const value of sorted) sum += value;
  return { p50Ms: rank(0.5), p99Ms: rank(0.99), meanMs: sum / sorted.length };
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const argument = (name: string) => {
    const index = process.argv.indexOf(name);
    return index === -1 ? undefined : process.argv[index + 1];
  };
  const url = argument("--url");
  if (url === undefined) {
    process.stderr.write("load: --url http://HOST:PORT is required.\n");
    process.exit(2);
  }
  const stream = process.argv.includes("--stream");
  const body = Buffer.from(
    JSON.stringify({
      model: argument("--model") ?? "bench",
      messages: [{ role: "user", content: "Say hello." }],
      max_tokens: 32,
      ...(stream ? { stream: true } : {}),
    }),
  );
  const result = await runLoad({
    url,
    key: argument("--key"),
    body,
    concurrency: Number(argument("--concurrency") ?? 16),
    warmupMs: Number(argument("--warmup") ?? 1) * 1000,
    durationMs: Number(argument("--duration") ?? 3) * 1000,
    expectedBytes: null,
  });
  const { latenciesMs: _omitted, ...summary } = result;
  process.stdout.write(`${JSON.stringify(summary, null, 2)}\n`);
  process.exit(result.errors > 0 ? 1 : 0);
}
