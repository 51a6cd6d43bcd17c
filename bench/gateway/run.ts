// The gateway benchmark (`npm run bench:gateway`). It starts three child processes (the
// stub upstream, the floor proxy in front of it, and a real `llmgw server` with a fresh
// SQLite data dir, an `external` model routed to the stub and a client key), then runs the
// same closed-loop load against the stub directly, through the floor and through llmgw,
// for {non-stream, stream} × each concurrency. The load runs in this process, so it shares
// no event loop with what it measures.
//
// On a small shared machine the absolute figures drift from second to second (other jobs
// come and go), so the three targets of a cell are measured in short alternating windows
// (direct, floor, llmgw, then the next window in a rotated order, ...) over the same span
// of time, and the goals are ratios of figures measured side by side:
//   - added p50 at concurrency 1: (p50 llmgw − p50 direct) / (p50 floor − p50 direct) ≤ 2
//   - throughput at concurrency 64: rps llmgw / rps floor ≥ 0.6
// A missed goal prints MISS and still exits 0; an error (a failed request, a server that
// does not start) exits 1, since such a run measured nothing valid.
//
// Options (flags win over environment):
//   --duration S     BENCH_DURATION     measured seconds per target and cell (default 5)
//   --window S       BENCH_WINDOW       length of one alternating window (default 1)
//   --warmup S       BENCH_WARMUP       unmeasured seconds per target and cell (default 1)
//   --concurrency L  BENCH_CONCURRENCY  comma list (default 1,16,64)
//   --modes L        BENCH_MODES        non-stream,stream (default both)
//   --cpu-prof W     BENCH_CPU_PROF     llmgw | floor | all: run those children with
//                                       --cpu-prof; profiles go to bench/results/prof-<time>/<who>/
//   --out DIR        BENCH_OUT          where the JSON goes (default bench/results)
//   --llmgw-entry F  BENCH_LLMGW_ENTRY  the llmgw command's script (default bin/llmgw.js)
//   --compare L      BENCH_COMPARE      NAME=FILE,...: also measure these llmgw command
//                                       scripts (another build or branch of the CLI), each
//                                       as one more target in the same alternating windows
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { request } from "undici";
import { LoadTarget, summarize } from "./load.ts";
import { ROOT, api, startService, stopService, tail, type Service } from "./services.ts";
import { flagReader } from "../flags.ts";

/** The three targets every run measures; `--compare` adds more llmgw builds after them. */
const TARGETS = ["direct", "floor", "llmgw"] as const;
type Target = string;
type Mode = "non-stream" | "stream";
const MODEL = "bench";

/** Each window first runs this long unmeasured, so all workers reach their steady pace. */
const SETTLE_MS = 200;

