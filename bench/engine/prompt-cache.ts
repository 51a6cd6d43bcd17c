// The bundled engine's prompt cache, measured (`npm run bench:engine-prompt-cache`): time
// to first token for chat requests that start with a long system prompt, the first time
// (cold: nothing of it is held by any sequence) and for the conversation's next questions
// (warm: a sequence holds the system prompt and the turns before).
//
// One `llmgw engine --parallel 2` on the engine benchmark's model. Each round makes two
// new system prompts of about --prompt-tokens tokens (A and B, each starting with the
// round's number so no earlier round's cache applies) and asks, in this order: A's first
// question, B's first question (both cold), then A's second, B's second, A's third and B's
// third (warm). With two sequences and two conversations in turn, each warm request must
// find the sequence holding its own conversation: the sequence given back last holds the
// other one. A request asks for one token, so its time is the time to the first token;
// the engine's `timings.cache_n` says how many prompt tokens it did not evaluate again.
//
// Goal: cold ÷ warm time to first token ≥ 5 (median of the per-round ratios of the
// round's median cold and median warm times). Samples during which other processes kept
// more than --max-other-cores busy are left out, as in run.ts.
//
// Options: --rounds N (BENCH_ROUNDS, default 5), --prompt-tokens N (BENCH_PROMPT_TOKENS,
// default 2000), --threads N (BENCH_THREADS, default 2), --max-other-cores X, --out DIR.
import { mkdirSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { writeTinyLlamaGguf } from "../../src/gguf/tiny-model.ts";
import { flagReader, wholeNumber } from "../flags.ts";
import { BENCH_MODEL_SHAPE, startEngineProcess, type EngineProcess } from "./engine-process.ts";
import { measureOtherLoad } from "./other-load.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const GOAL = 5;

interface Options {
  rounds: number;
  promptTokens: number;
  threads: number;
  maxOtherCores: number;
  out: string;
}

interface Sample {
  round: number;
  conversation: "A" | "B";
  turn: number;
  cold: boolean;
  seconds: number;
  promptTokens: number;
  cachedTokens: number;
  otherCores: number | null;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const maxOtherCores = Number(flag("max-other-cores", "BENCH_MAX_OTHER_CORES") ?? 0.2);
  if (!Number.isFinite(maxOtherCores) || maxOtherCores < 0) throw new Error("--max-other-cores must be a number ≥ 0.");
  return {
    rounds: wholeNumber(flag("rounds", "BENCH_ROUNDS") ?? "5", "rounds", 1),
    promptTokens: wholeNumber(flag("prompt-tokens", "BENCH_PROMPT_TOKENS") ?? "2000", "prompt-tokens", 100),
    threads: wholeNumber(flag("threads", "BENCH_THREADS") ?? "2", "threads", 1),
    maxOtherCores,
    out: flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results"),
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

/** Lines of rules; the generated model's vocabulary spends about 13.6 tokens on each (its chat template adds a few). */
const TOKENS_PER_LINE = 13.6;
function systemPrompt(name: string, round: number, tokens: number): string {
  const lines = [`Round ${round}, assistant ${name}. Follow these rules.`];
  for (let index = 0; lines.length * TOKENS_PER_LINE < tokens; index += 1) lines.push(`Rule ${index}: say hello to ${name} world`);
  return lines.join("\n");
}

const QUESTIONS = ["What is the first rule?", "And the second one?", "Which rule is the last?"];

async function ask(engine: EngineProcess, messages: Array<{ role: string; content: string }>) {
  const started = performance.now();
  const { status, body } = await engine.post<{
    usage?: { prompt_tokens: number };
    timings?: { cache_n: number };
    choices?: Array<{ message: { content: string } }>;
  }>("/v1/chat/completions", { model: "bench", messages, max_tokens: 1, temperature: 0 });
  const seconds = (performance.now() - started) / 1000;
  if (status !== 200 || !body.usage || !body.timings) throw new Error(`the engine answered ${status}: ${JSON.stringify(body).slice(0, 500)}`);
  return { seconds, promptTokens: body.usage.prompt_tokens, cachedTokens: body.timings.cache_n, reply: body.choices?.[0]?.message.content ?? "" };
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-bench-prompt-cache-"));
  let engine: EngineProcess | undefined;
  try {
    const model = await writeTinyLlamaGguf({ path: path.join(dir, "bench-f32.gguf"), seed: 11, endless: true, ...BENCH_MODEL_SHAPE });
    // Room for the system prompt, three turns and their one-token replies, per sequence.
    const perSequence = Math.min(BENCH_MODEL_SHAPE.contextLength, Math.ceil((options.promptTokens * 1.3 + 200) / 256) * 256);
    engine = await startEngineProcess({
      label: "prompt cache",
      entry: path.join(ROOT, "bin/llmgw.js"),
      modelPath: model.path,
      args: ["--threads", String(options.threads), "--parallel", "2", "--ctx-size", String(2 * perSequence), "--model-name", "bench"],
    });
    const running = engine;
    const ourPids = () => [process.pid, running.child.pid ?? 0];
    const samples: Sample[] = [];
    for (let round = 0; round <= options.rounds; round += 1) {
      const conversations = {
        A: [{ role: "system", content: systemPrompt("A", round, options.promptTokens) }],
        B: [{ role: "system", content: systemPrompt("B", round, options.promptTokens) }],
      };
      const line: string[] = [];
      for (let turn = 0; turn < QUESTIONS.length; turn += 1) {
        for (const name of ["A", "B"] as const) {
          const history = conversations[name];
          history.push({ role: "user", content: QUESTIONS[turn] as string });
          const otherLoad = measureOtherLoad(ourPids);
          const answer = await ask(running, history);
          history.push({ role: "assistant", content: answer.reply });
          const sample: Sample = { round, conversation: name, turn, cold: turn === 0, ...answer, otherCores: otherLoad() };
          // Round 0 warms up (page cache, first allocations) and is not counted.
          if (round > 0) samples.push(sample);
          line.push(`${name}${turn + 1} ${(sample.seconds * 1000).toFixed(0)} ms (${sample.cachedTokens}/${sample.promptTokens} cached)`);
        }
      }
      process.stdout.write(`${round === 0 ? "warm-up" : `round ${round}`}: ${line.join(", ")}\n`);
    }
    await running.stop();
    engine = undefined;

    const clean = samples.filter((sample) => sample.otherCores === null || sample.otherCores <= options.maxOtherCores);
    const ratios: number[] = [];
    for (let round = 1; round <= options.rounds; round += 1) {
      const cold = clean.filter((s) => s.round === round && s.cold).map((s) => s.seconds);
      const warm = clean.filter((s) => s.round === round && !s.cold).map((s) => s.seconds);
      if (cold.length > 0 && warm.length > 0) ratios.push(median(cold) / median(warm));
    }
    const coldAll = clean.filter((s) => s.cold);
    const warmAll = clean.filter((s) => !s.cold);
    const ratio = ratios.length === 0 ? Number.NaN : median(ratios);
    const met = ratio >= GOAL;
    const ms = (values: number[]) => (values.length === 0 ? "n/a" : `${(median(values) * 1000).toFixed(0)} ms`);
    process.stdout.write(
      `\n| requests | time to first token (median) | prompt tokens (median) | cached prompt tokens (median) |\n|--|--:|--:|--:|\n` +
        `| cold (first question) | ${ms(coldAll.map((s) => s.seconds))} | ${median(coldAll.map((s) => s.promptTokens))} | ${median(coldAll.map((s) => s.cachedTokens))} |\n` +
        `| warm (next questions) | ${ms(warmAll.map((s) => s.seconds))} | ${median(warmAll.map((s) => s.promptTokens))} | ${median(warmAll.map((s) => s.cachedTokens))} |\n\n` +
        `${samples.length - clean.length} of ${samples.length} samples left out (others above ${options.maxOtherCores} cores)\n` +
        `goal: cold ÷ warm time to first token ≥ ${GOAL}: ${ratio.toFixed(1)} ${met ? "PASS" : "MISS"}\n`,
    );
    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `engine-prompt-cache-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(file, `${JSON.stringify({ bench: "engine-prompt-cache", at: new Date().toISOString(), options, ratio, met, samples }, null, 2)}\n`);
    process.stdout.write(`wrote ${path.relative(ROOT, file)}\n`);
  } finally {
    await engine?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/engine/prompt-cache: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
