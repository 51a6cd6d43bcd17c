import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inflateSync } from "node:zlib";
import { BLACK, WHITE, encodeTinyPng, noisePixels, pngDataUrl, writeTinyPng } from "./tiny-png.ts";

interface Chunk {
  type: string;
  data: Buffer;
  crc: number;
}

// CRC-32 bit by bit, independent of the table-driven one under test.
function bitwiseCrc32(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) {
    crc ^= byte;
    for (let bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

/** Splits a PNG into chunks, checking the signature, the lengths and every CRC on the way. */
function readChunks(png: Buffer): Chunk[] {
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], "PNG signature");
  const chunks: Chunk[] = [];
  let at = 8;
  while (at < png.length) {
    const length = png.readUInt32BE(at);
    const type = png.toString("latin1", at + 4, at + 8);
    const data = png.subarray(at + 8, at + 8 + length);
    const crc = png.readUInt32BE(at + 8 + length);
    assert.equal(crc, bitwiseCrc32(png.subarray(at + 4, at + 8 + length)), `CRC of ${type}`);
    chunks.push({ type, data, crc });
    at += 12 + length;
  }
  assert.equal(at, png.length, "the chunks end exactly at the end of the file");
  return chunks;
}

/** The unfiltered scanlines of an 8-bit RGB PNG, as [r, g, b] per pixel. */
function decode(png: Buffer): { width: number; height: number; pixels: number[][] } {
  const chunks = readChunks(png);
  assert.deepEqual(
    chunks.map((chunk) => chunk.type),
    ["IHDR", "IDAT", "IEND"],
  );
  const ihdr = chunks[0]!.data;
  const width = ihdr.readUInt32BE(0);
  const height = ihdr.readUInt32BE(4);
  assert.deepEqual([...ihdr.subarray(8)], [8, 2, 0, 0, 0], "8-bit truecolour, deflate, no filter method extras, no interlace");
  const raw = inflateSync(chunks[1]!.data);
  assert.equal(raw.length, height * (1 + 3 * width));
  const pixels: number[][] = [];
  for (let y = 0; y < height; y++) {
    const row = y * (1 + 3 * width);
    assert.equal(raw[row], 0, `row ${y} uses filter type None`);
    for (let x = 0; x < width; x++) pixels.push([...raw.subarray(row + 1 + 3 * x, row + 4 + 3 * x)]);
  }
  return { width, height, pixels };
}

test("a solid image encodes as a valid PNG whose IDAT inflates to its pixels", () => {
  const png = encodeTinyPng({ width: 5, height: 3, color: [10, 200, 30] });
  const image = decode(png);
  assert.equal(image.width, 5);
  assert.equal(image.height, 3);
  assert.equal(image.pixels.length, 15);
  assert.ok(image.pixels.every((pixel) => pixel.join() === "10,200,30"));
  // The CRC of an empty IEND chunk is fixed by the specification's example files.
  assert.equal(png.subarray(-4).toString("hex"), "ae426082");
});

test("a pixel function sets each pixel, and black, white and two noise seeds give four different files", () => {
  const gradient = decode(encodeTinyPng({ width: 4, height: 2, pixel: (x, y) => [x * 60, y * 100, 7] }));
  assert.deepEqual(gradient.pixels[0], [0, 0, 7]);
  assert.deepEqual(gradient.pixels[3], [180, 0, 7]);
  assert.deepEqual(gradient.pixels[5], [60, 100, 7]);

  const images = [
    encodeTinyPng({ width: 32, height: 32, color: BLACK }),
    encodeTinyPng({ width: 32, height: 32, color: WHITE }),
    encodeTinyPng({ width: 32, height: 32, pixel: noisePixels(1, 32) }),
    encodeTinyPng({ width: 32, height: 32, pixel: noisePixels(2, 32) }),
  ];
  const decoded = images.map((png) => decode(png).pixels.flat().join());
  assert.equal(new Set(decoded).size, 4);
  assert.ok(
    decode(images[1]!).pixels.every((pixel) => pixel.join() === "255,255,255"),
    "white is white",
  );
  const noise = decode(images[2]!).pixels.flat();
  assert.ok(new Set(noise).size > 100, "noise spreads over the channel values");
  assert.equal(encodeTinyPng({ width: 32, height: 32, pixel: noisePixels(1, 32) }).toString("hex"), images[2]!.toString("hex"), "one seed, one image");
});

test("the data URL carries the PNG bytes, and writeTinyPng writes them to a file", async () => {
  const png = encodeTinyPng({ width: 2, height: 2, color: WHITE });
  const url = pngDataUrl(png);
  assert.match(url, /^data:image\/png;base64,[A-Za-z0-9+/]+=*$/);
  assert.ok(Buffer.from(url.slice("data:image/png;base64,".length), "base64").equals(png));

  const dir = await mkdtemp(join(tmpdir(), "llmgw-tiny-png-"));
  try {
    const path = join(dir, "white.png");
    const written = await writeTinyPng({ path, width: 2, height: 2, color: WHITE });
    assert.ok(written.equals(png));
    assert.ok((await readFile(path)).equals(png));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("sizes and channel values a PNG cannot hold are refused with the value", () => {
  assert.throws(() => encodeTinyPng({ width: 0, height: 2 }), /width must be an integer from 1 to 4096, got 0/);
  assert.throws(() => encodeTinyPng({ width: 2, height: 2, pixel: () => [0, 256, 0] }), /pixel \(0, 0\) has channel value 256/);
});
