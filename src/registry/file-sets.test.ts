// File-set classification and artifact choice over file lists shaped like real Hub
// repositories (bartowski/Unsloth GGUF layouts, transformers safetensors layouts).
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError, type LlmgwError, NotFoundError } from "../core/errors.ts";
import { chooseArtifact, classifyFiles, describeSet, ggufQuantLabel, type ArtifactSet, type ListedFile } from "./file-sets.ts";
import { validateMirrorFile } from "../mirror/mirror-paths.ts";
import { sanitizeRepoPath } from "./repo-path.ts";

const files = (...paths: string[]): ListedFile[] => paths.map((path, i) => ({ path, size: 1000 * (i + 1) }));

const GGUF_REPO = files(
  ".gitattributes",
  "README.md",
  "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
  "Llama-3.2-1B-Instruct-Q8_0.gguf",
  "Llama-3.2-1B-Instruct-IQ4_XS.gguf",
  "llama-3.2-1b-instruct-f16.gguf",
  "Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf",
  "Q5_K_S/Llama-3.2-1B-Instruct-Q5_K_S-00001-of-00003.gguf",
  "Q5_K_S/Llama-3.2-1B-Instruct-Q5_K_S-00002-of-00003.gguf",
  "Q5_K_S/Llama-3.2-1B-Instruct-Q5_K_S-00003-of-00003.gguf",
  "BF16/Llama-3.2-1B-Instruct-BF16-00001-of-00002.gguf",
  "mmproj-Llama-3.2-1B-F16.gguf",
  "mmproj-Llama-3.2-1B-Q8_0.gguf",
  "imatrix_unsloth.gguf",
  "Llama-3.2-1B-Instruct.imatrix",
);

const SAFETENSORS_REPO = files(
  "README.md",
  "config.json",
  "generation_config.json",
  "model-00001-of-00002.safetensors",
  "model-00002-of-00002.safetensors",
  "model.safetensors.index.json",
  "special_tokens_map.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "tokenizer.model",
  "chat_template.jinja",
  "original/consolidated.00.pth",
  "pytorch_model.bin",
);

function assertError(type: new (...args: never[]) => LlmgwError, code: string, ...mentions: string[]) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof type, `expected ${type.name}, got ${String(error)}`);
    assert.equal(error.code, code);
    for (const mention of mentions) assert.ok(error.message.includes(mention), `message should mention '${mention}': ${error.message}`);
    return true;
  };
}

test("quantisation labels are read from file names and folders, upper-cased", () => {
  const cases: Record<string, string | null> = {
    "Llama-3.2-1B-Instruct-Q4_K_M.gguf": "Q4_K_M",
    "qwen2.5-7b-instruct-q5_k_s.gguf": "Q5_K_S",
    "mistral-7b-instruct-v0.2.Q8_0.gguf": "Q8_0",
    "gemma-3-27b-it-IQ4_XS.gguf": "IQ4_XS",
    "model-f16.gguf": "F16",
    "ggml-model-bf16.gguf": "BF16",
    "Qwen3-30B-A3B-UD-Q4_K_XL.gguf": "UD-Q4_K_XL",
    "Phi-3-mini-4k-instruct-Q4_0_4_4.gguf": "Q4_0_4_4",
    "DeepSeek-R1-UD-IQ1_S-00001-of-00003.gguf": "UD-IQ1_S",
    "Q6_K/Big-Model-00001-of-00002.gguf": "Q6_K",
    "model-fp16.gguf": "F16",
    "bitnet-TQ1_0.gguf": "TQ1_0",
    "gpt-oss-20b-MXFP4.gguf": "MXFP4",
    "Qwen2-7B.gguf": null,
    "model.gguf": null,
  };
  for (const [path, label] of Object.entries(cases)) assert.equal(ggufQuantLabel(path), label, path);
});

