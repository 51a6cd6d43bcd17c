// Benchmark of the GGUF header check: bytes it reads against the file size, from a file
// and over HTTP ranges on loopback (standing in for the mirror), for headers of a few
// shapes in files of 1 GiB or more. The data region is a hole, so the files take no disk.
// Criterion (issue "Weights supply chain"): the check reads under 0.1% of a 1 GiB file.
//   npx tsx bench/gguf-header/run.ts
import { createServer } from "node:http";
import { createReadStream } from "node:fs";
import { mkdtemp, rm, stat, truncate } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AddressInfo } from "node:net";
import { readGgufHeader } from "../../src/gguf/header.ts";
import { llamaMetadata, llamaTensors, writeGgufFixture, type LlamaShape } from "../../test/support/gguf-fixture.ts";

const GiB = 1024 ** 3;
const LLAMA_8B: LlamaShape = { layers: 32, embedding: 4096, heads: 32, kvHeads: 8, feedForward: 14336, vocab: 32000, weightType: 12 };

const cases: Array<{ name: string; tokens?: number; vocab: number }> = [
  { name: "8B tensors, no tokenizer", vocab: 32000 },
  { name: "8B, 32k SPM tokenizer (Llama 2 style)", tokens: 32000, vocab: 32000 },
  { name: "8B, 128k tokenizer without merges", tokens: 128256, vocab: 128256 },
];

const dir = await mkdtemp(join(tmpdir(), "llmgw-bench-gguf-"));
let sent = 0;
const server = createServer(async (req, res) => {
  const path = join(dir, decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname));
  const size = (await stat(path)).size;
  const match = /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "");
  const start = Number(match?.[1] ?? 0);
  const end = Math.min(Number(match?.[2] ?? size - 1), size - 1);
  res.writeHead(206, { "content-range": `bytes ${start}-${end}/${size}`, "content-length": end - start + 1 });
  const stream = createReadStream(path, { start, end });
  stream.on("data", (chunk) => (sent += chunk.length));
  stream.pipe(res);
});
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;

let failed = false;
try {
  console.log("case | header bytes | file bytes | read (file) | read (HTTP) | share of file | HTTP ms");
  for (const [i, c] of cases.entries()) {
    const name = `case-${i}.gguf`;
    const path = join(dir, name);
    const shape = { ...LLAMA_8B, vocab: c.vocab };
    const info = await writeGgufFixture({
      path,
      metadata: llamaMetadata({ ...shape, contextLength: 8192, fileType: 15, ...(c.tokens === undefined ? {} : { tokens: c.tokens }) }),
      tensors: llamaTensors(shape),
    });
    // Pad a smaller (sparse) data region to 1 GiB; a larger one stays whole, since the
    // header check refuses a file whose tensor data was cut short. The share is still of
    // 1 GiB, which overstates it for the larger files.
    if (info.fileBytes < GiB) await truncate(path, GiB);
    const fromFile = await readGgufHeader({ file: path });
    sent = 0;
    const started = performance.now();
    const overHttp = await readGgufHeader({ url: `${base}/${name}` });
    const ms = performance.now() - started;
    if (overHttp.bytesRead !== sent) throw new Error(`bytesRead ${overHttp.bytesRead} but the server sent ${sent}`);
    const share = overHttp.bytesRead / GiB;
    const verdict = share < 0.001 ? "" : " (over 0.1%)";
    if (i === 0 && share >= 0.001) failed = true;
    console.log(
      `${c.name} | ${info.headerBytes} | ${Math.max(GiB, info.fileBytes)} | ${fromFile.bytesRead} | ${overHttp.bytesRead} | ${(share * 100).toFixed(4)}%${verdict} | ${ms.toFixed(0)}`,
    );
  }
  console.log(failed ? "FAIL: the header check read 0.1% or more of a 1 GiB file" : "PASS: the header check reads under 0.1% of a 1 GiB file (case 1)");
} finally {
  server.close();
  await rm(dir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
