// A PEFT adapter folder, as vLLM loads it (`--lora-modules NAME=FOLDER`): adapter_config.json
// beside the adapter's weights (adapter_model.safetensors or .bin, sometimes tokenizer files).
// This module owns what llmgw reads of such a folder: its config (a LoRA, and of which rank,
// which vLLM must be told with --max-lora-rank), and its files, which are pinned like weights:
// the fleet lists them with size and sha256 once per definition, and a node refuses to start
// the engine when the folder holds other files, or the same files with other bytes.
import { lstat, readdir, readFile } from "node:fs/promises";
import path from "node:path";
import { BadRequestError, describeError, errorCode } from "../core/errors.ts";

/** A file of an adapter folder, by its path inside the folder ('/'-separated). */
export interface PeftFile {
  file: string;
  bytes: number;
}

/** What a folder may hold: a PEFT adapter is a handful of files; more is not an adapter folder. */
export const PEFT_FOLDER_LIMITS = { files: 64, depth: 3, configBytes: 1024 * 1024 } as const;

/** LoRA ranks vLLM's --max-lora-rank accepts (vllm/config/lora.py); its default is 16. */
export const VLLM_LORA_RANKS = [1, 8, 16, 32, 64, 128, 256, 320, 512] as const;
export const VLLM_DEFAULT_MAX_LORA_RANK = 16;

export interface PeftConfig {
  /** The LoRA rank: `r`, or the largest of `rank_pattern`'s per-module ranks when one is larger. */
  rank: number;
}

/**
 * Hidden files and folders are not the adapter's: `huggingface-cli download --local-dir`
 * writes .cache/huggingface/ (with download times, different on every node) into the folder,
 * and a git checkout has .git. vLLM reads neither, so neither is listed nor pinned.
 */
const isHidden = (name: string) => name.startsWith(".");

/**
 * The folder's regular files, sorted; a link, a device or a folder nested too deep is
 * refused (a link can be re-pointed after the check, as for weights). `what` names the
 * adapter in messages.
 */
export async function listPeftFolder(folder: string, what: string, param?: string): Promise<PeftFile[]> {
  const refused = refusal(param);
  const files: PeftFile[] = [];
  const walk = async (relative: string, depth: number): Promise<void> => {
    const absolute = path.join(folder, relative);
    let entries: import("node:fs").Dirent[];
    try {
      entries = await readdir(absolute, { withFileTypes: true });
    } catch (error) {
      const code = errorCode(error);
      const why = code === "ENOENT" ? "does not exist" : code === "ENOTDIR" ? "is not a folder" : `cannot be read (${code ?? describeError(error)})`;
      throw refused(
        `${what}: ${absolute} ${why}; the adapter's PEFT folder (the one holding adapter_config.json) must be at this path.`,
        "adapter_missing",
        error,
      );
    }
    for (const entry of entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      if (isHidden(entry.name)) continue;
      const name = relative === "" ? entry.name : `${relative}/${entry.name}`;
      if (entry.isDirectory()) {
        if (depth + 1 >= PEFT_FOLDER_LIMITS.depth) {
          throw refused(
            `${what}: ${path.join(folder, name)} is ${depth + 1} folders below the adapter folder, deeper than the ${PEFT_FOLDER_LIMITS.depth - 1} an adapter folder may have; give the folder of the adapter alone.`,
            "adapter_invalid",
          );
        }
        await walk(name, depth + 1);
        continue;
      }
      if (!entry.isFile()) {
        const kind = entry.isSymbolicLink()
          ? "a symbolic link (llmgw pins the files an engine loads, and a link can be re-pointed after the check)"
          : "not a regular file";
        throw refused(`${what}: ${path.join(folder, name)} is ${kind}; copy the real file into the folder.`, "adapter_invalid");
      }
      const info = await lstat(path.join(folder, name));
      files.push({ file: name, bytes: info.size });
      if (files.length > PEFT_FOLDER_LIMITS.files) {
        throw refused(
          `${what}: ${folder} holds more than ${PEFT_FOLDER_LIMITS.files} files, which is not a PEFT adapter folder; give the folder of the adapter alone.`,
          "adapter_invalid",
        );
      }
    }
  };
  await walk("", 0);
  return files;
}

/**
 * Reads adapter_config.json and refuses what vLLM would refuse at load, on every node
 * (vllm/lora/peft_helper.py): another PEFT kind than LoRA, DoRA, `modules_to_save`, bias
 * terms (unless `allowBias`: the profile passes --enable-lora-bias), a rank above 512.
 */
