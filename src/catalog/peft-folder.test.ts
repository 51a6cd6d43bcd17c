// vLLM's LoRA adapters (PEFT folders) from the door to the engine's flags: the catalog
// refuses a folder vLLM cannot serve; the fleet pins every file of the folder by size and
// sha256 (hashing each file once while its stamp holds) with the adapter's rank; a node
// refuses to start the engine when the folder on its disk holds other files or other bytes;
// `vllm serve` is told the rank and how many adapters to keep.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { appendFile, mkdir, mkdtemp, rm, symlink, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { NodeWeights } from "../agent/node-weights.ts";
import { WeightCache } from "../agent/weight-cache.ts";
import { WeightsIdentity, WeightsIdentityError } from "../agent/weights-identity.ts";
import { BadRequestError } from "../core/errors.ts";
import { SecretBox } from "../core/secret-box.ts";
import { loraLimits, vllmLoraReserveBytes } from "../engines/vllm/vllm-launch.ts";
import { replicaNeeds } from "../fleet/replica-needs.ts";
import { FileHashMemo } from "../fleet/adapter-pins.ts";
import type { Assignment } from "../fleet/agent-protocol.ts";
import { readModelWeights } from "../fleet/model-weights.ts";
import { openSqliteTestStore } from "../../test/support/stores.ts";
import { Catalog, type CatalogModel } from "./catalog.ts";
import { profileSchema } from "./model-schema.ts";
import { vllmMaxLoraRank } from "./peft-folder.ts";
import { DiskWeightsChecker } from "./weights-check.ts";
import type { Store } from "../store/store.ts";

let dir: string;
let modelFile: string;
let store: Store;
let cleanup: () => Promise<void>;

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "llmgw-peft-"));
  await mkdir(path.join(dir, "model"));
  modelFile = path.join(dir, "model", "config.json");
  await writeFile(modelFile, JSON.stringify({ architectures: ["LlamaForCausalLM"] }));
  ({ store, cleanup } = await openSqliteTestStore());
});

after(async () => {
  await cleanup();
  await rm(dir, { recursive: true, force: true });
});

/** A PEFT folder as `peft` saves one: the config, the weights, and a README. */
async function writePeftFolder(name: string, config: Record<string, unknown> = { peft_type: "LORA", r: 8 }): Promise<string> {
  const folder = path.join(dir, name);
  await mkdir(folder, { recursive: true });
  await writeFile(path.join(folder, "adapter_config.json"), JSON.stringify(config));
  await writeFile(path.join(folder, "adapter_model.safetensors"), randomBytes(4096));
  await writeFile(path.join(folder, "README.md"), `# ${name}\n`);
  return folder;
}

const box = SecretBox.fromKey(randomBytes(32));
const catalog = () => new Catalog({ store, box, weights: new DiskWeightsChecker() });
const vllmModel = (name: string, adapters: unknown[]) => ({
  name,
  source: { kind: "file", path: modelFile },
  profiles: [{ name: "gpu", engine: "vllm", hardware: { gpu: { class: "H100" } } }],
  adapters,
});
const folderAdapter = (name: string, folder: string) => ({ name, source: { kind: "file", path: folder } });

function refused(pattern: RegExp) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof BadRequestError, `expected a 400, got ${String(error)}`);
    assert.equal(error.param, "adapters.0.source", error.message);
    assert.match(error.message, pattern);
    return true;
  };
}

