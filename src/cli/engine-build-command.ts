// `llmgw engine build`: the terminal side of engine-build.ts, then of the bundled engine's
// build for this CPU (engines/llamacpp/native-binding.ts). Progress goes to stderr (a
// line per step, and the compile's percentage every 5% or every minute, so a log of a CI run
// shows it is alive without a line per source file); the path to pass to
// `llmgw agent --llama-server` is the only thing on stdout, so scripts can take it.
//
// SIGINT (Ctrl-C) and SIGTERM stop the build rather than llmgw alone: the tools run in their
// own process group, which a terminal's Ctrl-C does not reach, so the build is aborted, which
// stops the group and releases the lock, and the command exits with 130 or 143.
import path from "node:path";
import { BadRequestError, LlmgwError, describeError } from "../core/errors.ts";
import { buildLlamaCpp, type BuildProgress } from "../engines/llama-server/engine-build.ts";
import { buildBundledBinding } from "../engines/llamacpp/native-binding.ts";

export interface EngineBuildFlags {
  out?: string;
  jobs?: string;
  quiet?: boolean;
  /** false (--no-bundled): leave the bundled engine on node-llama-cpp's prebuilt binary. */
  bundled?: boolean;
}

export interface EngineBuildDependencies {
  /** The llama.cpp source bundle (default node-llama-cpp's): tests build a stand-in. */
  bundle?: string;
}

const EXIT_ON_SIGNAL: Record<"SIGINT" | "SIGTERM", number> = { SIGINT: 130, SIGTERM: 143 };

export async function runEngineBuildCommand(flags: EngineBuildFlags, dependencies: EngineBuildDependencies = {}): Promise<void> {
  const jobs = flags.jobs === undefined ? undefined : Number(flags.jobs);
  if (jobs !== undefined && (!Number.isInteger(jobs) || jobs < 1 || jobs > 256)) {
    throw new BadRequestError(`--jobs must be a whole number from 1 to 256, got '${flags.jobs}'`);
  }
  // Absolute: the printed path is handed to agents that run in other folders.
  const out = flags.out === undefined ? undefined : path.resolve(flags.out);
  let started = Date.now();
  let lastPercent = -100;
  let lastPrinted = 0;
  const say = (text: string) => {
    if (flags.quiet !== true) process.stderr.write(`engine build: ${text}\n`);
  };
  const onProgress = (progress: BuildProgress) => {
    if (progress.step !== "compile" || progress.percent === undefined) return say(progress.detail);
    if (progress.percent === 0) {
      // A compile starts (llama-server's, then the bundled engine's): its own clock.
      started = Date.now();
      lastPercent = -100;
      return say(progress.detail);
    }
    const now = Date.now();
    if (progress.percent - lastPercent < 5 && now - lastPrinted < 60_000) return;
    lastPercent = progress.percent;
    lastPrinted = now;
    say(`compiling: ${progress.percent}% after ${Math.round((now - started) / 60_000)} min`);
  };

  const controller = new AbortController();
  let received: "SIGINT" | "SIGTERM" | undefined;
  const onSignal = (name: "SIGINT" | "SIGTERM") => {
    if (received !== undefined) return; // Already stopping; a second Ctrl-C must not leave the tools running.
    received = name;
    say(`${name}: stopping cmake and the compilers, then releasing the lock`);
    controller.abort(name);
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  try {
    const result = await buildLlamaCpp({
      ...(out === undefined ? {} : { outDir: out }),
      ...(jobs === undefined ? {} : { jobs }),
      ...(dependencies.bundle === undefined ? {} : { bundle: dependencies.bundle }),
      onProgress,
      signal: controller.signal,
    });
    say(`${result.record.version}; start a node with: llmgw agent --llama-server ${out === undefined ? "auto" : result.llamaServer}`);
    // Only for node-llama-cpp's own source: a stand-in bundle (the tests') has no binding.
    // --out and --jobs are llama-server's: node-llama-cpp builds into its own package
    // folder with as many jobs as it chooses.
    if (flags.bundled !== false && dependencies.bundle === undefined) {
      try {
        const binding = await buildBundledBinding({ signal: controller.signal, onProgress });
        say(`the bundled engine's llama.cpp for this CPU ${binding.reused ? "was built already" : "is built"}; engines load it when they start`);
      } catch (error) {
        if (received !== undefined) throw error;
        // The bundled engine still runs, on the prebuilt binary: a warning, not a failed
        // build, and printed even with --quiet, as nothing else would tell.
        process.stderr.write(
          `engine build: warning: could not build the bundled engine's llama.cpp for this CPU (${describeError(error)}); it keeps node-llama-cpp's prebuilt binary, which processes prompts at about half the speed. Run \`llmgw engine build\` again after fixing the cause.\n`,
        );
      }
    }
    process.stdout.write(`${result.llamaServer}\n`);
  } catch (error) {
    if (received === undefined) throw error;
    process.stderr.write(`error: ${error instanceof LlmgwError ? error.message : describeError(error)}\n`);
    process.exitCode = EXIT_ON_SIGNAL[received];
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}
