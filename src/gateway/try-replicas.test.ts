// The replica-attempt loop's two callers, a client's /v1 request and llmgw's own call to a
// model (a guard's question, internal-call.ts), meeting the same failing replica. They used
// to differ on a replica that refuses llmgw's credentials: the internal call gave up with a
// plain "HTTP 401" where the proxy tried another replica or said upstream_auth_failed.
// A real llmgw server in this process, `external` profiles on fake upstreams
// (test/support/fake-upstream.ts).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { LlmgwError } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";

const hi = [{ role: "user" as const, content: "hi" }];

describe("one replica-attempt loop for client requests and internal calls", () => {
  let harness: Harness;
  let client: OpenAI;
  let keyed: FakeUpstream;
  let failing: FakeUpstream;
  let good: FakeUpstream;

  before(async () => {
    harness = await startHarness();
    client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
    // Wants the Bearer token "the-right-key" and answers 401 to any other, as an external server does.
    keyed = await startFakeUpstream({ key: "the-right-key", reply: "from the keyed one" });
    failing = await startFakeUpstream({ failWithStatus: 503 });
    good = await startFakeUpstream({ reply: "from the good one" });
  });

  after(async () => {
    await harness.close();
    await Promise.all([keyed.close(), failing.close(), good.close()]);
  });

  /** llmgw's own question to the model, as a guard model is asked. */
  const askInternally = (model: CatalogModel) =>
    harness.server.gateway.callModel({ model, body: { messages: hi }, timeoutMs: 10_000, signal: new AbortController().signal }) as Promise<{
      choices: Array<{ message: { content: string } }>;
    }>;

  for (const [first, setUp] of [
    ["refuses llmgw's key (401)", () => ({ url: keyed.url, api_key: "a-wrong-key", upstream: keyed })],
    ["answers 503", () => ({ url: failing.url, upstream: failing })],
  ] as const) {
    test(`a replica that ${first} is passed over for another, by a client request and by an internal call alike`, async () => {
      const { upstream, ...profile } = setUp();
      const name = first.startsWith("refuses") ? "refused-then-good" : "failing-then-good";
      // The failing profile's priority makes it the first choice every time.
      const model = await harness.addModel({
        name,
        profiles: [
          { name: "first", engine: "external", priority: 10, ...profile },
          { name: "second", engine: "external", url: good.url },
        ],
      });
      const before = upstream.requests.length;
      const answer = await client.chat.completions.create({ model: name, messages: hi });
      assert.equal(answer.choices[0]?.message.content, "from the good one");
      const internal = await askInternally(model);
      assert.equal(internal.choices[0]?.message.content, "from the good one");
      assert.equal(upstream.requests.length, before + 2, "both callers tried the first-choice replica first");
    });
  }

  test("a lone replica that refuses llmgw's key is a 502 upstream_auth_failed naming the profile, for both callers", async () => {
    const model = await harness.addModel({ name: "refused-alone", profiles: [{ name: "only", engine: "external", url: keyed.url, api_key: "a-wrong-key" }] });
    await assert.rejects(client.chat.completions.create({ model: "refused-alone", messages: hi }), (error: unknown) => {
      assert.ok(error instanceof OpenAI.APIError, String(error));
      assert.equal(error.status, 502);
      assert.equal(error.code, "upstream_auth_failed");
      assert.match(error.message, /refused-alone\/only.*api_key/);
      return true;
    });
    await assert.rejects(askInternally(model), (error: unknown) => {
      assert.ok(error instanceof LlmgwError, String(error));
      assert.equal(error.status, 502);
      assert.equal(error.code, "upstream_auth_failed");
      assert.match(error.message, /refused-alone\/only.*api_key/);
      return true;
    });
  });

  test("a replica with the right key answers both callers", async () => {
    const model = await harness.addModel({ name: "keyed-right", profiles: [{ name: "k", engine: "external", url: keyed.url, api_key: "the-right-key" }] });
    assert.equal((await client.chat.completions.create({ model: "keyed-right", messages: hi })).choices[0]?.message.content, "from the keyed one");
    assert.equal((await askInternally(model)).choices[0]?.message.content, "from the keyed one");
    assert.equal(keyed.requests.at(-1)?.authorization, "Bearer the-right-key");
  });
});