interface Options {
  durationS: number;
  windowS: number;
  warmupS: number;
  concurrency: number[];
  modes: Mode[];
  cpuProf: "none" | "llmgw" | "floor" | "all";
  out: string;
  llmgwEntry: string;
  compare: { name: string; entry: string }[];
  /** Whether the client key has a budget and rate limits (and the model prices), so policy is in the path. */
  keyLimits: boolean;
  /** The --compare builds get an unlimited key and an unpriced model (builds from before key limits). */
  comparePlain: boolean;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const positive = (value: string | undefined, fallback: number, name: string) => {
    if (value === undefined) return fallback;
    const number = Number(value);
    if (!Number.isFinite(number) || number <= 0) throw new Error(`Invalid --${name} '${value}': expected a positive number.`);
    return number;
  };
  const concurrency = (flag("concurrency", "BENCH_CONCURRENCY") ?? "1,16,64").split(",").map((part) => {
    const number = Number(part.trim());
    if (!Number.isInteger(number) || number < 1) throw new Error(`Invalid --concurrency entry '${part}': expected whole numbers ≥ 1, e.g. 1,16,64.`);
    return number;
  });
  const modes = (flag("modes", "BENCH_MODES") ?? "non-stream,stream").split(",").map((part) => {
    const mode = part.trim();
    if (mode !== "non-stream" && mode !== "stream") throw new Error(`Invalid --modes entry '${part}': use non-stream and/or stream.`);
    return mode;
  });
  const cpuProf = flag("cpu-prof", "BENCH_CPU_PROF") ?? "none";
  if (!["none", "llmgw", "floor", "all"].includes(cpuProf)) throw new Error(`Invalid --cpu-prof '${cpuProf}': use llmgw, floor or all.`);
  const keyLimits = flag("key-limits", "BENCH_KEY_LIMITS") ?? "on";
  if (keyLimits !== "on" && keyLimits !== "off") throw new Error(`Invalid --key-limits '${keyLimits}': use on or off.`);
  return {
    durationS: positive(flag("duration", "BENCH_DURATION"), 5, "duration"),
    windowS: positive(flag("window", "BENCH_WINDOW"), 1, "window"),
    warmupS: positive(flag("warmup", "BENCH_WARMUP"), 1, "warmup"),
    concurrency,
    modes,
    cpuProf: cpuProf as Options["cpuProf"],
    out: path.resolve(flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results")),
    llmgwEntry: path.resolve(flag("llmgw-entry", "BENCH_LLMGW_ENTRY") ?? path.join(ROOT, "bin/llmgw.js")),
    compare: (flag("compare", "BENCH_COMPARE") ?? "")
      .split(",")
      .filter((part) => part.trim() !== "")
      .map((part) => {
        const [name, entry] = part.split("=");
        if (name === undefined || entry === undefined || !/^[a-z0-9-]+$/i.test(name) || (TARGETS as readonly string[]).includes(name)) {
          throw new Error(
            `Invalid --compare entry '${part}': use NAME=FILE with a new name of letters, digits and '-', e.g. bundled=/tmp/llmgw/dist/cli/main.mjs.`,
          );
        }
        return { name, entry: path.resolve(entry) };
      }),
    keyLimits: keyLimits === "on",
    comparePlain: argv.includes("--compare-plain") || process.env.BENCH_COMPARE_PLAIN === "1",
  };
}

// ---------------------------------------------------------------------------------------
// Child processes

/** CPU seconds (user + system) a process has used so far, from /proc; null elsewhere. */
const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();
function cpuSeconds(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------------------
// llmgw setup through its admin API

function requestBody(mode: Mode): Buffer {
  return Buffer.from(
    JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "Say hello." }], max_tokens: 32, ...(mode === "stream" ? { stream: true } : {}) }),
  );
}

/** One request, fully checked: status, shape of the answer; returns the body's length. */
async function probe(target: string, url: string, mode: Mode, key: string | undefined): Promise<number> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (key !== undefined) headers.authorization = `Bearer ${key}`;
  const response = await request(`${url}/v1/chat/completions`, { method: "POST", headers, body: requestBody(mode) });
  const text = await response.body.text();
  const problem = (what: string) => new Error(`${target} (${mode}) answered wrongly: ${what}. Body: ${text.slice(0, 300)}`);
  if (response.statusCode !== 200) throw problem(`HTTP ${response.statusCode}`);
  if (mode === "non-stream") {
    const parsed = JSON.parse(text) as { object?: string };
    if (parsed.object !== "chat.completion") throw problem("not a chat.completion");
  } else {
    const events = text.split("\n\n").filter((event) => event !== "");
    if (events.length !== 21 || events.at(-1) !== "data: [DONE]") throw problem(`${events.length} events, expected 20 chunks and [DONE]`);
    if (!events.slice(0, 20).every((event) => event.startsWith("data: {") && event.includes('"chat.completion.chunk"')))
      throw problem("a chunk is not a chat.completion.chunk event");
  }
  return Buffer.byteLength(text);
}

// ---------------------------------------------------------------------------------------
// The matrix

interface WindowRecord {
  mode: Mode;
  concurrency: number;
  target: Target;
  window: number;
  /** Position of this target within its window's rotation (0 = first). */
  order: number;
  requests: number;
  errors: number;
  errorSamples: string[];
  rps: number;
  p50Ms: number;
  p99Ms: number;
  /** CPU time per answered request over the whole window, µs (null without /proc). */
  cpuUsPerRequest: { proxy: number | null; stub: number | null; load: number };
}

interface CellResult {
  mode: Mode;
  concurrency: number;
  target: Target;
  requests: number;
  errors: number;
  errorSamples: string[];
  rps: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  addedP50Us: number | null;
  cpuUsPerRequest: { proxy: number | null; stub: number | null; load: number };
}

