// The overload benchmark (`npm run bench:overload`): what admission control does when
// more clients arrive than an engine has slots. The upstream is the benchmark stub paced
// like an engine (`--slots S` requests at once, `--delay-ms D` each, the rest queued inside
// it, as llama-server queues requests beyond its slots). A real `llmgw server` routes to it
// through two models:
//   - `admitted`: max_inflight S and a queue of Q: llmgw's admission control.
//   - `unbounded`: max_inflight far above S and no queue: every request goes straight to
//     the engine, which is what llmgw did before admission control.
// Three phases, one after the other, each with a warm-up and a measured window:
//   1. slots only: S closed-loop clients on `admitted` (every request fits: the baseline).
//   2. overload:   F×S clients on `admitted`.
//   3. overload without admission: F×S clients on `unbounded`.
// Goal: in phase 2 the admitted requests' p99 stays within 2× of phase 1's p99, every
// other request gets 429, and no other status appears. A client that gets 429 waits
// `--backoff-ms` before it tries again (as the SDKs back off; without it the 429 loop only
// measures how fast refusals can be sent). Phase 3 shows what the clients would see
// instead. Ratios of figures measured in one run are the result; the machine is shared.
//
// Options: --slots S (8)  --delay-ms D (100)  --factor F (4)  --queue Q (S/2)
//          --duration SECONDS (8)  --warmup SECONDS (1)  --backoff-ms MS (100)  --out DIR
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { Pool } from "undici";
import { summarize } from "./load.ts";
import { ROOT, api, startService, stopService, tail, type Service } from "./services.ts";

interface Options {
  slots: number;
  delayMs: number;
  factor: number;
  queue: number;
  durationS: number;
  warmupS: number;
  backoffMs: number;
  out: string;
}

function parseOptions(argv: string[]): Options {
  const value = (name: string, fallback: number): number => {
    const index = argv.indexOf(`--${name}`);
    if (index === -1) return fallback;
    const number = Number(argv[index + 1]);
    if (!Number.isFinite(number) || number < 0) throw new Error(`Invalid --${name} '${argv[index + 1]}': expected a number ≥ 0.`);
    return number;
  };
  const slots = value("slots", 8);
  const outIndex = argv.indexOf("--out");
  return {
    slots,
    delayMs: value("delay-ms", 100),
    factor: value("factor", 4),
    queue: value("queue", Math.max(1, Math.floor(slots / 2))),
    durationS: value("duration", 8),
    warmupS: value("warmup", 1),
    backoffMs: value("backoff-ms", 100),
    out: path.resolve(outIndex === -1 ? path.join(ROOT, "bench/results") : argv[outIndex + 1]!),
  };
}

interface PhaseResult {
  phase: string;
  model: string;
  clients: number;
  /** Answers with status 200 in the measured window, and their latencies. */
  admitted: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  rejected429: number;
  /** Any other status or a transport error: must be 0. */
  other: number;
  otherSamples: string[];
}

