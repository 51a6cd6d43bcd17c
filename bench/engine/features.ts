// The bundled engine's features benchmark (`npm run bench:engine-features`): what a JSON
// schema costs a generation, and how fast the engine embeds.
//
// - Structured output: tokens per second of a chat answer decoded under a JSON-schema
//   grammar (response_format json_schema), next to the same chat unconstrained, on the
//   same engine and model, alternating within each round. The schema is one string
//   property with a minLength beyond max_tokens, so the grammar never lets the answer
//   close early and both run to max_tokens: the figures compare equal work. Goal: the
//   grammar's tokens/s ≥ 0.8 × unconstrained (median of the per-round ratios).
// - Embeddings: inputs per second for one /v1/embeddings request of --texts short texts
//   (one to six words each), and, as the baseline it is measured against, the same texts
//   sent one request each, one after another.
//
// The model is the engine benchmark's (run.ts): a generated F32 llama GGUF of ~330 MB that
// never ends a reply on its own. The engine runs with --parallel 1. Samples taken while
// other processes kept more than --max-other-cores busy are left out (other-load.ts).
//
// Options (flags win over environment):
//   --rounds N     BENCH_ROUNDS    measured rounds (default 7; one more unmeasured first)
//   --tokens N     BENCH_TOKENS    tokens per generation (default 64)
//   --threads N    BENCH_THREADS   llama.cpp threads (default 2)
//   --texts N      BENCH_TEXTS     texts per embeddings request (default 64)
//   --out DIR      BENCH_OUT       where the JSON goes (default bench/results)
//   --max-other-cores X  BENCH_MAX_OTHER_CORES  (default 0.2)
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
const GOAL_RATIO = 0.8;
const PROMPT = "Write a short note about the weather today.";
const WORDS = ["rain", "sun", "wind", "cloud", "snow", "fog", "storm", "frost", "heat", "mist"];

interface Options {
  rounds: number;
  tokens: number;
  threads: number;
  texts: number;
  out: string;
  maxOtherCores: number;
}

type Kind = "plain" | "json_schema" | "embed_batch" | "embed_single";

