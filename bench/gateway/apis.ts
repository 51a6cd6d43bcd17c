// What the translated APIs add on llmgw's hot path: the same request through one llmgw
// server as an OpenAI chat completion, as OpenAI's Responses API (/v1/responses) and as
// Ollama's API (/api/chat), next to the stub upstream answered directly, in alternating
// 1 s windows (as run.ts does, so a noisy machine's bursts fall on every target alike).
// Each llmgw target's added latency is its p50 minus the stub's; the goal (issue 29) is
// that /v1/responses and /api/chat add at most 1.3× what chat completions add, at c=1.
//
// The stub (stub-upstream.ts) answers a fixed chat completion, or a fixed stream of 20
// chunks; the llmgw server has it as an `external` model with a client key, as run.ts.
// Every answer must be status 200; before timing, each target's answer is checked in full
// for its API's shape (a response object with the stub's text, an Ollama done line).
//
//   npm run bench:gateway-apis [-- --duration 10 --concurrency 1,16 --modes non-stream,stream
//                                  --targets responses,ollama --store on|off --cpu-prof-dir DIR]
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { request } from "undici";
import { flagReader, wholeNumber } from "../flags.ts";
import { LoadTarget, summarize } from "./load.ts";
import { ROOT, api, startService, stopService, type Service } from "./services.ts";

const MODEL = "bench";
const SETTLE_MS = 200;
const GOAL_RATIO = 1.3;
type Mode = "non-stream" | "stream";
type Target = "direct" | "chat" | "responses" | "ollama";
const ALL_TARGETS: readonly Target[] = ["direct", "chat", "responses", "ollama"];
const PATHS: Record<Target, string> = { direct: "/v1/chat/completions", chat: "/v1/chat/completions", responses: "/v1/responses", ollama: "/api/chat" };

const flag = flagReader(process.argv.slice(2));
const durationS = wholeNumber(flag("duration", "BENCH_DURATION") ?? "5", "duration");
const warmupS = wholeNumber(flag("warmup", "BENCH_WARMUP") ?? "1", "warmup", 0);
const concurrencies = (flag("concurrency", "BENCH_CONCURRENCY") ?? "1").split(",").map((value) => wholeNumber(value, "concurrency"));
const modes = (flag("modes", "BENCH_MODES") ?? "non-stream,stream").split(",") as Mode[];
/** The targets to run (the stub directly and chat completions always: the figures are against them), e.g. for a profile of one. */
const TARGETS: readonly Target[] = (() => {
  const named = flag("targets", "BENCH_TARGETS");
  if (named === undefined) return ALL_TARGETS;
  const picked = named.split(",") as Target[];
  for (const target of picked) if (!ALL_TARGETS.includes(target)) throw new Error(`Invalid --targets entry '${target}': ${ALL_TARGETS.join(", ")}.`);
  return ALL_TARGETS.filter((target) => target === "direct" || target === "chat" || picked.includes(target));
})();
/** `--store off`: /v1/responses with store: false, to see what keeping responses costs (default on, as OpenAI's default). */
const keepResponses = (flag("store", "BENCH_STORE") ?? "on") !== "off";
/** Where `node --cpu-prof` writes the llmgw server's profile (bench/gateway/profile-summary.ts reads it); none by default. */
const profileDir = flag("cpu-prof-dir", "BENCH_CPU_PROF_DIR");
for (const mode of modes) if (mode !== "non-stream" && mode !== "stream") throw new Error(`Invalid --modes entry '${mode}': non-stream or stream.`);

function body(target: Target, mode: Mode): Buffer {
  const stream = mode === "stream";
  if (target === "responses") return Buffer.from(JSON.stringify({ model: MODEL, input: "Say hello.", max_output_tokens: 32, stream, store: keepResponses }));
  // Ollama streams unless told not to.
  if (target === "ollama")
    return Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Say hello." }], stream, options: { num_predict: 32 } }));
  return Buffer.from(
    JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Say hello." }], max_tokens: 32, ...(stream ? { stream: true } : {}) }),
  );
}

/** One request in full: status 200 and the shape of the target's API. */
async function probe(target: Target, url: string, key: string | undefined, mode: Mode): Promise<void> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (key !== undefined) headers.authorization = `Bearer ${key}`;
  const answer = await request(`${url}${PATHS[target]}`, { method: "POST", headers, body: body(target, mode) });
  const text = await answer.body.text();
  if (answer.statusCode !== 200) throw new Error(`${target} (${mode}) answered ${answer.statusCode}: ${text.slice(0, 300)}`);
  const shaped =
    target === "responses"
      ? mode === "stream"
        ? text.includes("event: response.completed")
        : (JSON.parse(text) as { object?: string; status?: string }).status === "completed"
      : target === "ollama"
        ? text.trim().split("\n").at(-1)!.includes('"done":true')
        : mode === "stream"
          ? text.includes("data: [DONE]")
          : text.includes('"chat.completion"');
  if (!shaped) throw new Error(`${target} (${mode}) answered something that is not its API's answer: ${text.slice(0, 300)}`);
}

