// Where the bundled engine's time goes per generated token (`npm run bench:engine-profile`).
// The engine's own generator (LlamaRunner, the code `llmgw engine` runs) in this process,
// on the engine benchmark's model, with the llama.cpp context's two native calls timed:
// `decodeBatch` (one decode step, run on libuv's thread pool) and `sampleToken` (one
// sample, also on the pool). For 1 and 2 generations at once it reports, per decode step:
// the wall time, the native decode, the samples, and the rest (node-llama-cpp's and the
// engine's JavaScript per token, including the pool round trips and the detokenisation).
// Then the same generation through the engine's HTTP server, non-streamed and streamed,
// so the cost of the SSE path shows as a difference; and the pool's own round trip,
// measured by starting the next decode from a different pool thread each time
// (UV_THREADPOOL_SIZE 4) against the same one (1).
//
// The timing wraps the context's native binding object (`_ctx`, node-llama-cpp
// internals); a version of node-llama-cpp without it makes this tool stop with a
// message, never the engine.
import { spawnSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { silentLogger } from "../../src/core/log.ts";
import { createEngineServer } from "../../src/engines/llamacpp/engine-server.ts";
import { ENGINE_THREAD_POOL_SIZE } from "../../src/engines/llamacpp/engine-launch.ts";
import { LlamaRunner } from "../../src/engines/llamacpp/llama-runner.ts";
import { writeTinyLlamaGguf } from "../../src/gguf/tiny-model.ts";
import { flagReader } from "../flags.ts";
import { BENCH_MODEL_SHAPE } from "./engine-process.ts";

const SELF = fileURLToPath(import.meta.url);

interface NativeTimes {
  decodes: number[];
  samples: number[];
}

/** Wraps the runner's context binding so that each native decode and sample is timed. */
function timeNativeCalls(runner: LlamaRunner): NativeTimes {
  const context = (runner as unknown as { context?: { _ctx?: Record<string, unknown> } }).context;
  const binding = context?._ctx;
  if (!context || !binding || typeof binding.decodeBatch !== "function" || typeof binding.sampleToken !== "function") {
    throw new Error(
      "node-llama-cpp's context no longer has the _ctx binding with decodeBatch and sampleToken this profile times; update bench/engine/profile.ts",
    );
  }
  const times: NativeTimes = { decodes: [], samples: [] };
  const timed = (list: number[], call: (...args: unknown[]) => Promise<unknown>) =>
    async function (this: unknown, ...args: unknown[]) {
      const started = performance.now();
      try {
        return await call(...args);
      } finally {
        list.push(performance.now() - started);
      }
    };
  context._ctx = new Proxy(binding, {
    get(target, property) {
      const value = target[property as string];
      if (property === "decodeBatch") return timed(times.decodes, (value as (...args: unknown[]) => Promise<unknown>).bind(target));
      if (property === "sampleToken") return timed(times.samples, (value as (...args: unknown[]) => Promise<unknown>).bind(target));
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
  return times;
}

const sum = (values: number[]) => values.reduce((total, value) => total + value, 0);
const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? Number.NaN;
};

async function profile(options: { tokens: number; rounds: number; threads: number }): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-profile-"));
  try {
    const model = await writeTinyLlamaGguf({ path: path.join(dir, "bench-f32.gguf"), seed: 11, endless: true, ...BENCH_MODEL_SHAPE });
    process.stdout.write(
      `UV_THREADPOOL_SIZE ${process.env.UV_THREADPOOL_SIZE ?? "unset (4)"}; ${options.threads} threads; ${options.tokens} tokens per generation\n`,
    );
    for (const level of [1, 2]) {
      const runner = await LlamaRunner.load({
        modelPath: model.path,
        contextSize: level * 1024,
        parallel: level,
        threads: options.threads,
        logger: silentLogger(),
      });
      const times = timeNativeCalls(runner);
      const rows: Array<{ step: number; decode: number; sample: number; rest: number; decodes: number }> = [];
      for (let round = 0; round <= options.rounds; round += 1) {
        times.decodes.length = 0;
        times.samples.length = 0;
        const started = performance.now();
        await Promise.all(
          Array.from({ length: level }, (_, index) =>
            runner.complete(`hello world ${round} ${index}`, {
              params: { temperature: 0, stop: [], maxTokens: options.tokens },
              signal: new AbortController().signal,
            }),
          ),
        );
        const wall = performance.now() - started;
        // Per decode step; the first decodes the prompts, the others one token per generation.
        const steps = times.decodes.length;
        if (round > 0)
          rows.push({
            step: wall / steps,
            decode: sum(times.decodes) / steps,
            sample: sum(times.samples) / steps,
            rest: (wall - sum(times.decodes) - sum(times.samples)) / steps,
            decodes: steps,
          });
      }
      const pick = (key: keyof (typeof rows)[number]) => median(rows.map((row) => row[key]));
      process.stdout.write(
        `${level} generation(s) at once: ${pick("decodes")} decode steps; per step (ms, medians of ${options.rounds} rounds): wall ${pick("step").toFixed(2)}, native decode ${pick("decode").toFixed(2)}, samples ${pick("sample").toFixed(2)}, the rest ${pick("rest").toFixed(2)}\n`,
      );
      if (level === 1) {
        await promptProcessing(runner, times, options);
        await httpPaths(runner, options);
      }
      await runner.dispose();
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A new 512-token prompt (BOS and token ids), one token generated: the request against its native decodes. */
async function promptProcessing(runner: LlamaRunner, times: NativeTimes, options: { rounds: number }): Promise<void> {
  const rows: Array<{ wall: number; decode: number; sample: number }> = [];
  for (let round = 0; round <= options.rounds; round += 1) {
    const ids = Array.from({ length: 511 }, (_, index) => 10 + ((round * 7919 + index * 104729) % 240));
    times.decodes.length = 0;
    times.samples.length = 0;
    const started = performance.now();
    await runner.complete(ids, { params: { temperature: 0, stop: [], maxTokens: 1 }, signal: new AbortController().signal });
    if (round > 0) rows.push({ wall: performance.now() - started, decode: sum(times.decodes), sample: sum(times.samples) });
  }
  const pick = (key: keyof (typeof rows)[number]) => median(rows.map((row) => row[key]));
  process.stdout.write(
    `prompt of 512 tokens, 1 token generated (ms, medians): wall ${pick("wall").toFixed(1)}, native decode ${pick("decode").toFixed(1)} (${(512000 / pick("decode")).toFixed(0)} tok/s), samples ${pick("sample").toFixed(2)}, the rest ${(pick("wall") - pick("decode") - pick("sample")).toFixed(1)}\n`,
  );
}

/** One generation through the engine's HTTP server, non-streamed and streamed: the SSE path's cost per token. */
async function httpPaths(runner: LlamaRunner, options: { tokens: number; rounds: number }): Promise<void> {
  const server = createEngineServer({ key: "k", modelName: "bench", logger: silentLogger() });
  server.setGenerator(runner);
  const address: AddressInfo = await server.listen("127.0.0.1", 0);
  const post = async (stream: boolean, round: number) => {
    const started = performance.now();
    const response = await fetch(`http://127.0.0.1:${address.port}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer k", "content-type": "application/json" },
      // A prompt of its own for each request: the streamed one must not find the
      // non-streamed one's prompt in the prompt cache and skip work the other did.
      body: JSON.stringify({
        model: "bench",
        messages: [{ role: "user", content: `${stream ? "streamed" : "plain"} question ${round}` }],
        max_tokens: options.tokens,
        temperature: 0,
        stream,
      }),
    });
    await response.text();
    return performance.now() - started;
  };
  const plain: number[] = [];
  const streamed: number[] = [];
  for (let round = 0; round <= options.rounds; round += 1) {
    const a = await post(false, round);
    const b = await post(true, round);
    if (round > 0) {
      plain.push(a);
      streamed.push(b);
    }
  }
  await server.shutdown();
  process.stdout.write(
    `HTTP, 1 generation of ${options.tokens} tokens (chat): non-streamed ${median(plain).toFixed(0)} ms, streamed ${median(streamed).toFixed(0)} ms: SSE costs ${((median(streamed) - median(plain)) / options.tokens).toFixed(3)} ms per token\n`,
  );
}

const flag = flagReader(process.argv.slice(2));
const options = {
  tokens: Number(flag("tokens", "BENCH_TOKENS") ?? 64),
  rounds: Number(flag("rounds", "BENCH_ROUNDS") ?? 5),
  threads: Number(flag("threads", "BENCH_THREADS") ?? 2),
};
if (process.env.LLMGW_PROFILE_CHILD === "1") {
  await profile(options);
} else {
  // Node sizes its thread pool before any code runs, so each pool size is its own process.
  for (const size of [ENGINE_THREAD_POOL_SIZE, "4"]) {
    const child = spawnSync(process.execPath, ["--import", "tsx", SELF, ...process.argv.slice(2)], {
      env: { ...process.env, LLMGW_PROFILE_CHILD: "1", UV_THREADPOOL_SIZE: size },
      stdio: "inherit",
    });
    if (child.status !== 0) process.exit(child.status ?? 1);
  }
}
