// Autoscaling between scaling.min and scaling.max, measured (`npm run bench:routing-autoscale`,
// issue 28): how long an overload waits for the replicas it needs, and whether any request
// fails while replicas come and go.
//
// One `llmgw up` with one model on the bundled engine (the engine benchmark's generated
// model, src/gguf/tiny-model.ts), `parallel` 2 and one thread per replica, scaling min 1,
// max 3, the target left at its default (the replica's parallel, 2), up_after at its
// default (15 s), down_after shortened to --down-after seconds (default 60) so the run ends
// within minutes. Closed-loop clients, each sending one chat request (a short question,
// --tokens generated tokens, default 32) after the other: 1 client at first, one more every
// 2 s up to 6, held until 60 s; then 1 client for --tail seconds (default 360). Every 250 ms
// the model's health (ready replicas, the autoscaler's load and desired count) is sampled.
//
// Reported: the time from the overload (the first sample whose load exceeds the target ×
// the ready replicas) to the second and the third replica ready; the scaling decisions with
// their times; requests that failed, in all and after the overload (while scaling down),
// the goal being 0; and, side by side in the same run, the latency of the overload's
// requests against the same 60 s with the model held at one replica (scaling.max 1).
//
// Options: --tokens N (BENCH_TOKENS, default 32), --down-after S (BENCH_DOWN_AFTER, default
// 60), --tail S (BENCH_TAIL, default 360), --out DIR (BENCH_OUT, default bench/results).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import { writeTinyLlamaGguf } from "../../src/gguf/tiny-model.ts";
import { BENCH_MODEL_SHAPE } from "../engine/engine-process.ts";
import { flagReader, wholeNumber } from "../flags.ts";
import { percentile } from "./percentile.ts";
import { ROOT, api, startService, stopService, tail, type Service } from "../gateway/services.ts";

const MODEL = "elastic";
const PARALLEL = 2;
const MAX_REPLICAS = 3;
const PEAK_CLIENTS = 6;
const RAMP_STEP_MS = 2_000;
const OVERLOAD_MS = 60_000;
const REQUEST_DEADLINE_MS = 300_000;

interface Options {
  tokens: number;
  downAfter: number;
  tail: number;
  out: string;
}

interface Done {
  /** ms since the run began */
  start: number;
  end: number;
  ok: boolean;
  error?: string;
}

interface Sample {
  at: number;
  ready: number;
  load: number | null;
  desired: number | null;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  return {
    tokens: wholeNumber(flag("tokens", "BENCH_TOKENS") ?? "32", "tokens", 1),
    downAfter: wholeNumber(flag("down-after", "BENCH_DOWN_AFTER") ?? "60", "down-after", 15),
    tail: wholeNumber(flag("tail", "BENCH_TAIL") ?? "360", "tail", 30),
    out: path.resolve(flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results")),
  };
}

async function ask(url: string, key: string, tokens: number, n: number): Promise<void> {
  const response = await request(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: `Question ${n}: say hello world` }], max_tokens: tokens }),
    headersTimeout: REQUEST_DEADLINE_MS,
    bodyTimeout: REQUEST_DEADLINE_MS,
  });
  const text = await response.body.text();
  if (response.statusCode !== 200) throw new Error(`${response.statusCode}: ${text.slice(0, 300)}`);
}

/**
 * The traffic: clients as the schedule says (1, one more each ramp step up to the peak,
 * held until `overloadMs`, then 1 for `tailMs`). A client told to stop finishes its request first.
 */
async function runTraffic(up: Service, key: string, options: Options, overloadMs: number, tailMs: number, began: number): Promise<Done[]> {
  const done: Done[] = [];
  let sent = 0;
  const now = () => performance.now() - began;
  const client = async (stopAt: () => number) => {
    while (now() < stopAt()) {
      const start = now();
      try {
        await ask(up.url, key, options.tokens, sent++);
        done.push({ start, end: now(), ok: true });
      } catch (error) {
        done.push({ start, end: now(), ok: false, error: error instanceof Error ? error.message : String(error) });
      }
    }
  };
  const clients: Array<Promise<void>> = [client(() => overloadMs + tailMs)];
  for (let extra = 1; extra < PEAK_CLIENTS; extra += 1) {
    await sleep(Math.max(0, extra * RAMP_STEP_MS - now()));
    clients.push(client(() => overloadMs));
  }
  await Promise.all(clients);
  return done;
}

async function sampleHealth(up: Service, key: string, began: number, until: () => boolean): Promise<Sample[]> {
  const samples: Sample[] = [];
  while (!until()) {
    const health = (await api(`${up.url}/api/v1/models/${MODEL}/health`, key, "GET")) as {
      replicas: Array<{ state: string }>;
      autoscaling: { load: number | null; desired: number } | null;
    };
    samples.push({
      at: performance.now() - began,
      ready: health.replicas.filter((replica) => replica.state === "ready").length,
      load: health.autoscaling?.load ?? null,
      desired: health.autoscaling?.desired ?? null,
    });
    await sleep(250);
  }
  return samples;
}

