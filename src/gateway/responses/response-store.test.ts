// The kept responses on SQLite and PostgreSQL, with the test's clock: a chain read in one
// query oldest first, each key seeing only its own, expiry hiding a response before the
// sweep deletes it, and deletes.
import assert from "node:assert/strict";
import { testBothStores } from "../../../test/support/stores.ts";
import { ResponseStore, type StoredResponse } from "./response-store.ts";
import type { ResponseObject } from "./response-types.ts";

function stored(id: string, previous: string | null, text: string): StoredResponse {
  const response: ResponseObject = {
    id,
    object: "response",
    created_at: 1,
    status: "completed",
    error: null,
    incomplete_details: null,
    output: [
      { id: `msg_${id}`, type: "message", status: "completed", role: "assistant", content: [{ type: "output_text", text, annotations: [], logprobs: [] }] },
    ],
    usage: null,
  };
  return {
    id,
    previousResponseId: previous,
    model: "demo",
    input: [{ id: `in_${id}`, type: "message", role: "user", content: [{ type: "input_text", text: `question ${id}` }] }],
    response,
  };
}

testBothStores("responses are kept per key, chained oldest first, hidden once expired and swept", async (store) => {
  let now = Date.parse("2026-12-03T10:00:00Z");
  const responses = new ResponseStore({ store, retentionDays: 2, clock: () => now });
  await responses.save("key-a", stored("resp_1", null, "one"));
  await responses.save("key-a", stored("resp_2", "resp_1", "two"));
  await responses.save("key-a", stored("resp_3", "resp_2", "three"));
  await responses.save("key-b", stored("resp_b", null, "other"));

  const chain = await responses.chain("resp_3", "key-a");
  assert.deepEqual(
    chain.map((kept) => [kept.id, kept.previousResponseId, kept.input[0]?.id, kept.response.output[0]?.type]),
    [
      ["resp_1", null, "in_resp_1", "message"],
      ["resp_2", "resp_1", "in_resp_2", "message"],
      ["resp_3", "resp_2", "in_resp_3", "message"],
    ],
  );
  assert.deepEqual((await responses.get("resp_2", "key-a"))?.response.output[0], stored("resp_2", null, "two").response.output[0]);
  assert.equal(await responses.get("resp_2", "key-b"), undefined, "another key's response is not found");
  assert.deepEqual(await responses.chain("resp_3", "key-b"), [], "nor chained on");
  assert.equal(await responses.delete("resp_1", "key-b"), false, "nor deleted");

  // A response deleted from the middle ends the chain there.
  assert.equal(await responses.delete("resp_2", "key-a"), true);
  assert.equal(await responses.delete("resp_2", "key-a"), false, "a second delete finds nothing");
  assert.deepEqual(
    (await responses.chain("resp_3", "key-a")).map((kept) => kept.id),
    ["resp_3"],
  );

  // Past the retention: not read, even before a sweep deletes it.
  now += 2 * 86_400_000 + 1;
  await responses.save("key-a", stored("resp_4", "resp_3", "four"));
  assert.equal(await responses.get("resp_3", "key-a"), undefined);
  assert.deepEqual(
    (await responses.chain("resp_4", "key-a")).map((kept) => kept.id),
    ["resp_4"],
  );
  assert.equal(await responses.sweep(2), 3, "resp_1, resp_3 and resp_b went, two rows a statement");
  const left = await store.db.selectFrom("responses").select("id").execute();
  assert.deepEqual(
    left.map((row) => row.id),
    ["resp_4"],
  );
});

testBothStores("retention 0 keeps responses until deleted; a failed write is logged, never thrown", async (store) => {
  let now = Date.parse("2026-12-03T10:00:00Z");
  const warnings: unknown[] = [];
  const logger = { warn: (fields: unknown) => warnings.push(fields), info: () => undefined } as never;
  const responses = new ResponseStore({ store, retentionDays: 0, clock: () => now, logger });
  await responses.keep("key-a", stored("resp_1", null, "one"));
  // Read at once (on SQLite the row waits in memory for the next turn; a read writes it first).
  assert.equal((await responses.chain("resp_1", "key-a"))[0]?.id, "resp_1");
  now += 5000 * 86_400_000;
  assert.equal(await responses.sweep(), 0);
  assert.equal((await responses.get("resp_1", "key-a"))?.id, "resp_1");
  // The same id again violates the primary key: keep() (or, on SQLite, the write that follows it) logs it, and nothing throws.
  await responses.keep("key-a", stored("resp_1", null, "again"));
  await responses.keep("key-a", stored("resp_2", null, "two"));
  assert.equal((await responses.get("resp_2", "key-a"))?.id, "resp_2");
  assert.equal(warnings.length, 1);
  assert.match(JSON.stringify(warnings[0]), /resp_1/);
});
