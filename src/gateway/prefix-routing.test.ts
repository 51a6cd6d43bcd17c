// Prefix routing through a real server: a model whose replicas are stand-in upstreams
// (external profiles) that record what reaches them. A conversation's turns all go to one
// replica, conversations spread over all of them, a busy home passes requests on within
// the load bound, two servers on one database send a prefix to the same replica, and the
// settings are refused at the door when they make no sense.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { fakeUpstreams, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { ctlRunner } from "../../test/support/ctl-runner.ts";
import { dropSchema, postgresSchemaOrSkip } from "../../test/support/stores.ts";

type Message = { role: "system" | "user" | "assistant"; content: string };

/** Conversation `n`'s messages up to its turn `turns`: a system prompt of its own, then questions and answers. */
function conversation(n: number, turns: number): Message[] {
  const messages: Message[] = [{ role: "system", content: `You are assistant number ${n}. Keep every answer short and kind.` }];
  for (let turn = 1; turn <= turns; turn += 1) {
    if (turn > 1) messages.push({ role: "assistant", content: `Answer ${turn - 1}` });
    messages.push({ role: "user", content: `Question ${turn} of conversation ${n}` });
  }
  return messages;
}

/** Which upstream each recorded request of conversation `n` reached, in order. */
function whereWent(upstreams: FakeUpstream[], n: number): number[] {
  const seen: Array<{ at: number; index: number }> = [];
  upstreams.forEach((upstream, index) => {
    upstream.requests.forEach((request, at) => {
      if (String(request.body?.messages?.[0]?.content).includes(`assistant number ${n}.`)) seen.push({ at, index });
    });
  });
  return seen.map((s) => s.index);
}

/**
 * Conversations per test. The replica ids, and so the homes, are new each run: with 80, a
 * replica that the ring gives even 15% of the keys (a third below an even share of four)
 * gets none with a chance of 0.85^80, about 1 in 500,000. Not a multiple of 3, so
 * least-busy's rotation does not line a conversation's turns up by chance.
 */
const CONVERSATIONS = 80;

const externalProfiles = (upstreams: FakeUpstream[]) => upstreams.map((upstream, index) => ({ name: `p${index}`, engine: "external", url: upstream.url }));