/** `clients` closed-loop workers against one model for a warm-up and a measured window. */
async function runPhase(options: {
  phase: string;
  url: string;
  key: string;
  model: string;
  clients: number;
  warmupMs: number;
  durationMs: number;
  backoffMs: number;
}): Promise<PhaseResult> {
  const pool = new Pool(options.url, { connections: options.clients, pipelining: 1, headersTimeout: 120_000, bodyTimeout: 120_000 });
  const body = Buffer.from(JSON.stringify({ model: options.model, messages: [{ role: "user", content: "Say hello." }], max_tokens: 32 }));
  const headers = { authorization: `Bearer ${options.key}`, "content-type": "application/json" };
  const measureFrom = performance.now() + options.warmupMs;
  const measureUntil = measureFrom + options.durationMs;
  const latencies: number[] = [];
  let rejected = 0;
  let other = 0;
  const otherSamples: string[] = [];
  const measured = (at: number) => at >= measureFrom && at <= measureUntil;
  const worker = async () => {
    while (performance.now() < measureUntil) {
      const sentAt = performance.now();
      try {
        const response = await pool.request({ path: "/v1/chat/completions", method: "POST", headers, body });
        await response.body.dump();
        const doneAt = performance.now();
        if (response.statusCode === 200) {
          if (measured(doneAt)) latencies.push(doneAt - sentAt);
        } else if (response.statusCode === 429) {
          if (measured(doneAt)) rejected += 1;
          await new Promise((resolve) => setTimeout(resolve, options.backoffMs));
        } else if (measured(doneAt)) {
          other += 1;
          if (otherSamples.length < 5) otherSamples.push(`HTTP ${response.statusCode}`);
        }
      } catch (error) {
        other += 1;
        if (otherSamples.length < 5) otherSamples.push(error instanceof Error ? error.message : String(error));
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
  };
  await Promise.all(Array.from({ length: options.clients }, worker));
  await pool.close();
  const stats = summarize(Float64Array.from(latencies));
  return {
    phase: options.phase,
    model: options.model,
    clients: options.clients,
    admitted: latencies.length,
    p50Ms: stats.p50Ms,
    p99Ms: stats.p99Ms,
    maxMs: latencies.length === 0 ? NaN : Math.max(...latencies),
    rejected429: rejected,
    other,
    otherSamples,
  };
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const temp = mkdtempSync(path.join(os.tmpdir(), "llmgw-overload-"));
  const logDir = path.join(temp, "logs");
  mkdirSync(logDir);
  const services: Service[] = [];
  try {
    const overloadClients = Math.round(options.factor * options.slots);
    log(
      `llmgw overload benchmark: an engine stand-in with ${options.slots} slots × ${options.delayMs} ms; ${options.slots} then ${overloadClients} clients; ` +
        `queue ${options.queue}; ${options.warmupS} s warm-up + ${options.durationS} s per phase; 429 backoff ${options.backoffMs} ms`,
    );
    const stub = await startService({
      name: "stub",
      args: ["--import", "tsx", "bench/gateway/stub-upstream.ts", "--delay-ms", String(options.delayMs), "--slots", String(options.slots)],
      logDir,
    });
    services.push(stub);
    const dataDir = path.join(temp, "data");
    const server = await startService({
      name: "llmgw",
      args: [path.join(ROOT, "bin/llmgw.js"), "server", "--data-dir", dataDir, "--listen", "127.0.0.1:0"],
      logDir,
    });
    services.push(server);
    const adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    await api(`${server.url}/api/v1/models`, adminKey, "POST", {
      name: "admitted",
      profiles: [{ name: "engine", engine: "external", url: stub.url, max_inflight: options.slots }],
      queue_size: options.queue,
    });
    await api(`${server.url}/api/v1/models`, adminKey, "POST", {
      name: "unbounded",
      profiles: [{ name: "engine", engine: "external", url: stub.url, max_inflight: 4096 }],
      queue_size: 0,
    });
    const { key } = (await api(`${server.url}/api/v1/keys`, adminKey, "POST", { name: "overload" })) as { key: string };
    const phase = (name: string, model: string, clients: number) =>
      runPhase({
        phase: name,
        url: server.url,
        key,
        model,
        clients,
        warmupMs: options.warmupS * 1000,
        durationMs: options.durationS * 1000,
        backoffMs: options.backoffMs,
      });

    const results: PhaseResult[] = [];
    for (const [name, model, clients] of [
      ["slots only", "admitted", options.slots],
      ["overload, admission", "admitted", overloadClients],
      ["overload, no admission", "unbounded", overloadClients],
    ] as const) {
      const result = await phase(name, model, clients);
      results.push(result);
      log(`${name}: ${result.admitted} answered, p99 ${result.p99Ms.toFixed(1)} ms, ${result.rejected429} × 429, ${result.other} other`);
    }
    const [base, admitted, unbounded] = results as [PhaseResult, PhaseResult, PhaseResult];
    const ratio = admitted.p99Ms / base.p99Ms;
    const pass = ratio <= 2 && admitted.other === 0 && base.other === 0;
    process.stdout.write(`\n${renderTable(results, base.p99Ms)}\n\n`);
    process.stdout.write(
      `${pass ? "PASS" : "MISS"} overload: admitted p99 / slots-only p99 = ${admitted.p99Ms.toFixed(1)} / ${base.p99Ms.toFixed(1)} ms = ${ratio.toFixed(2)} (goal ≤ 2), ` +
        `${admitted.rejected429} answered 429, ${admitted.other} other statuses (goal 0)\n` +
        `     without admission the same clients see p99 ${unbounded.p99Ms.toFixed(1)} ms = ${(unbounded.p99Ms / base.p99Ms).toFixed(2)}× the slots-only p99\n`,
    );
    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `overload-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(
      file,
      `${JSON.stringify(
        {
          benchmark: "overload",
          date: new Date().toISOString(),
          options: { ...options, out: undefined },
          loadAverageAtEnd: os.loadavg(),
          results,
          ratio,
          pass,
        },
        null,
        2,
      )}\n`,
    );
    log(
      `wrote ${path.relative(process.cwd(), file)} (load average now ${os
        .loadavg()
        .map((v) => v.toFixed(2))
        .join(" ")})`,
    );
    process.exitCode = admitted.other + base.other === 0 ? 0 : 1;
  } catch (error) {
    process.stderr.write(`bench/gateway/overload failed: ${error instanceof Error ? error.message : String(error)}\n`);
    for (const service of services) process.stderr.write(`--- ${service.name} log (last lines) ---\n${tail(service.logFile)}\n`);
    process.exitCode = 1;
  } finally {
    await Promise.all(services.map(stopService));
    rmSync(temp, { recursive: true, force: true });
  }
}

function renderTable(results: PhaseResult[], baseP99: number): string {
  const rows = results.map((r) => [
    r.phase,
    r.model,
    String(r.clients),
    String(r.admitted),
    r.p50Ms.toFixed(1),
    r.p99Ms.toFixed(1),
    (r.p99Ms / baseP99).toFixed(2),
    String(r.rejected429),
    String(r.other),
  ]);
  const header = ["phase", "model", "clients", "answered", "p50 ms", "p99 ms", "p99 / slots-only", "429", "other"];
  const widths = header.map((title, i) => Math.max(title.length, ...rows.map((row) => row[i]!.length)));
  const line = (row: string[]) => `| ${row.map((cell, i) => (i < 2 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join(" | ")} |`;
  return [line(header), `|${widths.map((w, i) => (i < 2 ? "-".repeat(w + 2) : `${"-".repeat(w + 1)}:`)).join("|")}|`, ...rows.map(line)].join("\n");
}

function log(line: string): void {
  process.stderr.write(`${line}\n`);
}

await main();
