// What this node reports about itself when it joins the fleet and with its heartbeats:
// cores, memory, GPUs, the engines it can run and their versions, and its labels.
// Placement decides from these numbers alone, so they come from the machine
// (os.availableParallelism, os.totalmem, nvidia-smi, each engine's `--version`), or from
// an `--inventory FILE` that replaces them (tests give one machine three shapes; an
// operator caps what a node offers). Either way they pass checkInventory before they
// leave the node.
//
// Probing is best effort where the machine decides and strict where the operator does:
// no nvidia-smi means no GPUs, and a failing one (no driver, garbage) means no GPUs and a
// warning; a `vllm` on PATH that fails is left out with a warning; but a llama-server or
// vllm path the operator configured that does not answer its `--version` is an error
// naming the path, because the node would otherwise join without the engine it was set up
// for. Each probe runs in its own process group and is killed (with whatever it forked)
// when it does not answer in time: `vllm --version` imports torch and can hang on a broken
// CUDA install.
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import os from "node:os";
import { z } from "zod";
import { BadRequestError, describeError, errorCode } from "../core/errors.ts";
import { printable } from "../core/format.ts";
import { parseByteSize } from "../core/byte-size.ts";
import type { EngineInventory, GpuInventory, NodeInventory, NodeLabels } from "../fleet/fleet-types.ts";
import { normalizeGpuClass } from "../fleet/gpu-class.ts";
import { readLlamaServerVersion, unknownBuildWarning } from "../engines/llama-server/llama-server-version.ts";
import {
  ENGINE_NAMES,
  INVENTORY_LIMITS,
  LABEL_KEY_PATTERN,
  LABEL_KEY_RULE,
  LABEL_VALUE_PATTERN,
  LABEL_VALUE_RULE,
  checkInventory,
  checkLabels,
} from "../fleet/inventory-schema.ts";
import { BUNDLED_LLAMA_CPP } from "../gguf/llama-support.ts";

export const DEFAULT_PROBE_TIMEOUT_MS = 10_000;

/** The engine every agent has: llama.cpp inside node-llama-cpp, by the node-llama-cpp version (resolveLlamaCppBuild knows it). */
export const BUNDLED_ENGINE: EngineInventory = { engine: "llamacpp", version: BUNDLED_LLAMA_CPP.nodeLlamaCppVersions[0]! };

/** The query the inventory needs; `noheader` leaves one "index, name, memory" line per GPU. */
export const NVIDIA_SMI_ARGS = ["--query-gpu=index,name,memory.total", "--format=csv,noheader"];

/** A probe's output is a version line or a GPU table; more than this is not an answer. */
const MAX_PROBE_OUTPUT = 64 * 1024;

export interface DetectInventoryOptions {
  /** The node's own llama-server (`--llama-server PATH`): probed, and an error when it does not answer. */
  llamaServerPath?: string;
  /** vLLM's `vllm` command; without it, `vllm` on PATH is probed and left out (with a warning) when it fails. */
  vllmPath?: string;
  /** nvidia-smi; without it, `nvidia-smi` on PATH, and no GPUs when there is none. */
  nvidiaSmiPath?: string;
  /** The environment the probes run in and find commands on (PATH). Default process.env. */
  env?: NodeJS.ProcessEnv;
  /** How long each probe may take before it is killed. Default 10 s. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface DetectedInventory {
  inventory: NodeInventory;
  /** What could not be detected and was left out (a failing nvidia-smi or vllm), one sentence each, for the agent's log. */
  warnings: string[];
}

/** Detects this machine's inventory. Rejects when a configured engine path does not answer its --version. */
export async function detectInventory(options: DetectInventoryOptions = {}): Promise<DetectedInventory> {
  const probe = {
    env: options.env ?? process.env,
    timeoutMs: options.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS,
    ...(options.signal ? { signal: options.signal } : {}),
  };
  const warnings: string[] = [];
  const [gpus, llamaServer, vllm] = await Promise.all([
    detectGpus({ ...probe, command: options.nvidiaSmiPath, warnings }),
    options.llamaServerPath === undefined ? undefined : probeLlamaServer({ ...probe, command: options.llamaServerPath, warnings }),
    probeVllm({ ...probe, command: options.vllmPath, warnings }),
  ]);
  const engines = [BUNDLED_ENGINE, ...(llamaServer ? [llamaServer] : []), ...(vllm ? [vllm] : [])];
  const inventory = checkInventory({ cores: os.availableParallelism(), memoryBytes: os.totalmem(), gpus, engines }, "detected inventory");
  return { inventory, warnings };
}

