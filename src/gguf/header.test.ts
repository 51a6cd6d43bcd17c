import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { createReadStream } from "node:fs";
import { mkdtemp, rm, stat, writeFile, truncate } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import { Agent } from "undici";
import { readGgufHeader } from "./header.ts";
import { llamaMetadata, llamaTensors, str, u32, writeGgufFixture, type LlamaShape } from "../../test/support/gguf-fixture.ts";
import { BadRequestError, NotFoundError, UpstreamError } from "../core/errors.ts";

// A small llama with a large token embedding (Q4_K): ~25 MB of tensor data the check must not read.
const SHAPE: LlamaShape = { layers: 4, embedding: 512, heads: 8, kvHeads: 2, feedForward: 1536, vocab: 65536, weightType: 12 };

let dir: string;
let modelPath: string;
let modelInfo: Awaited<ReturnType<typeof writeGgufFixture>>;

/** Serves files from `dir` with Range support, counting the body bytes it sends. Stands in for the mirror and the Hub. */
function rangeServer(options: { ignoreRange?: boolean; status?: number } = {}) {
  const sent = { bytes: 0, requests: [] as string[] };
  const server: Server = createServer(async (req, res) => {
    if (options.status) {
      res.writeHead(options.status).end("nope");
      return;
    }
    const path = join(dir, decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname));
    let size: number;
    try {
      size = (await stat(path)).size;
    } catch {
      res.writeHead(404).end();
      return;
    }
    const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? "");
    sent.requests.push(req.headers.range ?? "(none)");
    let start = 0;
    let end = size - 1;
    if (range && !options.ignoreRange) {
      start = Number(range[1]);
      end = range[2] ? Math.min(Number(range[2]), size - 1) : size - 1;
      if (start >= size) {
        res.writeHead(416, { "content-range": `bytes */${size}` }).end();
        return;
      }
      res.writeHead(206, { "content-range": `bytes ${start}-${end}/${size}`, "content-length": end - start + 1 });
    } else {
      res.writeHead(200, { "content-length": size });
    }
    const stream = createReadStream(path, { start, end });
    stream.on("data", (chunk) => (sent.bytes += chunk.length));
    stream.pipe(res);
    res.on("close", () => stream.destroy());
  });
  return {
    sent,
    async start(): Promise<string> {
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-gguf-header-"));
  modelPath = join(dir, "model-Q4_K_M.gguf");
  modelInfo = await writeGgufFixture({
    path: modelPath,
    metadata: {
      ...llamaMetadata({ ...SHAPE, contextLength: 8192, fileType: 15, tokens: 2000 }),
      "tokenizer.chat_template": str("{{ messages }}"),
    },
    tensors: llamaTensors(SHAPE),
  });
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

function assertModelSummary(summary: Awaited<ReturnType<typeof readGgufHeader>>) {
  assert.equal(summary.architecture, "llama");
  assert.equal(summary.name, "fixture llama");
  assert.equal(summary.fileType, 15);
  assert.equal(summary.quantisation, "Q4_K_M");
  assert.equal(summary.quantisationFrom, "general.file_type");
  assert.equal(summary.contextLength, 8192);
  assert.equal(summary.embeddingLength, 512);
  assert.equal(summary.blockCount, 4);
  assert.equal(summary.feedForwardLength, 1536);
  assert.equal(summary.headCount, 8);
  assert.equal(summary.headCountKv, 2);
  assert.equal(summary.keyLength, 64);
  assert.equal(summary.valueLength, 64);
  assert.equal(summary.vocabSize, 2000);
  assert.equal(summary.chatTemplate, true);
  assert.equal(summary.split, undefined);
  assert.equal(summary.tensorCount, 3 + 4 * 9);
  const expectedParameters = llamaTensors(SHAPE).reduce((sum, t) => sum + t.dims.reduce((a, b) => a * b, 1), 0);
  assert.equal(summary.parameterCount, expectedParameters);
  assert.equal(summary.tensorBytes, modelInfo.tensorBytes);
  assert.equal(summary.headerBytes, modelInfo.headerBytes);
  assert.equal(summary.fileBytes, modelInfo.fileBytes);
  assert.deepEqual(summary.unknownTensorTypes, []);
  assert.deepEqual(summary.missingKeys, []);
}

describe("readGgufHeader", () => {
  test("reads the header of a file and only its first bytes", async () => {
    const summary = await readGgufHeader({ file: modelPath });
    assertModelSummary(summary);
    assert.equal(summary.source, modelPath);
    assert.ok(modelInfo.fileBytes > 20_000_000, `fixture is ${modelInfo.fileBytes} bytes`);
    assert.equal(summary.bytesRead, 256 * 1024, "one 256 KiB prefix holds this header");
    assert.ok(summary.bytesRead < modelInfo.fileBytes / 50);
  });

  test("reads the header over HTTP ranges and counts the bytes that came over the wire", async () => {
    const server = rangeServer();
    const base = await server.start();
    try {
      const summary = await readGgufHeader({ url: `${base}/model-Q4_K_M.gguf?token=secret`, headers: { authorization: "Bearer t" } });
      assertModelSummary(summary);
      assert.equal(summary.source, `${base}/model-Q4_K_M.gguf`, "the query string is not echoed");
      assert.equal(summary.bytesRead, server.sent.bytes);
      assert.deepEqual(server.sent.requests, [`bytes=0-${256 * 1024 - 1}`]);
    } finally {
      await server.close();
    }
  });

  test("grows the prefix when the header is larger than the first read", async () => {
    const path = join(dir, "big-vocab.gguf");
    const shape = { ...SHAPE, layers: 1 };
    const info = await writeGgufFixture({
      path,
      metadata: llamaMetadata({ ...shape, contextLength: 4096, fileType: 7, tokens: 20_000 }),
      tensors: llamaTensors(shape),
    });
    assert.ok(info.headerBytes > 256 * 1024, `header is ${info.headerBytes} bytes`);
    const server = rangeServer();
    const base = await server.start();
    try {
      const dispatcher = new Agent({ headersTimeout: 10_000, bodyTimeout: 10_000 });
      const summary = await readGgufHeader({ url: `${base}/big-vocab.gguf`, dispatcher }, { initialBytes: 32 * 1024 });
      await dispatcher.close();
      assert.equal(summary.vocabSize, 20_000);
      assert.equal(summary.quantisation, "Q8_0");
      assert.equal(summary.headerBytes, info.headerBytes);
      assert.equal(summary.bytesRead, server.sent.bytes);
      // Doubling from 32 KiB, each request only fetches the bytes not yet held.
      assert.ok(summary.bytesRead < 2 * info.headerBytes, `read ${summary.bytesRead} for a ${info.headerBytes}-byte header`);
      assert.ok(server.sent.requests.length > 1);
    } finally {
      await server.close();
    }
  });

  test("a server that ignores Range is read only as far as needed", async () => {
    const server = rangeServer({ ignoreRange: true });
    const base = await server.start();
    try {
      // Through Node's global fetch this time, as a caller-supplied fetch.
      const summary = await readGgufHeader({ url: `${base}/model-Q4_K_M.gguf`, fetch: globalThis.fetch });
      assertModelSummary(summary);
      assert.ok(summary.bytesRead < 4 * 1024 * 1024, `read ${summary.bytesRead} of ${modelInfo.fileBytes}`);
    } finally {
      await server.close();
    }
  });

  test("reads under 0.1% of a 1 GiB file", async () => {
    const path = join(dir, "one-gib.gguf");
    // A 1.7B-parameter Q4_0 llama: just under 1 GiB of (sparse) tensor data.
    const shape: LlamaShape = { layers: 22, embedding: 2048, heads: 32, kvHeads: 8, feedForward: 5632, vocab: 32000, weightType: 2 };
    const info = await writeGgufFixture({ path, metadata: llamaMetadata({ ...shape, contextLength: 4096, fileType: 2 }), tensors: llamaTensors(shape) });
    assert.ok(info.fileBytes <= 1024 ** 3, `fixture is ${info.fileBytes} bytes`);
    await truncate(path, 1024 ** 3); // pad the (sparse) data region to exactly 1 GiB
    const summary = await readGgufHeader({ file: path });
    assert.equal(summary.quantisation, "Q4_0");
    assert.equal(summary.vocabSize, 32000);
    assert.equal(summary.fileBytes, 1024 ** 3);
    assert.ok(summary.bytesRead / 1024 ** 3 < 0.001, `read ${summary.bytesRead} bytes`);
  });

  test("falls back to the tensor types when general.file_type is absent, and reports split keys", async () => {
    const path = join(dir, "no-ftype-00001-of-00002.gguf");
    const shape: LlamaShape = { ...SHAPE, vocab: 1000, weightType: 14, embeddingType: 8 };
    await writeGgufFixture({
      path,
      metadata: { ...llamaMetadata({ ...shape, contextLength: 2048 }), "split.no": { value: 0, type: 2 }, "split.count": { value: 2, type: 2 } },
      tensors: llamaTensors(shape),
    });
    const summary = await readGgufHeader({ file: path });
    assert.equal(summary.fileType, undefined);
    assert.equal(summary.quantisation, "Q6_K");
    assert.equal(summary.quantisationFrom, "tensor types");
    assert.equal(summary.vocabSize, 1000, "from llama.vocab_size when there is no tokenizer");
    assert.deepEqual(summary.split, { no: 0, count: 2 });
    assert.equal(summary.chatTemplate, false);
  });

  test("KV heads default to the attention heads and head sizes to embedding / heads", async () => {
    const path = join(dir, "mha.gguf");
    const metadata = llamaMetadata({ ...SHAPE, contextLength: 2048, fileType: 1 });
    delete metadata["llama.attention.head_count_kv"];
    metadata["llama.attention.key_length"] = u32(96);
    await writeGgufFixture({ path, metadata, tensors: [] });
    const summary = await readGgufHeader({ file: path });
    assert.equal(summary.headCountKv, 8);
    assert.equal(summary.keyLength, 96);
    assert.equal(summary.valueLength, 64);
    assert.equal(summary.quantisation, "F16");
  });

  test("a file that is not GGUF is a 400 naming the file", async () => {
    const path = join(dir, "index.html.gguf");
    await writeFile(path, "<!DOCTYPE html><html>not a model</html>");
    await assert.rejects(readGgufHeader({ file: path }), (error: unknown) => {
      assert.ok(error instanceof BadRequestError);
      assert.equal(error.code, "not_gguf");
      assert.match(error.message, /index\.html\.gguf is not a GGUF file/);
      assert.match(error.message, /3c 21 44 4f/);
      return true;
    });
    const server = rangeServer();
    const base = await server.start();
    try {
      await assert.rejects(readGgufHeader({ url: `${base}/index.html.gguf` }), (error: unknown) => {
        assert.ok(error instanceof BadRequestError);
        assert.match(error.message, new RegExp(`${base}/index.html.gguf is not a GGUF file`));
        return true;
      });
    } finally {
      await server.close();
    }
  });

  test("a truncated header is a 400", async () => {
    const path = join(dir, "truncated.gguf");
    const info = await writeGgufFixture({ path, metadata: llamaMetadata({ ...SHAPE, contextLength: 2048, fileType: 15 }), tensors: llamaTensors(SHAPE) });
    await truncate(path, info.headerBytes - 200);
    await assert.rejects(readGgufHeader({ file: path }), (error: unknown) => {
      assert.ok(error instanceof BadRequestError);
      assert.match(error.code, /gguf_truncated|gguf_malformed/);
      assert.match(error.message, /truncated\.gguf/);
      return true;
    });
  });

  test("a file cut after its header is refused as truncated, from disk and over HTTP", async () => {
    // The header and tensor infos are intact; only tensor data is missing, as after an
    // interrupted copy. llama.cpp refuses such a file, so the check must too.
    const path = join(dir, "cut-data.gguf");
    const info = await writeGgufFixture({ path, metadata: llamaMetadata({ ...SHAPE, contextLength: 2048, fileType: 15 }), tensors: llamaTensors(SHAPE) });
    const truncatedTo = (bytes: number) => (error: unknown) => {
      assert.ok(error instanceof BadRequestError);
      assert.equal(error.code, "gguf_truncated");
      assert.match(error.message, /cut-data\.gguf is truncated/);
      assert.match(error.message, new RegExp(`has only ${bytes} bytes`));
      assert.match(error.message, /fetch the file again/);
      return true;
    };
    await truncate(path, info.headerBytes + 1000);
    await assert.rejects(readGgufHeader({ file: path }), truncatedTo(info.headerBytes + 1000));
    const server = rangeServer();
    const base = await server.start();
    try {
      await assert.rejects(readGgufHeader({ url: `${base}/cut-data.gguf` }), truncatedTo(info.headerBytes + 1000));
    } finally {
      await server.close();
    }

    // Every tensor of this shape is a multiple of 32 bytes, so the data ends with the file:
    // one byte less is already too short.
    await truncate(path, info.fileBytes - 1);
    await assert.rejects(readGgufHeader({ file: path }), truncatedTo(info.fileBytes - 1));
    await truncate(path, info.fileBytes);
    assert.equal((await readGgufHeader({ file: path })).fileBytes, info.fileBytes);
  });

  test("a tensor offset that is not where ggml expects it is refused as malformed", async () => {
    const path = join(dir, "bad-offset.gguf");
    const tensors = llamaTensors(SHAPE);
    tensors[1] = { ...tensors[1]!, offset: 7 };
    await writeGgufFixture({ path, metadata: llamaMetadata({ ...SHAPE, contextLength: 2048, fileType: 15 }), tensors });
    await assert.rejects(readGgufHeader({ file: path }), (error: unknown) => {
      assert.ok(error instanceof BadRequestError);
      assert.equal(error.code, "gguf_malformed");
      assert.match(error.message, /tensor 'output_norm\.weight' starts at byte 7 of the data section, where ggml expects byte \d+/);
      return true;
    });
  });

  test("HTTP failures are upstream errors; retryable only when retrying may help", async () => {
    const missing = rangeServer();
    const base = await missing.start();
    try {
      await assert.rejects(readGgufHeader({ url: `${base}/nope.gguf` }), (error: unknown) => {
        assert.ok(error instanceof UpstreamError);
        assert.equal(error.status, 502);
        assert.equal(error.retryable, false);
        assert.match(error.message, /HTTP 404/);
        return true;
      });
    } finally {
      await missing.close();
    }
    const busy = rangeServer({ status: 503 });
    const busyBase = await busy.start();
    try {
      await assert.rejects(readGgufHeader({ url: `${busyBase}/model.gguf` }), (error: unknown) => error instanceof UpstreamError && error.retryable);
    } finally {
      await busy.close();
    }
    // Nothing listens on this port once the server is closed: a connection error.
    await assert.rejects(readGgufHeader({ url: `${busyBase}/model.gguf` }), (error: unknown) => error instanceof UpstreamError && error.retryable);
  });

  test("a missing file is a 404", async () => {
    await assert.rejects(readGgufHeader({ file: join(dir, "absent.gguf") }), NotFoundError);
  });
});
