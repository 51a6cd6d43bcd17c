// Tiny PNG encoder for tests that send images: solid colours or a pixel function, 8-bit
// RGB, no external package. The vision tests need two images that look different to a
// real llama-server (which decodes them with stb_image), as bytes, as a file or as the
// `data:image/png;base64,...` URL of an OpenAI `image_url` content part.
//
// Format facts from the PNG specification (W3C, 3rd edition): the 8-byte signature; then
// chunks of length (4 bytes, big-endian, data only), type, data and a CRC-32 over type and
// data; IHDR first (width, height, bit depth 8, colour type 2 = truecolour RGB, compression
// 0, filter method 0, interlace 0), IDAT with the zlib stream of the scanlines, each led by
// its filter type byte (0 = none here), and IEND last.
import { writeFile } from "node:fs/promises";
import { deflateSync } from "node:zlib";

export type Rgb = readonly [red: number, green: number, blue: number];

/** The colour of the pixel at column x, row y (0-based); channels 0..255. */
export type PixelFunction = (x: number, y: number) => Rgb;

export interface TinyPngImage {
  width: number;
  height: number;
  /** Every pixel this colour; ignored when `pixel` is given. Default black. */
  color?: Rgb;
  pixel?: PixelFunction;
}

export const BLACK: Rgb = [0, 0, 0];
export const WHITE: Rgb = [255, 255, 255];

const SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

// CRC-32 as PNG (and zlib) define it: polynomial 0xEDB88320, reflected, initial and final
// value 0xFFFFFFFF. Written here because zlib.crc32 only exists from Node 20.15.
const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) crc = (CRC_TABLE[(crc ^ byte) & 0xff] as number) ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

function chunk(type: string, data: Uint8Array): Buffer {
  const out = Buffer.alloc(12 + data.length);
  out.writeUInt32BE(data.length, 0);
  out.write(type, 4, "latin1");
  out.set(data, 8);
  out.writeUInt32BE(crc32(out.subarray(4, 8 + data.length)), 8 + data.length);
  return out;
}

function channel(value: number, x: number, y: number): number {
  if (!Number.isInteger(value) || value < 0 || value > 255)
    throw new RangeError(`tiny PNG: pixel (${x}, ${y}) has channel value ${value}; use integers 0..255.`);
  return value;
}

/** Encodes the image as PNG bytes (8-bit RGB, unfiltered scanlines). */
export function encodeTinyPng(image: TinyPngImage): Buffer {
  const { width, height } = image;
  // PNG allows up to 2^31 - 1; a test image has no business being large.
  for (const [what, value] of [
    ["width", width],
    ["height", height],
  ] as const) {
    if (!Number.isInteger(value) || value <= 0 || value > 4096) throw new RangeError(`tiny PNG: ${what} must be an integer from 1 to 4096, got ${value}.`);
  }
  const colour = image.color ?? BLACK;
  const pixel: PixelFunction = image.pixel ?? (() => colour);
  const stride = 1 + 3 * width;
  const raw = Buffer.alloc(height * stride);
  for (let y = 0; y < height; y++) {
    // raw[y * stride] stays 0: filter type None.
    for (let x = 0; x < width; x++) {
      const [r, g, b] = pixel(x, y);
      const at = y * stride + 1 + 3 * x;
      raw[at] = channel(r, x, y);
      raw[at + 1] = channel(g, x, y);
      raw[at + 2] = channel(b, x, y);
    }
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type: truecolour
  // Compression, filter method and interlace stay 0.
  return Buffer.concat([SIGNATURE, chunk("IHDR", ihdr), chunk("IDAT", deflateSync(raw)), chunk("IEND", new Uint8Array(0))]);
}

/** Writes the image as a PNG file and returns its bytes. */
export async function writeTinyPng(options: TinyPngImage & { path: string }): Promise<Buffer> {
  const png = encodeTinyPng(options);
  await writeFile(options.path, png);
  return png;
}

/** The `data:` URL of PNG bytes, for an OpenAI `image_url` content part. */
export function pngDataUrl(png: Uint8Array): string {
  return `data:image/png;base64,${Buffer.from(png).toString("base64")}`;
}

/** Seeded per-pixel noise (mulberry32 over the pixel index): one seed, one image. */
export function noisePixels(seed: number, width: number): PixelFunction {
  const value = (index: number, salt: number) => {
    let t = (Math.imul(seed >>> 0, 0x9e3779b1) + Math.imul(index, 3) + salt + 0x6d2b79f5) >>> 0;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) % 256;
  };
  return (x, y) => {
    const index = y * width + x;
    return [value(index, 0), value(index, 1), value(index, 2)];
  };
}
