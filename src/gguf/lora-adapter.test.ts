import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createReadStream } from "node:fs";
import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GGUFValueType } from "@huggingface/gguf";
import { LlmgwError } from "../core/errors.ts";
import { readGgufHeader } from "./header.ts";
import { checkAdapterFitsModel, describeLoraAdapter, readLoraAdapter, type GgufHeaderView, type LoraAdapterInfo } from "./lora-adapter.ts";
import { writeTinyLlamaGguf } from "./tiny-model.ts";
import { writeTinyLora } from "./tiny-lora.ts";

let dir: string;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-lora-adapter-"));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Asserts an LlmgwError with this code whose message matches every pattern. */
function refusedWith(code: string, ...patterns: RegExp[]) {
  return (error: unknown) => {
    assert.ok(error instanceof LlmgwError, `an LlmgwError, got ${String(error)}`);
    assert.equal(error.code, code, error.message);
    for (const pattern of patterns) assert.match(error.message, pattern);
    return true;
  };
}

test("a generated adapter is described from its header: architecture, embedding size, rank, alpha, layers", async () => {
  const model = await writeTinyLlamaGguf({ path: join(dir, "model.gguf"), layers: 3 });
  const path = join(dir, "adapter.gguf");
  await writeTinyLora({ path, layers: 3, vocabSize: model.vocabSize, rank: 8, alpha: 16, targets: ["attn_q", "attn_v", "output"], name: "pirate" });
  const adapter = await readLoraAdapter({ file: path });
  assert.deepEqual(adapter, {
    source: path,
    architecture: "llama",
    name: "pirate",
    embeddingLength: 64,
    embeddingFrom: "blk.0.attn_q.weight",
    rank: 8,
    alpha: 16,
    adapted: [
      "blk.0.attn_q.weight",
      "blk.0.attn_v.weight",
      "blk.1.attn_q.weight",
      "blk.1.attn_v.weight",
      "blk.2.attn_q.weight",
      "blk.2.attn_v.weight",
      "output.weight",
    ],
    layers: 3,
  } satisfies LoraAdapterInfo);
  assert.equal(checkAdapterFitsModel(adapter, await readGgufHeader({ file: model.path })), null, "it fits the model it was made for");
});

test("the embedding size comes from the output side of matrices that write the residual stream", async () => {
  // ffn_down reads the feed-forward width (96 here) and writes n_embd; attn_output writes n_embd.
  const path = join(dir, "down.gguf");
  await writeTinyLora({ path, embeddingLength: 48, heads: 4, feedForwardLength: 96, layers: 1, targets: ["ffn_down", "attn_output"] });
  const adapter = await readLoraAdapter({ file: path });
  assert.equal(adapter.embeddingLength, 48);
  assert.equal(adapter.embeddingFrom, "blk.0.ffn_down.weight");
  assert.equal(adapter.alpha, 8, "alpha defaults to 2 × rank");
  assert.equal(adapter.rank, 4);
});

test("an adapter for another architecture, embedding size or depth is named with both values", async () => {
  const model = await readGgufHeader({ file: (await writeTinyLlamaGguf({ path: join(dir, "base.gguf") })).path });
  const describe = async (file: string, options: Parameters<typeof writeTinyLora>[0] extends infer O ? Omit<O, "path"> : never) => {
    await writeTinyLora({ path: join(dir, file), ...options });
    return readLoraAdapter({ file: join(dir, file) });
  };

  const qwen = await describe("qwen.gguf", { architecture: "qwen2" });
  assert.equal(
    checkAdapterFitsModel(qwen, model),
    `Adapter ${join(dir, "qwen.gguf")} does not fit model ${model.source}: it is for architecture qwen2, the model is llama.`,
  );
  const wide = await describe("wide.gguf", { embeddingLength: 128 });
  assert.equal(
    checkAdapterFitsModel(wide, { architecture: "llama", embeddingLength: 64, blockCount: 2 }),
    `Adapter ${join(dir, "wide.gguf")} does not fit the model: it was made for embedding size 128 (from blk.0.attn_q.weight), the model's is 64.`,
  );
  const deep = await describe("deep.gguf", { layers: 4 });
  assert.match(checkAdapterFitsModel(deep, model) ?? "", /it adapts layer 3 \(blk\.3\), the model has 2 layers\.$/);

  const everything = await describe("everything.gguf", { architecture: "qwen2", embeddingLength: 128, layers: 3 });
  assert.match(
    checkAdapterFitsModel(everything, model) ?? "",
    /: it is for architecture qwen2, the model is llama; it was made for embedding size 128 .*, the model's is 64; it adapts layer 2 \(blk\.2\), the model has 2 layers\.$/,
  );
});