function cpuNote(): string {
  return `load average ${(readFileSync("/proc/loadavg", "utf8").split(" ")[0] ?? "?").trim()}`;
}

async function main(): Promise<void> {
  const temp = mkdtempSync(path.join(tmpdir(), "llmgw-bench-apis-"));
  const logDir = path.join(temp, "logs");
  mkdirSync(logDir);
  const services: Service[] = [];
  try {
    const stub = await startService({ name: "stub", args: ["--import", "tsx", "bench/gateway/stub-upstream.ts"], logDir });
    services.push(stub);
    const dataDir = path.join(temp, "data");
    const server = await startService({
      name: "llmgw",
      args: [
        ...(profileDir === undefined ? [] : ["--cpu-prof", "--cpu-prof-dir", path.resolve(profileDir)]),
        path.join(ROOT, "bin/llmgw.js"),
        "server",
        "--data-dir",
        dataDir,
        "--listen",
        "127.0.0.1:0",
      ],
      logDir,
    });
    services.push(server);
    const adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    await api(`${server.url}/api/v1/models`, adminKey, "POST", {
      name: MODEL,
      profiles: [{ name: "stub", engine: "external", url: stub.url, trust_max_tokens: true }],
    });
    const { key } = (await api(`${server.url}/api/v1/keys`, adminKey, "POST", { name: "bench" })) as { key: string };
    const urls: Record<Target, string> = { direct: stub.url, chat: server.url, responses: server.url, ollama: server.url };
    const keys: Record<Target, string | undefined> = { direct: undefined, chat: key, responses: key, ollama: key };
    console.log(`gateway APIs benchmark, ${cpuNote()}: stub ${stub.url}, llmgw ${server.url}; ${warmupS} s warm-up, ${durationS} s per target in 1 s windows`);
    for (const mode of modes) for (const target of TARGETS) await probe(target, urls[target], keys[target], mode);

    const results: unknown[] = [];
    for (const mode of modes) {
      for (const concurrency of concurrencies) {
        const loads = Object.fromEntries(
          TARGETS.map((target) => [
            target,
            new LoadTarget({ url: urls[target], path: PATHS[target], key: keys[target], body: body(target, mode), concurrency, expectedBytes: null }),
          ]),
        ) as Record<Target, LoadTarget>;
        const latencies = Object.fromEntries(TARGETS.map((target) => [target, [] as Float64Array[]])) as Record<Target, Float64Array[]>;
        const errors = Object.fromEntries(TARGETS.map((target) => [target, 0])) as Record<Target, number>;
        for (const target of TARGETS) await loads[target].run({ durationMs: warmupS * 1000 });
        for (let window = 0; window < durationS; window += 1) {
          // Rotated each window, so no target always runs right after another.
          const order = TARGETS.map((_, index) => TARGETS[(index + window) % TARGETS.length]!);
          for (const target of order) {
            const result = await loads[target].run({ durationMs: 1000, settleMs: SETTLE_MS });
            latencies[target].push(result.latenciesMs);
            errors[target] += result.errors;
          }
        }
        await Promise.all(TARGETS.map((target) => loads[target].close()));
        const stats = Object.fromEntries(
          TARGETS.map((target) => {
            const all = Float64Array.from(latencies[target].flatMap((part) => [...part]));
            return [target, { requests: all.length, errors: errors[target], ...summarize(all) }];
          }),
        ) as Record<Target, { requests: number; errors: number; p50Ms: number; p99Ms: number; meanMs: number }>;
        const added = (target: Target) => (stats[target] === undefined ? Number.NaN : stats[target].p50Ms - stats.direct.p50Ms);
        const ratio = (target: Target) => added(target) / added("chat");
        const row = {
          mode,
          concurrency,
          stats,
          addedP50Us: { chat: added("chat") * 1000, responses: added("responses") * 1000, ollama: added("ollama") * 1000 },
          ratio: { responses: ratio("responses"), ollama: ratio("ollama") },
        };
        results.push(row);
        const us = (ms: number) => `${Math.round(ms * 1000)} µs`;
        const verdict = (value: number) => `${value.toFixed(2)}${concurrency === 1 ? (value <= GOAL_RATIO ? " PASS" : " FAIL") : ""}`;
        console.log(
          `${mode} c=${concurrency}: p50 direct ${us(stats.direct.p50Ms)}; added: chat ${us(added("chat"))}, responses ${us(added("responses"))}, ollama ${us(added("ollama"))}; ` +
            `responses/chat ${verdict(ratio("responses"))}, ollama/chat ${verdict(ratio("ollama"))} (goal at c=1: ≤ ${GOAL_RATIO}); errors ${JSON.stringify(errors)}`,
        );
      }
    }
    const out = path.join(ROOT, "bench/results", `apis-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(out, `${JSON.stringify({ at: new Date().toISOString(), note: cpuNote(), durationS, results }, null, 2)}\n`);
    console.log(`results: ${path.relative(ROOT, out)}`);
  } finally {
    await Promise.all(services.map(stopService));
    rmSync(temp, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  console.error(error instanceof Error ? error.message : error);
  process.exitCode = 1;
});
