// The weights check on real files: tiny GGUF models that the bundled llama.cpp loads
// (src/gguf/tiny-model.ts), cut short, linked, replaced; and a mirror folder read through
// a small real MirrorLocator (a file is complete once it has its final name).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { chmod, mkdir, mkdtemp, rm, stat, symlink, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { BadRequestError } from "../core/errors.ts";
import { GGUFValueType, writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { checkProjector, checkWeightsFile, DiskWeightsChecker, locateWeights, type MirrorLocator } from "./weights-check.ts";
import { writeTinyProjector } from "../gguf/tiny-projector.ts";
import { modelDefinitionSchema, newModelSchema } from "./model-schema.ts";
import { folderMirror } from "../../test/support/folder-mirror.ts";

let dir: string;

function refusal(code: string, param: string, ...mentions: RegExp[]) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof BadRequestError, `expected a 400, got ${String(error)}`);
    assert.equal(error.code, code, error.message);
    assert.equal(error.param, param);
    for (const mention of mentions) assert.match(error.message, mention);
    assert.doesNotMatch(error.message, /\.\./, "no double full stop");
    return true;
  };
}

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "llmgw-weights-check-"));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("checkWeightsFile", () => {
  test("accepts a tiny GGUF that llama.cpp loads and returns its header", async () => {
    const file = path.join(dir, "ok.gguf");
    await writeTinyLlamaGguf({ path: file, seed: 1 });
    const checked = await checkWeightsFile({ file, modelName: "ok" });
    assert.equal(checked.path, file);
    assert.equal(checked.header?.architecture, "llama");
  });

  test("a file accepted earlier that was later cut short or removed fails the same check the agent runs before each start", async () => {
    const file = path.join(dir, "later-broken.gguf");
    const info = await writeTinyLlamaGguf({ path: file, seed: 2 });
    await checkWeightsFile({ file, modelName: "m" });

    // An interrupted copy over the good file: the header is intact, the tensor data is not.
    await truncate(file, Math.floor(info.bytes / 2));
    await assert.rejects(
      checkWeightsFile({ file, modelName: "m" }),
      refusal("gguf_truncated", "source.path", /model 'm'/, /later-broken\.gguf is truncated/, /copy or fetch the file again/),
    );

    await rm(file);
    await assert.rejects(
      checkWeightsFile({ file, modelName: "m", param: "source.file" }),
      refusal("weights_missing", "source.file", /later-broken\.gguf does not exist/, /change the model's source\.file/),
    );
  });

  test("a symbolic link is refused, naming the real path to give instead", async () => {
    const real = path.join(dir, "real.gguf");
    await writeTinyLlamaGguf({ path: real, seed: 3 });
    const link = path.join(dir, "link.gguf");
    await symlink(real, link);
    await assert.rejects(
      checkWeightsFile({ file: link, modelName: "m" }),
      refusal("weights_symlink", "source.path", /symbolic link/, new RegExp(`give the file's real path \\(${real}\\)`)),
    );
    const dangling = path.join(dir, "dangling.gguf");
    await symlink(path.join(dir, "nowhere.gguf"), dangling);
    await assert.rejects(checkWeightsFile({ file: dangling, modelName: "m" }), refusal("weights_symlink", "source.path", /dangling link/));
  });

  test("folders, files that are not GGUF and architectures llama.cpp cannot load are refused", async () => {
    await assert.rejects(checkWeightsFile({ file: dir, modelName: "m" }), refusal("weights_not_file", "source.path", /a folder/, /the \.gguf file/));

    const html = path.join(dir, "page.gguf");
    await writeFile(html, "<!DOCTYPE html><html>a download page</html>");
    await assert.rejects(checkWeightsFile({ file: html, modelName: "m" }), refusal("not_gguf", "source.path", /page\.gguf is not a GGUF file/));
    // Without a llama.cpp profile the file is not read as a GGUF.
    assert.equal((await checkWeightsFile({ file: html, modelName: "m", llamaCpp: false })).header, undefined);

    const gptj = path.join(dir, "gptj.gguf");
    await writeTinyLlamaGguf({ path: gptj, seed: 4, extraMetadata: { "general.architecture": { value: "gptj", type: GGUFValueType.STRING } } });
    await assert.rejects(
      checkWeightsFile({ file: gptj, modelName: "m" }),
      refusal("architecture_unsupported", "source.path", /a 'gptj' model/, /no implementation for it/),
    );
  });

  test("a split GGUF is named by its first part, and every other part must be there", async () => {
    const split = (no: number) => ({ "split.no": { value: no, type: GGUFValueType.UINT16 }, "split.count": { value: 2, type: GGUFValueType.UINT16 } });
    const first = path.join(dir, "big-00001-of-00002.gguf");
    const second = path.join(dir, "big-00002-of-00002.gguf");
    await writeTinyLlamaGguf({ path: first, seed: 8, extraMetadata: split(0) });
    await assert.rejects(
      checkWeightsFile({ file: first, modelName: "m" }),
      refusal("weights_missing", "source.path", /big-00002-of-00002\.gguf does not exist/),
    );
    await writeTinyLlamaGguf({ path: second, seed: 9, extraMetadata: split(1) });
    assert.deepEqual((await checkWeightsFile({ file: first, modelName: "m" })).header?.split, { no: 0, count: 2 });
    await assert.rejects(
      checkWeightsFile({ file: second, modelName: "m" }),
      refusal("weights_not_first_part", "source.path", /part 2 of a 2-part split GGUF/, /ending in -00001-of-00002\.gguf/),
    );
    const renamed = path.join(dir, "big-renamed.gguf");
    await writeTinyLlamaGguf({ path: renamed, seed: 10, extraMetadata: split(0) });
    await assert.rejects(checkWeightsFile({ file: renamed, modelName: "m" }), refusal("weights_split_name", "source.path", /cannot find the other parts/));
  });

  test("a file the server's user cannot read is refused with what to change", async () => {
    const file = path.join(dir, "secret.gguf");
    await writeTinyLlamaGguf({ path: file, seed: 5 });
    await chmod(file, 0o000);
    const refusedWith = process.getuid?.() === 0 ? checkWithoutRootsOverride(file) : await checkHere(file);
    assert.equal(refusedWith.code, "weights_unreadable", JSON.stringify(refusedWith));
    assert.equal(refusedWith.param, "source.path");
    assert.match(refusedWith.message, /not readable/);
    assert.match(refusedWith.message, /chmod/);
  });
});

interface Refusal {
  code?: string;
  param?: string | null;
  message: string;
}

/** How the check refuses `file` in this process. */
async function checkHere(file: string): Promise<Refusal> {
  try {
    await checkWeightsFile({ file, modelName: "m" });
    return { message: "accepted" };
  } catch (error) {
    return error instanceof BadRequestError ? { code: error.code, param: error.param, message: error.message } : { message: String(error) };
  }
}

/**
 * How the check refuses `file` when run by root without the capabilities that let root
 * ignore file modes (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): a child process started
 * through util-linux's setpriv, as a server started by root in a hardened unit would run.
 */
function checkWithoutRootsOverride(file: string): Refusal {
  const module = new URL("./weights-check.ts", import.meta.url).href;
  const script =
    `const { checkWeightsFile } = await import(${JSON.stringify(module)});` +
    `try { await checkWeightsFile({ file: ${JSON.stringify(file)}, modelName: "m" }); console.log(JSON.stringify({ message: "accepted" })); }` +
    `catch (e) { console.log(JSON.stringify({ code: e.code, param: e.param, message: e.message })); }`;
  const child = spawnSync(
    "setpriv",
    ["--bounding-set", "-dac_override,-dac_read_search", "--", process.execPath, "--import", "tsx", "--input-type=module", "-e", script],
    { encoding: "utf8", cwd: fileURLToPath(new URL("../..", import.meta.url)), timeout: 60_000 },
  );
  const line = (child.stdout ?? "").trim().split("\n").at(-1) ?? "";
  try {
    return JSON.parse(line) as Refusal;
  } catch {
    return {
      message: `the check could not run without root's override (status ${child.status}, ${child.error?.message ?? "no spawn error"}): ${child.stderr}`,
    };
  }
}

describe("locateWeights", () => {
  test("a mirror source is the complete file inside the mirror, and nothing else", async () => {
    const root = path.join(dir, "mirror");
    const mirror = folderMirror(root);
    const source = { kind: "mirror" as const, model: "owner--tiny", version: "0123456789ab", file: "tiny-Q4_K_M.gguf" };
    await assert.rejects(
      locateWeights({ source, modelName: "m", mirror }),
      refusal(
        "weights_not_mirrored",
        "source",
        /cannot be used from the mirror \(owner--tiny\/0123456789ab\/tiny-Q4_K_M\.gguf\): the mirror has no complete file/,
        /llmgw ctl mirror fetch/,
      ),
    );
    await assert.rejects(locateWeights({ source, modelName: "m" }), refusal("weights_not_mirrored", "source", /this server has no mirror/));

    await mkdir(path.join(root, "owner--tiny", "0123456789ab"), { recursive: true });
    await writeTinyLlamaGguf({ path: path.join(root, "owner--tiny", "0123456789ab", "tiny-Q4_K_M.gguf"), seed: 6 });
    const located = await locateWeights({ source, modelName: "m", mirror });
    assert.deepEqual(
      { file: located.file, param: located.param },
      { file: path.join(root, "owner--tiny", "0123456789ab", "tiny-Q4_K_M.gguf"), param: "source.file" },
    );
    assert.ok((await stat(located.file)).isFile());

    // A version folder that is a link to elsewhere leads outside the mirror.
    const outside = path.join(dir, "outside");
    await mkdir(outside);
    await writeTinyLlamaGguf({ path: path.join(outside, "tiny-Q4_K_M.gguf"), seed: 7 });
    await symlink(outside, path.join(root, "owner--tiny", "linked"));
    await assert.rejects(
      locateWeights({ source: { ...source, version: "linked" }, modelName: "m", mirror }),
      refusal("weights_outside_mirror", "source", /outside the mirror/, /llmgw ctl mirror rm/),
    );
  });

  test("a split GGUF in the mirror needs the mirror's word on every part, not only a file on disk", async () => {
    const root = path.join(dir, "mirror-split");
    const version = path.join(root, "owner--big", "0123456789ab");
    await mkdir(version, { recursive: true });
    const split = (no: number) => ({ "split.no": { value: no, type: GGUFValueType.UINT16 }, "split.count": { value: 2, type: GGUFValueType.UINT16 } });
    await writeTinyLlamaGguf({ path: path.join(version, "big-00001-of-00002.gguf"), seed: 11, extraMetadata: split(0) });
    await writeTinyLlamaGguf({ path: path.join(version, "big-00002-of-00002.gguf"), seed: 12, extraMetadata: split(1) });
    // The second part is on disk under its final name, but failed its verification.
    const refused = new Set(["big-00002-of-00002.gguf"]);
    const onDisk = folderMirror(root);
    const mirror: MirrorLocator = {
      root,
      check: async (model, ver, file) =>
        refused.has(file)
          ? { kind: "refused", error: new Error("its bytes no longer match their sha256 (failed verification)") }
          : onDisk.check(model, ver, file),
    };
    const source = { kind: "mirror" as const, model: "owner--big", version: "0123456789ab", file: "big-00001-of-00002.gguf" };
    const located = await locateWeights({ source, modelName: "m", mirror });
    await assert.rejects(
      checkWeightsFile({ ...located, modelName: "m" }),
      refusal("weights_not_mirrored", "source", /owner--big\/0123456789ab\/big-00002-of-00002\.gguf\): its bytes no longer match/, /llmgw ctl mirror verify/),
    );
    refused.clear();
    assert.deepEqual((await checkWeightsFile({ ...located, modelName: "m" })).header?.split, { no: 0, count: 2 });
  });

  test("a file source is its absolute path", async () => {
    assert.deepEqual(await locateWeights({ source: { kind: "file", path: "/srv/models/x.gguf" }, modelName: "m" }), {
      file: "/srv/models/x.gguf",
      param: "source.path",
    });
  });
});

