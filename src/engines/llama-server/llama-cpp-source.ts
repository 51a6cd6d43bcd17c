// Where llmgw's own llama-server comes from and where its build lives. node-llama-cpp ships
// the llama.cpp source of its bundled engine as a git bundle (`llama/gitRelease.bundle`), so
// a llama-server of the very same commit can be built here without any download
// (engine-build.ts). The build is cached per commit, by default under
// `~/.cache/llmgw/llama.cpp/<commit>/` ($XDG_CACHE_HOME is honoured):
//
//   source/      the bundle's checkout            build/   cmake's build folder (kept, so a
//   bin/         llama-server, llama-bench, ...             later build only adds what is new)
//   build.json   written last, once every binary is in bin/ and answers --version
//
// The build is compiled for the building CPU (GGML_NATIVE), so build.json records a
// fingerprint of the CPU's features and a build made for another CPU (a cache on a shared
// disk, a copied home folder) is not used: its programs could stop on an illegal instruction.
//
// The agent's `--llama-server auto` and the test support look a finished build up here
// without loading the build code, and without git or cmake: the bundle's commit is read from
// the bundle's own header.
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { open, readFile, rename, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { z } from "zod";
import { BadRequestError, describeError } from "../../core/errors.ts";

/** The programs a build makes, in bin/. llama-batched-bench is the engine benchmark's anchor for several sequences. */
export const LLAMA_CPP_TARGETS = ["llama-server", "llama-bench", "llama-batched-bench"] as const;
export type LlamaCppTarget = (typeof LLAMA_CPP_TARGETS)[number];

/** What build.json records: enough to tell whether a finished build is the one asked for. */
export const buildRecordSchema = z.object({
  /** SHA-1, or SHA-256 in a repository of that object format. */
  commit: z.string().regex(/^(?:[0-9a-f]{40}|[0-9a-f]{64})$/),
  /** The cmake configure flags; a build made with other flags is not reused. */
  flags: z.array(z.string()),
  targets: z.array(z.string()),
  /** `llama-server --version`'s version line, as printed. */
  version: z.string(),
  built_at: z.string(),
  seconds: z.number(),
  /**
   * cpuFingerprint() of the machine that compiled it. Records written before the field
   * existed have none; they are taken as made on this machine and given this one's.
   */
  cpu_fingerprint: z.string().optional(),
});
export type BuildRecord = z.infer<typeof buildRecordSchema>;

/** The llama.cpp source node-llama-cpp ships: the bundle and the commit it holds. */
export interface LlamaCppSource {
  bundle: string;
  commit: string;
}

/** The path of node-llama-cpp's git bundle (it may not exist: checked by llamaCppSource). */
export function bundledSourcePath(): string {
  // node-llama-cpp's exports map hides package.json: find its entry, then the folder above
  // it that is the package's root (the one holding llama/).
  const entry = createRequire(import.meta.url).resolve("node-llama-cpp");
  let dir = path.dirname(entry);
  while (path.basename(dir) !== "node-llama-cpp" && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return path.join(dir, "llama", "gitRelease.bundle");
}

/**
 * Reads the bundle's commit from its header, without git. A git bundle starts with
 * "# v2 git bundle" or "# v3 git bundle", then (v3) "@capability" lines, then "-<oid> ..."
 * prerequisite lines, then one "<oid> <refname>" line per ref, and an empty line before the
 * pack. node-llama-cpp's bundle holds one ref, HEAD.
 */
export async function llamaCppSource(bundle: string = bundledSourcePath()): Promise<LlamaCppSource> {
  if (!existsSync(bundle)) {
    throw new BadRequestError(`node-llama-cpp's llama.cpp source is not at ${bundle}: reinstall llmgw's dependencies (npm ci), which bring it`, {
      code: "llama_cpp_source_missing",
    });
  }
  let header: string;
  try {
    header = await readHeader(bundle, 64 * 1024);
  } catch (error) {
    throw new BadRequestError(`could not read the llama.cpp source bundle ${bundle}: ${describeError(error)}`, {
      code: "llama_cpp_source_missing",
      cause: error,
    });
  }
  const commit = bundleHead(header);
  if (commit === undefined) {
    throw new BadRequestError(
      `${bundle} is not a git bundle that names a commit (it starts '${header.split("\n")[0]?.slice(0, 80) ?? ""}'): reinstall llmgw's dependencies (npm ci), which bring it`,
      { code: "llama_cpp_source_missing" },
    );
  }
  return { bundle, commit };
}

/** The first `limit` bytes of a file, as latin1 (the pack after the header is binary). */
async function readHeader(file: string, limit: number): Promise<string> {
  const handle = await open(file, "r");
  try {
    const buffer = Buffer.alloc(limit);
    const { bytesRead } = await handle.read(buffer, 0, limit, 0);
    return buffer.subarray(0, bytesRead).toString("latin1");
  } finally {
    await handle.close();
  }
}

/** The commit of a git bundle header's HEAD ref (else its first ref); undefined when it is no bundle header. */
export function bundleHead(header: string): string | undefined {
  const end = header.indexOf("\n\n");
  if (end < 0) return undefined;
  const [signature, ...lines] = header.slice(0, end).split("\n");
  if (signature !== "# v2 git bundle" && signature !== "# v3 git bundle") return undefined;
  const refs: { oid: string; name: string }[] = [];
  for (const line of lines) {
    if (line.startsWith("@") || line.startsWith("-")) continue; // Capabilities and prerequisites.
    const ref = /^([0-9a-f]{40}|[0-9a-f]{64}) (\S.*)$/.exec(line);
    if (ref === null) return undefined;
    refs.push({ oid: ref[1] ?? "", name: ref[2] ?? "" });
  }
  return (refs.find((ref) => ref.name === "HEAD") ?? refs[0])?.oid;
}

let cachedFingerprint: string | undefined;

/**
 * A short hash of the CPU's feature flags (the `flags` line of /proc/cpuinfo; `Features` on
 * ARM), sorted so their order does not matter; "unknown" where there is no such line. Two
 * machines with the same fingerprint run each other's GGML_NATIVE builds. A kernel or
 * microcode update that adds a flag changes it too and costs a rebuild, the safe mistake.
 */
export function cpuFingerprint(cpuinfo?: string): string {
  if (cpuinfo === undefined && cachedFingerprint !== undefined) return cachedFingerprint;
  let text = cpuinfo;
  if (text === undefined) {
    try {
      text = readFileSync("/proc/cpuinfo", "utf8");
    } catch {
      text = "";
    }
  }
  const flags = /^(?:flags|Features)\s*:(.*)$/m.exec(text)?.[1];
  const fingerprint =
    flags === undefined || flags.trim() === ""
      ? "unknown"
      : createHash("sha256")
          .update([...new Set(flags.trim().split(/\s+/))].sort().join(" "))
          .digest("hex")
          .slice(0, 16);
  if (cpuinfo === undefined) cachedFingerprint = fingerprint;
  return fingerprint;
}

/** The default cache root: $XDG_CACHE_HOME/llmgw/llama.cpp, else ~/.cache/llmgw/llama.cpp. */
export function defaultBuildRoot(env: NodeJS.ProcessEnv = process.env): string {
  const cacheHome = env.XDG_CACHE_HOME !== undefined && path.isAbsolute(env.XDG_CACHE_HOME) ? env.XDG_CACHE_HOME : path.join(os.homedir(), ".cache");
  return path.join(cacheHome, "llmgw", "llama.cpp");
}

/** The folder of one commit's build. */
export function buildDirFor(commit: string, root: string = defaultBuildRoot()): string {
  return path.join(root, commit);
}

/** The path of a program in a build folder. */
export function binaryIn(buildDir: string, target: LlamaCppTarget): string {
  return path.join(buildDir, "bin", target);
}

/** The finished build in `buildDir`, or undefined when there is none (no build.json, or one that does not parse). */
export async function readBuildRecord(buildDir: string): Promise<BuildRecord | undefined> {
  let text: string;
  try {
    text = await readFile(path.join(buildDir, "build.json"), "utf8");
  } catch {
    return undefined;
  }
  try {
    const parsed = buildRecordSchema.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Gives a record from before the CPU fingerprint this machine's, in place (through a rename,
 * so build.json is never half written), keeping every other field as it is in the file.
 */
export async function adoptBuildRecord(buildDir: string, record: BuildRecord, fingerprint: string = cpuFingerprint()): Promise<BuildRecord> {
  if (record.cpu_fingerprint !== undefined) return record;
  const file = path.join(buildDir, "build.json");
  const raw = JSON.parse(await readFile(file, "utf8")) as Record<string, unknown>;
  const partial = `${file}.adopt-${process.pid}`;
  await writeFile(partial, `${JSON.stringify({ ...raw, cpu_fingerprint: fingerprint }, null, 2)}\n`);
  await rename(partial, file);
  return { ...record, cpu_fingerprint: fingerprint };
}

/** Why a finished build cannot run here, or undefined when it can. */
export function otherCpu(record: BuildRecord, fingerprint: string = cpuFingerprint()): string | undefined {
  if (record.cpu_fingerprint === undefined || record.cpu_fingerprint === fingerprint) return undefined;
  return `it was compiled for another CPU (GGML_NATIVE; CPU fingerprint ${record.cpu_fingerprint}, this machine's is ${fingerprint}) and could stop on an instruction this one lacks`;
}

/**
 * `--llama-server auto`: the llama-server of the finished build for node-llama-cpp's own
 * commit in the default cache, or an error that says how to make it.
 */
export async function builtLlamaServer(options: { root?: string; bundle?: string } = {}): Promise<string> {
  const source = await llamaCppSource(options.bundle);
  const dir = buildDirFor(source.commit, options.root);
  const record = await readBuildRecord(dir);
  const server = binaryIn(dir, "llama-server");
  if (record === undefined || !record.targets.includes("llama-server") || !existsSync(server)) {
    throw new BadRequestError(
      `no finished llama-server build for llama.cpp ${source.commit.slice(0, 7)} in ${dir}: run \`llmgw engine build\` first (15–25 minutes on 2 cores; it needs cmake, a C++ compiler, make and git)`,
      { code: "llama_server_not_built" },
    );
  }
  const why = otherCpu(record);
  if (why !== undefined) {
    throw new BadRequestError(`the llama-server build in ${dir} is not for this machine: ${why}. Run \`llmgw engine build\` to build it for this one.`, {
      code: "llama_server_other_cpu",
    });
  }
  // A record from before the fingerprint is this machine's from now on; a cache that cannot
  // be written (read-only) still serves.
  await adoptBuildRecord(dir, record).catch(() => undefined);
  return server;
}
