// Prefix routing against least-busy, measured (`npm run bench:routing-prefix`, issue 28):
// time to first token when a conversation's next turn finds, or does not find, its earlier
// turns still held by the engine that answers it.
//
// One `llmgw up` with one model of two replicas on the bundled engine (a generated model,
// src/gguf/tiny-model.ts, the engine benchmark's shape), each replica with `--parallel`
// sequences (default 4) and one thread, so the two share this machine's cores evenly. Each
// sequence keeps the prompt it last evaluated, and a request takes the free sequence with
// the longest common prefix (the bundled engine's prompt cache): a replica holds at most
// `parallel` conversations. The traffic is that of many users at once: 8 conversations,
// each with a system prompt of its own of about --prompt-tokens tokens (default 1,500),
// 6 turns each, 2 requests at a time. Two client workers each take a turn of a random
// conversation whose previous turn has been answered (seeded, the same order in both
// modes). Eight conversations are more than one replica holds and as many as both hold
// together: least-busy sends a conversation's turns to whichever replica is free, prefix
// routing sends them back to its own.
//
// A request asks for one token, not streamed, so its time is its time to first token; the
// engine's `timings.cache_n` says how many prompt tokens it did not evaluate again. The
// assistant turns of the history are fixed sentences (the generated model's words mean
// nothing). Each round runs both modes, in alternating order (ABBA), with new system
// prompts, so nothing of one mode is in the engines' sequences for the other.
//
// Goals: prefix p50 time to first token ≤ 0.5 × least-busy's (pooled over the rounds), and
// requests per replica within 25% of each other under prefix routing (the smaller count ≥
// 0.75 × the larger, each round). Which replica served a request is read from the usage
// rows in the server's SQLite store.
//
// Options: --rounds N (BENCH_ROUNDS, default 2), --prompt-tokens N (BENCH_PROMPT_TOKENS,
// default 1500), --parallel N (BENCH_PARALLEL, default 4), --seed N (BENCH_SEED, default 1),
// --out DIR (BENCH_OUT, default bench/results).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import Database from "better-sqlite3";
import { request } from "undici";
import { createPrng } from "../../src/gguf/gguf-writer.ts";
import { writeTinyLlamaGguf } from "../../src/gguf/tiny-model.ts";
import { BENCH_MODEL_SHAPE } from "../engine/engine-process.ts";
import { flagReader, wholeNumber } from "../flags.ts";
import { percentile } from "./percentile.ts";
import { ROOT, api, startService, stopService, tail, type Service } from "../gateway/services.ts";

const MODEL = "routed";
/** Each conversation's assistant is named by a letter of "ABCDEFGH". */
const CONVERSATIONS = 8;
const TURNS = 6;
const WORKERS = 2;
const TTFT_GOAL = 0.5;
const BALANCE_GOAL = 0.75;
const REQUEST_DEADLINE_MS = 300_000;
type Mode = "least-busy" | "prefix";

interface Options {
  rounds: number;
  promptTokens: number;
  parallel: number;
  seed: number;
  out: string;
}

interface Sample {
  round: number;
  mode: Mode;
  conversation: number;
  turn: number;
  seconds: number;
  promptTokens: number;
  cachedTokens: number;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  return {
    rounds: wholeNumber(flag("rounds", "BENCH_ROUNDS") ?? "2", "rounds", 1),
    promptTokens: wholeNumber(flag("prompt-tokens", "BENCH_PROMPT_TOKENS") ?? "1500", "prompt-tokens", 100),
    parallel: wholeNumber(flag("parallel", "BENCH_PARALLEL") ?? "4", "parallel", 1),
    seed: wholeNumber(flag("seed", "BENCH_SEED") ?? "1", "seed", 0),
    out: path.resolve(flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results")),
  };
}

/** The generated model's vocabulary spends about 13.6 tokens on a line of these rules (bench/engine/prompt-cache.ts). */
const TOKENS_PER_LINE = 13.6;
function systemPrompt(header: string, name: string, tokens: number): string {
  const lines = [`${header}: you are assistant ${name}. Follow these rules.`];
  for (let index = 0; lines.length * TOKENS_PER_LINE < tokens; index += 1) lines.push(`Rule ${index}: say hello to ${name} world`);
  return lines.join("\n");
}

type Message = { role: "system" | "user" | "assistant"; content: string };

async function ask(url: string, key: string, messages: Message[]): Promise<{ seconds: number; promptTokens: number; cachedTokens: number }> {
  const started = performance.now();
  const response = await request(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages, max_tokens: 1, temperature: 0 }),
    headersTimeout: REQUEST_DEADLINE_MS,
    bodyTimeout: REQUEST_DEADLINE_MS,
  });
  const text = await response.body.text();
  const seconds = (performance.now() - started) / 1000;
  if (response.statusCode !== 200) throw new Error(`POST /v1/chat/completions answered ${response.statusCode}: ${text.slice(0, 400)}`);
  const body = JSON.parse(text) as { usage?: { prompt_tokens: number }; timings?: { cache_n: number } };
  if (body.usage === undefined || body.timings === undefined) throw new Error(`the answer has no usage or timings: ${text.slice(0, 400)}`);
  return { seconds, promptTokens: body.usage.prompt_tokens, cachedTokens: body.timings.cache_n };
}

