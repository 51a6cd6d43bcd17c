// The bundled engine's benchmark (`npx tsx bench/engine/run.ts`): generated tokens per
// second with 1, 2 and 4 generations at once, and prompt processing, through a real
// `llmgw engine` process over HTTP, side by side with llama.cpp's own tools of the same
// commit (llama-cpp-anchors.ts: llama-bench and llama-batched-bench) and with
// node-llama-cpp used directly (direct.ts), on the same model and threads.
//
// The model is a generated llama GGUF with F32 weights of about 330 MB (never ends a
// reply on its own, so every generation runs to max_tokens): big enough that one decode
// step is bound by memory bandwidth, where one step for several sequences costs little
// more than a step for one. So a batching engine's tokens/s grows with the generations in
// flight, and one whose sequences take turns does not. The file goes to a temp dir and is
// deleted at the end.
//
// For each level L, an engine with --parallel L and a direct process with L sequences are
// loaded up front. Then each round runs every target once, in an order that rotates from
// round to round: the engine (its levels back to back; at level 1 also a 512-token prompt,
// and llama-bench's tg and pp512 right before or after), direct (its levels), and
// llama-batched-bench at each level. On a small shared machine the absolute figures drift with other work, so
// the goals are ratios of figures measured seconds apart in the same round (medians of
// the per-round ratios):
//   - one generation ≥ 0.85 × llama-bench tg;
//   - two at once ≥ 1.6 × one, four at once ≥ 2.2 × one;
//   - prompt processing ≥ 0.9 × llama-bench pp512.
// For every sample it prints how many cores other processes kept busy meanwhile
// (other-load.ts); samples above --max-other-cores are left out. A missed goal prints
// MISS and exits 0; an error exits 1.
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
//   --no-llama-cpp BENCH_LLAMA_CPP=0  leave out llama.cpp's tools (when they are not built)
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
import { batchedBench, findLlamaCppTools, llamaBench, type LlamaCppTools } from "./llama-cpp-anchors.ts";
import { flagReader, wholeNumber } from "../flags.ts";
import { ENGINE_THREAD_POOL_SIZE } from "../../src/engines/llamacpp/engine-launch.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const CONTEXT_PER_SEQUENCE = 1024;
/** Prompt tokens of the prompt-processing figure (llama-bench's pp512), BOS included. */
const PROMPT_TOKENS = 512;

/** The issue's goals, each a median of per-round ratios: `of` ÷ `to`. */
const GOALS = [
  { name: "one generation ÷ llama-bench tg", of: { target: "engine", kind: "tg", level: 1 }, to: { target: "llama-bench", kind: "tg", level: 1 }, ratio: 0.85 },
  { name: "two at once ÷ one", of: { target: "engine", kind: "tg", level: 2 }, to: { target: "engine", kind: "tg", level: 1 }, ratio: 1.6 },
  { name: "four at once ÷ one", of: { target: "engine", kind: "tg", level: 4 }, to: { target: "engine", kind: "tg", level: 1 }, ratio: 2.2 },
  {
    name: "prompt processing ÷ llama-bench pp512",
    of: { target: "engine", kind: "pp", level: 1 },
    to: { target: "llama-bench", kind: "pp", level: 1 },
    ratio: 0.9,
  },
] as const;

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
  /** Measure llama.cpp's own tools too (the anchors of three goals). */
  llamaCpp: boolean;
}

type Kind = "tg" | "pp";

interface Sample {
  round: number;
  /** "tg": generated tokens/s at `level` generations at once; "pp": prompt tokens/s. */
  kind: Kind;
  level: number;
  /** "engine", "direct", "llama-bench", "llama-batched-bench" or a --compare name. */
  target: string;
  tokensPerSecond: number;
  /** Cores that processes other than this benchmark's kept busy meanwhile (null: unknown). */
  otherCores: number | null;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const levels = (flag("levels", "BENCH_LEVELS") ?? "1,2,4").split(",").map((part) => wholeNumber(part.trim(), "levels"));
  if (!levels.includes(1)) throw new Error("--levels must include 1: the goals compare the others with it.");
  return {
    levels: [...new Set(levels)].sort((a, b) => a - b),
    rounds: wholeNumber(flag("rounds", "BENCH_ROUNDS") ?? "7", "rounds"),
    tokens: wholeNumber(flag("tokens", "BENCH_TOKENS") ?? "64", "tokens"),
    threads: wholeNumber(flag("threads", "BENCH_THREADS") ?? "2", "threads"),
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
        if (!name || !entry || ["engine", "direct", "llama-bench", "llama-batched-bench"].includes(name))
          throw new Error(`Invalid --compare entry '${part}': expected NAME=FILE, NAME not engine, direct or a llama.cpp tool.`);
        return { name, entry: path.resolve(entry) };
      }),
    llamaCpp: !argv.includes("--no-llama-cpp") && process.env.BENCH_LLAMA_CPP !== "0",
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