interface Goal {
  name: string;
  /** llmgw, or a build given with --compare. */
  target: Target;
  mode: Mode;
  description: string;
  /** The target's figure: added p50 in µs, or requests per second. */
  subject: number | null;
  floor: number | null;
  ratio: number | null;
  threshold: string;
  /** The same ratio window by window (the three targets' windows of one rotation). */
  perWindow: (number | null)[];
  verdict: "PASS" | "MISS" | "n/a";
}

function concat(parts: Float64Array[]): Float64Array {
  const merged = new Float64Array(parts.reduce((sum, part) => sum + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    merged.set(part, offset);
    offset += part.length;
  }
  return merged;
}

function rotate<T>(items: readonly T[], by: number): T[] {
  const shift = by % items.length;
  return [...items.slice(shift), ...items.slice(0, shift)];
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const began = performance.now();
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  const temp = mkdtempSync(path.join(os.tmpdir(), "llmgw-bench-"));
  const logDir = path.join(temp, "logs");
  mkdirSync(logDir);
  mkdirSync(options.out, { recursive: true });
  const profDir = path.join(options.out, `prof-${stamp}`);
  // One folder per process: Node writes one profile per thread (the main thread's is the
  // one that matters; tsx's module loader runs in a worker thread and writes its own).
  const profArgs = (who: "llmgw" | "floor") =>
    options.cpuProf === who || options.cpuProf === "all" ? ["--cpu-prof", `--cpu-prof-dir=${path.join(profDir, who)}`] : [];

  const services: Service[] = [];
  let interrupted = false;
  const cleanup = async () => {
    await Promise.all(services.map(stopService));
    rmSync(temp, { recursive: true, force: true });
  };
  // Stop the servers however this process ends: on a signal cleanly, on exit by force.
  for (const [signal, code] of [
    ["SIGINT", 130],
    ["SIGTERM", 143],
    ["SIGHUP", 129],
  ] as const) {
    process.once(signal, () => {
      if (interrupted) return;
      interrupted = true;
      log(`${signal}: stopping the servers`);
      void cleanup().then(() => process.exit(code));
    });
  }
  process.once("exit", () => {
    for (const service of services) if (service.child.exitCode === null && service.child.signalCode === null) service.child.kill("SIGKILL");
  });

  try {
    log(
      `llmgw gateway benchmark: ${options.modes.join(" + ")} × c=${options.concurrency.join(",")} × {${[...TARGETS, ...options.compare.map((variant) => variant.name)].join(", ")}}; per target and cell ` +
        `${options.warmupS} s warm-up, then ${options.durationS} s measured in ${options.windowS} s windows that alternate the targets`,
    );
    const stub = await startService({ name: "stub", args: ["--import", "tsx", "bench/gateway/stub-upstream.ts"], logDir });
    services.push(stub);
    const floor = await startService({
      name: "floor",
      args: [...profArgs("floor"), "--import", "tsx", "bench/gateway/floor-proxy.ts", "--upstream", stub.url],
      logDir,
    });
    services.push(floor);
    const targets: Target[] = [...TARGETS, ...options.compare.map((variant) => variant.name)];
    const urls: Record<Target, string> = { direct: stub.url, floor: floor.url };
    const keys: Record<Target, string | undefined> = { direct: undefined, floor: undefined };
    const pids: Record<Target, number | undefined> = { direct: undefined, floor: floor.child.pid };
    // An llmgw server with its own SQLite data dir, the stub as an `external` model and a client key.
    for (const { name, entry } of [{ name: "llmgw", entry: options.llmgwEntry }, ...options.compare]) {
      const dataDir = path.join(temp, `data-${name}`);
      const server = await startService({
        name,
        args: [...(name === "llmgw" ? profArgs("llmgw") : []), entry, "server", "--data-dir", dataDir, "--listen", "127.0.0.1:0"],
        logDir,
      });
      services.push(server);
      const adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
      // With key limits on, every request reserves and settles a budget (priced model) and a
      // rate window in SQLite, and answers carry x-ratelimit-* headers: the limits never bind.
      const limited = options.keyLimits && (name === "llmgw" || !options.comparePlain);
      const prices = limited ? { prices: { input_per_million: 0.5, output_per_million: 1.5 } } : {};
      const limits = limited ? { rpm: 100_000_000, tpm: 100_000_000, budget_usd: 1_000_000, budget_period: "month" } : {};
      // The stub stands for an engine, which keeps to max_tokens: `trust_max_tokens` (else, with
      // key limits, llmgw asks it for a stream to hold it to the bound: relay-assembled.ts). A
      // build from before the option refuses the field, and gets the profile without it.
      const profile = { name: "stub", engine: "external", url: stub.url };
      await api(`${server.url}/api/v1/models`, adminKey, "POST", { name: MODEL, profiles: [{ ...profile, trust_max_tokens: true }], ...prices }).catch(() =>
        api(`${server.url}/api/v1/models`, adminKey, "POST", { name: MODEL, profiles: [profile], ...prices }),
      );
      const { key } = (await api(`${server.url}/api/v1/keys`, adminKey, "POST", { name: "bench", ...limits })) as { key: string };
      urls[name] = server.url;
      keys[name] = key;
      pids[name] = server.child.pid;
      log(
        `${name} ${server.url} (${path.relative(ROOT, entry) || entry}; SQLite in ${dataDir}, external model '${MODEL}', client key ${key.slice(0, 12)}…${limited ? " with a budget and rate limits" : ""})`,
      );
    }
    log(`stub ${stub.url}  floor ${floor.url}`);

    // Every target must give the same, correct answer before anything is timed, and each
    // llmgw must be checking keys for real.
    const expectedBytes = {} as Record<Mode, number>;
    for (const mode of options.modes) {
      expectedBytes[mode] = await probe("direct", urls.direct!, mode, undefined);
      for (const target of targets.slice(1)) {
        const bytes = await probe(target, urls[target]!, mode, keys[target]);
        if (bytes !== expectedBytes[mode]) throw new Error(`${target} (${mode}) answered ${bytes} bytes where the stub answers ${expectedBytes[mode]}.`);
      }
    }
    for (const target of targets.slice(2)) {
      const refused = await request(`${urls[target]}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: "Bearer llmgw-not-a-real-key", "content-type": "application/json" },
        body: requestBody("non-stream"),
      });
      await refused.body.dump();
      if (refused.statusCode !== 401)
        throw new Error(`${target} answered ${refused.statusCode} to a wrong key; the benchmark needs the key check on (expected 401).`);
      if (options.keyLimits && (target === "llmgw" || !options.comparePlain)) {
        const limited = await request(`${urls[target]}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${keys[target]}`, "content-type": "application/json" },
          body: requestBody("non-stream"),
        });
        await limited.body.dump();
        if (limited.headers["x-ratelimit-limit-requests"] === undefined)
          throw new Error(`${target} answered a limited key without x-ratelimit-limit-requests; the limits are not in the path.`);
      }
    }

    const windows: WindowRecord[] = [];
    // Every answer each target gave, warm-ups and probes included (to put a CPU profile per request).
    const served: Record<Target, number> = Object.fromEntries(
      targets.map((target, index) => [
        target,
        index === 0
          ? options.modes.length * targets.length
          : index === 1
            ? options.modes.length
            : options.modes.length + 1 + (options.keyLimits && (target === "llmgw" || !options.comparePlain) ? 1 : 0),
      ]),
    );
    const cells: CellResult[] = [];
    const windowCount = Math.max(1, Math.round(options.durationS / options.windowS));
    const windowMs = (options.durationS * 1000) / windowCount;
    const cellCount = options.modes.length * options.concurrency.length;
    // Metrics are always on in llmgw; a scraper reads each llmgw's /metrics every second (15 times
    // Prometheus's default rate), so what scraping costs is in the figures too.
    const scraper = setInterval(() => {
      for (const target of targets.slice(2)) {
        void request(`${urls[target]}/metrics`)
          .then((response) => response.body.dump())
          .catch(() => undefined);
      }
    }, 1000);
    let cellIndex = 0;
    for (const mode of options.modes) {
      for (const concurrency of options.concurrency) {
        cellIndex += 1;
        const loads: Record<Target, LoadTarget> = Object.fromEntries(
          targets.map((target) => [
            target,
            new LoadTarget({ url: urls[target]!, key: keys[target], body: requestBody(mode), concurrency, expectedBytes: expectedBytes[mode] }),
          ]),
        );
        const latencies: Record<Target, Float64Array[]> = Object.fromEntries(targets.map((target) => [target, []]));
        try {
          for (const target of rotate(targets, cellIndex)) {
            const warm = await loads[target]!.run({ durationMs: options.warmupS * 1000 });
            served[target] = (served[target] ?? 0) + warm.completed;
            if (warm.errors > 0)
              throw new Error(`${target} (${mode}, c=${concurrency}) failed during warm-up: ${warm.errors} errors, e.g. ${warm.errorSamples[0]}.`);
          }
          for (let window = 0; window < windowCount; window += 1) {
            for (const [order, target] of rotate(targets, cellIndex + window).entries()) {
              const proxyBefore = cpuSeconds(pids[target]);
              const stubBefore = cpuSeconds(stub.child.pid);
              const loadBefore = process.cpuUsage();
              const result = await loads[target]!.run({ durationMs: windowMs, settleMs: SETTLE_MS });
              const loadUsage = process.cpuUsage(loadBefore);
              const proxyAfter = cpuSeconds(pids[target]);
              const stubAfter = cpuSeconds(stub.child.pid);
              const perRequest = (before: number | null, after: number | null) =>
                before === null || after === null ? null : ((after - before) * 1e6) / Math.max(1, result.completed);
              latencies[target]!.push(result.latenciesMs);
              served[target] = (served[target] ?? 0) + result.completed;
              windows.push({
                mode,
                concurrency,
                target,
                window,
                order,
                requests: result.requests,
                errors: result.errors,
                errorSamples: result.errorSamples,
                rps: result.rps,
                p50Ms: result.p50Ms,
                p99Ms: result.p99Ms,
                cpuUsPerRequest: {
                  proxy: perRequest(proxyBefore, proxyAfter),
                  stub: perRequest(stubBefore, stubAfter),
                  load: (loadUsage.user + loadUsage.system) / Math.max(1, result.completed),
                },
              });
            }
          }
        } finally {
          await Promise.all(targets.map((target) => loads[target]!.close()));
        }

        // Merge the windows: all latencies of a target together, throughput over all of them.
        for (const target of targets) {
          const own = windows.filter((w) => w.mode === mode && w.concurrency === concurrency && w.target === target);
          const stats = summarize(concat(latencies[target]!));
          const requests = own.reduce((sum, w) => sum + w.requests, 0);
          const cpu = (pick: (w: WindowRecord) => number | null) => {
            const values = own.map(pick).filter((value): value is number => value !== null);
            return values.length === 0 ? null : values.reduce((sum, value) => sum + value, 0) / values.length;
          };
          cells.push({
            mode,
            concurrency,
            target,
            requests,
            errors: own.reduce((sum, w) => sum + w.errors, 0),
            errorSamples: own.flatMap((w) => w.errorSamples).slice(0, 5),
            rps: requests / options.durationS,
            ...stats,
            addedP50Us: null,
            cpuUsPerRequest: {
              proxy: cpu((w) => w.cpuUsPerRequest.proxy),
              stub: cpu((w) => w.cpuUsPerRequest.stub),
              load: cpu((w) => w.cpuUsPerRequest.load) ?? 0,
            },
          });
        }
        const here = cells.slice(-targets.length);
        for (const cell of here) cell.addedP50Us = (cell.p50Ms - here[0]!.p50Ms) * 1000;
        const errorsHere = here.reduce((sum, cell) => sum + cell.errors, 0);
        log(
          `[${cellIndex}/${cellCount}] ${mode.padEnd(10)} c=${String(concurrency).padEnd(3)} ` +
            here.map((cell) => `${cell.target} ${fmt(cell.rps, 0)} rps p50 ${fmt(cell.p50Ms, 3)} ms`).join(" | ") +
            (errorsHere > 0 ? `  ERRORS ${errorsHere}: ${here.flatMap((cell) => cell.errorSamples)[0]}` : ""),
        );
      }
    }

    clearInterval(scraper);
    // What /metrics counted, beside what the load saw (which leaves out answers cut at a window's end).
    const metricsCounted: Record<string, Record<string, number>> = {};
    for (const target of targets.slice(2)) {
      const text = await (await request(`${urls[target]}/metrics`)).body.text();
      const counts: Record<string, number> = {};
      for (const match of text.matchAll(new RegExp(`^llmgw_requests_total\\{model="${MODEL}",status="(\\d+)"\\} (\\d+)$`, "gm")))
        counts[match[1]!] = Number(match[2]);
      metricsCounted[target] = counts;
      log(`${target} /metrics: llmgw_requests_total for '${MODEL}' by status ${JSON.stringify(counts)}; answers the load read whole: ${served[target]! - 1}`);
    }

    const cellOf = (mode: Mode, concurrency: number, target: Target) =>
      cells.find((cell) => cell.mode === mode && cell.concurrency === concurrency && cell.target === target)!;
    const windowOf = (mode: Mode, concurrency: number, target: Target, window: number) =>
      windows.find((w) => w.mode === mode && w.concurrency === concurrency && w.target === target && w.window === window)!;
    const windowIndexes = Array.from({ length: windowCount }, (_, window) => window);
    const goals: Goal[] = [];
    // The goals, for llmgw and for every build given with --compare.
    for (const subject of targets.slice(2)) {
      for (const mode of options.modes) {
        if (options.concurrency.includes(1)) {
          const direct = cellOf(mode, 1, "direct");
          const floorAdded = cellOf(mode, 1, "floor").p50Ms - direct.p50Ms;
          const subjectAdded = cellOf(mode, 1, subject).p50Ms - direct.p50Ms;
          const ratio = floorAdded > 0 ? subjectAdded / floorAdded : null;
          goals.push({
            name: "added-p50-c1",
            target: subject,
            mode,
            description: `${mode}, c=1: added p50 ${subject} / added p50 floor`,
            subject: subjectAdded * 1000,
            floor: floorAdded * 1000,
            ratio,
            threshold: "≤ 2",
            perWindow: windowIndexes.map((window) => {
              const d = windowOf(mode, 1, "direct", window).p50Ms;
              const f = windowOf(mode, 1, "floor", window).p50Ms - d;
              return f > 0 ? (windowOf(mode, 1, subject, window).p50Ms - d) / f : null;
            }),
            verdict: ratio === null ? "n/a" : ratio <= 2 ? "PASS" : "MISS",
          });
        }
        if (options.concurrency.includes(64)) {
          const ratio = cellOf(mode, 64, subject).rps / cellOf(mode, 64, "floor").rps;
          goals.push({
            name: "rps-c64",
            target: subject,
            mode,
            description: `${mode}, c=64: rps ${subject} / rps floor`,
            subject: cellOf(mode, 64, subject).rps,
            floor: cellOf(mode, 64, "floor").rps,
            ratio,
            threshold: "≥ 0.60",
            perWindow: windowIndexes.map((window) => windowOf(mode, 64, subject, window).rps / windowOf(mode, 64, "floor", window).rps),
            verdict: ratio >= 0.6 ? "PASS" : "MISS",
          });
        }
      }
    }

    const elapsedS = (performance.now() - began) / 1000;
    const errors = cells.reduce((sum, cell) => sum + cell.errors, 0);
    process.stdout.write(`\n${renderTable(cells)}\n\n${renderGoals(goals)}\n`);

    const machine = {
      cpus: os.cpus().length,
      cpuModel: os.cpus()[0]?.model ?? "unknown",
      memoryGiB: Math.round(os.totalmem() / 2 ** 30),
      platform: `${os.platform()} ${os.release()}`,
      node: process.version,
      loadAverageAtEnd: os.loadavg().map((value) => Number(value.toFixed(2))),
    };
    const file = path.join(options.out, `gateway-${stamp}.json`);
    const report = {
      benchmark: "gateway",
      date: new Date().toISOString(),
      commit: gitDescribe(),
      machine,
      options: { ...options, out: undefined },
      expectedBodyBytes: expectedBytes,
      elapsedSeconds: Number(elapsedS.toFixed(1)),
      errors,
      cells,
      goals,
      served,
      metricsCounted,
      windows,
    };
    writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`);
    log(
      `${errors === 0 ? "no errors" : `${errors} ERRORS: this run is not a valid measurement`}; ${cells.reduce((sum, cell) => sum + cell.requests, 0)} requests measured in ${elapsedS.toFixed(0)} s (load average now ${machine.loadAverageAtEnd.join(" ")})`,
    );
    log(`wrote ${path.relative(process.cwd(), file)}`);
    await cleanup();
    if (options.cpuProf !== "none") {
      log(
        `CPU profiles in ${path.relative(process.cwd(), profDir)}/ (the main thread's ends in .0.001.cpuprofile); requests served: floor ${served.floor}, llmgw ${served.llmgw}`,
      );
      log(`summarize: npx tsx bench/gateway/profile-summary.ts FILE --skip 3 --requests N`);
    }
    process.exitCode = errors === 0 ? 0 : 1;
  } catch (error) {
    if (!interrupted) {
      process.stderr.write(`bench/gateway failed: ${error instanceof Error ? error.message : String(error)}\n`);
      for (const service of services) process.stderr.write(`--- ${service.name} log (last lines) ---\n${tail(service.logFile)}\n`);
    }
    await cleanup();
    process.exitCode = 1;
  }
}

function gitDescribe(): string | null {
  try {
    const commit = execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd: ROOT, encoding: "utf8" }).trim();
    const dirty = execFileSync("git", ["status", "--porcelain", "--", "src"], { cwd: ROOT, encoding: "utf8" }).trim() !== "";
    return dirty ? `${commit} (src/ has uncommitted changes)` : commit;
  } catch {
    return null;
  }
}