async function waitReady(up: Service, key: string, count: number): Promise<void> {
  const until = performance.now() + 180_000;
  while (true) {
    const health = (await api(`${up.url}/api/v1/models/${MODEL}/health`, key, "GET")) as { replicas: Array<{ state: string }> };
    const ready = health.replicas.filter((replica) => replica.state === "ready").length;
    if (ready === count && health.replicas.length === count) return;
    if (performance.now() > until) throw new Error(`Not ${count} ready replicas after 180 s: ${JSON.stringify(health)}\n${tail(up.logFile)}`);
    await sleep(500);
  }
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const temp = mkdtempSync(path.join(os.tmpdir(), "llmgw-bench-autoscale-"));
  const logDir = path.join(temp, "logs");
  mkdirSync(logDir);
  let up: Service | undefined;
  try {
    const model = await writeTinyLlamaGguf({ path: path.join(temp, "bench-f32.gguf"), seed: 12, endless: true, ...BENCH_MODEL_SHAPE });
    const dataDir = path.join(temp, "data");
    up = await startService({ name: "llmgw-up", args: [path.join(ROOT, "bin/llmgw.js"), "up", "--data-dir", dataDir, "--listen", "127.0.0.1:0"], logDir });
    const key = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    await api(`${up.url}/api/v1/models`, key, "POST", {
      name: MODEL,
      source: { kind: "file", path: model.path },
      scaling: { min: 1, max: MAX_REPLICAS, down_after: options.downAfter },
      profiles: [{ name: "cpu", engine: "llamacpp", parallel: PARALLEL, ctx_size: PARALLEL * 512, threads: 1 }],
    });
    process.stdout.write(
      `autoscaling benchmark: parallel ${PARALLEL}, min 1, max ${MAX_REPLICAS}, target ${PARALLEL} (default), up_after 15 s (default), down_after ${options.downAfter} s; ` +
        `1 → ${PEAK_CLIENTS} clients (one more every ${RAMP_STEP_MS / 1000} s) until ${OVERLOAD_MS / 1000} s, then 1 for ${options.tail} s; ${options.tokens} tokens a request; ` +
        `${os.cpus().length} CPUs, load average ${os
          .loadavg()
          .map((v) => v.toFixed(2))
          .join(" ")}\n`,
    );
    await waitReady(up, key, 1);
    // Warm-up, unmeasured: the engine's first allocations and the page cache.
    for (let n = 0; n < 2; n += 1) await ask(up.url, key, options.tokens, -1 - n);

    // The autoscaled run.
    const began = performance.now();
    let trafficOver = false;
    const sampling = sampleHealth(up, key, began, () => trafficOver);
    const done = await runTraffic(up, key, options, OVERLOAD_MS, options.tail * 1000, began);
    trafficOver = true;
    const samples = await sampling;
    const events = (
      (await api(`${up.url}/api/v1/events?kind=model_scaled&limit=50`, key, "GET")) as {
        data: Array<{ at: string; data: { direction: string; from: number; to: number; why: string } }>;
      }
    ).data.sort((a, b) => a.at.localeCompare(b.at));
    const beganWall = Date.now() - (performance.now() - began);

    // The baseline: the same overload with the model held at one replica.
    await api(`${up.url}/api/v1/models/${MODEL}`, key, "PATCH", { scaling: { min: 1, max: 1 } });
    await waitReady(up, key, 1);
    const baseBegan = performance.now();
    const baseline = await runTraffic(up, key, options, OVERLOAD_MS, 0, baseBegan);

    const overloadAt = samples.find((s) => s.load !== null && s.load > PARALLEL * s.ready)?.at ?? null;
    const readyAt = (count: number) => samples.find((s) => s.ready >= count && (overloadAt === null || s.at >= overloadAt))?.at ?? null;
    const since = (at: number | null) => (at === null || overloadAt === null ? "never" : seconds(at - overloadAt));
    const failed = done.filter((d) => !d.ok);
    const failedDown = failed.filter((d) => d.start >= OVERLOAD_MS);
    const peak = (runs: Done[]) => runs.filter((d) => d.ok && d.start >= PEAK_CLIENTS * RAMP_STEP_MS && d.start < OVERLOAD_MS).map((d) => d.end - d.start);
    const scaledLatency = peak(done);
    const fixedLatency = peak(baseline);
    const decisions = events.map((e) => `${e.data.direction} ${e.data.from}→${e.data.to} at ${seconds(Date.parse(e.at) - beganWall)} (${e.data.why})`);
    const lastReady = samples.at(-1)?.ready ?? 0;
    const zeroFailed = failed.length === 0;
    process.stdout.write(
      `\n| measure | figure |\n|--|--:|\n` +
        `| overload began (load above the target × ready replicas) | ${overloadAt === null ? "never" : seconds(overloadAt)} after the start |\n` +
        `| second replica ready | ${since(readyAt(2))} after the overload |\n` +
        `| third replica ready | ${since(readyAt(3))} after the overload |\n` +
        `| requests | ${done.length} (${failed.length} failed; ${failedDown.length} failed after the overload, while scaling down) |\n` +
        `| replicas ready at the end | ${lastReady} |\n` +
        `| latency at 6 clients, autoscaled (p50 / p95) | ${seconds(percentile(scaledLatency, 0.5))} / ${seconds(percentile(scaledLatency, 0.95))} (${scaledLatency.length} requests) |\n` +
        `| latency at 6 clients, one replica (p50 / p95) | ${seconds(percentile(fixedLatency, 0.5))} / ${seconds(percentile(fixedLatency, 0.95))} (${fixedLatency.length} requests) |\n\n` +
        `decisions:\n${decisions.map((line) => `  ${line}`).join("\n")}\n` +
        (failed.length > 0 ? `failures:\n${failed.map((d) => `  at ${seconds(d.start)}: ${d.error}`).join("\n")}\n` : "") +
        `goal: 0 failed requests: ${zeroFailed ? "PASS" : "MISS"}\n`,
    );
    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `routing-autoscale-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(
      file,
      `${JSON.stringify({ bench: "routing-autoscale", at: new Date().toISOString(), options, overloadAt, events, samples, done, baseline }, null, 2)}\n`,
    );
    process.stdout.write(`wrote ${path.relative(ROOT, file)}\n`);
  } finally {
    if (up !== undefined) await stopService(up);
    rmSync(temp, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/routing/autoscale: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
