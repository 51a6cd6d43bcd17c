// GET /metrics on a real server in this process, with a stand-in OpenAI-compatible upstream
// behind an external profile: after requests, what the scrape shows moved as it should,
// in valid text exposition format; who may read it (a request through a proxy, marked by
// X-Forwarded-For, stands for one from another machine, which a test cannot make); and
// which Host names a local request may use without a key (another name stands for a
// DNS-rebinding page in a browser on the server's machine).
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import path from "node:path";
import { BadRequestError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { startServer } from "../server/server.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream } from "../../test/support/fake-upstream.ts";
import { startJsonOnlyUpstream } from "../../test/support/json-only-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { parsePrometheusText, type Exposition } from "../../test/support/prometheus-text.ts";

const METRICS_KEY = "metrics-key-for-tests-0123456789";

async function scrape(harness: Harness): Promise<Exposition> {
  const response = await fetch(`${harness.url}/metrics`);
  const text = await response.text();
  assert.equal(response.status, 200, text);
  assert.equal(response.headers.get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  return parsePrometheusText(text);
}

function chat(harness: Harness, key: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${harness.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], ...body }),
  });
}

test("after requests, a local scrape shows them by model and status, with latencies, tokens, replicas and budgets", async () => {
  const upstream = await startFakeUpstream({ reply: "one two three" });
  const harness = await startHarness({ metrics: { budgetSpent: async () => [{ key: "team-a", spent_usd: 0.75 }] } });
  try {
    await harness.addModel({ name: "ext", profiles: [{ name: "p", engine: "external", url: upstream.url }] });
    const key = await harness.clientKey();
    for (let i = 0; i < 2; i += 1) {
      const answer = (await (await chat(harness, key, { model: "ext" })).json()) as { choices: Array<{ message: { content: string } }> };
      assert.equal(answer.choices[0]?.message.content, "one two three");
    }
    const streamed = await chat(harness, key, { model: "ext", stream: true });
    assert.match(await streamed.text(), /data: \[DONE\]/);
    const unknown = await chat(harness, key, { model: "no-such-model" });
    assert.equal(unknown.status, 404);
    await unknown.text();
    const wrongKey = await chat(harness, "not-a-key", { model: "ext" });
    assert.equal(wrongKey.status, 401);
    await wrongKey.text();
    assert.equal((await fetch(`${harness.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).status, 200);

    // The usage rows are written after the answer ends; so are the metrics, in the same call.
    const exposition = await eventually("the streamed request counted", async () => {
      const seen = await scrape(harness);
      return seen.value("llmgw_requests_total", { model: "ext", status: "200" }) === 3 ? seen : undefined;
    });
    assert.equal(exposition.value("llmgw_requests_total", { model: "-", status: "404" }), 1);
    assert.equal(exposition.value("llmgw_requests_total", { model: "-", status: "401" }), 1);
    assert.equal(exposition.value("llmgw_requests_total", { model: "-", status: "200" }), 1, "GET /v1/models");
    const everyModelLabel = new Set(
      [...exposition.families.values()].flatMap((family) => family.samples.map((sample) => sample.labels.model)).filter((label) => label !== undefined),
    );
    assert.deepEqual([...everyModelLabel].sort(), ["-", "ext"], "a name the client sent never becomes a label");

    assert.equal(exposition.value("llmgw_request_duration_seconds_count", { model: "ext" }), 3);
    assert.ok(exposition.value("llmgw_request_duration_seconds_sum", { model: "ext" })! > 0);
    assert.equal(exposition.value("llmgw_time_to_first_token_seconds_count", { model: "ext" }), 1, "the one stream");
    // The fake upstream counts 7 prompt tokens and one per word; the stream's come from the usage llmgw asked for.
    assert.equal(exposition.value("llmgw_tokens_total", { model: "ext", direction: "input" }), 21);
    assert.equal(exposition.value("llmgw_tokens_total", { model: "ext", direction: "output" }), 9);

    assert.equal(exposition.value("llmgw_inflight_requests", { model: "ext" }), 0);
    assert.equal(exposition.value("llmgw_queue_depth", { model: "ext" }), 0);
    assert.equal(exposition.value("llmgw_replicas", { model: "ext", state: "ready" }), 1);
    assert.equal(exposition.value("llmgw_replicas", { model: "ext", state: "failed" }), 0);
    assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "team-a" }), 0.75);
    assert.ok(exposition.value("process_cpu_seconds_total")! > 0);
    assert.equal(exposition.families.get("nodejs_heap_size_used_bytes")?.type, "gauge");
  } finally {
    await harness.close();
    await upstream.close();
  }
});

test("an upstream that reports a negative token count leaves /metrics working, and its count out", async () => {
  const upstream = await startJsonOnlyUpstream({ reply: "odd", usage: { prompt_tokens: -5, completion_tokens: 3, total_tokens: -2 } });
  const harness = await startHarness();
  try {
    await harness.addModel({ name: "odd", profiles: [{ name: "p", engine: "external", url: upstream.url }] });
    const key = await harness.clientKey();
    for (const stream of [false, true]) {
      const answer = await chat(harness, key, { model: "odd", stream });
      assert.equal(answer.status, 200);
      await answer.text();
    }
    const exposition = await eventually("both requests counted", async () => {
      const seen = await scrape(harness);
      return seen.value("llmgw_requests_total", { model: "odd", status: "200" }) === 2 ? seen : undefined;
    });
    // The nonsense counts are not added: the answers count as unreported, so their tokens are
    // the gateway's estimate (the text "odd" is 3 bytes), never a negative number.
    const tokens = exposition.samples("llmgw_tokens_total", { model: "odd" });
    assert.equal(exposition.value("llmgw_tokens_total", { model: "odd", direction: "output" }), 6, JSON.stringify(tokens));
    assert.ok(
      tokens.every((sample) => sample.value >= 0),
      JSON.stringify(tokens),
    );
    assert.equal((await fetch(`${harness.url}/metrics`)).status, 200, "a later scrape works too");
  } finally {
    await harness.close();
    await upstream.close();
  }
});

test("requests at a busy replica show as in flight, the ones waiting for it as queued", async () => {
  const gate = new Gate();
  const upstream = await startFakeUpstream({ beforeAnswer: gate.wait });
  const harness = await startHarness();
  try {
    await harness.addModel({ name: "one-slot", profiles: [{ name: "p", engine: "external", url: upstream.url, max_inflight: 1 }], queue_size: 4 });
    const key = await harness.clientKey();
    const answers = [chat(harness, key, { model: "one-slot" }), chat(harness, key, { model: "one-slot" }), chat(harness, key, { model: "one-slot" })];
    await eventually("one request in flight and two queued", async () => {
      const seen = await scrape(harness);
      return seen.value("llmgw_inflight_requests", { model: "one-slot" }) === 1 && seen.value("llmgw_queue_depth", { model: "one-slot" }) === 2;
    });
    gate.open();
    for (const answer of await Promise.all(answers)) {
      assert.equal(answer.status, 200);
      await answer.text();
    }
    await eventually("nothing in flight or queued, three answered", async () => {
      const seen = await scrape(harness);
      return (
        seen.value("llmgw_inflight_requests", { model: "one-slot" }) === 0 &&
        seen.value("llmgw_queue_depth", { model: "one-slot" }) === 0 &&
        seen.value("llmgw_requests_total", { model: "one-slot", status: "200" }) === 3
      );
    });
  } finally {
    await harness.close();
    await upstream.close();
  }
});

test("from elsewhere (here: through a proxy) /metrics needs the metrics key or an admin key; others get the usual error shape", async () => {
  const harness = await startHarness({ metrics: { metricsKey: METRICS_KEY } });
  try {
    const clientKey = await harness.clientKey();
    const proxied = (authorization?: string, method = "GET") =>
      fetch(`${harness.url}/metrics`, { method, headers: { "x-forwarded-for": "203.0.113.9", ...(authorization === undefined ? {} : { authorization }) } });

    const noKey = await proxied();
    assert.equal(noKey.status, 401);
    const noKeyBody = (await noKey.json()) as { error: { code: string; type: string; message: string } };
    assert.equal(noKeyBody.error.code, "missing_api_key");
    assert.equal(noKeyBody.error.type, "authentication_error");
    assert.match(noKeyBody.error.message, /metrics key/);

    const wrong = await proxied(`Bearer ${METRICS_KEY.slice(0, -1)}`);
    assert.equal(wrong.status, 401);
    const wrongBody = (await wrong.json()) as { error: { code: string; message: string } };
    assert.equal(wrongBody.error.code, "invalid_api_key");
    assert.ok(!wrongBody.error.message.includes(METRICS_KEY.slice(0, -1)), "the key sent is not echoed");

    const client = await proxied(`Bearer ${clientKey}`);
    assert.equal(client.status, 403);
    assert.equal(((await client.json()) as { error: { code: string } }).error.code, "admin_required");

    for (const key of [METRICS_KEY, harness.adminKey]) {
      const allowed = await proxied(`Bearer ${key}`);
      assert.equal(allowed.status, 200);
      assert.ok(parsePrometheusText(await allowed.text()).families.has("llmgw_requests_total"));
    }

    const posted = await proxied(`Bearer ${METRICS_KEY}`, "POST");
    assert.equal(posted.status, 405);
    assert.equal(posted.headers.get("allow"), "GET");
    await posted.text();

    const head = await fetch(`${harness.url}/metrics`, { method: "HEAD" });
    assert.equal(head.status, 200);
    assert.ok(Number(head.headers.get("content-length")) > 0);
  } finally {
    await harness.close();
  }
});

/** GET /metrics with the Host header given (fetch sets its own Host); the status and the answer's text. */
function getWithHost(harness: Harness, host: string, authorization?: string): Promise<{ status: number; text: string }> {
  const url = new URL(`${harness.url}/metrics`);
  return new Promise((resolve, reject) => {
    const request = http.get(url, { headers: { host, ...(authorization === undefined ? {} : { authorization }) } }, (response) => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", (chunk: string) => {
        text += chunk;
      });
      response.on("end", () => resolve({ status: response.statusCode ?? 0, text }));
      response.on("error", reject);
    });
    request.on("error", reject);
  });
}

test("from this machine, /metrics answers only Host names of this server without a key; another name needs the metrics key", async () => {
  const harness = await startHarness({ metrics: { metricsKey: METRICS_KEY, metricsHosts: ["prometheus.internal"] } });
  try {
    const port = new URL(harness.url).port;
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `prometheus.internal:${port}`, "prometheus.internal"]) {
      const allowed = await getWithHost(harness, host);
      assert.equal(allowed.status, 200, `${host}: ${allowed.text}`);
      assert.ok(parsePrometheusText(allowed.text).families.has("llmgw_requests_total"), host);
    }

    // A page on evil.example whose name now resolves to 127.0.0.1: the browser sends its own name.
    const rebound = await getWithHost(harness, `evil.example:${port}`);
    assert.equal(rebound.status, 403);
    const refusal = JSON.parse(rebound.text) as { error: { code: string; type: string; message: string } };
    assert.equal(refusal.error.code, "metrics_host_not_allowed");
    assert.equal(refusal.error.type, "permission_error");
    assert.match(refusal.error.message, /--metrics-host/);
    assert.doesNotMatch(rebound.text, /llmgw_/, "no metric leaks into the refusal");
    assert.equal((await getWithHost(harness, `localhost:${Number(port) + 1}`)).status, 403, "a loopback name with another port");

    for (const key of [METRICS_KEY, harness.adminKey]) {
      const withKey = await getWithHost(harness, `evil.example:${port}`, `Bearer ${key}`);
      assert.equal(withKey.status, 200, withKey.text);
    }
    assert.equal((await getWithHost(harness, `evil.example:${port}`, `Bearer ${await harness.clientKey()}`)).status, 403);
  } finally {
    await harness.close();
  }
});

test("a metrics key too short to keep a secret stops the start before the data dir is touched", async () => {
  const dataDir = path.join(mkdtempSync(path.join(tmpdir(), "llmgw-metrics-")), "data");
  try {
    await assert.rejects(
      startServer({ dataDir, host: "127.0.0.1", port: 0, database: path.join(dataDir, "llmgw.db"), logger: silentLogger(), metricsKey: "too-short" }),
      (error: unknown) => error instanceof BadRequestError && /at least 16/.test(error.message),
    );
    assert.equal(existsSync(dataDir), false);
    // A second start with a good key finds the data dir free (no lock was left behind).
    const server = await startServer({
      dataDir,
      host: "127.0.0.1",
      port: 0,
      database: path.join(dataDir, "llmgw.db"),
      logger: silentLogger(),
      metricsKey: METRICS_KEY,
    });
    await server.close();
  } finally {
    rmSync(path.dirname(dataDir), { recursive: true, force: true });
  }
});
