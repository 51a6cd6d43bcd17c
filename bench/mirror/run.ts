// The mirror benchmark (`npx tsx bench/mirror/run.ts`). A child process serves one large
// synthetic file through the stand-in hub over loopback (its sha256 is computed there
// before anything is timed). This process then downloads it, alternating two ways:
//
//   plain   undici request of the resolve URL, its 302 followed, the body piped into
//           fs.createWriteStream: the floor of what a download to disk costs here.
//   mirror  Mirror.fetchVersion on a SQLite store: the same URL, plus sha256 while
//           streaming, progress rows, fsync, verification and rename.
//
// Each round runs both (the order alternates between rounds); after each run what it wrote
// is deleted and the file system flushed (untimed), so no write-back of one run overlaps
// the next. The
// goal is a ratio of medians: mirror MB/s ≥ 0.8 × plain MB/s. On a small shared machine
// the absolute figures drift with whatever else runs, so the median of the per-round
// ratios (two runs seconds apart, under about the same load) is printed beside it. A
// missed goal prints MISS and still exits 0; an error exits 1.
//
// Options (flags win over environment):
//   --size BYTES   BENCH_SIZE   file size (default 1073741824, 1 GiB)
//   --runs N       BENCH_RUNS   rounds (default 7)
//   --dir DIR      BENCH_DIR    where downloads are written (default: a temp dir in os.tmpdir())
//   --out DIR      BENCH_OUT    where the JSON goes (default bench/results)
import { execFileSync, fork } from "node:child_process";
import { createWriteStream, mkdirSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { Agent, request } from "undici";
import { HubClient } from "../../src/registry/hub-client.ts";
import { openStore } from "../../src/store/store.ts";
import { Mirror } from "../../src/mirror/mirror.ts";
import { planMirrorFetch } from "../../src/mirror/mirror-plan.ts";
import { flagReader } from "../flags.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const GOAL = 0.8;
/** Pause between runs, after `sync`, so the file system's background work from one run is done before the next. */
const SETTLE_MS = 1000;

/** Flushes the file system (sync(1)), so no write-back from the previous run overlaps the next one. */
function settle(): void {
  try {
    execFileSync("sync");
  } catch {
    // No sync(1): the pause alone has to do.
  }
}

interface Options {
  size: number;
  runs: number;
  dir: string | undefined;
  out: string;
}

interface Sample {
  round: number;
  kind: "plain" | "mirror";
  seconds: number;
  mbPerSecond: number;
  /** CPU seconds this process used during the run (user + system). */
  cpuSeconds: number;
}

function parseOptions(argv: string[]): Options {
  const flag = flagReader(argv);
  const size = Number(flag("size", "BENCH_SIZE") ?? 1024 ** 3);
  const runs = Number(flag("runs", "BENCH_RUNS") ?? 7);
  if (!Number.isSafeInteger(size) || size <= 0) throw new Error("--size must be a positive number of bytes.");
  if (!Number.isSafeInteger(runs) || runs <= 0) throw new Error("--runs must be a positive integer.");
  return { size, runs, dir: flag("dir", "BENCH_DIR"), out: flag("out", "BENCH_OUT") ?? path.join(ROOT, "bench/results") };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

async function timed(kind: Sample["kind"], round: number, size: number, work: () => Promise<void>): Promise<Sample> {
  const cpu = process.cpuUsage();
  const start = performance.now();
  await work();
  const seconds = (performance.now() - start) / 1000;
  const used = process.cpuUsage(cpu);
  return { round, kind, seconds, mbPerSecond: size / 1e6 / seconds, cpuSeconds: (used.user + used.system) / 1e6 };
}

async function main(): Promise<void> {
  const options = parseOptions(process.argv.slice(2));
  const work = options.dir ?? (await mkdtemp(path.join(os.tmpdir(), "llmgw-bench-mirror-")));
  mkdirSync(work, { recursive: true });
  const hubProcess = fork(path.join(ROOT, "bench/mirror/hub-process.ts"), [String(options.size)], {
    execArgv: ["--import", "tsx"],
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const hubExited = new Promise((resolve) => hubProcess.once("exit", resolve));
  try {
    process.stdout.write(`Preparing a ${options.size} byte file and its sha256 in the hub process (not timed)...\n`);
    const served = await new Promise<{ url: string; repo: string; path: string; size: number; sha256: string }>((resolve, reject) => {
      hubProcess.once("message", (message) => resolve(message as { url: string; repo: string; path: string; size: number; sha256: string }));
      hubProcess.once("exit", (code) => reject(new Error(`the hub process exited (${code}) before it was ready`)));
    });

    const registry = new HubClient({ endpoint: served.url });
    const info = await registry.repoInfo({ repo: served.repo });
    const plan = planMirrorFetch({ registry, repoInfo: info, chosen: { files: info.files } });
    const url = plan.files[0]?.url as string;
    const store = await openStore({ database: path.join(work, "llmgw.db") });
    const mirror = new Mirror({ store, root: path.join(work, "mirror") });
    // The plain copy gets the same kind of connection pool the mirror makes for itself.
    const plainAgent = new Agent({ headersTimeout: 30_000, bodyTimeout: 60_000 });
    const plainFile = path.join(work, "plain.bin");

    const plain = async (): Promise<void> => {
      const first = await request(url, { dispatcher: plainAgent });
      await first.body.dump();
      const location = first.headers.location;
      if (typeof location !== "string") throw new Error(`expected a redirect from ${url}, got ${first.statusCode}`);
      const response = await request(new URL(location, url).href, { dispatcher: plainAgent });
      if (response.statusCode !== 200) throw new Error(`the CDN answered ${response.statusCode}`);
      await pipeline(response.body, createWriteStream(plainFile));
    };
    const mirrored = async (): Promise<void> => {
      const summary = await mirror.fetchVersion({
        model: "bench--big-GGUF",
        version: plan.version,
        repo: plan.repo,
        revision: plan.revision,
        files: plan.files,
      });
      if (!summary.complete || summary.fetched !== 1) throw new Error(`the mirror fetch did not complete: ${JSON.stringify(summary.files[0]?.error)}`);
    };

    const samples: Sample[] = [];
    for (let round = 1; round <= options.runs; round += 1) {
      const order: Sample["kind"][] = round % 2 === 1 ? ["plain", "mirror"] : ["mirror", "plain"];
      for (const kind of order) {
        const sample = await timed(kind, round, options.size, kind === "plain" ? plain : mirrored);
        samples.push(sample);
        process.stdout.write(
          `round ${round} ${kind.padEnd(6)} ${sample.mbPerSecond.toFixed(0).padStart(6)} MB/s  ${sample.seconds.toFixed(2)} s  cpu ${sample.cpuSeconds.toFixed(2)} s\n`,
        );
        // Not timed: remove what was written, so its dirty pages are dropped, not flushed during the next run.
        if (kind === "plain") await rm(plainFile, { force: true });
        else await mirror.deleteVersion("bench--big-GGUF", plan.version);
        settle();
        await sleep(SETTLE_MS);
      }
    }

    const medianOf = (kind: Sample["kind"], field: "mbPerSecond" | "cpuSeconds") => median(samples.filter((s) => s.kind === kind).map((s) => s[field]));
    const plainMbs = medianOf("plain", "mbPerSecond");
    const mirrorMbs = medianOf("mirror", "mbPerSecond");
    const ratio = mirrorMbs / plainMbs;
    const met = ratio >= GOAL;
    const pairedRatios = Array.from({ length: options.runs }, (_, index) => {
      const round = samples.filter((sample) => sample.round === index + 1);
      const mirrorRun = round.find((sample) => sample.kind === "mirror");
      const plainRun = round.find((sample) => sample.kind === "plain");
      return (mirrorRun?.mbPerSecond ?? 0) / (plainRun?.mbPerSecond ?? 1);
    });
    const pairedRatio = median(pairedRatios);
    process.stdout.write(
      `\nmedian plain  ${plainMbs.toFixed(0)} MB/s (cpu ${medianOf("plain", "cpuSeconds").toFixed(2)} s)\n` +
        `median mirror ${mirrorMbs.toFixed(0)} MB/s (cpu ${medianOf("mirror", "cpuSeconds").toFixed(2)} s)\n` +
        `ratio ${ratio.toFixed(2)} (goal ≥ ${GOAL}) ${met ? "OK" : "MISS"}; median of per-round ratios ${pairedRatio.toFixed(2)}\n`,
    );

    mkdirSync(options.out, { recursive: true });
    const file = path.join(options.out, `mirror-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
    writeFileSync(
      file,
      `${JSON.stringify(
        {
          bench: "mirror",
          at: new Date().toISOString(),
          node: process.version,
          cpus: os.cpus().length,
          loadavg: os.loadavg(),
          size: options.size,
          runs: options.runs,
          dir: work,
          median: { plainMbPerSecond: plainMbs, mirrorMbPerSecond: mirrorMbs, ratio, pairedRatio },
          pairedRatios,
          goal: { ratio: GOAL, met },
          samples,
        },
        null,
        2,
      )}\n`,
    );
    process.stdout.write(`wrote ${path.relative(ROOT, file)}\n`);

    await mirror.close();
    await store.close();
    await plainAgent.close();
    await registry.close();
  } finally {
    hubProcess.disconnect();
    await hubExited;
    if (options.dir === undefined) await rm(work, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`bench/mirror failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
