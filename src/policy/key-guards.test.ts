// Keys naming guard models, end to end: a real llmgw server (test/support/server-harness.ts),
// serving models WITHOUT guards of their own behind a fake OpenAI-compatible upstream, and a
// stand-in Llama Guard 3 (test/support/stand-in-guard.ts) that reads llmgw's prompt as the
// classifier would. The guards a key names check that key's requests and no other key's;
// the door refuses names that are not guard models; the catalog keeps a guard a key names;
// the guards' time lands in the request's usage row. The official openai client sees what
// a client sees.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { startStandInGuard, type StandInGuard } from "../../test/support/stand-in-guard.ts";
import { eventually } from "../../test/support/eventually.ts";

/** What the stand-in guard takes per question in the usage test: a known minimum of guard time. */
const GUARD_DELAY_MS = 50;

describe("guards named by keys", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  let leaky: FakeUpstream;
  let guard: StandInGuard;
  let otherClient: OpenAI;

  before(async () => {
    harness = await startHarness({ guardTimeoutMs: 5000 });
    upstream = await startFakeUpstream({ reply: "hello from the fake upstream" });
    leaky = await startFakeUpstream({ reply: "first you build a bomb" });
    guard = await startStandInGuard({ format: "llama-guard-3", key: "guard-key", unsafeWords: { kill: ["S1"], bomb: ["S9"] } });
    await harness.addModel({
      name: "lg",
      role: "guard",
      guard_format: "llama-guard-3",
      profiles: [{ name: "g", engine: "external", url: guard.url, api_key: "guard-key" }],
    });
    await harness.addModel({ name: "plain", profiles: [{ name: "up", engine: "external", url: upstream.url }] });
    await harness.addModel({ name: "leaky", profiles: [{ name: "up", engine: "external", url: leaky.url }] });
    assert.equal(harness.server.catalog.get("plain").definition.guards, undefined, "the models have no guards of their own");
    otherClient = new OpenAI({ apiKey: await harness.clientKey({ name: "unguarded" }), baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstream.close();
    await leaky.close();
    await guard.close();
  });

  /** Creates a key through the admin API (failing the test if refused); returns its id and a client. */
  const keyWith = async (name: string, guards: unknown) => {
    const created = await harness.admin("POST", "/api/v1/keys", { name, guards });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    return { id: created.body.id as string, info: created.body, client: new OpenAI({ apiKey: created.body.key, baseURL: `${harness.url}/v1`, maxRetries: 0 }) };
  };
  const ask = (client: OpenAI, model: string, content: string) => client.chat.completions.create({ model, messages: [{ role: "user", content }] });

  test("a key's input guard checks its requests to a model without guards; another key's requests pass", async () => {
    const { info, client } = await keyWith("kiosk", { input: ["lg"] });
    assert.deepEqual(info.guards, { input: ["lg"], output: [] });

    const asked = guard.questions.length;
    const safe = await ask(client, "plain", "Tell me about bread.");
    assert.equal(safe.choices[0]?.message.content, "hello from the fake upstream");
    assert.equal(guard.questions.length, asked + 1, "the key's guard was asked");
    assert.equal(guard.questions.at(-1)!.check, "input");
    assert.equal(guard.questions.at(-1)!.judged, "Tell me about bread.");

    const upstreamRequests = upstream.requests.length;
    const refused = await ask(client, "plain", "How do I kill the process of my neighbour?").catch((error: unknown) => error);
    assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
    assert.equal(refused.code, "content_policy_violation");
    assert.equal(refused.message, "400 Refused by guard model 'lg': the request has unsafe content (S1 Violent Crimes).");
    assert.equal(upstream.requests.length, upstreamRequests, "the model never saw the refused request");

    const questions = guard.questions.length;
    const other = await ask(otherClient, "plain", "How do I kill the process of my neighbour?");
    assert.equal(other.choices[0]?.message.content, "hello from the fake upstream", "a key without guards is not checked");
    assert.equal(guard.questions.length, questions, "the guard was not asked for the other key");
  });

  test("a key's output guard holds a non-stream answer: the unsafe answer never reaches that key; another key gets it", async () => {
    const { client } = await keyWith("checked-answers", { output: ["lg"] });
    const refused = await ask(client, "leaky", "Tell me a story.").catch((error: unknown) => error);
    assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
    assert.equal(refused.code, "content_policy_violation");
    assert.match(refused.message, /Refused by guard model 'lg': the answer has unsafe content \(S9 Indiscriminate Weapons\)\.$/);
    assert.doesNotMatch(JSON.stringify(refused.error), /first you build a bomb/, "nothing of the answer is sent");
    assert.equal(guard.questions.at(-1)!.check, "output");
    assert.equal(guard.questions.at(-1)!.judged, "first you build a bomb");

    const safe = await ask(client, "plain", "Hi");
    assert.equal(safe.choices[0]?.message.content, "hello from the fake upstream", "a safe answer arrives whole");
    assert.equal(safe.usage?.total_tokens, 12);
    const other = await ask(otherClient, "leaky", "Tell me a story.");
    assert.equal(other.choices[0]?.message.content, "first you build a bomb", "another key's answers are not held");
  });

  test("the door refuses names that are not guard models; the keys' views show the guards; PATCH changes a side and null removes them", async () => {
    const notGuard = await harness.admin("POST", "/api/v1/keys", { name: "bad", guards: { input: ["lg", "plain"] } });
    assert.equal(notGuard.status, 400);
    assert.equal(notGuard.body.error.code, "invalid_field");
    assert.equal(notGuard.body.error.param, "guards.input.1");
    assert.equal(
      notGuard.body.error.message,
      "Invalid key: field 'guards.input.1': 'plain' is not a guard model (its role is serve). Name a model with role guard.",
    );
    const missing = await harness.admin("POST", "/api/v1/keys", { name: "bad", guards: { output: ["nope"] } });
    assert.equal(missing.status, 400);
    assert.equal(missing.body.error.param, "guards.output.0");
    assert.match(missing.body.error.message, /^Invalid key: field 'guards.output.0': guard model 'nope' does not exist\./);
    const unknownField = await harness.admin("POST", "/api/v1/keys", { name: "bad", guards: { inputs: ["lg"] } });
    assert.equal(unknownField.status, 400);
    assert.equal(
      (await harness.admin("GET", "/api/v1/keys")).body.data.filter((k: { name: string }) => k.name === "bad").length,
      0,
      "no refused key was stored",
    );

    const { id, client } = await keyWith("patched", { input: ["lg"] });
    const listed = (await harness.admin("GET", "/api/v1/keys")).body.data.find((k: { id: string }) => k.id === id);
    assert.deepEqual(listed.guards, { input: ["lg"], output: [] });
    assert.equal((await harness.admin("GET", "/api/v1/keys")).body.data.find((k: { name: string }) => k.name === "unguarded").guards, null);
    await assert.rejects(ask(client, "plain", "kill"), OpenAI.BadRequestError);

    const badPatch = await harness.admin("PATCH", `/api/v1/keys/${id}`, { guards: { output: ["plain"] } });
    assert.equal(badPatch.status, 400);
    assert.equal(badPatch.body.error.param, "guards.output.0");
    const outputAdded = await harness.admin("PATCH", `/api/v1/keys/${id}`, { guards: { output: ["lg"] } });
    assert.equal(outputAdded.status, 200, JSON.stringify(outputAdded.body));
    assert.deepEqual(outputAdded.body.guards, { input: ["lg"], output: ["lg"] }, "a side given replaces that side only");
    assert.deepEqual((await harness.admin("GET", `/api/v1/keys/${id}`)).body.guards, { input: ["lg"], output: ["lg"] });

    const removed = await harness.admin("PATCH", `/api/v1/keys/${id}`, { guards: null });
    assert.equal(removed.status, 200);
    assert.equal(removed.body.guards, null);
    const questions = guard.questions.length;
    const passed = await ask(client, "plain", "kill");
    assert.equal(passed.choices[0]?.message.content, "hello from the fake upstream", "the removal applies to the key's next request");
    assert.equal(guard.questions.length, questions);
  });

  test("a guard a key names cannot be deleted, renamed away or made a serving model; once no active key names it, it can", async () => {
    await harness.addModel({
      name: "kg",
      role: "guard",
      guard_format: "llama-guard-3",
      profiles: [{ name: "g", engine: "external", url: guard.url, api_key: "guard-key" }],
    });
    const { id } = await keyWith("holds-kg", { output: ["kg"] });
    const deleted = await harness.admin("DELETE", "/api/v1/models/kg");
    assert.equal(deleted.status, 409);
    assert.equal(deleted.body.error.code, "guard_in_use");
    assert.match(
      deleted.body.error.message,
      /^Model 'kg' is a guard of key 'holds-kg', and this change would leave it without it\. Take it out of their guards first \(.*ctl key update/,
    );
    assert.equal((await harness.admin("PATCH", "/api/v1/models/kg", { role: "serve", guard_format: null })).status, 409);
    assert.equal((await harness.admin("PATCH", "/api/v1/models/kg", { name: "kg2" })).status, 409);
    assert.equal(
      (await harness.admin("PATCH", "/api/v1/models/kg", { name: "kg2", aliases: ["kg"] })).status,
      200,
      "a rename that keeps the name as an alias is allowed",
    );
    assert.equal((await harness.admin("PATCH", "/api/v1/models/kg2", { name: "kg", aliases: [] })).status, 200);

    assert.equal((await harness.admin("DELETE", `/api/v1/keys/${id}`)).status, 200);
    assert.equal((await harness.admin("DELETE", "/api/v1/models/kg")).status, 200, "a revoked key holds no guard");
  });

  test("a key whose guard is gone by the time it asks is refused with 503 (fail closed)", async () => {
    // Another server's change can race the catalog's check; stand for it by writing the row.
    const { id, client } = await keyWith("stale", { input: ["lg"] });
    await harness.server.store.db
      .updateTable("api_keys")
      .set({ guards: JSON.stringify({ input: ["gone"], output: [] }) })
      .where("id", "=", id)
      .execute();
    const upstreamRequests = upstream.requests.length;
    const refused = await ask(client, "plain", "Tell me about bread.").catch((error: unknown) => error);
    assert.ok(refused instanceof OpenAI.APIError && refused.status === 503, String(refused));
    assert.equal(refused.code, "guard_unavailable");
    assert.match(refused.message, /Guard model 'gone' could not check the request \(it is not in the catalog\), so it was refused\./);
    assert.equal(upstream.requests.length, upstreamRequests);
  });

  test("a model that lets its streams pass its own output guards unchecked does not lift a key's output guard", async () => {
    const { client } = await keyWith("stream-held", { output: ["lg"] });
    const other = await keyWith("stream-free", null);
    assert.equal((await harness.admin("PATCH", "/api/v1/models/plain", { output_guard_streams: "unchecked" })).status, 200);
    try {
      const streamed = (who: OpenAI) => who.chat.completions.create({ model: "plain", messages: [{ role: "user", content: "Hi" }], stream: true });
      const refused = await streamed(client).catch((error: unknown) => error);
      assert.ok(refused instanceof OpenAI.APIError && refused.status === 400, String(refused));
      assert.equal(refused.code, "output_guard_needs_whole_answer");
      assert.match(refused.message, /The key 'stream-held' has output guards \('lg'\)/);
      let text = "";
      for await (const chunk of await streamed(other.client)) text += chunk.choices[0]?.delta.content ?? "";
      assert.ok(text.length > 0, "a key without output guards streams");
    } finally {
      assert.equal((await harness.admin("PATCH", "/api/v1/models/plain", { output_guard_streams: "refuse" })).status, 200);
    }
  });

  test("the guards' time is in the usage row: input and output guard time of a guarded request, null for an unguarded one", async () => {
    // A few ms over the minimum asserted: Node's timers may fire up to a millisecond early.
    guard.delayMs = GUARD_DELAY_MS + 5;
    try {
      const input = await keyWith("timed-input", { input: ["lg"] });
      const both = await keyWith("timed-both", { input: ["lg"], output: ["lg"] });
      const unguarded = await keyWith("timed-none", null);
      await ask(input.client, "plain", "Hi");
      await ask(both.client, "plain", "Hi");
      await ask(unguarded.client, "plain", "Hi");
      const refused = await ask(input.client, "plain", "How do I kill a process?").catch((error: unknown) => error);
      assert.ok(refused instanceof OpenAI.APIError && refused.status === 400, String(refused));
      const rowOf = (keyId: string) =>
        eventually(
          `the usage row of key ${keyId}`,
          async () => (await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", keyId).execute())[0],
        );
      const rowsOf = (keyId: string, count: number) =>
        eventually(`${count} usage rows of key ${keyId}`, async () => {
          const rows = await harness.server.store.db.selectFrom("usage").selectAll().where("key_id", "=", keyId).orderBy("id").execute();
          return rows.length >= count ? rows : undefined;
        });
      const rows = await rowsOf(input.id, 2);
      const inputRow = rows[0]!;
      const refusedRow = rows[1]!;
      assert.equal(refusedRow.status, 400);
      assert.ok(refusedRow.guard_ms !== null && refusedRow.guard_ms >= GUARD_DELAY_MS, `a refusal keeps its guard time too: ${refusedRow.guard_ms} ms`);
      assert.ok(inputRow.guard_ms !== null && inputRow.guard_ms >= GUARD_DELAY_MS, `input guard time ${inputRow.guard_ms} ms`);
      const bothRow = await rowOf(both.id);
      assert.ok(bothRow.guard_ms !== null && bothRow.guard_ms >= 2 * GUARD_DELAY_MS, `input and output guard time ${bothRow.guard_ms} ms`);
      assert.equal((await rowOf(unguarded.id)).guard_ms, null, "no guard applied");
      assert.equal(inputRow.status, 200);
    } finally {
      guard.delayMs = 0;
    }
  });
});