describe("prefix routing", () => {
  let harness: Harness;
  let client: OpenAI;
  const fakes = fakeUpstreams();
  const { ctl } = ctlRunner(() => harness);

  before(async () => {
    harness = await startHarness();
    client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await fakes.closeAll();
  });

  test("each conversation's turns go to one replica, and the conversations spread over all of them", async () => {
    const upstreams = await Promise.all([fakes.start(), fakes.start(), fakes.start()]);
    await harness.addModel({ name: "affine", routing: "prefix", profiles: externalProfiles(upstreams) });
    const spread = await Promise.all([fakes.start(), fakes.start(), fakes.start()]);
    await harness.addModel({ name: "spread", profiles: externalProfiles(spread) });
    for (let turn = 1; turn <= 3; turn += 1) {
      for (let n = 0; n < CONVERSATIONS; n += 1) {
        await client.chat.completions.create({ model: "affine", messages: conversation(n, turn) });
        await client.chat.completions.create({ model: "spread", messages: conversation(n, turn) });
      }
    }
    const homes = new Set<number>();
    for (let n = 0; n < CONVERSATIONS; n += 1) {
      const went = whereWent(upstreams, n);
      assert.equal(went.length, 3);
      assert.equal(new Set(went).size, 1, `conversation ${n} went to upstreams ${went.join(", ")}`);
      homes.add(went[0]!);
    }
    assert.equal(homes.size, 3, `${CONVERSATIONS} conversations have homes on all three replicas`);
    // The same traffic on a least-busy model: turns of a conversation go wherever is free (rotating).
    const scattered = Array.from({ length: CONVERSATIONS }, (_, n) => new Set(whereWent(spread, n)).size).filter((size) => size > 1).length;
    assert.ok(scattered > 0, "least-busy spreads a conversation's turns over replicas");
  });

  test("Anthropic Messages requests are routed by their prompt too", async () => {
    const upstreams = await Promise.all([fakes.start(), fakes.start()]);
    await harness.addModel({ name: "affine-messages", routing: "prefix", profiles: externalProfiles(upstreams) });
    for (let turn = 1; turn <= 4; turn += 1) {
      const messages = conversation(7, turn);
      const response = await fetch(`${harness.url}/v1/messages`, {
        method: "POST",
        headers: { "x-api-key": client.apiKey, "anthropic-version": "2023-06-01", "content-type": "application/json" },
        body: JSON.stringify({ model: "affine-messages", max_tokens: 16, system: messages[0]!.content, messages: messages.slice(1) }),
      });
      assert.equal(response.status, 200, await response.text());
    }
    assert.equal(new Set(whereWent(upstreams, 7)).size, 1, "four turns, one replica");
  });

  test("a busy home keeps a second request, and passes a third to the next replica; a full home passes it on too", async () => {
    const gate = new Gate();
    const upstreams = await Promise.all([fakes.start({ beforeAnswer: gate.wait }), fakes.start({ beforeAnswer: gate.wait })]);
    const model = await harness.addModel({
      name: "bounded",
      routing: "prefix",
      profiles: upstreams.map((upstream, index) => ({ name: `p${index}`, engine: "external", url: upstream.url, max_inflight: 3 })),
    });
    const messages = conversation(3, 2);
    const inFlight = () => upstreams.map((upstream) => upstream.inFlight());
    const answers: Promise<unknown>[] = [];
    const send = async (expected: number[]) => {
      answers.push(client.chat.completions.create({ model: "bounded", messages }));
      await eventually(`in flight ${expected.join("/")}`, () => String(inFlight().sort()) === String([...expected].sort()));
    };
    await send([1, 0]);
    const home = inFlight().indexOf(1);
    const other = 1 - home;
    // 1 in flight: the bound is ceil(1.25 × 2 / 2) = 2, and home takes the second.
    await send([2, 0]);
    assert.equal(upstreams[home]!.inFlight(), 2);
    // 2 in flight: ceil(1.25 × 3 / 2) = 2; home would hold 3, so the next replica takes it.
    await send([2, 1]);
    assert.equal(upstreams[other]!.inFlight(), 1);
    // 3 in flight: ceil(1.25 × 4 / 2) = 3; home takes its third.
    await send([3, 1]);
    assert.equal(upstreams[home]!.inFlight(), 3);
    // Home is full (max_inflight 3): the fifth goes to the other replica, within ceil(1.25 × 5 / 2) = 4.
    await send([3, 2]);
    gate.open();
    await Promise.all(answers);
    assert.equal(harness.server.gateway.waitingFor(model.id), 0);
  });

  test("routing and its prefix settings are checked at the door, naming the field; a change merges into the stored settings", async () => {
    const upstream = await fakes.start();
    const base = { profiles: [{ name: "p", engine: "external", url: upstream.url }] };
    const refused = [
      [{ routing: "round-robin" }, "routing", /must be one of least-busy, prefix/],
      [{ routing: "prefix", prefix: { load_factor: 0.5 } }, "prefix.load_factor", /must be at least 1/],
      [{ routing: "prefix", prefix: { chars: 4 } }, "prefix.chars", /must be at least 16/],
      [{ routing: "prefix", prefix: { chars: 100_000 } }, "prefix.chars", /must be at most 65536/],
      [{ routing: "prefix", prefix: { chunk: 4 } }, "prefix", /chunk/],
    ] as const;
    for (const [fields, field, message] of refused) {
      const answer = await harness.admin("POST", "/api/v1/models", { name: "refused", ...base, ...fields });
      assert.equal(answer.status, 400, JSON.stringify(fields));
      assert.ok(String(answer.body.error.message).includes(`'${field}'`), answer.body.error.message);
      assert.match(answer.body.error.message, message);
    }
    const added = await harness.admin("POST", "/api/v1/models", { name: "settled", ...base, routing: "prefix", prefix: { chars: 512 } });
    assert.equal(added.status, 201, JSON.stringify(added.body));
    assert.deepEqual(added.body.prefix, { chars: 512, load_factor: 1.25 }, "the default fills what was not given");
    const changed = await harness.admin("PATCH", "/api/v1/models/settled", { prefix: { load_factor: 2 } });
    assert.equal(changed.status, 200, JSON.stringify(changed.body));
    assert.deepEqual(changed.body.prefix, { chars: 512, load_factor: 2 });
    const zero = await harness.admin("PATCH", "/api/v1/models/settled", { prefix: { load_factor: 0 } });
    assert.equal(zero.status, 400);
    assert.match(zero.body.error.message, /'prefix\.load_factor': must be at least 1/);
    const shown = await ctl(["model", "show", "settled"]);
    assert.match(
      shown.stdout,
      /^routing: prefix \(a conversation's first 512 characters pick its replica; one above 2 × the mean requests in flight is passed over\)$/m,
    );
    // null goes back to the defaults.
    const reset = await harness.admin("PATCH", "/api/v1/models/settled", { prefix: null });
    assert.equal(reset.status, 200, JSON.stringify(reset.body));
    assert.deepEqual(reset.body.prefix, { chars: 4096, load_factor: 1.25 });
    await harness.admin("PATCH", "/api/v1/models/settled", { routing: "least-busy" });
    assert.match((await ctl(["model", "show", "settled"])).stdout, /^routing: least-busy /m);
  });
});

test("two servers on one database send a conversation to the same replica", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const fakes = fakeUpstreams();
  const started: Harness[] = [];
  try {
    const a = await startHarness({ database, cluster: { name: "a" } });
    started.push(a);
    const b = await startHarness({ database, adminKey: a.adminKey, cluster: { name: "b" } });
    started.push(b);
    const upstreams = await Promise.all([fakes.start(), fakes.start(), fakes.start(), fakes.start()]);
    await a.addModel({ name: "shared", routing: "prefix", profiles: externalProfiles(upstreams) });
    const key = await a.clientKey();
    const clients = [a, b].map((server) => new OpenAI({ apiKey: key, baseURL: `${server.url}/v1`, maxRetries: 0 }));
    // b hears of the model through the change feed.
    await eventually("b knows the model", () => b.server.catalog.resolve("shared") !== undefined);
    for (let n = 0; n < CONVERSATIONS; n += 1) {
      await clients[0]!.chat.completions.create({ model: "shared", messages: conversation(n, 1) });
      await clients[1]!.chat.completions.create({ model: "shared", messages: conversation(n, 2) });
    }
    for (let n = 0; n < CONVERSATIONS; n += 1) {
      const went = whereWent(upstreams, n);
      assert.equal(went.length, 2);
      assert.equal(went[0], went[1], `conversation ${n}: a sent it to upstream ${went[0]}, b to ${went[1]}`);
    }
    assert.equal(new Set(Array.from({ length: CONVERSATIONS }, (_, n) => whereWent(upstreams, n)[0])).size, 4, "and they spread over all four replicas");
  } finally {
    for (const harness of started.reverse()) await harness.close();
    await fakes.closeAll();
    await dropSchema(database.schema);
  }
});