describe("a vision projector (source.projector)", () => {
  test("a clip GGUF passes; a model GGUF, a missing file and a link are refused naming source.projector", async () => {
    const weights = path.join(dir, "eye.gguf");
    await writeTinyLlamaGguf({ path: weights, seed: 3 });
    const projector = path.join(dir, "mmproj-eye.gguf");
    await writeTinyProjector({ path: projector, textEmbeddingLength: 64 });
    const source = (projectorPath: string) => ({ kind: "file" as const, path: weights, projector: projectorPath });
    assert.equal(await checkProjector({ source: source(projector), modelName: "eye" }), projector);
    await assert.rejects(
      checkProjector({ source: source(weights), modelName: "eye" }),
      refusal("projector_invalid", "source.projector", /a 'llama' GGUF; a projector is a 'clip' GGUF/),
    );
    await assert.rejects(checkProjector({ source: source(path.join(dir, "nope.gguf")), modelName: "eye" }), refusal("weights_missing", "source.projector"));
    const link = path.join(dir, "mmproj-link.gguf");
    await symlink(projector, link);
    await assert.rejects(checkProjector({ source: source(link), modelName: "eye" }), refusal("weights_symlink", "source.projector"));
    // At the door: the catalog's checker runs it with the weights.
    const definition = modelDefinitionSchema.parse({
      capabilities: { vision: true, embeddings: false },
      source: source(weights),
      profiles: [{ name: "cpu", engine: "llamacpp" }],
    });
    await assert.rejects(new DiskWeightsChecker().check({ name: "eye", definition }), refusal("projector_invalid", "source.projector"));
  });

  test("the definition says what a projector needs: vision on, and a llamacpp profile", () => {
    const parse = (extra: object) =>
      newModelSchema.safeParse({
        name: "eye",
        source: { kind: "file", path: "/m.gguf", projector: "/mmproj.gguf" },
        profiles: [{ name: "cpu", engine: "llamacpp" }],
        ...extra,
      });
    const withoutVision = parse({});
    assert.equal(withoutVision.success, false);
    assert.match(JSON.stringify(withoutVision.error?.issues), /capabilities.*must be true for a model with a vision projector/);
    assert.equal(parse({ capabilities: { vision: true, embeddings: false } }).success, true);
    const onVllm = parse({
      capabilities: { vision: true, embeddings: false },
      profiles: [{ name: "gpu", engine: "vllm", hardware: { gpu: { class: "H100" } } }],
    });
    assert.match(JSON.stringify(onVllm.error?.issues), /a vision projector goes with GGUF weights on llamacpp profiles/);
    const relative = parse({ capabilities: { vision: true, embeddings: false }, source: { kind: "file", path: "/m.gguf", projector: "mmproj.gguf" } });
    assert.match(JSON.stringify(relative.error?.issues), /source.*projector.*must be an absolute path/);
    const climbing = parse({
      capabilities: { vision: true, embeddings: false },
      source: { kind: "mirror", model: "m", version: "v", file: "m.gguf", projector: "../other/mmproj.gguf" },
    });
    assert.equal(climbing.success, false, "a mirrored projector stays inside its version");
  });
});
