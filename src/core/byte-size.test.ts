// Sizes as flags and inventory files give them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "./errors.ts";
import { parseByteSize } from "./byte-size.ts";

test("reads plain bytes and binary units in any case, with or without 'iB'", () => {
  assert.equal(parseByteSize("1048576", "--max-body"), 1048576);
  assert.equal(parseByteSize("512k", "--max-body"), 512 * 1024);
  assert.equal(parseByteSize("16M", "--max-body"), 16 * 1024 ** 2);
  assert.equal(parseByteSize(" 8GiB ", "memory"), 8 * 1024 ** 3);
  assert.equal(parseByteSize("1.5g", "memory"), 1.5 * 1024 ** 3);
});

test("refuses what is not a size, naming the flag and the value", () => {
  for (const value of ["", "lots", "16 t", "-1m"]) {
    assert.throws(
      () => parseByteSize(value, "--max-body"),
      (error: unknown) =>
        error instanceof BadRequestError && error.message === `Invalid --max-body '${value}': use a number of bytes or a size like 512k, 16m, 1g.`,
    );
  }
});
