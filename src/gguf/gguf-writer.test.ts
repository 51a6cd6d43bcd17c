import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gguf } from "@huggingface/gguf";
import { GGUFValueType, createPrng, writeGguf } from "./gguf-writer.ts";
import { readGgufHeader } from "./header.ts";

let dir: string;

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-gguf-writer-"));
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

test("tensors land padded to 32 bytes at the offsets their infos give, with the values given or filled in order", async () => {
  const path = join(dir, "mixed.gguf");
  const random = createPrng(9);
  const order: string[] = [];
  // 3 and 5 values are 12 and 20 bytes: each needs padding before the next tensor.
  const written = await writeGguf({
    path,
    metadata: {
      "general.architecture": { value: "test", type: GGUFValueType.STRING },
      "test.list": { value: [1, 2], type: GGUFValueType.ARRAY, subType: GGUFValueType.INT32 },
    },
    tensors: [
      { name: "given", dims: [3], data: new Float32Array([1.5, -2, 3]) },
      {
        name: "filled",
        dims: [5, 1],
        data: (values) => {
          order.push("filled");
          values.set([random(), random()]);
        },
      },
      { name: "after", dims: [2], data: () => order.push("after") },
    ],
  });
  assert.deepEqual(order, ["filled", "after"]);
  assert.equal(written.parameterCount, 10);

  const parsed = await gguf(path, { allowLocalFile: true, typedMetadata: true });
  assert.equal(parsed.typedMetadata.version.value, 3);
  assert.deepEqual(parsed.typedMetadata["test.list"], { value: [1, 2], type: GGUFValueType.ARRAY, subType: GGUFValueType.INT32 });
  assert.deepEqual(
    parsed.tensorInfos.map((t) => [t.name, t.shape.map(Number), Number(t.offset), t.dtype]),
    [
      ["given", [3], 0, 0],
      ["filled", [5, 1], 32, 0],
      ["after", [2], 64, 0],
    ],
  );
  assert.equal(Number(parsed.tensorDataOffset % 32n), 0);
  const bytes = await readFile(path);
  assert.equal(bytes.length, written.bytes);
  assert.equal(written.bytes, Number(parsed.tensorDataOffset) + 96, "the last tensor is padded too");
  const at = (offset: number, count: number) => [...new Float32Array(bytes.buffer.slice(bytes.byteOffset + offset, bytes.byteOffset + offset + count * 4))];
  const data = Number(parsed.tensorDataOffset);
  assert.deepEqual(at(data, 3), [1.5, -2, 3]);
  const expected = createPrng(9);
  assert.deepEqual(at(data + 32, 5), [Math.fround(expected()), Math.fround(expected()), 0, 0, 0], "the fill function starts from zeros");
  // The project's own header check (offsets, alignment, data inside the file) accepts the layout.
  assert.equal((await readGgufHeader({ file: path })).tensorCount, 3);
});

test("a tensor whose values do not match its dims is refused, naming both", async () => {
  await assert.rejects(
    writeGguf({ path: join(dir, "bad.gguf"), metadata: {}, tensors: [{ name: "w", dims: [2, 3], data: new Float32Array(5) }], caller: "writeTest" }),
    /^RangeError: writeTest: tensor w has 5 values, where its dims \[2, 3\] hold 6\.$/,
  );
  await assert.rejects(stat(join(dir, "bad.gguf")), { code: "ENOENT" }, "refused before the file is created");
});