test("a file that is not a GGUF, a model and a non-LoRA adapter are refused with clear sentences", async () => {
  const text = join(dir, "notes.txt");
  await writeFile(text, "these are not weights\n");
  await assert.rejects(readLoraAdapter({ file: text }), refusedWith("not_gguf", /notes\.txt is not a GGUF file/));
  await assert.rejects(readLoraAdapter({ file: join(dir, "missing.gguf") }), refusedWith("not_found", /does not exist/));

  const model = await writeTinyLlamaGguf({ path: join(dir, "a-model.gguf") });
  await assert.rejects(
    readLoraAdapter({ file: model.path }),
    refusedWith(
      "not_lora_adapter",
      /a-model\.gguf is not a LoRA adapter: its general\.type is missing, where an adapter's is "adapter"\. It looks like a llama model with 21 tensors\./,
    ),
  );

  const ia3 = join(dir, "ia3.gguf");
  await writeTinyLora({ path: ia3, extraMetadata: { "adapter.type": { value: "ia3", type: GGUFValueType.STRING } } });
  await assert.rejects(readLoraAdapter({ file: ia3 }), refusedWith("not_lora_adapter", /is an adapter of type "ia3", not a LoRA adapter/));

  // llama.cpp asserts FLOAT32 and would stop the engine; refused at add instead.
  const doubleAlpha = join(dir, "double-alpha.gguf");
  await writeTinyLora({ path: doubleAlpha, extraMetadata: { "adapter.lora.alpha": { value: 16, type: GGUFValueType.FLOAT64 } } });
  await assert.rejects(
    readLoraAdapter({ file: doubleAlpha }),
    refusedWith("invalid_lora_adapter", /adapter\.lora\.alpha is a FLOAT64, where llama\.cpp reads a FLOAT32/),
  );

  const numericType = join(dir, "numeric-type.gguf");
  await writeTinyLora({ path: numericType, extraMetadata: { "general.type": { value: 1, type: GGUFValueType.UINT32 } } });
  await assert.rejects(
    readLoraAdapter({ file: numericType }),
    refusedWith("invalid_lora_adapter", /general\.type is a UINT32, where llama\.cpp reads a STRING/),
  );
});

test("tensor sets llama.cpp refuses are refused from the header", () => {
  const view = (tensors: [string, number[]][]): GgufHeaderView => ({
    source: "x.gguf",
    typedMetadata: {
      "general.architecture": { value: "llama", type: GGUFValueType.STRING },
      "general.type": { value: "adapter", type: GGUFValueType.STRING },
      "adapter.type": { value: "lora", type: GGUFValueType.STRING },
    },
    tensorInfos: tensors.map(([name, shape]) => ({ name, shape: shape.map(BigInt) })),
  });
  assert.throws(
    () => describeLoraAdapter(view([["blk.0.attn_q.weight.lora_a", [64, 4]]])),
    refusedWith("invalid_lora_adapter", /'blk\.0\.attn_q\.weight' lacks its lora_b half/),
  );
  assert.throws(() => describeLoraAdapter(view([["blk.0.attn_q.weight", [64, 64]]])), refusedWith("invalid_lora_adapter", /neither a lora_a nor a lora_b/));
  assert.throws(() => describeLoraAdapter(view([])), refusedWith("invalid_lora_adapter", /holds no lora_a\/lora_b tensors/));
  assert.throws(
    () =>
      describeLoraAdapter(
        view([
          ["blk.0.attn_q.weight.lora_a", [64, 4]],
          ["blk.0.attn_q.weight.lora_b", [8, 64]],
        ]),
      ),
    refusedWith("invalid_lora_adapter", /'blk\.0\.attn_q\.weight' has lora_a of rank 4 but lora_b of rank 8/),
  );

  // Norm vectors are skipped as llama.cpp skips them; token_embd's pair is flipped; no alpha is allowed.
  const described = describeLoraAdapter(
    view([
      ["blk.0.attn_norm.weight", [64]],
      ["token_embd.weight.lora_a", [8, 600]],
      ["token_embd.weight.lora_b", [8, 64]],
    ]),
  );
  assert.equal(described.embeddingLength, 64);
  assert.equal(described.rank, 8);
  assert.equal(described.alpha, undefined);
  assert.equal(described.layers, 0);
});

test("an adapter is read the same way from a URL with range requests", async () => {
  const path = join(dir, "served.gguf");
  await writeTinyLora({ path, rank: 2, alpha: 4 });
  const size = (await stat(path)).size;
  const ranges: string[] = [];
  const authorizations: (string | undefined)[] = [];
  // A plain static file server with Range support, as the mirror serves files.
  const server: Server = createServer((req, res) => {
    authorizations.push(req.headers.authorization);
    const range = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "");
    if (!range) {
      res.writeHead(200, { "content-length": size });
      createReadStream(path).pipe(res);
      return;
    }
    ranges.push(req.headers.range ?? "");
    const start = Number(range[1]);
    const end = Math.min(Number(range[2]), size - 1);
    res.writeHead(206, { "content-range": `bytes ${start}-${end}/${size}`, "content-length": end - start + 1 });
    createReadStream(path, { start, end }).pipe(res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/adapters/served.gguf?token=secret`;
    const fromUrl = await readLoraAdapter({ url });
    const fromFile = await readLoraAdapter({ file: path });
    assert.deepEqual({ ...fromUrl, source: "" }, { ...fromFile, source: "" });
    assert.equal(fromUrl.source, url.replace("?token=secret", ""), "the source is named without its query string");
    assert.equal(fromUrl.rank, 2);
    assert.deepEqual(ranges, ["bytes=0-262143"], "one range request: the header is fetched once, its first 256 KiB holding this adapter whole");
    const viaFetch = await readLoraAdapter({ url, headers: { authorization: "Bearer node" }, fetch: (target, init) => fetch(target, init) });
    assert.deepEqual(viaFetch, fromUrl, "a caller's fetch is used the same way");
    assert.equal(authorizations.at(-1), "Bearer node", "the caller's headers reach the server");
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
});