test("the door refuses a folder vLLM cannot serve, naming what is wrong", async () => {
  const cases: Array<[string, () => Promise<string>, RegExp]> = [
    ["no config", async () => path.join(dir, "nowhere"), /adapter_config\.json is not a file/],
    ["not LoRA", () => writePeftFolder("ia3", { peft_type: "IA3", r: 8 }), /'IA3' adapter; vLLM serves LoRA adapters/],
    ["no rank", () => writePeftFolder("norank", { peft_type: "LORA" }), /no LoRA rank/],
    ["rank too high", () => writePeftFolder("huge", { peft_type: "LORA", r: 1024 }), /rank 1024; vLLM serves ranks up to 512/],
    ["a module's rank too high", () => writePeftFolder("pattern", { peft_type: "LORA", r: 8, rank_pattern: { q_proj: 600 } }), /rank 600/],
    ["DoRA", () => writePeftFolder("dora", { peft_type: "LORA", r: 8, use_dora: true }), /DoRA adapter/],
    ["modules_to_save", () => writePeftFolder("saves", { peft_type: "LORA", r: 8, modules_to_save: ["lm_head"] }), /modules_to_save: \["lm_head"\]/],
    ["bias", () => writePeftFolder("bias", { peft_type: "LORA", r: 8, bias: "all" }), /bias terms .*--enable-lora-bias/],
    [
      "not JSON",
      async () => {
        const folder = await writePeftFolder("broken");
        await writeFile(path.join(folder, "adapter_config.json"), "{ r: 8");
        return folder;
      },
      /is not JSON/,
    ],
    [
      "no weights",
      async () => {
        const folder = await writePeftFolder("empty");
        await unlink(path.join(folder, "adapter_model.safetensors"));
        return folder;
      },
      /no adapter_model\.safetensors or adapter_model\.bin/,
    ],
    [
      "a link inside",
      async () => {
        const folder = await writePeftFolder("linked");
        await symlink(path.join(folder, "README.md"), path.join(folder, "NOTES.md"));
        return folder;
      },
      /NOTES\.md is a symbolic link/,
    ],
  ];
  for (const [what, make, pattern] of cases) {
    const folder = await make();
    await assert.rejects(catalog().create(vllmModel(`m-${what.replace(/[^A-Za-z0-9]+/g, "-")}`, [folderAdapter("a", folder)]), "t"), refused(pattern), what);
  }
  assert.equal(catalog().list().length, 0);
  // Bias terms are loaded where the profile asks vLLM for them.
  const biased = await writePeftFolder("bias-enabled", { peft_type: "LORA", r: 8, bias: "lora_only" });
  const model = vllmModel("biased", [folderAdapter("a", biased)]);
  model.profiles[0] = { ...model.profiles[0]!, engine_args: ["--enable-lora-bias"] } as (typeof model.profiles)[0];
  assert.equal((await catalog().create(model, "t")).name, "biased");
});

async function addModel(name: string, folders: string[]): Promise<CatalogModel> {
  const created = await catalog().create(
    vllmModel(
      name,
      folders.map((folder, index) => folderAdapter(`a${index}`, folder)),
    ),
    "t",
  );
  return created;
}

const sha256Of = (bytes: Buffer | string) => createHash("sha256").update(bytes).digest("hex");
const noMirror = { check: () => Promise.reject(new Error("no mirror in this test")) };

test("the fleet pins every file of the folder with its rank, and hashes a file again only when it changed", async () => {
  const folder = await writePeftFolder("style", { peft_type: "LORA", r: 16, rank_pattern: { v_proj: 32 } });
  // What huggingface-cli download --local-dir leaves in the folder (with times that differ per node) is not the adapter's.
  await mkdir(path.join(folder, ".cache", "huggingface", "download"), { recursive: true });
  await writeFile(path.join(folder, ".cache", "huggingface", "download", "adapter_model.safetensors.metadata"), String(Date.now()));
  const model = await addModel("pinned", [folder]);
  const memo = new FileHashMemo();
  const weights = await readModelWeights(model, noMirror, memo);
  const [adapter] = weights.adapters;
  assert.equal(adapter?.rank, 32);
  assert.equal(adapter?.sha256, null);
  assert.deepEqual(
    adapter?.files?.map((f) => f.file),
    ["README.md", "adapter_config.json", "adapter_model.safetensors"],
  );
  assert.equal(adapter?.files?.find((f) => f.file === "README.md")?.sha256, sha256Of("# style\n"));
  assert.equal(
    adapter?.bytes,
    adapter?.files?.reduce((sum, f) => sum + f.bytes, 0),
  );
  assert.equal(memo.hashed, 3);

  // The next pass reads the weights again: nothing is hashed again while the files are the same.
  await readModelWeights(model, noMirror, memo);
  assert.equal(memo.hashed, 3);
  await appendFile(path.join(folder, "README.md"), "more\n");
  const again = await readModelWeights(model, noMirror, memo);
  assert.equal(memo.hashed, 4, "only the changed file is hashed again");
  assert.equal(again.adapters[0]?.files?.find((f) => f.file === "README.md")?.sha256, sha256Of("# style\nmore\n"));
});