const prompts = (level: number) => Array.from({ length: level }, (_, index) => `hello world ${index}`);

/** One measurement of one target: what it measured, as tokens per second. */
type Measured = { kind: Kind; level: number; target: string; tokensPerSecond: number; sameRunAsPrevious?: true };

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

  /** `level` generations of `maxTokens` at once: their tokens over the time until the last answer. */
  async generate(maxTokens: number): Promise<number> {
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
    return answers.reduce((sum, tokens) => sum + tokens, 0) / ((performance.now() - started) / 1000);
  }

  /**
   * A prompt of PROMPT_TOKENS tokens (BOS and token ids), one token generated: the prompt's
   * tokens over the request's time. Its first id differs from round to round, so the
   * prompt cache holds nothing of it (checked through timings.cache_n).
   */
  async processPrompt(round: number): Promise<number> {
    const ids = Array.from({ length: PROMPT_TOKENS - 1 }, (_, index) => 10 + ((round * 7919 + index * 104729) % 240));
    const started = performance.now();
    const { status, body } = await this.engine.post<{ usage?: { prompt_tokens: number }; timings?: { cache_n: number } }>("/v1/completions", {
      model: "bench",
      prompt: ids,
      max_tokens: 1,
      temperature: 0,
    });
    const seconds = (performance.now() - started) / 1000;
    if (status !== 200 || body.usage?.prompt_tokens !== PROMPT_TOKENS) throw new Error(`the engine answered ${status}: ${JSON.stringify(body)}`);
    const evaluated = body.usage.prompt_tokens - (body.timings?.cache_n ?? 0);
    if (evaluated < PROMPT_TOKENS - 2) throw new Error(`the prompt cache held ${body.timings?.cache_n} tokens of a prompt meant to be new`);
    return evaluated / seconds;
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
      // The same libuv pool as the engine's (ENGINE_THREAD_POOL_SIZE): node-llama-cpp used
      // directly decodes on that pool too, and the comparison is of everything else.
      env: { ...process.env, UV_THREADPOOL_SIZE: ENGINE_THREAD_POOL_SIZE },
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    await new Promise<void>((resolve, reject) => {
      child.once("message", () => resolve());
      child.once("exit", (code) => reject(new Error(`the direct process (${level} sequences) exited (${code}) before it was ready`)));
    });
    return new DirectTarget(level, child);
  }

  generate(maxTokens: number): Promise<number> {
    return new Promise((resolve, reject) => {
      const onExit = (code: number | null) => reject(new Error(`the direct process exited (${code}) during a round`));
      this.child.once("exit", onExit);
      this.child.once("message", (message: DirectResult) => {
        this.child.off("exit", onExit);
        resolve(message.tokens / message.seconds);
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

const fixed = (value: number, digits = 1) => (Number.isFinite(value) ? value.toFixed(digits) : "n/a");

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const loadAtStart = os.loadavg();
  process.stdout.write(`load average at start: ${loadAtStart.map((l) => fixed(l, 2)).join(" ")} (${os.cpus().length} CPUs)\n`);
  if ((loadAtStart[0] ?? 0) > 1) process.stdout.write("warning: other work is running; the figures will be noisy. Rerun when the load is low.\n");
  const tools: LlamaCppTools | null = options.llamaCpp ? await findLlamaCppTools() : null;

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
      `model: ${(model.bytes / 1e6).toFixed(0)} MB F32, ${(model.parameterCount / 1e6).toFixed(0)} M parameters; ${options.threads} threads; ${options.tokens} tokens per generation${tools ? `; llama.cpp ${tools.commit.slice(0, 7)}` : ""}\n`,
    );
    const engineEntries = [{ name: "engine", entry: path.join(ROOT, "bin/llmgw.js") }, ...options.compare];
    for (const level of options.levels) {
      for (const { name, entry } of engineEntries) engines.push(await EngineTarget.start(name, entry, model.path, level, options.threads));
      directs.push(await DirectTarget.start(model.path, level, options.threads));
    }

    /** Each target's turn in a round: its measurements, levels in the order given. */
    type Turn = (round: number, levels: number[]) => AsyncGenerator<Measured>;
    // llama-bench runs inside the engine's turn, next to the engine's one generation and its
    // prompt (before them in even rounds, after them in odd ones): the two goals against it
    // compare figures taken a second apart, not a turn apart, on a machine whose speed
    // drifts from one moment to the next.
    const llamaBenchRun = async function* (): AsyncGenerator<Measured> {
      if (!tools) return;
      const bench = await llamaBench(tools, { modelPath: model.path, threads: options.threads, tg: options.tokens, pp: PROMPT_TOKENS });
      yield { kind: "tg", level: 1, target: "llama-bench", tokensPerSecond: bench.tg };
      yield { kind: "pp", level: 1, target: "llama-bench", tokensPerSecond: bench.pp, sameRunAsPrevious: true };
    };
    const engineTurn = (name: string): Turn =>
      async function* (round, levels) {
        const withAnchor = name === "engine";
        for (const level of levels) {
          const engine = engines.find((target) => target.name === name && target.level === level) as EngineTarget;
          if (level === 1 && withAnchor && round % 2 === 0) yield* llamaBenchRun();
          yield { kind: "tg", level, target: name, tokensPerSecond: await engine.generate(options.tokens) };
          if (level === 1) yield { kind: "pp", level: 1, target: name, tokensPerSecond: await engine.processPrompt(round) };
          if (level === 1 && withAnchor && round % 2 === 1) yield* llamaBenchRun();
        }
      };
    const directTurn: Turn = async function* (_round, levels) {
      for (const level of levels) {
        const direct = directs.find((target) => target.level === level) as DirectTarget;
        yield { kind: "tg", level, target: "direct", tokensPerSecond: await direct.generate(options.tokens) };
      }
    };
    const llamaCppTurn: Turn = async function* (_round, levels) {
      if (!tools) return;
      for (const level of levels) {
        const speed = await batchedBench(tools, { modelPath: model.path, threads: options.threads, level, prompt: 8, tg: options.tokens });
        yield { kind: "tg", level, target: "llama-batched-bench", tokensPerSecond: speed };
      }
    };
    const turns: Turn[] = [...engineEntries.map(({ name }) => engineTurn(name)), directTurn, ...(tools ? [llamaCppTurn] : [])];

    const samples: Sample[] = [];
    const ourPids = () => [process.pid, ...engines.map((e) => e.pid), ...directs.map((d) => d.pid)];
    for (let round = 0; round <= options.rounds; round += 1) {
      // One target's levels back to back (the goals compare them), in a rotated order; the
      // target that goes first rotates too.
      const levels = options.levels.map((_, index) => options.levels[(index + round) % options.levels.length] as number);
      const line: string[] = [];
      for (let index = 0; index < turns.length; index += 1) {
        const turn = turns[(index + round) % turns.length] as Turn;
        let otherLoad = measureOtherLoad(ourPids);
        let previous: Sample | undefined;
        for await (const { sameRunAsPrevious, ...measured } of turn(round, levels)) {
          // llama-bench measures tg and pp in one run: the load during that run is both's.
          const sample: Sample = { round, ...measured, otherCores: sameRunAsPrevious && previous ? previous.otherCores : otherLoad() };
          previous = sample;
          // Round 0 warms up (page cache, first allocations) and is not counted.
          if (round > 0) samples.push(sample);
          const label = `${sample.target} ${sample.kind === "pp" ? "pp" : `×${sample.level}`}`;
          line.push(`${label} ${fixed(sample.tokensPerSecond)}${sample.otherCores === null ? "" : ` (others ${fixed(sample.otherCores, 2)})`}`);
          otherLoad = measureOtherLoad(ourPids);
        }
      }
      process.stdout.write(`${round === 0 ? "warm-up" : `round ${round}`}: ${line.join(", ")}\n`);
    }

    // Samples disturbed by other work (see other-load.ts) say nothing about the engine.
    const clean = samples.filter((sample) => sample.otherCores === null || sample.otherCores <= options.maxOtherCores);
    const of = (target: string, kind: Kind, level: number) => clean.filter((s) => s.target === target && s.kind === kind && s.level === level);
    const medianRate = (target: string, kind: Kind, level: number) => median(of(target, kind, level).map((s) => s.tokensPerSecond));
    type Point = { target: string; kind: Kind; level: number };
    /** Median over rounds of a ÷ b, each pair from the same round. */
    const pairedRatio = (a: Point, b: Point) => {
      const ratios: number[] = [];
      for (let round = 1; round <= options.rounds; round += 1) {
        const x = of(a.target, a.kind, a.level).find((s) => s.round === round);
        const y = of(b.target, b.kind, b.level).find((s) => s.round === round);
        if (x && y) ratios.push(x.tokensPerSecond / y.tokensPerSecond);
      }
      return ratios.length === 0 ? Number.NaN : median(ratios);
    };
    const tg = (target: string, level: number): Point => ({ target, kind: "tg", level });
    const batchStats = new Map<string, { batches: number; sequencesPerBatch: number } | null>();
    for (const engine of engines) batchStats.set(`${engine.name}@${engine.level}`, await engine.stop());
    for (const direct of directs) await direct.stop();
    engines.length = 0;
    directs.length = 0;
    const loadAtEnd = os.loadavg();

    const rows = options.levels.map((level) => ({
      level,
      engine: medianRate("engine", "tg", level),
      batched: medianRate("llama-batched-bench", "tg", level),
      direct: medianRate("direct", "tg", level),
      engineVsBatched: pairedRatio(tg("engine", level), tg("llama-batched-bench", level)),
      engineVsSingle: pairedRatio(tg("engine", level), tg("engine", 1)),
      batchedVsSingle: pairedRatio(tg("llama-batched-bench", level), tg("llama-batched-bench", 1)),
      directVsSingle: pairedRatio(tg("direct", level), tg("direct", 1)),
      sequencesPerBatch: batchStats.get(`engine@${level}`)?.sequencesPerBatch ?? null,
      compared: Object.fromEntries(
        options.compare.map(({ name }) => [
          name,
          {
            tokensPerSecond: medianRate(name, "tg", level),
            vsSingle: pairedRatio(tg(name, level), tg(name, 1)),
            vsEngine: pairedRatio(tg(name, level), tg("engine", level)),
            sequencesPerBatch: batchStats.get(`${name}@${level}`)?.sequencesPerBatch ?? null,
          },
        ]),
      ),
    }));
    const single = {
      llamaBenchTg: medianRate("llama-bench", "tg", 1),
      enginePp: medianRate("engine", "pp", 1),
      llamaBenchPp: medianRate("llama-bench", "pp", 1),
      comparedPp: Object.fromEntries(options.compare.map(({ name }) => [name, medianRate(name, "pp", 1)])),
    };
    const goals = GOALS.filter((goal) => options.levels.includes(goal.of.level) && (tools || goal.to.target === "engine")).map((goal) => {
      const value = pairedRatio(goal.of, goal.to);
      return { name: goal.name, ratio: goal.ratio, value, met: value >= goal.ratio };
    });
    const others = samples.map((s) => s.otherCores).filter((value): value is number => value !== null);
    const otherText = others.length === 0 ? "unknown" : `median ${fixed(median(others), 2)}, max ${fixed(Math.max(...others), 2)}`;
    const leftOut = samples.length - clean.length;
    process.stdout.write(
      `\n| generations at once | engine tok/s | llama-batched-bench tok/s | direct tok/s | engine ÷ llama-batched-bench | engine ÷ engine at 1 | llama-batched-bench ÷ itself at 1 | direct ÷ direct at 1 | engine sequences per decode batch |\n` +
        `|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n` +
        rows
          .map(
            (row) =>
              `| ${row.level} | ${fixed(row.engine)} | ${fixed(row.batched)} | ${fixed(row.direct)} | ${fixed(row.engineVsBatched, 2)} | ${fixed(row.engineVsSingle, 2)} | ${fixed(row.batchedVsSingle, 2)} | ${fixed(row.directVsSingle, 2)} | ${row.sequencesPerBatch === null ? "n/a" : fixed(row.sequencesPerBatch, 2)} |`,
          )
          .join("\n") +
        `\n\nllama-bench tg${options.tokens}: ${fixed(single.llamaBenchTg)} tok/s; prompt of ${PROMPT_TOKENS} tokens: engine ${fixed(single.enginePp)} tok/s, llama-bench pp${PROMPT_TOKENS} ${fixed(single.llamaBenchPp)} tok/s` +
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
                .join("\n") +
              `\n${name} prompt: ${fixed(single.comparedPp[name] ?? Number.NaN)} tok/s`,
          )
          .join("") +
        `\n\ntok/s: medians of ${options.rounds} rounds; ratios: medians of per-round ratios. Cores busy with other work during the samples: ${otherText}; ${leftOut} of ${samples.length} samples left out (others above ${options.maxOtherCores} cores)${leftOut > samples.length / 4 ? ": too many, rerun on a quieter machine" : ""}; load average ${loadAtStart.map((l) => fixed(l, 2)).join(" ")} at the start, ${loadAtEnd.map((l) => fixed(l, 2)).join(" ")} at the end.\n` +
        goals.map((goal) => `goal: ${goal.name} ≥ ${goal.ratio}: ${fixed(goal.value, 2)} ${goal.met ? "PASS" : "MISS"}\n`).join(""),
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
          llamaCpp: tools?.commit ?? null,
          model: { bytes: model.bytes, parameters: model.parameterCount, ...BENCH_MODEL_SHAPE },
          rows,
          single,
          goals,
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
