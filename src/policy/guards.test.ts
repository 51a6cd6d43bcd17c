// Guard models end to end: a real llmgw server (test/support/server-harness.ts), serving
// models behind a fake OpenAI-compatible upstream, and stand-in guards (test/support/
// stand-in-guard.ts) that read llmgw's prompt as Llama Guard 3, ShieldGemma or a JSON
// classifier would and answer in that format's exact shape. The official openai client
// sees what a client sees.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { startStandInGuard, type StandInGuard } from "../../test/support/stand-in-guard.ts";
import { eventually } from "../../test/support/eventually.ts";
import type { GuardFormat } from "./guards-formats.ts";
import type { RenderedError } from "../core/errors.ts";

const GUARD_TIMEOUT_MS = 500;

describe("guard models", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  let leaky: FakeUpstream;
  let client: OpenAI;
  let key: string;
  const guards = {} as Record<GuardFormat, StandInGuard>;
  const guardName: Record<GuardFormat, string> = { "llama-guard-3": "lg", shieldgemma: "sg", json: "jg" };

  before(async () => {
    harness = await startHarness({ guardTimeoutMs: GUARD_TIMEOUT_MS });
    upstream = await startFakeUpstream({ reply: "hello from the fake upstream" });
    leaky = await startFakeUpstream({ reply: "first you build a bomb" });
    guards["llama-guard-3"] = await startStandInGuard({
      format: "llama-guard-3",
      key: "guard-key",
      unsafeWords: { kill: ["S1"], hate: ["S10"], bomb: ["S9"] },
    });
    guards.shieldgemma = await startStandInGuard({ format: "shieldgemma", key: "guard-key", unsafeWords: { kill: [] } });
    guards.json = await startStandInGuard({ format: "json", key: "guard-key", unsafeWords: { kill: ["violence"], hate: ["hate"] } });
    await harness.addModel({
      name: "lg",
      role: "guard",
      guard_format: "llamaguard3",
      profiles: [{ name: "g", engine: "external", url: guards["llama-guard-3"].url, api_key: "guard-key", upstream_model: "llama-guard-3-1b" }],
    });
    await harness.addModel({
      name: "sg",
      role: "guard",
      guard_format: "shieldgemma",
      profiles: [{ name: "g", engine: "external", url: guards.shieldgemma.url, api_key: "guard-key" }],
    });
    await harness.addModel({
      name: "jg",
      role: "guard",
      guard_format: "json",
      profiles: [{ name: "g", engine: "external", url: guards.json.url, api_key: "guard-key" }],
    });
    for (const [format, name] of Object.entries(guardName)) {
      await harness.addModel({ name: `chat-${name}`, guards: { input: [name] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
      assert.ok(format);
    }
    await harness.addModel({ name: "answers-checked", guards: { output: ["lg"] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
    await harness.addModel({ name: "leaky", guards: { output: ["lg"] }, profiles: [{ name: "up", engine: "external", url: leaky.url }] });
    key = await harness.clientKey();
    client = new OpenAI({ apiKey: key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstream.close();
    await leaky.close();
    await Promise.all(Object.values(guards).map((guard) => guard.close()));
  });

  /** Posts to the client API; the tests read the body of refused requests only, in OpenAI's error shape. */
  const post = async (pathname: string, body: unknown) => {
    const response = await fetch(`${harness.url}${pathname}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    return { status: response.status, headers: response.headers, body: (await response.json()) as RenderedError["body"] };
  };

  test("the catalog takes guards that exist and are guards, and keeps them while they are named", async () => {
    assert.equal(harness.server.catalog.get("lg").definition.guard_format, "llama-guard-3", "llamaguard3 is stored as llama-guard-3");
    const profiles = [{ name: "up", engine: "external", url: upstream.url }];
    const missing = await harness.admin("POST", "/api/v1/models", { name: "m1", guards: { input: ["nope"] }, profiles });
    assert.equal(missing.status, 400);
    assert.equal(missing.body.error.param, "guards.input.0");
    assert.match(missing.body.error.message, /guard model 'nope' does not exist/);
    const notGuard = await harness.admin("POST", "/api/v1/models", { name: "m2", guards: { output: ["chat-lg"] }, profiles });
    assert.equal(notGuard.status, 400);
    assert.match(notGuard.body.error.message, /'chat-lg' is not a guard model \(its role is serve\)/);
    const guardedGuard = await harness.admin("POST", "/api/v1/models", {
      name: "g2",
      role: "guard",
      guard_format: "json",
      guards: { input: ["lg"] },
      profiles,
    });
    assert.equal(guardedGuard.status, 400);
    assert.match(guardedGuard.body.error.message, /a guard model cannot itself have guards/);
    const onErrorOnServe = await harness.admin("POST", "/api/v1/models", { name: "m3", guard_on_error: "allow", profiles });
    assert.equal(onErrorOnServe.status, 400);
    assert.equal(onErrorOnServe.body.error.param, "guard_on_error");

    const deleted = await harness.admin("DELETE", "/api/v1/models/lg");
    assert.equal(deleted.status, 409);
    assert.equal(deleted.body.error.code, "guard_in_use");
    assert.match(deleted.body.error.message, /^Model 'lg' is a guard of models 'answers-checked', 'chat-lg', 'leaky', and this change/);
    assert.equal((await harness.admin("PATCH", "/api/v1/models/lg", { role: "serve", guard_format: null })).status, 409);
    assert.equal((await harness.admin("PATCH", "/api/v1/models/lg", { name: "lg-renamed" })).status, 409);
    // Renamed with the old name kept as an alias, the references still hold.
    assert.equal((await harness.admin("PATCH", "/api/v1/models/lg", { name: "lg-renamed", aliases: ["lg"] })).status, 200);
    assert.equal((await harness.admin("PATCH", "/api/v1/models/lg-renamed", { name: "lg", aliases: [] })).status, 200);
    // PATCH of guards merges the sides.
    const patched = await harness.admin("PATCH", "/api/v1/models/answers-checked", { guards: { input: ["jg"] } });
    assert.equal(patched.status, 200, JSON.stringify(patched.body));
    assert.deepEqual(harness.server.catalog.get("answers-checked").definition.guards, { input: ["jg"], output: ["lg"] });
    assert.equal((await harness.admin("PATCH", "/api/v1/models/answers-checked", { guards: { input: [] } })).status, 200);
  });

  for (const format of ["llama-guard-3", "shieldgemma", "json"] as const) {
    test(`${format}: a safe request passes to the model, an unsafe one is refused with 400 before it`, async () => {
      const guard = guards[format];
      const model = `chat-${guardName[format]}`;
      const answer = await client.chat.completions.create({
        model,
        messages: [
          { role: "system", content: "Be brief." },
          { role: "user", content: "Tell me about bread." },
        ],
      });
      assert.equal(answer.choices[0]?.message.content, "hello from the fake upstream");
      const asked = guard.questions.at(-1)!;
      assert.equal(asked.check, "input");
      assert.match(asked.judged, /Tell me about bread\./);
      assert.equal(asked.authorization, "Bearer guard-key", "the guard is asked with its profile's key");
      assert.equal(asked.body.temperature, 0);

      const upstreamRequests = upstream.requests.length;
      const refused = await client.chat.completions
        .create({ model, messages: [{ role: "user", content: "How do I kill the process of my neighbour?" }] })
        .catch((error: unknown) => error);
      assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
      assert.equal(refused.status, 400);
      assert.equal(refused.code, "content_policy_violation");
      assert.match(refused.message, new RegExp(`Refused by guard model '${guardName[format]}': the request has unsafe content`));
      assert.equal(upstream.requests.length, upstreamRequests, "the model never saw the unsafe request");
    });
  }

  test("the 400 names Llama Guard 3's categories by name", async () => {
    const refused = await post("/v1/chat/completions", { model: "chat-lg", messages: [{ role: "user", content: "I hate them and want to kill them" }] });
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error.code, "content_policy_violation");
    assert.equal(refused.body.error.message, "Refused by guard model 'lg': the request has unsafe content (S1 Violent Crimes, S10 Hate).");
    assert.equal(guards["llama-guard-3"].questions.at(-1)!.body.model, "llama-guard-3-1b", "the guard gets its upstream model name");
  });

  test("ShieldGemma's Yes names the harm types checked; the JSON guard's own categories are named", async () => {
    const shield = await post("/v1/chat/completions", { model: "chat-sg", messages: [{ role: "user", content: "kill" }] });
    assert.match(shield.body.error.message, /\(Dangerous Content, Harassment, Hate Speech, Sexually Explicit\)\.$/);
    const json = await post("/v1/chat/completions", { model: "chat-jg", messages: [{ role: "user", content: "kill with hate" }] });
    assert.match(json.body.error.message, /\(violence, hate\)\.$/);
  });

  for (const behaviour of ["garbled", "error", "hang"] as const) {
    test(`a guard that is ${behaviour === "hang" ? "silent past the guard timeout" : behaviour === "error" ? "failing (HTTP 500)" : "answering garbage"} refuses with 503, or lets the request pass with guard_on_error allow`, async () => {
      const guard = guards["llama-guard-3"];
      guard.behaviour = behaviour;
      try {
        const upstreamRequests = upstream.requests.length;
        const failed = await post("/v1/chat/completions", { model: "chat-lg", messages: [{ role: "user", content: "Tell me about bread." }] });
        assert.equal(failed.status, 503);
        assert.equal(failed.body.error.code, "guard_unavailable");
        assert.match(failed.body.error.message, /^Guard model 'lg' could not check the request \(/);
        const why = {
          garbled: /its answer is not a llama-guard-3 verdict: "I'm sorry/,
          error: /answered HTTP 500: the guard engine failed/,
          hang: /did not answer within 0\.5 s/,
        }[behaviour];
        assert.match(failed.body.error.message, why);
        assert.ok(failed.headers.get("retry-after") !== null);
        assert.equal(upstream.requests.length, upstreamRequests, "fail closed: the model was not asked");

        assert.equal((await harness.admin("PATCH", "/api/v1/models/lg", { guard_on_error: "allow" })).status, 200);
        const passed = await client.chat.completions.create({ model: "chat-lg", messages: [{ role: "user", content: "Tell me about bread." }] });
        assert.equal(passed.choices[0]?.message.content, "hello from the fake upstream");
      } finally {
        guard.behaviour = "verdict";
        await harness.admin("PATCH", "/api/v1/models/lg", { guard_on_error: null });
      }
    });
  }

  test("an output guard holds a non-stream answer: an unsafe one never reaches the client, a safe one does", async () => {
    const guard = guards["llama-guard-3"];
    const refused = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "leaky", messages: [{ role: "user", content: "Tell me a story." }] }),
    });
    assert.equal(refused.status, 400);
    const text = await refused.text();
    assert.doesNotMatch(text, /first you build a bomb/, "nothing of the answer is sent");
    assert.equal(JSON.parse(text).error.message, "Refused by guard model 'lg': the answer has unsafe content (S9 Indiscriminate Weapons).");
    const asked = guard.questions.at(-1)!;
    assert.equal(asked.check, "output");
    assert.equal(asked.judged, "first you build a bomb");
    assert.match(asked.body.messages?.[0]?.content ?? "", /User: Tell me a story\.\n\nAgent: first you build a bomb\n\n<END CONVERSATION>/);

    const safe = await client.chat.completions.create({ model: "answers-checked", messages: [{ role: "user", content: "Hi" }] });
    assert.equal(safe.choices[0]?.message.content, "hello from the fake upstream");
    assert.equal(guard.questions.at(-1)!.judged, "hello from the fake upstream");
    assert.equal(safe.usage?.total_tokens, 12, "the held answer reaches the client whole");
  });

  test("a client that leaves while its answer is being checked cancels the guard's question", async () => {
    // A server whose guard timeout is far away, so only the client's leaving can end the question.
    const patient = await startHarness({ guardTimeoutMs: 600_000 });
    const guard = await startStandInGuard({ format: "llama-guard-3", unsafeWords: {} });
    try {
      guard.behaviour = "hang";
      await patient.addModel({ name: "lg", role: "guard", guard_format: "llama-guard-3", profiles: [{ name: "g", engine: "external", url: guard.url }] });
      await patient.addModel({ name: "checked", guards: { output: ["lg"] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
      const controller = new AbortController();
      const request = fetch(`${patient.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${patient.adminKey}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "checked", messages: [{ role: "user", content: "Hi" }] }),
        signal: controller.signal,
      }).catch((error: unknown) => error);
      await eventually("the output guard to be asked", () => guard.questions.length === 1);
      assert.equal(guard.questions[0]!.check, "output");
      controller.abort();
      assert.ok((await request) instanceof Error);
      await eventually("the guard's question to be cancelled", () => guard.cancelled() === 1);
    } finally {
      await patient.close();
      await guard.close();
    }
  });

  test("completions prompts and embeddings input are checked; token ids are refused on a guarded model", async () => {
    await harness.addModel({ name: "text-lg", guards: { input: ["lg"] }, profiles: [{ name: "up", engine: "external", url: upstream.url }] });
    const refused = await post("/v1/completions", { model: "text-lg", prompt: ["a poem", "about how to kill"] });
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error.code, "content_policy_violation");
    assert.equal(guards["llama-guard-3"].questions.at(-1)!.judged, "a poem\nabout how to kill");
    assert.equal((await post("/v1/completions", { model: "text-lg", prompt: "a poem about bread" })).status, 200);
    assert.equal((await post("/v1/embeddings", { model: "text-lg", input: ["hate speech sample"] })).body.error.code, "content_policy_violation");
    assert.equal((await post("/v1/embeddings", { model: "text-lg", input: "bread" })).status, 200);
    const tokens = await post("/v1/completions", { model: "text-lg", prompt: [1, 2, 3] });
    assert.equal(tokens.status, 400);
    assert.equal(tokens.body.error.param, "prompt");
    assert.match(tokens.body.error.message, /checked by guard models, which read text/);
  });
});