interface ProbeOptions {
  env: NodeJS.ProcessEnv;
  timeoutMs: number;
  signal?: AbortSignal;
}

async function detectGpus(options: ProbeOptions & { command: string | undefined; warnings: string[] }): Promise<GpuInventory[]> {
  const command = options.command ?? "nvidia-smi";
  const result = await runProbe({ ...options, command, args: NVIDIA_SMI_ARGS });
  const noGpus = "this node reports no GPUs; fix the driver or give the GPUs in --inventory FILE";
  switch (result.kind) {
    case "missing":
      if (options.command === undefined) return [];
      throw new BadRequestError(`nvidia-smi was not found at ${command}. Give the path of nvidia-smi, or leave it out to use the one on PATH.`, {
        code: "inventory_probe_failed",
      });
    case "unstartable":
      options.warnings.push(`nvidia-smi at ${command} could not be started (${describeError(result.error)}); ${noGpus}.`);
      return [];
    case "timed-out":
      options.warnings.push(`nvidia-smi did not answer within ${seconds(options.timeoutMs)} and was stopped; ${noGpus}.`);
      return [];
    case "exited":
      if (result.code !== 0) {
        // Exit code 9 is nvidia-smi's "couldn't communicate with the NVIDIA driver" (a GPU machine whose driver is not loaded).
        options.warnings.push(`nvidia-smi exited with ${exitText(result)}: ${excerpt(result)}; ${noGpus}.`);
        return [];
      }
  }
  const parsed = parseNvidiaSmiGpus(result.stdout);
  if (parsed.kind === "unreadable") {
    options.warnings.push(`nvidia-smi printed a line that is not "index, name, memory": '${printable(parsed.line)}'; ${noGpus}.`);
    return [];
  }
  return parsed.gpus;
}

/**
 * The GPUs of `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader`, one
 * line each: "0, NVIDIA H100 80GB HBM3, 81559 MiB". A line that does not read that way
 * ("[N/A]" memory, an error text) makes the whole answer unreadable: a node that reports
 * some of its GPUs would be given replicas for the wrong ones.
 */
export function parseNvidiaSmiGpus(output: string): { kind: "ok"; gpus: GpuInventory[] } | { kind: "unreadable"; line: string } {
  const gpus: GpuInventory[] = [];
  for (const line of output
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "")) {
    const fields = line.split(",").map((field) => field.trim());
    const index = fields[0] ?? "";
    const memory = parseGpuMemory(fields[fields.length - 1] ?? "");
    // A name could hold a comma; it is everything between the first and the last field.
    const name = fields.slice(1, -1).join(", ");
    if (fields.length < 3 || !/^\d{1,3}$/.test(index) || name === "" || memory === undefined) return { kind: "unreadable", line };
    gpus.push({ index: Number(index), name, class: normalizeGpuClass(name), memoryBytes: memory });
  }
  return { kind: "ok", gpus };
}

/**
 * "81559 MiB" in bytes; undefined for anything else ("[N/A]", 0). nvidia-smi prints MiB;
 * other units are read too, every one of them as a power of 1024 like all sizes in llmgw
 * (parseByteSize).
 */
function parseGpuMemory(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)\s*([KMGT])i?B$/i.exec(text);
  if (match === null) return undefined;
  const power = "KMGT".indexOf(match[2]!.toUpperCase()) + 1;
  const bytes = Math.round(Number(match[1]) * 1024 ** power);
  return bytes > 0 ? bytes : undefined;
}