test("GGUF files are grouped by quantisation, splits as one set, projectors apart, imatrix left out", () => {
  const sets = classifyFiles(GGUF_REPO);
  const byQuant: Record<string, ArtifactSet> = Object.fromEntries(sets.gguf.map((set) => [set.quant ?? set.name, set]));
  assert.deepEqual(Object.keys(byQuant).sort(), ["BF16", "F16", "IQ4_XS", "Q4_K_M", "Q5_K_S", "Q8_0", "UD-Q4_K_XL"]);

  const split = byQuant.Q5_K_S;
  assert.ok(split !== undefined);
  assert.equal(split.files.length, 3);
  assert.equal(split.entry, "Q5_K_S/Llama-3.2-1B-Instruct-Q5_K_S-00001-of-00003.gguf");
  assert.deepEqual(split.split, { count: 3, missing: [] });
  assert.equal(split.complete, true);
  assert.equal(
    split.totalBytes,
    split.files.reduce((n, f) => n + f.size, 0),
  );
  assert.deepEqual(
    split.files.map((f) => f.path.slice(-19)),
    ["00001-of-00003.gguf", "00002-of-00003.gguf", "00003-of-00003.gguf"],
  );

  const incomplete = byQuant.BF16;
  assert.ok(incomplete !== undefined);
  assert.equal(incomplete.complete, false);
  assert.deepEqual(incomplete.split, { count: 2, missing: [2] });
  assert.match(describeSet(incomplete), /incomplete: part 2 missing/);

  assert.deepEqual(
    sets.projectors.map((p) => [p.file.path, p.quant]),
    [
      ["mmproj-Llama-3.2-1B-F16.gguf", "F16"],
      ["mmproj-Llama-3.2-1B-Q8_0.gguf", "Q8_0"],
    ],
  );
  assert.deepEqual(sets.excluded.map((e) => e.file.path).sort(), ["Llama-3.2-1B-Instruct.imatrix", "imatrix_unsloth.gguf"]);
  assert.ok(sets.gguf.every((set) => set.files.every((f) => !/imatrix|mmproj/.test(f.path))));
  assert.deepEqual(sets.other.map((f) => f.path).sort(), [".gitattributes", "README.md"]);
});

test("safetensors shards are one set with their index; companions are found", () => {
  const sets = classifyFiles(SAFETENSORS_REPO);
  assert.equal(sets.safetensors.length, 1);
  const set = sets.safetensors[0];
  assert.ok(set !== undefined);
  assert.equal(set.name, "model");
  assert.equal(set.entry, "model.safetensors.index.json");
  assert.deepEqual(
    set.files.map((f) => f.path),
    ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"],
  );
  assert.equal(set.complete, true);
  assert.deepEqual(sets.companions.map((f) => f.path).sort(), [
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
  ]);
  assert.deepEqual(sets.other.map((f) => f.path).sort(), ["README.md", "original/consolidated.00.pth", "pytorch_model.bin"]);
});

