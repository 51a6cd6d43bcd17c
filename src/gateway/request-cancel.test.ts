// RequestCancel: the signal it makes follows it (made before or after it fired), and undici
// takes it as a request's signal: a request waiting for an upstream that never answers
// ends when the client goes away, and the upstream sees its connection close.
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Pool } from "undici";
import { eventually } from "../../test/support/eventually.ts";
import { RequestCancel } from "./request-cancel.ts";

test("the AbortSignal follows the cancellation, whether it was asked for before or after it fired", () => {
  const early = new RequestCancel();
  const signal = early.signal;
  let heard = 0;
  early.on("abort", () => (heard += 1));
  assert.equal(signal.aborted, false);
  early.abort();
  early.abort();
  assert.equal(signal.aborted, true);
  assert.equal(early.aborted, true);
  assert.equal(heard, 1, "'abort' is emitted once");
  const late = new RequestCancel();
  late.abort();
  assert.equal(late.signal.aborted, true);
});

test("undici takes it as a request's signal: a request still waiting for its answer is cancelled", async () => {
  let arrived = 0;
  let closed = 0;
  // Never answers: the request waits for its headers until it is cancelled.
  const server = http.createServer((req) => {
    arrived += 1;
    req.socket.on("close", () => (closed += 1));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const pool = new Pool(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    const cancel = new RequestCancel();
    const pending = pool.request({ path: "/", method: "POST", body: "{}", signal: cancel });
    await eventually("the request at the server", () => arrived === 1);
    cancel.abort();
    await assert.rejects(pending, (error: Error) => error.name === "RequestAbortedError" || /abort/i.test(error.message));
    await eventually("the server to see the connection close", () => closed === 1);
  } finally {
    await pool.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