/**
 * `llama-server --version` prints a "version: ..." line and "built with ..." on stderr (after
 * device lines on a CUDA build). The version is reported as printed after "version:"
 * ("4567 (abc1234)", "0.4.0-dev (build 1, commit 80fb11a)", "0 (unknown)": every shape
 * llama.cpp builds print, llama-server-version.ts); a build llmgw has no architecture list
 * for is accepted with a warning.
 */
async function probeLlamaServer(options: ProbeOptions & { command: string; warnings: string[] }): Promise<EngineInventory> {
  const result = await runProbe({ ...options, args: ["--version"] });
  const failed = (why: string) =>
    new BadRequestError(
      `llama-server at ${options.command} ${why}. Check the llama-server path, or leave it out to run llama.cpp models on the bundled engine only.`,
      {
        code: "inventory_probe_failed",
      },
    );
  if (result.kind === "missing") throw failed("does not exist");
  if (result.kind === "unstartable") throw failed(`could not be started (${describeError(result.error)})`);
  if (result.kind === "timed-out") throw failed(`did not answer --version within ${seconds(options.timeoutMs)} and was stopped`);
  if (result.code !== 0) throw failed(`exited with ${exitText(result)} on --version: ${excerpt(result)}`);
  const read = readLlamaServerVersion(`${result.stderr}\n${result.stdout}`);
  if (read === undefined) throw failed(`printed no "version: ..." line on --version: ${excerpt(result)}`);
  if (!read.known) options.warnings.push(unknownBuildWarning({ path: options.command, version: read.version }));
  return { engine: "llama-server", version: read.version.slice(0, INVENTORY_LIMITS.versionLength) };
}

/** `vllm --version` prints the version ("0.6.3.post1") on stdout, possibly after log lines. */
async function probeVllm(options: ProbeOptions & { command: string | undefined; warnings: string[] }): Promise<EngineInventory | undefined> {
  const command = options.command ?? "vllm";
  const result = await runProbe({ ...options, command, args: ["--version"] });
  const version = result.kind === "exited" && result.code === 0 ? lastVersionLine(result.stdout) : undefined;
  if (version !== undefined) return { engine: "vllm", version };
  if (result.kind === "missing" && options.command === undefined) return undefined;
  const why =
    result.kind === "missing"
      ? "does not exist"
      : result.kind === "unstartable"
        ? `could not be started (${describeError(result.error)})`
        : result.kind === "timed-out"
          ? `did not answer --version within ${seconds(options.timeoutMs)} and was stopped`
          : result.code !== 0
            ? `exited with ${exitText(result)} on --version: ${excerpt(result)}`
            : `printed no version on --version: ${excerpt(result)}`;
  if (options.command !== undefined) {
    throw new BadRequestError(`vllm at ${command} ${why}. Check the vllm path, or leave it out to run without vLLM.`, { code: "inventory_probe_failed" });
  }
  options.warnings.push(`vllm on PATH ${why}; this node reports no vLLM engine.`);
  return undefined;
}

function lastVersionLine(output: string): string | undefined {
  const versions = output
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => /^v?\d+\.\d+[0-9A-Za-z.+-]*$/.test(line));
  return versions[versions.length - 1];
}

type ProbeResult =
  | { kind: "exited"; code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }
  | { kind: "timed-out" }
  /** The command is not there (ENOENT): not on PATH, or no file at the path. */
  | { kind: "missing" }
  /** It is there but could not be run (EACCES, a bad interpreter line). */
  | { kind: "unstartable"; error: Error };

/**
 * Runs `command args` in its own process group with stdin closed and waits for it to end,
 * at most `timeoutMs`; then it SIGKILLs the group (the command and anything it forked) and
 * answers "timed-out". An abort kills the group the same way and rejects with the reason.
 */