test("a single model.safetensors is a set; shards without their index are incomplete", () => {
  const single = classifyFiles(files("config.json", "model.safetensors"));
  assert.equal(single.safetensors[0]?.entry, "model.safetensors");
  assert.equal(single.safetensors[0]?.complete, true);

  const noIndex = classifyFiles(files("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  assert.equal(noIndex.safetensors[0]?.complete, false);
  const missingShard = classifyFiles(files("model.safetensors.index.json", "model-00001-of-00002.safetensors"));
  assert.deepEqual(missingShard.safetensors[0]?.split, { count: 2, missing: [2] });
  assert.throws(() => chooseArtifact({ sets: missingShard, format: "safetensors" }), assertError(NotFoundError, "incomplete_set", "part 2 of 2"));
});

test("the default choice is Q4_K_M; a quant by any case; a file picks its whole set", () => {
  const sets = classifyFiles(GGUF_REPO);
  const byDefault = chooseArtifact({ sets });
  assert.equal(byDefault.set.quant, "Q4_K_M");
  assert.deepEqual(
    byDefault.files.map((f) => f.path),
    ["Llama-3.2-1B-Instruct-Q4_K_M.gguf"],
  );
  assert.deepEqual(byDefault.companions, []);
  assert.equal(byDefault.projector, null);
  assert.equal(byDefault.projectorsOffered.length, 2);

  assert.equal(chooseArtifact({ sets, quant: "q8_0" }).set.entry, "Llama-3.2-1B-Instruct-Q8_0.gguf");
  assert.equal(chooseArtifact({ sets, quant: "ud-q4_k_xl" }).set.quant, "UD-Q4_K_XL");

  const bySplitPart = chooseArtifact({ sets, file: "Q5_K_S/Llama-3.2-1B-Instruct-Q5_K_S-00002-of-00003.gguf" });
  assert.equal(bySplitPart.set.quant, "Q5_K_S");
  assert.equal(bySplitPart.files.length, 3);
  assert.equal(bySplitPart.totalBytes, bySplitPart.set.totalBytes);

  const byName = chooseArtifact({ sets, file: "Llama-3.2-1B-Instruct-IQ4_XS.gguf" });
  assert.equal(byName.set.quant, "IQ4_XS");
});

test("a projector is added on request, F16 first, or by name", () => {
  const sets = classifyFiles(GGUF_REPO);
  const best = chooseArtifact({ sets, projector: true });
  assert.equal(best.projector?.path, "mmproj-Llama-3.2-1B-F16.gguf");
  assert.deepEqual(
    best.files.map((f) => f.path),
    ["Llama-3.2-1B-Instruct-Q4_K_M.gguf", "mmproj-Llama-3.2-1B-F16.gguf"],
  );
  assert.equal(chooseArtifact({ sets, projector: "q8_0" }).projector?.path, "mmproj-Llama-3.2-1B-Q8_0.gguf");
  assert.throws(() => chooseArtifact({ sets, projector: "Q2_K" }), assertError(NotFoundError, "projector_not_found", "mmproj-Llama-3.2-1B-F16.gguf"));
});

test("not found lists what the repository has", () => {
  const sets = classifyFiles(GGUF_REPO);
  assert.throws(
    () => chooseArtifact({ sets, quant: "Q3_K_L" }),
    assertError(NotFoundError, "quant_not_found", "Q3_K_L", "Q4_K_M", "Q8_0", "IQ4_XS", "F16", "Q5_K_S (3 parts"),
  );
  assert.throws(
    () => chooseArtifact({ sets, file: "nope.gguf" }),
    assertError(NotFoundError, "file_not_found", "'nope.gguf'", "Llama-3.2-1B-Instruct-Q8_0.gguf"),
  );
  assert.throws(() => chooseArtifact({ sets, quant: "BF16" }), assertError(NotFoundError, "incomplete_set", "BF16", "part 2 of 2"));
  const withoutDefault = classifyFiles(files("m-Q8_0.gguf", "m-Q6_K.gguf"));
  assert.throws(() => chooseArtifact({ sets: withoutDefault }), assertError(NotFoundError, "quant_not_found", "no Q4_K_M GGUF (the default)", "Q8_0", "Q6_K"));
  assert.throws(() => chooseArtifact({ sets: classifyFiles(SAFETENSORS_REPO), format: "gguf" }), assertError(NotFoundError, "no_gguf_files", "safetensors"));
});

test("a repository with one GGUF set serves it without naming the quantisation", () => {
  const sets = classifyFiles(files("README.md", "tiny.gguf"));
  assert.equal(chooseArtifact({ sets }).set.entry, "tiny.gguf");
});

test("safetensors are chosen with their companions", () => {
  const sets = classifyFiles(SAFETENSORS_REPO);
  const chosen = chooseArtifact({ sets });
  assert.equal(chosen.set.format, "safetensors");
  const paths = chosen.files.map((f) => f.path);
  assert.deepEqual(paths.slice(0, 3), ["model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]);
  for (const companion of ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"])
    assert.ok(paths.includes(companion), companion);
  assert.ok(!paths.includes("pytorch_model.bin"));
  assert.equal(
    chosen.totalBytes,
    chosen.files.reduce((n, f) => n + f.size, 0),
  );
  assert.throws(() => chooseArtifact({ sets, quant: "Q4_K_M", format: "safetensors" }), assertError(BadRequestError, "conflicting_options"));
});

test("the wrong kind of file is refused with the reason", () => {
  const sets = classifyFiles(GGUF_REPO);
  assert.throws(() => chooseArtifact({ sets, file: "mmproj-Llama-3.2-1B-F16.gguf" }), assertError(BadRequestError, "file_is_projector", "projector"));
  assert.throws(() => chooseArtifact({ sets, file: "imatrix_unsloth.gguf" }), assertError(BadRequestError, "file_excluded", "importance matrix"));
  assert.throws(() => chooseArtifact({ sets, quant: "Q8_0", file: "x.gguf" }), assertError(BadRequestError, "conflicting_options"));
});

test("paths with '..', absolute paths and backslashes are refused, naming the value", () => {
  for (const bad of ["../model.gguf", "a/../../b.gguf", "/etc/passwd", "a\\b.gguf", "C:/x.gguf", "a//b.gguf", "./a.gguf", "", "a\u0000b"]) {
    assert.throws(() => sanitizeRepoPath(bad), assertError(BadRequestError, "invalid_path"), JSON.stringify(bad));
    assert.throws(() => classifyFiles([{ path: bad, size: 1 }]), assertError(BadRequestError, "invalid_path"), JSON.stringify(bad));
  }
  assert.throws(
    () => chooseArtifact({ sets: classifyFiles(GGUF_REPO), file: "../Llama-3.2-1B-Instruct-Q8_0.gguf" }),
    assertError(BadRequestError, "invalid_path", "'../Llama-3.2-1B-Instruct-Q8_0.gguf'", ".."),
  );
  assert.equal(sanitizeRepoPath("Q4_K_M/model-Q4_K_M.gguf"), "Q4_K_M/model-Q4_K_M.gguf");
});

test("the registry refuses every path the mirror could not store: segments over 255 bytes, and '.partial' names", () => {
  // Linux's NAME_MAX counts bytes: 126 two-byte characters and ".gguf" are 257 bytes, 125 are 255.
  for (const bad of [`${"d".repeat(256)}/model.gguf`, `Q4/${"é".repeat(126)}.gguf`, "Q4/model.gguf.partial"]) {
    assert.throws(() => sanitizeRepoPath(bad), assertError(BadRequestError, "invalid_path"), bad.slice(0, 20));
    assert.throws(() => validateMirrorFile(bad), assertError(BadRequestError, "invalid_path"), bad.slice(0, 20));
  }
  assert.throws(() => sanitizeRepoPath(`${"d".repeat(256)}/model.gguf`), /segment 1 \('d{200}…'\) is not allowed: it is longer than 255 bytes/);
  for (const good of [`${"d".repeat(255)}/model.gguf`, `Q4/${"é".repeat(125)}.gguf`, "model.partial.gguf"]) {
    assert.equal(sanitizeRepoPath(good), good);
    assert.equal(validateMirrorFile(good), good);
  }
});

test("set descriptions give sizes in binary units", () => {
  const sets = classifyFiles([
    { path: "m-Q4_K_M.gguf", size: 4.6 * 1024 ** 3 },
    { path: "m-Q8_0.gguf", size: 512 * 1024 ** 2 },
  ]);
  assert.deepEqual(sets.gguf.map(describeSet).sort(), ["Q4_K_M (1 file, 4.6 GiB)", "Q8_0 (1 file, 0.5 GiB)"]);
});

test("two sets with the same quantisation ask for a file", () => {
  const sets = classifyFiles(files("7b/m-7b-Q4_K_M.gguf", "13b/m-13b-Q4_K_M.gguf"));
  assert.throws(() => chooseArtifact({ sets }), assertError(BadRequestError, "ambiguous_quant", "7b/m-7b-Q4_K_M.gguf", "13b/m-13b-Q4_K_M.gguf"));
  assert.equal(chooseArtifact({ sets, file: "13b/m-13b-Q4_K_M.gguf" }).set.entry, "13b/m-13b-Q4_K_M.gguf");
});