test("a node refuses to start the engine when the folder on its disk is not the one pinned", async () => {
  const folder = await writePeftFolder("node-side");
  const model = await addModel("on-node", [folder]);
  const weights = await readModelWeights(model, noMirror, new FileHashMemo());
  const identity = new WeightsIdentity({});
  const nodeWeights = new NodeWeights({
    cache: new WeightCache({ root: path.join(dir, "cache"), serverUrl: "http://127.0.0.1:1", credential: () => "unused", identity }),
    identity,
  });
  const assignment = {
    modelName: model.name,
    profile: model.definition.profiles[0]!,
    source: model.definition.source!,
    files: weights.files,
    adapters: weights.adapters,
  } as Pick<Assignment, "modelName" | "profile" | "source" | "files" | "adapters"> as Assignment;
  const prepare = () => nodeWeights.prepare(assignment, new AbortController().signal);

  assert.deepEqual((await prepare()).adapterPaths, [folder]);

  // A file added to the folder (another weights file vLLM might load) refuses the start.
  await writeFile(path.join(folder, "adapter_model.bin"), "other weights");
  await assert.rejects(prepare(), (error: unknown) => {
    assert.ok(error instanceof WeightsIdentityError);
    assert.match(error.message, /adapter_model\.bin was added/);
    return true;
  });
  await unlink(path.join(folder, "adapter_model.bin"));
  assert.deepEqual((await prepare()).adapterPaths, [folder]);

  // The same names with other bytes: the weights identity check names the file.
  await writeFile(path.join(folder, "adapter_model.safetensors"), randomBytes(4096));
  await assert.rejects(prepare(), (error: unknown) => {
    assert.ok(error instanceof WeightsIdentityError);
    assert.match(error.message, /adapter_model\.safetensors/);
    assert.equal(error.code, "weights_sha256_mismatch");
    return true;
  });

  // A file gone.
  await unlink(path.join(folder, "README.md"));
  await assert.rejects(prepare(), /README\.md is missing/);

  // From a server that pinned no folder files (before this check existed): the config must be there.
  const unpinned = { ...assignment, adapters: weights.adapters.map(({ files: _files, rank: _rank, ...adapter }) => ({ ...adapter, bytes: null })) };
  assert.deepEqual((await nodeWeights.prepare(unpinned, new AbortController().signal)).adapterPaths, [folder]);
  await unlink(path.join(folder, "adapter_config.json"));
  await assert.rejects(nodeWeights.prepare(unpinned, new AbortController().signal), /adapter_config\.json/);
});

test("vllm serve is told the rank that holds every adapter and how many to keep; placement counts vLLM's adapter slots", () => {
  assert.equal(vllmMaxLoraRank([]), 16, "vLLM's default when no rank is known");
  assert.equal(vllmMaxLoraRank([8, 4]), 16);
  assert.equal(vllmMaxLoraRank([8, 33]), 64);
  assert.equal(vllmMaxLoraRank([320]), 320);
  assert.deepEqual(loraLimits([{ rank: 8 }, { rank: 64 }]), ["--max-lora-rank", "64", "--max-loras", "2", "--max-cpu-loras", "2"]);
  const many = Array.from({ length: 6 }, () => ({ rank: 16 }));
  assert.deepEqual(loraLimits(many), ["--max-lora-rank", "16", "--max-loras", "4", "--max-cpu-loras", "6"]);
  // An operator's own values stand alone: a --max-cpu-loras of ours below their --max-loras would stop vLLM.
  assert.deepEqual(loraLimits(many, ["--max-loras", "8"]), ["--max-lora-rank", "16"]);
  assert.deepEqual(loraLimits(many, ["--max-lora-rank=256"]), ["--max-loras", "4", "--max-cpu-loras", "6"]);

  // Slots: up to 4 adapters at once, each as large as the largest adapter at the rank vLLM is given.
  const MiB = 1024 * 1024;
  const weights = (bytes: number) => [
    { file: "adapter_config.json", bytes: 500 },
    { file: "adapter_model.safetensors", bytes },
  ];
  const reserve = vllmLoraReserveBytes([
    { rank: 8, bytes: null, files: weights(10 * MiB) },
    { rank: 32, bytes: null, files: weights(20 * MiB) },
  ]);
  // --max-lora-rank 32: the rank-8 adapter would be 40 MiB there; 2 slots.
  assert.equal(reserve, 2 * 40 * MiB);
  const profile = profileSchema.parse({ name: "gpu", engine: "vllm", hardware: { gpu: { class: "H100" } } });
  const bare = replicaNeeds({ profile, weightsBytes: 16 * 1024 * MiB });
  const withSlots = replicaNeeds({ profile, weightsBytes: 16 * 1024 * MiB, adapterBytes: 30 * MiB, vllmLoraReserveBytes: reserve });
  assert.equal((withSlots.gpu?.memoryBytesPerGpu ?? 0) - (bare.gpu?.memoryBytesPerGpu ?? 0), reserve);
});
