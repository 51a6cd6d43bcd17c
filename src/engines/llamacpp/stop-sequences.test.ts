import { test } from "node:test";
import assert from "node:assert/strict";
import { StopSequences } from "./stop-sequences.ts";

/** Feeds chunks and returns what was sent, and whether (and after which chunk) it stopped. */
function run(stops: string[], chunks: string[]): { sent: string[]; stoppedAt: number; flushed: string } {
  const matcher = new StopSequences(stops);
  const sent: string[] = [];
  let stoppedAt = -1;
  for (const [index, chunk] of chunks.entries()) {
    const scan = matcher.push(chunk);
    sent.push(scan.text);
    if (scan.stopped && stoppedAt < 0) stoppedAt = index;
  }
  return { sent, stoppedAt, flushed: matcher.flush() };
}

test("without stop sequences text passes straight through", () => {
  assert.deepEqual(run([], ["a", "b"]), { sent: ["a", "b"], stoppedAt: -1, flushed: "" });
  assert.deepEqual(run([""], ["a"]), { sent: ["a"], stoppedAt: -1, flushed: "" }, "an empty stop sequence is ignored");
});

test("the reply ends before the first stop sequence, also when it spans chunks", () => {
  assert.deepEqual(run(["END"], ["abc", "dE", "N", "Dxyz", "more"]), { sent: ["abc", "d", "", "", ""], stoppedAt: 3, flushed: "" });
  // Of two stop sequences the one that starts first wins, whichever is listed first.
  assert.deepEqual(run(["cd", "b"], ["abcd"]).sent, ["a"]);
  assert.deepEqual(run(["bcd", "cd"], ["ab", "cd"]).sent, ["a", ""]);
});

test("text that may start a stop sequence is held back until the next text settles it", () => {
  // "EN" could be the start of "END"; "ENx" is not, so it is sent with the next chunk.
  assert.deepEqual(run(["END"], ["abcEN", "x"]), { sent: ["abc", "ENx"], stoppedAt: -1, flushed: "" });
  // At the end of the generation the held text is part of the reply.
  assert.deepEqual(run(["END"], ["abcE"]), { sent: ["abc"], stoppedAt: -1, flushed: "E" });
  // The longest possible start is held: "aab" may start "aabX".
  assert.deepEqual(run(["aabX"], ["xaab"]).sent, ["x"]);
});

test("multi-byte characters and surrogate pairs are never split", () => {
  assert.deepEqual(run(["— h"], ["say", "—", " hi"]), { sent: ["say", "", ""], stoppedAt: 2, flushed: "" });
  // "😁" is two UTF-16 code units; a stop sequence starting with its second would otherwise split it.
  const lowHalf = "😁".slice(1);
  const result = run([`${lowHalf}x`], ["a😁"]);
  assert.deepEqual(result.sent, ["a"]);
  assert.equal(result.flushed, "😁");
});
