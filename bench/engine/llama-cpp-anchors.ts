// llama.cpp's own benchmarks, the engine benchmark's anchors: `llama-bench` (one
// generation's tokens/s, `tg`, and prompt processing, `pp512`) and `llama-batched-bench`
// (aggregate tokens/s of L generations at once), from the very llama.cpp commit that
// node-llama-cpp ships, as `llmgw engine build` compiles them into the build cache. Each
// call is one measurement of its own process; run.ts calls them in the same rounds as the
// engine, so every ratio compares figures taken seconds apart.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { binaryIn, buildDirFor, llamaCppSource } from "../../src/engines/llama-server/llama-cpp-source.ts";

export interface LlamaCppTools {
  commit: string;
  llamaBench: string;
  batchedBench: string;
}

/** The cached llama-bench and llama-batched-bench of node-llama-cpp's commit; an error says how to build them. */
export async function findLlamaCppTools(): Promise<LlamaCppTools> {
  const { commit } = await llamaCppSource();
  const dir = buildDirFor(commit);
  const llamaBench = binaryIn(dir, "llama-bench");
  const batchedBench = binaryIn(dir, "llama-batched-bench");
  for (const binary of [llamaBench, batchedBench]) {
    if (!existsSync(binary)) {
      throw new Error(
        `${binary} is missing: the engine benchmark measures against llama.cpp's own tools of the same commit (${commit.slice(0, 7)}); build them once with \`npx llmgw engine build\` (15–25 minutes on 2 cores), or pass --no-llama-cpp`,
      );
    }
  }
  return { commit, llamaBench, batchedBench };
}

function run(binary: string, args: readonly string[]): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(binary, args, { maxBuffer: 16 * 1024 * 1024, timeout: 300_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${binary} ${args.join(" ")} failed: ${error.message}\n${stderr.slice(-2000)}`));
      else resolve({ stdout, stderr });
    });
  });
}

/** One llama-bench run (after its own warm-up): tokens/s of `tg` generated tokens, and of a `pp`-token prompt. */
export async function llamaBench(
  tools: LlamaCppTools,
  options: { modelPath: string; threads: number; tg: number; pp: number },
): Promise<{ tg: number; pp: number }> {
  const { stdout: out } = await run(tools.llamaBench, [
    "-m",
    options.modelPath,
    "-t",
    String(options.threads),
    "-p",
    String(options.pp),
    "-n",
    String(options.tg),
    "-r",
    "1",
    "-o",
    "json",
  ]);
  const tests = JSON.parse(out) as Array<{ n_prompt: number; n_gen: number; avg_ts: number }>;
  const tg = tests.find((test) => test.n_prompt === 0 && test.n_gen === options.tg)?.avg_ts;
  const pp = tests.find((test) => test.n_prompt === options.pp && test.n_gen === 0)?.avg_ts;
  if (tg === undefined || pp === undefined) throw new Error(`llama-bench gave no tg${options.tg} and pp${options.pp} figures: ${out.slice(0, 500)}`);
  return { tg, pp };
}

/**
 * One llama-batched-bench run: `level` sequences, each a `prompt`-token prompt then `tg`
 * generated tokens, all decoded together; the generation phase's aggregate tokens/s.
 * It prints its results through llama.cpp's logging thread, which the main thread's exit
 * sometimes cuts off before the line is written (seen here as an empty stdout and exit
 * status 0 in about one run of five), so a run without its line is repeated, twice at most.
 */
export async function batchedBench(
  tools: LlamaCppTools,
  options: { modelPath: string; threads: number; level: number; prompt: number; tg: number },
): Promise<number> {
  // It skips, silently, a level whose sequences do not fit its context; and llama.cpp may
  // shrink the context to the free memory it sees (--fit), so that is turned off.
  const context = Math.max(4096, options.level * (options.prompt + options.tg) + 256);
  const args = ["-m", options.modelPath, "-t", String(options.threads), "-c", String(context), "-fit", "off"];
  args.push("-npp", String(options.prompt), "-ntg", String(options.tg), "-npl", String(options.level), "--output-format", "jsonl");
  for (let attempt = 1; ; attempt += 1) {
    const { stdout } = await run(tools.batchedBench, args);
    const line = stdout
      .split("\n")
      .map((text) => text.trim())
      .find((text) => text.startsWith("{") && text.includes('"speed_tg"'));
    if (line === undefined) {
      if (attempt < 3) continue;
      throw new Error(`llama-batched-bench (${options.level} sequences) printed no result in ${attempt} runs: ${stdout.slice(0, 300)}`);
    }
    const result = JSON.parse(line) as { pl: number; speed_tg: number };
    if (result.pl !== options.level) throw new Error(`llama-batched-bench measured ${result.pl} sequences, not ${options.level}`);
    return result.speed_tg;
  }
}
