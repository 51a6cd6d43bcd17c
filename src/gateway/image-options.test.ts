// The image flags of `llmgw server` and `up` as the CLI reads them (run-server.ts's
// imageOptions): each one's bounds, and --max-image-bytes against --max-body, checked at
// startup so that a server never starts with limits that contradict each other.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "../core/errors.ts";
import { imageOptions } from "../cli/run-server.ts";

const MiB = 1024 * 1024;

/** The message of the startup error `flags` give. */
function refused(flags: Parameters<typeof imageOptions>[0]): string {
  try {
    imageOptions(flags);
  } catch (error) {
    assert.ok(error instanceof BadRequestError, String(error));
    return error.message;
  }
  assert.fail(`expected ${JSON.stringify(flags)} to be refused`);
}

test("without image flags the gateway gets --max-body and the defaults; a smaller --max-body shrinks the default image size to ¾ of it", () => {
  assert.deepEqual(imageOptions({}), { maxBodyBytes: 16 * MiB });
  assert.deepEqual(imageOptions({ maxBody: "4m" }), { maxBodyBytes: 4 * MiB, maxBytes: 3 * MiB });
  assert.deepEqual(imageOptions({ maxBody: "64m" }), { maxBodyBytes: 64 * MiB });
});

test("--max-image-bytes is at least 1k and at most ¾ of --max-body, whose base64 fills the body", () => {
  assert.equal(imageOptions({ maxImageBytes: "12m" }).maxBytes, 12 * MiB);
  assert.equal(imageOptions({ maxImageBytes: "1k" }).maxBytes, 1024);
  assert.equal(imageOptions({ maxImageBytes: "30m", maxBody: "40m" }).maxBytes, 30 * MiB);
  assert.match(refused({ maxImageBytes: "13m" }), /^Invalid --max-image-bytes '13m': give at most 12 MiB, ¾ of --max-body \(16 MiB\).*raise --max-body\.$/);
  assert.match(refused({ maxImageBytes: "4m", maxBody: "4m" }), /at most 3 MiB, ¾ of --max-body \(4 MiB\)/);
  assert.match(refused({ maxImageBytes: "512" }), /^Invalid --max-image-bytes '512': give at least 1k/);
  assert.match(refused({ maxImageBytes: "lots" }), /^Invalid --max-image-bytes 'lots'/);
});

test("--max-images is 1 to 64", () => {
  assert.equal(imageOptions({ maxImages: "64" }).maxImages, 64);
  assert.equal(imageOptions({ maxImages: "1" }).maxImages, 1);
  assert.match(refused({ maxImages: "65" }), /^Invalid --max-images '65': give 1 to 64\.$/);
  assert.match(refused({ maxImages: "0" }), /^Invalid --max-images '0'/);
});

test("--image-fetch-timeout is 100ms to 5m: AbortSignal.timeout fires at once past 2^31 ms", () => {
  assert.equal(imageOptions({ imageFetchTimeout: "5m" }).fetchTimeoutMs, 300_000);
  assert.equal(imageOptions({ imageFetchTimeout: "100ms" }).fetchTimeoutMs, 100);
  for (const value of ["6m", "600h", "50ms"]) {
    assert.match(refused({ imageFetchTimeout: value }), new RegExp(`^Invalid --image-fetch-timeout '${value}': give 100ms to 5m`));
  }
});

test("--image-urls and --allow-private-image-urls", () => {
  assert.equal(imageOptions({ imageUrls: "refuse" }).urls, "refuse");
  assert.match(refused({ imageUrls: "sometimes" }), /^Invalid --image-urls 'sometimes'/);
  assert.equal(imageOptions({ allowPrivateImageUrls: true }).allowPrivate, true);
  assert.equal(imageOptions({}).allowPrivate, undefined);
});