/** One mode's traffic: 8 conversations × 6 turns, 2 at a time, the next turn picked at random among those whose previous turn was answered. */
async function runTraffic(up: Service, key: string, options: Options, round: number, mode: Mode): Promise<Sample[]> {
  // Seeded (the tiny model generator's mulberry32): the same conversation order in both modes.
  const pick = createPrng(options.seed * 1000 + round);
  const histories: Message[][] = Array.from({ length: CONVERSATIONS }, (_, n) => [
    { role: "system", content: systemPrompt(`Round ${round}, ${mode}`, "ABCDEFGH"[n]!, options.promptTokens) },
  ]);
  const turnsDone = new Array<number>(CONVERSATIONS).fill(0);
  const busy = new Set<number>();
  const samples: Sample[] = [];
  const worker = async () => {
    while (true) {
      const ready = [...turnsDone.keys()].filter((n) => turnsDone[n]! < TURNS && !busy.has(n));
      if (ready.length === 0) {
        if (turnsDone.every((done) => done === TURNS)) return;
        // The other worker holds the last conversations' turns: wait for one to be answered.
        await sleep(5);
        continue;
      }
      const n = ready[Math.floor(pick() * ready.length)]!;
      busy.add(n);
      const turn = turnsDone[n]! + 1;
      const history = histories[n]!;
      history.push({ role: "user", content: `Question ${turn}: which rule comes after rule ${turn * 3}?` });
      const answer = await ask(up.url, key, history);
      history.push({ role: "assistant", content: `Rule ${turn * 3 + 1} comes after it, as the list says.` });
      samples.push({ round, mode, conversation: n, turn, ...answer });
      turnsDone[n] = turn;
      busy.delete(n);
    }
  };
  await Promise.all(Array.from({ length: WORKERS }, worker));
  return samples;
}