interface Sample {
  round: number;
  kind: Kind;
  /** Tokens generated (chat) or inputs embedded. */
  count: number;
  seconds: number;
  perSecond: number;
  otherCores: number | null;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const whole = (name: string, env: string, fallback: number) => wholeNumber(flag(name, env) ?? String(fallback), name);
  const maxOther = Number(flag("max-other-cores", "BENCH_MAX_OTHER_CORES") ?? "0.2");
  if (!Number.isFinite(maxOther) || maxOther < 0) throw new Error("Invalid --max-other-cores: expected a number ≥ 0.");
  return {
    rounds: whole("rounds", "BENCH_ROUNDS", 7),
    tokens: whole("tokens", "BENCH_TOKENS", 64),
    threads: whole("threads", "BENCH_THREADS", 2),
    texts: whole("texts", "BENCH_TEXTS", 64),
    out: path.resolve(flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results")),
    maxOtherCores: maxOther,
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length === 0 ? Number.NaN : sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/** Short texts of one to six words, different from each other. */
function shortTexts(count: number): string[] {
  return Array.from({ length: count }, (_, index) => Array.from({ length: 1 + (index % 6) }, (_, word) => WORDS[(index + word * 3) % WORDS.length]).join(" "));
}

/** A schema whose only string must be longer than any answer of --tokens tokens, so the answer never closes before max_tokens (at most 1000: llama.cpp refuses a string rule repeated much more often). */
function noteSchema(tokens: number) {
  return {
    type: "json_schema",
    json_schema: {
      name: "note",
      strict: true,
      schema: {
        type: "object",
        properties: { text: { type: "string", minLength: Math.min(1000, tokens * 16) } },
        required: ["text"],
        additionalProperties: false,
      },
    },
  };
}

/** What the bench reads of a chat completion (or of an error answer, where both are absent). */
interface ChatAnswer {
  usage?: { completion_tokens: number };
  choices?: Array<{ message: { content: string | null } }>;
}

async function timeChat(engine: EngineProcess, options: Options, kind: "plain" | "json_schema"): Promise<{ count: number; seconds: number }> {
  const started = performance.now();
  const { status, body } = await engine.post<ChatAnswer>("/v1/chat/completions", {
    messages: [{ role: "user", content: PROMPT }],
    max_tokens: options.tokens,
    temperature: 0,
    ...(kind === "json_schema" ? { response_format: noteSchema(options.tokens) } : {}),
  });
  const seconds = (performance.now() - started) / 1000;
  if (status !== 200 || body.usage?.completion_tokens !== options.tokens)
    throw new Error(`the ${kind} chat answered ${status}: ${JSON.stringify(body).slice(0, 500)}`);
  const content = String(body.choices?.[0]?.message.content);
  if (kind === "json_schema" && !content.startsWith('{"text"')) {
    throw new Error(`the json_schema answer does not follow the schema: ${content.slice(0, 200)}`);
  }
  return { count: body.usage.completion_tokens, seconds };
}

async function timeEmbeddings(engine: EngineProcess, texts: string[], kind: "embed_batch" | "embed_single"): Promise<{ count: number; seconds: number }> {
  const started = performance.now();
  const requests = kind === "embed_batch" ? [texts] : texts.map((text) => [text]);
  for (const input of requests) {
    const { status, body } = await engine.post<{ data?: unknown[] }>("/v1/embeddings", { input });
    if (status !== 200 || body.data?.length !== input.length) throw new Error(`embeddings answered ${status}: ${JSON.stringify(body).slice(0, 500)}`);
  }
  return { count: texts.length, seconds: (performance.now() - started) / 1000 };
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const loadAtStart = os.loadavg();
  process.stdout.write(`load average at start: ${loadAtStart.map((l) => l.toFixed(2)).join(" ")} (${os.cpus().length} CPUs)\n`);
  const dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-bench-features-"));
  let engine: EngineProcess | undefined;
  try {
    const model = await writeTinyLlamaGguf({ path: path.join(dir, "bench-f32.gguf"), seed: 11, endless: true, ...BENCH_MODEL_SHAPE });
    process.stdout.write(
      `model: ${(model.bytes / 1e6).toFixed(0)} MB F32; ${options.threads} threads; ${options.tokens} tokens per chat; ${options.texts} texts per embeddings round\n`,
    );
    engine = await startEngineProcess({
      label: "bench",
      entry: path.join(ROOT, "bin/llmgw.js"),
      modelPath: model.path,
      args: ["--threads", String(options.threads), "--parallel", "1", "--ctx-size", "1024", "--model-name", "bench"],
    });
    const running = engine;
    const texts = shortTexts(options.texts);
    const samples: Sample[] = [];
    for (let round = 0; round <= options.rounds; round += 1) {
      // Which of the pair goes first alternates, so a drift in the machine's pace favours neither.
      const kinds: Kind[] = round % 2 === 0 ? ["plain", "json_schema", "embed_batch", "embed_single"] : ["json_schema", "plain", "embed_single", "embed_batch"];
      const line: string[] = [];
      for (const kind of kinds) {
        const otherLoad = measureOtherLoad(() => [process.pid, running.child.pid ?? 0]);
        const { count, seconds } =
          kind === "plain" || kind === "json_schema" ? await timeChat(running, options, kind) : await timeEmbeddings(running, texts, kind);
        const sample: Sample = { round, kind, count, seconds, perSecond: count / seconds, otherCores: otherLoad() };
        // Round 0 warms up (the embedding context is created on the first embeddings request).
        if (round > 0) samples.push(sample);
        line.push(`${kind} ${sample.perSecond.toFixed(1)}${sample.otherCores === null ? "" : ` (others ${sample.otherCores.toFixed(2)})`}`);
      }
      process.stdout.write(`${round === 0 ? "warm-up" : `round ${round}`}: ${line.join(", ")}\n`);
    }

    const clean = samples.filter((sample) => sample.otherCores === null || sample.otherCores <= options.maxOtherCores);
    const leftOut = samples.length - clean.length;
    const of = (kind: Kind) => clean.filter((sample) => sample.kind === kind);
    const pairedRatio = (kind: Kind, baseline: Kind) => {
      const ratios: number[] = [];
      for (const sample of of(kind)) {
        const other = of(baseline).find((candidate) => candidate.round === sample.round);
        if (other !== undefined) ratios.push(sample.perSecond / other.perSecond);
      }
      return median(ratios);
    };
    const rows = {
      plainTokensPerSecond: median(of("plain").map((s) => s.perSecond)),
      schemaTokensPerSecond: median(of("json_schema").map((s) => s.perSecond)),
      schemaRatio: pairedRatio("json_schema", "plain"),
      batchInputsPerSecond: median(of("embed_batch").map((s) => s.perSecond)),
      singleInputsPerSecond: median(of("embed_single").map((s) => s.perSecond)),
      batchRatio: pairedRatio("embed_batch", "embed_single"),
    };
    process.stdout.write(
      `${[
        "",
        "| measure | figure |",
        "|---|--:|",
        `| chat, unconstrained (tok/s) | ${rows.plainTokensPerSecond.toFixed(1)} |`,
        `| chat, json_schema grammar (tok/s) | ${rows.schemaTokensPerSecond.toFixed(1)} |`,
        `| grammar ÷ unconstrained (median of rounds) | ${rows.schemaRatio.toFixed(2)} |`,
        `| embeddings, ${options.texts} texts in one request (inputs/s) | ${rows.batchInputsPerSecond.toFixed(1)} |`,
        `| embeddings, one request per text (inputs/s) | ${rows.singleInputsPerSecond.toFixed(1)} |`,
        `| one request ÷ one per text | ${rows.batchRatio.toFixed(2)} |`,
        "",
      ].join("\n")}\n`,
    );
    if (leftOut > 0)
      process.stdout.write(`${leftOut} of ${samples.length} samples left out: other processes kept more than ${options.maxOtherCores} cores busy\n`);
    const met = rows.schemaRatio >= GOAL_RATIO;
    process.stdout.write(`${met ? "PASS" : "MISS"} json_schema tokens/s ÷ unconstrained = ${rows.schemaRatio.toFixed(2)} (goal ≥ ${GOAL_RATIO})\n`);
    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `engine-features-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(
      file,
      `${JSON.stringify(
        {
          bench: "engine-features",
          at: new Date().toISOString(),
          node: process.version,
          cpus: os.cpus().length,
          loadAtStart,
          loadAtEnd: os.loadavg(),
          options,
          model: { bytes: model.bytes, ...BENCH_MODEL_SHAPE },
          rows,
          goal: { ratio: GOAL_RATIO, met },
          samplesLeftOut: leftOut,
          samples,
        },
        null,
        2,
      )}\n`,
    );
    process.stdout.write(`wrote ${path.relative(ROOT, file)}\n`);
  } finally {
    await engine?.stop().catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/engine/features: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