function runProbe(options: ProbeOptions & { command: string; args: string[] }): Promise<ProbeResult> {
  const { signal } = options;
  signal?.throwIfAborted();
  return new Promise<ProbeResult>((resolve, reject) => {
    // PATH lookup uses the PATH of `env`, so a test's stand-ins are found the way real commands are.
    const child = spawn(options.command, options.args, { env: options.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const stdout = collect(child.stdout);
    const stderr = collect(child.stderr);
    let settled = false;
    const finish = (settle: () => void): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      settle();
    };
    const killGroup = (): void => {
      if (child.pid !== undefined) {
        try {
          process.kill(-child.pid, "SIGKILL");
        } catch {
          // ESRCH: the group is already gone.
        }
      }
      // A grandchild that left the group could keep the pipes open; stop reading them.
      child.stdout.destroy();
      child.stderr.destroy();
    };
    const onAbort = (): void => {
      killGroup();
      finish(() => reject(signal?.reason));
    };
    const timer = setTimeout(() => {
      killGroup();
      finish(() => resolve({ kind: "timed-out" }));
    }, options.timeoutMs);
    signal?.addEventListener("abort", onAbort, { once: true });
    child.once("error", (error) => {
      finish(() => resolve(errorCode(error) === "ENOENT" ? { kind: "missing" } : { kind: "unstartable", error }));
    });
    // "close": the process has exited and its output has been read to the end.
    child.once("close", (code, exitSignal) => {
      finish(() => resolve({ kind: "exited", code, signal: exitSignal, stdout: stdout(), stderr: stderr() }));
    });
  });
}

/** Reads a stream into memory up to MAX_PROBE_OUTPUT bytes; returns what it has so far. */
function collect(stream: NodeJS.ReadableStream): () => string {
  const chunks: Buffer[] = [];
  let size = 0;
  stream.on("data", (chunk: Buffer) => {
    if (size >= MAX_PROBE_OUTPUT) return;
    chunks.push(chunk.subarray(0, MAX_PROBE_OUTPUT - size));
    size += chunk.length;
  });
  return () => Buffer.concat(chunks).toString("utf8");
}

function exitText(result: { code: number | null; signal: NodeJS.Signals | null }): string {
  return result.code !== null ? `code ${result.code}` : `signal ${result.signal ?? "unknown"}`;
}

/** The first line the command printed, for a message ("printed nothing" when it printed nothing). */
function excerpt(result: { stdout: string; stderr: string }): string {
  const line = `${result.stderr}\n${result.stdout}`
    .split("\n")
    .map((l) => l.trim())
    .find((l) => l !== "");
  return line === undefined ? "it printed nothing" : `'${printable(line)}'`;
}

function seconds(ms: number): string {
  return `${Number((ms / 1000).toFixed(1))} s`;
}

const size = z.union([z.number(), z.string()], { error: 'must be a number of bytes or a size like "32GiB"' });

/**
 * An inventory file: the wire form (NodeInventory) or a friendlier one written by hand,
 * with sizes as strings ("memory": "32GiB", read like every llmgw size flag), GPU indexes
 * by position, GPU classes from their names, and the bundled engine when no engines are
 * given. Fields are checked strictly: a misspelt "gpu" must not silently mean no GPUs.
 */
const inventoryFileSchema = z.strictObject({
  cores: z.unknown(),
  memory: size.optional(),
  memoryBytes: z.unknown().optional(),
  gpus: z
    .array(
      z.strictObject({
        index: z.unknown().optional(),
        name: z.string({ error: "must be the GPU's name, as nvidia-smi reports it" }),
        class: z.string().optional(),
        memory: size.optional(),
        memoryBytes: z.unknown().optional(),
      }),
    )
    .default([]),
  engines: z.array(z.strictObject({ engine: z.enum(ENGINE_NAMES), version: z.string() })).optional(),
});

const INVENTORY_FILE_FIELDS = "cores, memory or memoryBytes, gpus (index, name, class, memory or memoryBytes), engines (engine, version)";

/**
 * The inventory in `--inventory FILE`, which replaces the detected one. Throws a
 * BadRequestError (`invalid_inventory`) naming the file, and the field when one is wrong.
 */
export async function readInventoryFile(file: string): Promise<NodeInventory> {
  const what = `inventory file ${file}`;
  const refuse = (message: string, param: string | null = null, cause?: unknown) =>
    new BadRequestError(message, { code: "invalid_inventory", param, ...(cause === undefined ? {} : { cause }) });
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (error) {
    const reason = errorCode(error) === "ENOENT" ? "it does not exist" : describeError(error);
    throw refuse(`Cannot read ${what}: ${reason}. Check the --inventory path.`, null, error);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw refuse(
      `The ${what} is not valid JSON (${describeError(error)}). Write a JSON object such as {"cores": 8, "memory": "32GiB", "gpus": []}.`,
      null,
      error,
    );
  }
  const parsed = inventoryFileSchema.safeParse(json);
  if (!parsed.success) {
    // The shape is wrong (an unknown field, a string where a list belongs); checkInventory names ranges.
    const issue = parsed.error.issues[0];
    const at = issue ? issue.path.map(String) : [];
    if (issue?.code === "unrecognized_keys") {
      // Name the misspelt field itself ("gpu" for "gpus"), not the object that holds it.
      const field = [...at, issue.keys[0] ?? ""].join(".");
      throw refuse(`Invalid ${what}: unknown field '${field}'. Known fields: ${INVENTORY_FILE_FIELDS}.`, field, parsed.error);
    }
    const path = at.join(".");
    throw refuse(`Invalid ${what}:${path === "" ? "" : ` field '${path}':`} ${issue?.message ?? "invalid"}.`, path === "" ? null : path, parsed.error);
  }
  const form = parsed.data;
  const bytes = (field: { memory?: number | string | undefined; memoryBytes?: unknown }, path: string): unknown => {
    if (field.memory !== undefined && field.memoryBytes !== undefined) {
      throw refuse(`Invalid ${what}: ${path} gives both memory and memoryBytes; give one.`, `${path}memory`);
    }
    if (field.memory === undefined) return field.memoryBytes;
    if (typeof field.memory === "number") return field.memory;
    try {
      return parseByteSize(field.memory, `${path}memory`);
    } catch (error) {
      throw refuse(
        `Invalid ${what}: field '${path}memory': '${printable(field.memory)}' is not a size; use a number of bytes or a size like "80GiB".`,
        `${path}memory`,
        error,
      );
    }
  };
  return checkInventory(
    {
      cores: form.cores,
      memoryBytes: bytes(form, ""),
      gpus: form.gpus.map((gpu, position) => ({
        index: gpu.index ?? position,
        name: gpu.name,
        // A class written by hand ("h100") goes through the same rule as a detected name.
        class: normalizeGpuClass(gpu.class ?? gpu.name),
        memoryBytes: bytes(gpu, `gpus.${position}.`),
      })),
      engines: form.engines ?? [BUNDLED_ENGINE],
    },
    what,
  );
}

/**
 * `--labels k=v,k2=v2`: Kubernetes-style keys and short values, each key once. Throws a
 * BadRequestError (`invalid_labels`) naming the pair that is wrong.
 */
export function parseLabels(text: string): NodeLabels {
  const labels = new Map<string, string>();
  const refuse = (pair: string, why: string) =>
    new BadRequestError(
      `Invalid --labels pair '${printable(pair)}': ${why}. Write labels as key=value pairs separated by commas, for example zone=eu-1,rack=r12.`,
      {
        code: "invalid_labels",
        param: "labels",
      },
    );
  for (const pair of text.split(",").map((p) => p.trim())) {
    if (pair === "") continue;
    const equals = pair.indexOf("=");
    if (equals < 0) throw refuse(pair, "it has no '='");
    const key = pair.slice(0, equals).trim();
    const value = pair.slice(equals + 1).trim();
    if (!LABEL_KEY_PATTERN.test(key)) throw refuse(pair, `the key must be ${LABEL_KEY_RULE}`);
    if (!LABEL_VALUE_PATTERN.test(value)) throw refuse(pair, `the value must be ${LABEL_VALUE_RULE}`);
    if (labels.has(key)) throw refuse(pair, `the key '${key}' is given twice`);
    labels.set(key, value);
  }
  return checkLabels(Object.fromEntries(labels), "--labels");
}