/** Requests of the model per replica so far, from the usage rows; waits until `expected` rows are there. */
async function requestsPerReplica(databaseFile: string, expected: number): Promise<Map<string, number>> {
  const database = new Database(databaseFile, { readonly: true, fileMustExist: true });
  try {
    const until = performance.now() + 30_000;
    while (true) {
      const rows = database.prepare("SELECT replica_id AS replica, count(*) AS count FROM usage WHERE model = ? GROUP BY replica_id").all(MODEL) as Array<{
        replica: string | null;
        count: number;
      }>;
      const total = rows.reduce((sum, row) => sum + row.count, 0);
      if (total >= expected) return new Map(rows.map((row) => [row.replica ?? "(none)", row.count]));
      if (performance.now() > until) throw new Error(`The store holds ${total} usage rows of '${MODEL}' after 30 s; ${expected} expected.`);
      await sleep(200);
    }
  } finally {
    database.close();
  }
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const temp = mkdtempSync(path.join(os.tmpdir(), "llmgw-bench-routing-"));
  const logDir = path.join(temp, "logs");
  mkdirSync(logDir);
  let up: Service | undefined;
  try {
    const model = await writeTinyLlamaGguf({ path: path.join(temp, "bench-f32.gguf"), seed: 11, endless: true, ...BENCH_MODEL_SHAPE });
    const dataDir = path.join(temp, "data");
    up = await startService({ name: "llmgw-up", args: [path.join(ROOT, "bin/llmgw.js"), "up", "--data-dir", dataDir, "--listen", "127.0.0.1:0"], logDir });
    const key = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    // Room for the system prompt and six turns per sequence.
    const perSequence = Math.min(BENCH_MODEL_SHAPE.contextLength, Math.ceil((options.promptTokens * 1.2 + 400) / 256) * 256);
    await api(`${up.url}/api/v1/models`, key, "POST", {
      name: MODEL,
      source: { kind: "file", path: model.path },
      scaling: { min: 2, max: 2 },
      profiles: [{ name: "cpu", engine: "llamacpp", parallel: options.parallel, ctx_size: options.parallel * perSequence, threads: 1 }],
    });
    process.stdout.write(
      `prefix routing benchmark: ${options.rounds} rounds; ${CONVERSATIONS} conversations × ${TURNS} turns, ${WORKERS} at a time; system prompts of ~${options.promptTokens} tokens; ` +
        `2 replicas × parallel ${options.parallel}; ${os.cpus().length} CPUs, load average ${os
          .loadavg()
          .map((v) => v.toFixed(2))
          .join(" ")}\n`,
    );
    const until = performance.now() + 180_000;
    while (true) {
      const health = (await api(`${up.url}/api/v1/models/${MODEL}/health`, key, "GET")) as { replicas: Array<{ state: string }> };
      if (health.replicas.filter((replica) => replica.state === "ready").length === 2) break;
      if (performance.now() > until) throw new Error(`The two replicas were not ready after 180 s: ${JSON.stringify(health)}\n${tail(up.logFile)}`);
      await sleep(500);
    }
    // A warm-up conversation per replica and mode, unmeasured: first allocations, page cache.
    for (const mode of ["least-busy", "prefix"] as const) {
      await api(`${up.url}/api/v1/models/${MODEL}`, key, "PATCH", { routing: mode });
      await Promise.all([0, 1].map((n) => ask(up!.url, key, [{ role: "user", content: `Warm-up ${mode} ${n}: ${"hello world ".repeat(200)}` }])));
    }
    const databaseFile = path.join(dataDir, "llmgw.db");
    let counted = 4;
    let before = await requestsPerReplica(databaseFile, counted);
    const samples: Sample[] = [];
    const perReplica: Array<{ round: number; mode: Mode; counts: number[] }> = [];
    for (let round = 1; round <= options.rounds; round += 1) {
      const modes: Mode[] = round % 2 === 1 ? ["least-busy", "prefix"] : ["prefix", "least-busy"];
      for (const mode of modes) {
        await api(`${up.url}/api/v1/models/${MODEL}`, key, "PATCH", { routing: mode });
        const taken = await runTraffic(up, key, options, round, mode);
        samples.push(...taken);
        counted += taken.length;
        const after = await requestsPerReplica(databaseFile, counted);
        const counts = [...after].map(([replica, count]) => count - (before.get(replica) ?? 0)).sort((a, b) => b - a);
        before = after;
        perReplica.push({ round, mode, counts });
        const seconds = taken.map((s) => s.seconds);
        const cached = taken.filter((s) => s.cachedTokens > s.promptTokens / 2).length;
        process.stdout.write(
          `round ${round} ${mode}: TTFT p50 ${(percentile(seconds, 0.5) * 1000).toFixed(0)} ms, p95 ${(percentile(seconds, 0.95) * 1000).toFixed(0)} ms; ` +
            `${cached} of ${taken.length} requests found most of their prompt cached; requests per replica ${counts.join("/")}\n`,
        );
      }
    }
    const of = (mode: Mode) => samples.filter((s) => s.mode === mode);
    const p50 = (mode: Mode) =>
      percentile(
        of(mode).map((s) => s.seconds),
        0.5,
      );
    const ratio = p50("prefix") / p50("least-busy");
    const balance = perReplica.filter((r) => r.mode === "prefix").map((r) => (r.counts.length < 2 ? 0 : r.counts[r.counts.length - 1]! / r.counts[0]!));
    const ttftMet = ratio <= TTFT_GOAL;
    const balanceMet = balance.every((share) => share >= BALANCE_GOAL);
    const row = (mode: Mode) => {
      const taken = of(mode);
      const seconds = taken.map((s) => s.seconds);
      const reused = taken.reduce((sum, s) => sum + s.cachedTokens, 0) / taken.reduce((sum, s) => sum + s.promptTokens, 0);
      const counts = perReplica.filter((r) => r.mode === mode).map((r) => r.counts.join("/"));
      return `| ${mode} | ${(percentile(seconds, 0.5) * 1000).toFixed(0)} ms | ${(percentile(seconds, 0.95) * 1000).toFixed(0)} ms | ${taken.filter((s) => s.cachedTokens > s.promptTokens / 2).length} of ${taken.length} | ${(reused * 100).toFixed(0)}% | ${counts.join(", ")} |`;
    };
    process.stdout.write(
      `\n| routing | TTFT p50 | TTFT p95 | requests with most of the prompt cached | prompt tokens reused | requests per replica (each round) |\n|--|--:|--:|--:|--:|--|\n${row("least-busy")}\n${row("prefix")}\n\n` +
        `goal: prefix p50 ÷ least-busy p50 ≤ ${TTFT_GOAL}: ${ratio.toFixed(2)} ${ttftMet ? "PASS" : "MISS"}\n` +
        `goal: requests per replica within 25% under prefix (smaller ÷ larger ≥ ${BALANCE_GOAL}, each round): ${balance.map((b) => b.toFixed(2)).join(", ")} ${balanceMet ? "PASS" : "MISS"}\n`,
    );
    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `routing-prefix-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(
      file,
      `${JSON.stringify({ bench: "routing-prefix", at: new Date().toISOString(), options, ratio, balance, perReplica, samples }, null, 2)}\n`,
    );
    process.stdout.write(`wrote ${path.relative(ROOT, file)}\n`);
  } finally {
    if (up !== undefined) await stopService(up);
    rmSync(temp, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/routing/prefix: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
