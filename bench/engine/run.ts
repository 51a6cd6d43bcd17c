// The bundled engine's benchmark (`npx tsx bench/engine/run.ts`): aggregate generated
// tokens per second with 1, 2 and 4 generations at once, through a real `llmgw engine`
// process over HTTP, side by side with node-llama-cpp used directly (direct.ts) on the
// same model and settings.
//
// The model is a generated llama GGUF with F32 weights of about 330 MB (never ends a
// reply on its own, so every generation runs to max_tokens): big enough that one decode
// step is bound by memory bandwidth, where one step for several sequences costs little
// more than a step for one. So a batching engine's tokens/s grows with the generations in
// flight, and one whose sequences take turns does not. The file goes to a temp dir and is
// deleted at the end.
//
// For each level L, an engine with --parallel L and a direct process with L sequences are
// loaded up front. Then each round runs, for both targets (alternating which goes first)
// and each level (back to back, in a rotated order), L generations of --tokens tokens at
// once and times them. On a small shared machine the absolute figures drift with other
// work, so the goal is a ratio of figures measured seconds apart in the same round:
//   - engine at 2 generations ≥ 1.5 × engine at 1 (median of the per-round ratios)
// and the engine is compared with direct at each level. For every sample it prints how
// many cores other processes kept busy meanwhile (other-load.ts); rerun when that was
// more than a few hundredths. A missed goal prints MISS and exits 0; an error exits 1.
//
// Options (flags win over environment):
//   --levels L     BENCH_LEVELS    comma list of generations at once (default 1,2,4)
//   --rounds N     BENCH_ROUNDS    measured rounds (default 7; one more unmeasured first)
//   --tokens N     BENCH_TOKENS    tokens per generation (default 64)
//   --threads N    BENCH_THREADS   llama.cpp threads (default 2)
//   --out DIR      BENCH_OUT       where the JSON goes (default bench/results)
//   --max-other-cores X  BENCH_MAX_OTHER_CORES  leave out samples during which other
//                                  processes kept more than X cores busy (default 0.2)
//   --compare L    BENCH_COMPARE   NAME=FILE,...: also measure these llmgw command scripts
//                                  (another commit's bin/llmgw.js) as engines, in the same rounds
import { fork, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { writeTinyLlamaGguf } from "../../src/gguf/tiny-model.ts";
import type { DirectResult, DirectRound } from "./direct.ts";
import { measureOtherLoad } from "./other-load.ts";
import { BENCH_MODEL_SHAPE, startEngineProcess, type EngineProcess } from "./engine-process.ts";
import { flagReader } from "../flags.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const CONTEXT_PER_SEQUENCE = 1024;
const GOAL = { level: 2, ratio: 1.5 };

interface Options {
  levels: number[];
  rounds: number;
  tokens: number;
  threads: number;
  out: string;
  /** More llmgw command scripts (another build or commit) measured as engines in the same rounds. */
  compare: { name: string; entry: string }[];
  /** Samples during which other processes used more cores than this are left out. */
  maxOtherCores: number;
}

interface Sample {
  round: number;
  level: number;
  /** "engine", "direct" or a --compare name. */
  target: string;
  tokens: number;
  seconds: number;
  tokensPerSecond: number;
  /** Cores that processes other than this benchmark's kept busy meanwhile (null: unknown). */
  otherCores: number | null;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const whole = (value: string, name: string): number => {
    const number = Number(value);
    if (!Number.isInteger(number) || number < 1) throw new Error(`Invalid --${name} '${value}': expected a whole number ≥ 1.`);
    return number;
  };
  const levels = (flag("levels", "BENCH_LEVELS") ?? "1,2,4").split(",").map((part) => whole(part.trim(), "levels"));
  if (!levels.includes(1) || !levels.includes(GOAL.level)) throw new Error(`--levels must include 1 and ${GOAL.level}: the goal compares them.`);
  return {
    levels: [...new Set(levels)].sort((a, b) => a - b),
    rounds: whole(flag("rounds", "BENCH_ROUNDS") ?? "7", "rounds"),
    tokens: whole(flag("tokens", "BENCH_TOKENS") ?? "64", "tokens"),
    threads: whole(flag("threads", "BENCH_THREADS") ?? "2", "threads"),
    out: flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results"),
    maxOtherCores: (() => {
      const value = Number(flag("max-other-cores", "BENCH_MAX_OTHER_CORES") ?? 0.2);
      if (!Number.isFinite(value) || value < 0) throw new Error("--max-other-cores must be a number ≥ 0.");
      return value;
    })(),
    compare: (flag("compare", "BENCH_COMPARE") ?? "")
      .split(",")
      .filter((part) => part.trim() !== "")
      .map((part) => {
        const [name, entry] = part.split("=");
        if (!name || !entry || ["engine", "direct"].includes(name))
          throw new Error(`Invalid --compare entry '${part}': expected NAME=FILE, NAME not engine or direct.`);
        return { name, entry: path.resolve(entry) };
      }),
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

const prompts = (level: number) => Array.from({ length: level }, (_, index) => `hello world ${index}`);

/** A `llmgw engine` child process with --parallel `level`. */
class EngineTarget {
  readonly pid: number;
  private constructor(
    readonly name: string,
    readonly level: number,
    private readonly engine: EngineProcess,
  ) {
    this.pid = engine.child.pid ?? 0;
  }

  static async start(name: string, entry: string, modelPath: string, level: number, threads: number): Promise<EngineTarget> {
    const engine = await startEngineProcess({
      label: `${name} (parallel ${level})`,
      entry,
      modelPath,
      args: ["--threads", String(threads), "--parallel", String(level), "--ctx-size", String(level * CONTEXT_PER_SEQUENCE), "--model-name", "bench"],
    });
    return new EngineTarget(name, level, engine);
  }

  async round(maxTokens: number): Promise<{ tokens: number; seconds: number }> {
    const started = performance.now();
    const answers = await Promise.all(
      prompts(this.level).map(async (prompt) => {
        const { status, body } = await this.engine.post<{ usage?: { completion_tokens: number } }>("/v1/completions", {
          model: "bench",
          prompt,
          max_tokens: maxTokens,
          temperature: 0,
        });
        if (status !== 200 || body.usage?.completion_tokens !== maxTokens) throw new Error(`the engine answered ${status}: ${JSON.stringify(body)}`);
        return body.usage.completion_tokens;
      }),
    );
    return { tokens: answers.reduce((sum, tokens) => sum + tokens, 0), seconds: (performance.now() - started) / 1000 };
  }

  /** Stops the engine and returns what it logged about its decode batches. */
  async stop(): Promise<{ batches: number; sequencesPerBatch: number } | null> {
    await this.engine.stop();
    for (const line of this.engine.stderr().split("\n")) {
      if (!line.startsWith("{")) continue;
      try {
        const entry = JSON.parse(line) as { msg?: string; decodeBatches?: number; sequencesPerBatch?: number };
        if (entry.msg === "decode batches") return { batches: entry.decodeBatches ?? 0, sequencesPerBatch: entry.sequencesPerBatch ?? 0 };
      } catch {
        // Not a JSON log line.
      }
    }
    return null;
  }
}

/** node-llama-cpp used directly, with `level` sequences, in its own process (direct.ts). */
class DirectTarget {
  readonly name = "direct";
  readonly pid: number;

  private constructor(
    readonly level: number,
    private readonly child: ChildProcess,
  ) {
    this.pid = child.pid ?? 0;
  }

  static async start(modelPath: string, level: number, threads: number): Promise<DirectTarget> {
    const child = fork(path.join(ROOT, "bench/engine/direct.ts"), [modelPath, String(level), String(threads), String(CONTEXT_PER_SEQUENCE)], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    await new Promise<void>((resolve, reject) => {
      child.once("message", () => resolve());
      child.once("exit", (code) => reject(new Error(`the direct process (${level} sequences) exited (${code}) before it was ready`)));
    });
    return new DirectTarget(level, child);
  }

  round(maxTokens: number): Promise<{ tokens: number; seconds: number }> {
    return new Promise((resolve, reject) => {
      const onExit = (code: number | null) => reject(new Error(`the direct process exited (${code}) during a round`));
      this.child.once("exit", onExit);
      this.child.once("message", (message: DirectResult) => {
        this.child.off("exit", onExit);
        resolve({ tokens: message.tokens, seconds: message.seconds });
      });
      this.child.send({ type: "round", prompts: prompts(this.level), maxTokens } satisfies DirectRound);
    });
  }

  async stop(): Promise<void> {
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    this.child.disconnect();
    await exited;
  }
}

const fixed = (value: number, digits = 1) => value.toFixed(digits);

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const loadAtStart = os.loadavg();
  process.stdout.write(`load average at start: ${loadAtStart.map((l) => fixed(l, 2)).join(" ")} (${os.cpus().length} CPUs)\n`);
  if ((loadAtStart[0] ?? 0) > 1) process.stdout.write("warning: other work is running; the figures will be noisy. Rerun when the load is low.\n");

  const dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-bench-engine-"));
  const engines: EngineTarget[] = [];
  const directs: DirectTarget[] = [];
  const cleanUp = async () => {
    for (const target of [...engines, ...directs]) await target.stop().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  };
  process.once("SIGINT", () => void cleanUp().finally(() => process.exit(130)));
  try {
    const model = await writeTinyLlamaGguf({ path: path.join(dir, "bench-f32.gguf"), seed: 11, endless: true, ...BENCH_MODEL_SHAPE });
    process.stdout.write(
      `model: ${(model.bytes / 1e6).toFixed(0)} MB F32, ${(model.parameterCount / 1e6).toFixed(0)} M parameters; ${options.threads} threads; ${options.tokens} tokens per generation\n`,
    );
    const engineEntries = [{ name: "engine", entry: path.join(ROOT, "bin/llmgw.js") }, ...options.compare];
    for (const level of options.levels) {
      for (const { name, entry } of engineEntries) engines.push(await EngineTarget.start(name, entry, model.path, level, options.threads));
      directs.push(await DirectTarget.start(model.path, level, options.threads));
    }
    const targetNames = [...engineEntries.map((e) => e.name), "direct"];
    const targetAt = (name: string, level: number): EngineTarget | DirectTarget =>
      [...engines, ...directs].find((target) => target.name === name && target.level === level) as EngineTarget | DirectTarget;

    const samples: Sample[] = [];
    const ourPids = () => [process.pid, ...engines.map((e) => e.pid), ...directs.map((d) => d.pid)];
    for (let round = 0; round <= options.rounds; round += 1) {
      // One target's levels back to back (the goal compares them), in a rotated order; the
      // target that goes first rotates too.
      const levels = options.levels.map((_, index) => options.levels[(index + round) % options.levels.length] as number);
      const targets = targetNames.map((_, index) => targetNames[(index + round) % targetNames.length] as string);
      const line: string[] = [];
      for (const target of targets) {
        for (const level of levels) {
          const runner = targetAt(target, level);
          const otherLoad = measureOtherLoad(ourPids);
          const { tokens, seconds } = await runner.round(options.tokens);
          const sample: Sample = { round, level, target, tokens, seconds, tokensPerSecond: tokens / seconds, otherCores: otherLoad() };
          // Round 0 warms up (page cache, first allocations) and is not counted.
          if (round > 0) samples.push(sample);
          line.push(`${target} ×${level} ${fixed(sample.tokensPerSecond)}${sample.otherCores === null ? "" : ` (others ${fixed(sample.otherCores, 2)})`}`);
        }
      }
      process.stdout.write(`${round === 0 ? "warm-up" : `round ${round}`}: ${line.join(", ")}\n`);
    }

    // Samples disturbed by other work (see other-load.ts) say nothing about the engine.
    const clean = samples.filter((sample) => sample.otherCores === null || sample.otherCores <= options.maxOtherCores);
    const of = (target: string, level: number) => clean.filter((s) => s.target === target && s.level === level);
    const medianRate = (target: string, level: number) => median(of(target, level).map((s) => s.tokensPerSecond));
    /** Median over rounds of target@level ÷ other@otherLevel, each pair from the same round. */
    const pairedRatio = (target: string, level: number, other: string, otherLevel: number) => {
      const ratios: number[] = [];
      for (let round = 1; round <= options.rounds; round += 1) {
        const a = of(target, level).find((s) => s.round === round);
        const b = of(other, otherLevel).find((s) => s.round === round);
        if (a && b) ratios.push(a.tokensPerSecond / b.tokensPerSecond);
      }
      return ratios.length === 0 ? Number.NaN : median(ratios);
    };
    const batchStats = new Map<string, { batches: number; sequencesPerBatch: number } | null>();
    for (const engine of engines) batchStats.set(`${engine.name}@${engine.level}`, await engine.stop());
    for (const direct of directs) await direct.stop();
    engines.length = 0;
    directs.length = 0;
    const loadAtEnd = os.loadavg();

    const rows = options.levels.map((level) => ({
      level,
      engine: medianRate("engine", level),
      direct: medianRate("direct", level),
      engineVsDirect: pairedRatio("engine", level, "direct", level),
      engineVsSingle: pairedRatio("engine", level, "engine", 1),
      directVsSingle: pairedRatio("direct", level, "direct", 1),
      sequencesPerBatch: batchStats.get(`engine@${level}`)?.sequencesPerBatch ?? null,
      compared: Object.fromEntries(
        options.compare.map(({ name }) => [
          name,
          {
            tokensPerSecond: medianRate(name, level),
            vsSingle: pairedRatio(name, level, name, 1),
            vsEngine: pairedRatio(name, level, "engine", level),
            sequencesPerBatch: batchStats.get(`${name}@${level}`)?.sequencesPerBatch ?? null,
          },
        ]),
      ),
    }));
    const goalRow = rows.find((row) => row.level === GOAL.level);
    const met = (goalRow?.engineVsSingle ?? 0) >= GOAL.ratio;
    const others = samples.map((s) => s.otherCores).filter((value): value is number => value !== null);
    const otherText = others.length === 0 ? "unknown" : `median ${fixed(median(others), 2)}, max ${fixed(Math.max(...others), 2)}`;
    const leftOut = samples.length - clean.length;
    process.stdout.write(
      `\n| generations at once | engine tok/s | direct tok/s | engine ÷ direct | engine ÷ engine at 1 | direct ÷ direct at 1 | engine sequences per decode batch |\n` +
        `|--:|--:|--:|--:|--:|--:|--:|\n` +
        rows
          .map(
            (row) =>
              `| ${row.level} | ${fixed(row.engine)} | ${fixed(row.direct)} | ${fixed(row.engineVsDirect, 2)} | ${fixed(row.engineVsSingle, 2)} | ${fixed(row.directVsSingle, 2)} | ${row.sequencesPerBatch === null ? "n/a" : fixed(row.sequencesPerBatch, 2)} |`,
          )
          .join("\n") +
        options.compare
          .map(
            ({ name }) =>
              `\n\n| generations at once | ${name} tok/s | ${name} ÷ ${name} at 1 | ${name} ÷ engine | ${name} sequences per decode batch |\n|--:|--:|--:|--:|--:|\n` +
              rows
                .map((row) => {
                  const other = row.compared[name];
                  const perBatch = other?.sequencesPerBatch;
                  return `| ${row.level} | ${fixed(other?.tokensPerSecond ?? 0)} | ${fixed(other?.vsSingle ?? 0, 2)} | ${fixed(other?.vsEngine ?? 0, 2)} | ${perBatch == null ? "n/a" : fixed(perBatch, 2)} |`;
                })
                .join("\n"),
          )
          .join("") +
        `\n\ntok/s: medians of ${options.rounds} rounds; ratios: medians of per-round ratios. Cores busy with other work during the samples: ${otherText}; ${leftOut} of ${samples.length} samples left out (others above ${options.maxOtherCores} cores)${leftOut > samples.length / 4 ? ": too many, rerun on a quieter machine" : ""}; load average ${loadAtStart.map((l) => fixed(l, 2)).join(" ")} at the start, ${loadAtEnd.map((l) => fixed(l, 2)).join(" ")} at the end.\n` +
        `goal: engine with ${GOAL.level} generations ≥ ${GOAL.ratio} × engine with 1: ${fixed(goalRow?.engineVsSingle ?? 0, 2)} ${met ? "PASS" : "MISS"}\n`,
    );

    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `engine-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(
      file,
      `${JSON.stringify(
        {
          bench: "engine",
          at: new Date().toISOString(),
          node: process.version,
          cpus: os.cpus().length,
          loadAtStart,
          loadAtEnd,
          options,
          model: { bytes: model.bytes, parameters: model.parameterCount, ...BENCH_MODEL_SHAPE },
          rows,
          goal: { ...GOAL, met },
          samplesLeftOut: leftOut,
          samples,
        },
        null,
        2,
      )}\n`,
    );
    process.stdout.write(`wrote ${path.relative(ROOT, file)}\n`);
  } finally {
    await cleanUp();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/engine: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