function fmt(value: number | null, digits: number): string {
  return value === null || !Number.isFinite(value) ? "–" : value.toFixed(digits);
}

function log(line: string): void {
  process.stderr.write(`${line}\n`);
}

function renderTable(cells: CellResult[]): string {
  const header = ["mode", "c", "target", "rps", "p50 ms", "p99 ms", "+p50 µs", "proxy CPU µs/req", "errors"];
  const rows = cells.map((cell) => [
    cell.mode,
    String(cell.concurrency),
    cell.target,
    fmt(cell.rps, 0),
    fmt(cell.p50Ms, 3),
    fmt(cell.p99Ms, 3),
    cell.target === "direct" ? "" : fmt(cell.addedP50Us, 0),
    fmt(cell.cpuUsPerRequest.proxy, 0),
    String(cell.errors),
  ]);
  const widths = header.map((title, column) => Math.max(title.length, ...rows.map((row) => row[column]!.length)));
  const right = new Set([1, 3, 4, 5, 6, 7, 8]);
  const line = (row: string[]) =>
    `| ${row.map((text, column) => (right.has(column) ? text.padStart(widths[column]!) : text.padEnd(widths[column]!))).join(" | ")} |`;
  const rule = `|${widths.map((width, column) => (right.has(column) ? `${"-".repeat(width + 1)}:` : "-".repeat(width + 2))).join("|")}|`;
  return [line(header), rule, ...rows.map(line)].join("\n");
}

function renderGoals(goals: Goal[]): string {
  if (goals.length === 0) return "goals: n/a (the concurrency list has neither 1 nor 64)";
  return goals
    .map((goal) => {
      const figures =
        goal.name === "added-p50-c1" ? `${fmt(goal.subject, 0)} µs / ${fmt(goal.floor, 0)} µs` : `${fmt(goal.subject, 0)} rps / ${fmt(goal.floor, 0)} rps`;
      const known = goal.perWindow.filter((value): value is number => value !== null).sort((x, y) => x - y);
      const spread =
        known.length === 0 ? "–" : `median ${fmt(known[Math.floor((known.length - 1) / 2)]!, 2)}, range ${fmt(known[0]!, 2)}–${fmt(known.at(-1)!, 2)}`;
      return `${goal.verdict.padEnd(4)} ${goal.description} = ${figures} = ${fmt(goal.ratio, 2)}  (goal ${goal.threshold}; window by window: ${spread})`;
    })
    .join("\n");
}

await main();
