// `llmgw engine build`: the terminal side of engine-build.ts. Progress goes to stderr (a
// line per step, and the compile's percentage every 5% or every minute, so a log of a CI run
// shows it is alive without a line per source file); the path to pass to
// `llmgw agent --llama-server` is the only thing on stdout, so scripts can take it.
import { BadRequestError } from "../core/errors.ts";
import { buildLlamaCpp, type BuildProgress } from "../engines/llama-server/engine-build.ts";

export interface EngineBuildFlags {
  out?: string;
  jobs?: string;
  quiet?: boolean;
}

export async function runEngineBuildCommand(flags: EngineBuildFlags): Promise<void> {
  const jobs = flags.jobs === undefined ? undefined : Number(flags.jobs);
  if (jobs !== undefined && (!Number.isInteger(jobs) || jobs < 1 || jobs > 256)) {
    throw new BadRequestError(`--jobs must be a whole number from 1 to 256, got '${flags.jobs}'`);
  }
  const started = Date.now();
  let lastPercent = -100;
  let lastPrinted = 0;
  const say = (text: string) => {
    if (flags.quiet !== true) process.stderr.write(`engine build: ${text}\n`);
  };
  const onProgress = (progress: BuildProgress) => {
    if (progress.step !== "compile" || progress.percent === undefined || progress.percent === 0) return say(progress.detail);
    const now = Date.now();
    if (progress.percent - lastPercent < 5 && now - lastPrinted < 60_000) return;
    lastPercent = progress.percent;
    lastPrinted = now;
    say(`compiling: ${progress.percent}% after ${Math.round((now - started) / 60_000)} min`);
  };
  const result = await buildLlamaCpp({
    ...(flags.out === undefined ? {} : { outDir: flags.out }),
    ...(jobs === undefined ? {} : { jobs }),
    onProgress,
  });
  say(`${result.record.version}; start a node with: llmgw agent --llama-server ${flags.out === undefined ? "auto" : result.llamaServer}`);
  process.stdout.write(`${result.llamaServer}\n`);
}