export async function readPeftConfig(folder: string, what: string, param?: string, options: { allowBias?: boolean } = {}): Promise<PeftConfig> {
  const refused = refusal(param);
  const file = path.join(folder, "adapter_config.json");
  const info = await lstat(file).catch(() => null);
  if (!path.isAbsolute(folder) || info === null || !info.isFile()) {
    throw refused(
      `${what} must be a PEFT adapter folder on the nodes for vLLM (one holding adapter_config.json and the adapter's safetensors), but ${file} is not a file.`,
      "adapter_invalid",
    );
  }
  if (info.size > PEFT_FOLDER_LIMITS.configBytes) throw refused(`${what}: ${file} is ${info.size} bytes, too large for an adapter config.`, "adapter_invalid");
  let config: unknown;
  try {
    config = JSON.parse(await readFile(file, "utf8"));
  } catch (error) {
    throw refused(`${what}: ${file} is not JSON (${describeError(error)}); it should be the adapter_config.json PEFT wrote.`, "adapter_invalid", error);
  }
  const fields = typeof config === "object" && config !== null ? (config as Record<string, unknown>) : {};
  const peftType = fields.peft_type;
  if (peftType !== undefined && peftType !== "LORA") {
    throw refused(`${what}: ${file} describes a '${String(peftType)}' adapter; vLLM serves LoRA adapters (peft_type "LORA") only.`, "adapter_invalid");
  }
  if (fields.use_dora === true) throw refused(`${what}: ${file} describes a DoRA adapter (use_dora); vLLM serves plain LoRA adapters only.`, "adapter_invalid");
  const saved = fields.modules_to_save;
  if (Array.isArray(saved) ? saved.length > 0 : saved !== undefined && saved !== null) {
    throw refused(
      `${what}: ${file} saves whole modules beside the adapter (modules_to_save: ${JSON.stringify(saved)}), which vLLM does not load; train the adapter without modules_to_save.`,
      "adapter_invalid",
    );
  }
  if (fields.bias !== undefined && fields.bias !== "none" && options.allowBias !== true) {
    throw refused(
      `${what}: ${file} has bias terms (bias "${String(fields.bias)}"), which vLLM loads only with --enable-lora-bias in the profile's engine_args; add it there, or train with bias "none".`,
      "adapter_invalid",
    );
  }
  const r = fields.r;
  if (typeof r !== "number" || !Number.isInteger(r) || r < 1) {
    throw refused(
      `${what}: ${file} has no LoRA rank ('r' as a whole number of at least 1); it should be the adapter_config.json PEFT wrote.`,
      "adapter_invalid",
    );
  }
  const pattern = typeof fields.rank_pattern === "object" && fields.rank_pattern !== null ? Object.values(fields.rank_pattern) : [];
  const rank = Math.max(r, ...pattern.filter((value): value is number => typeof value === "number" && Number.isInteger(value)));
  const largest = VLLM_LORA_RANKS[VLLM_LORA_RANKS.length - 1]!;
  if (rank > largest) throw refused(`${what} has LoRA rank ${rank}; vLLM serves ranks up to ${largest}.`, "adapter_invalid");
  return { rank };
}

/** Whether a model's vLLM profiles load adapter bias terms (--enable-lora-bias, in vLLM versions that have it). */
export function allowsLoraBias(profiles: readonly { engine_args?: readonly string[] }[]): boolean {
  return profiles.some((profile) => (profile.engine_args ?? []).some((arg) => arg === "--enable-lora-bias" || arg.startsWith("--enable-lora-bias=")));
}

/** The --max-lora-rank a set of adapters needs: the smallest rank vLLM accepts that holds them all. */
export function vllmMaxLoraRank(ranks: readonly number[]): number {
  const highest = Math.max(VLLM_DEFAULT_MAX_LORA_RANK, ...ranks);
  return VLLM_LORA_RANKS.find((choice) => choice >= highest) ?? VLLM_LORA_RANKS[VLLM_LORA_RANKS.length - 1]!;
}

function refusal(param: string | undefined) {
  return (message: string, code: string, cause?: unknown): BadRequestError =>
    new BadRequestError(message, { code, ...(param === undefined ? {} : { param }), ...(cause === undefined ? {} : { cause }) });
}
