// Usage you can read, end to end: a real server in this process, an `external` model on a
// fake OpenAI-compatible upstream (test/support/fake-upstream.ts, which sends token counts
// in a stream only when asked with stream_options.include_usage, as OpenAI's API does),
// the official openai client, GET /api/v1/usage and `llmgw ctl usage` as a child process.
// The streamed request does not ask for usage: the gateway asks the upstream itself, and
// its tokens and cost reach the raw row and the per-minute aggregates.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { startHarness, type Harness } from "./support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "./support/fake-upstream.ts";
import { eventually } from "./support/eventually.ts";
import { openStore } from "../src/store/store.ts";
import { UsageRecorder } from "../src/gateway/usage-recorder.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

/** The fake upstream's reply: five words, so five completion tokens; it counts 7 prompt tokens. */
const REPLY = "usage is counted per request";
const PRICES = { input_per_million: 3, output_per_million: 15 };
const COST = (7 * 3 + 5 * 15) / 1_000_000;

describe("usage reports", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  let failing: FakeUpstream;
  let client: OpenAI;

  before(async () => {
    harness = await startHarness();
    upstream = await startFakeUpstream({ reply: REPLY });
    failing = await startFakeUpstream({ failWithStatus: 500 });
    await harness.addModel({
      name: "metered",
      aliases: ["metered-alias"],
      prices: PRICES,
      profiles: [{ name: "up", engine: "external", url: `${upstream.url}/v1` }],
    });
    await harness.addModel({ name: "broken", profiles: [{ name: "up", engine: "external", url: `${failing.url}/v1` }] });
    const created = await harness.admin("POST", "/api/v1/keys", { name: "reporter" });
    assert.equal(created.status, 201, JSON.stringify(created.body));
    client = new OpenAI({ apiKey: created.body.key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
  });

  after(async () => {
    await harness.close();
    await upstream.close();
    await failing.close();
  });

  test("a stream without include_usage: its tokens and cost are in the raw row and in GET /api/v1/usage", async () => {
    const stream = await client.chat.completions.create({ model: "metered-alias", messages: [{ role: "user", content: "hi" }], stream: true });
    let text = "";
    for await (const chunk of stream) {
      assert.equal(chunk.usage ?? null, null, "the client did not ask for usage, so it gets none");
      text += chunk.choices[0]?.delta.content ?? "";
    }
    assert.equal(text, REPLY);
    assert.equal(upstream.requests.at(-1)?.body.stream_options?.include_usage, true, "the gateway asked the upstream for the counts");
    await assert.rejects(
      client.chat.completions.create({ model: "broken", messages: [{ role: "user", content: "hi" }] }),
      (error: unknown) => error instanceof OpenAI.APIError && error.status === 500,
    );

    const raw = await eventually(
      "the stream's usage row",
      async () => (await harness.server.store.db.selectFrom("usage").selectAll().where("model", "=", "metered").where("stream", "=", 1).execute())[0],
    );
    assert.equal(raw.prompt_tokens, 7);
    assert.equal(raw.completion_tokens, 5);
    assert.ok(Math.abs(raw.cost_usd! - COST) < 1e-12, `cost ${raw.cost_usd} at the model's prices`);
    assert.equal(raw.guard_ms, null, "no guard applies here");
    assert.ok(raw.ttft_ms !== null);
    await eventually(
      "the failed request's row",
      async () => (await harness.server.store.db.selectFrom("usage").select("id").where("model", "=", "broken").execute()).length === 1,
    );

    const report = await harness.admin("GET", "/api/v1/usage?group_by=key,model");
    assert.equal(report.status, 200, JSON.stringify(report.body));
    const rows = report.body.data as Array<Record<string, unknown>>;
    assert.deepEqual(
      rows.map((r) => [r.period, r.key, r.model, r.requests, r.errors, r.prompt_tokens, r.completion_tokens]),
      [
        [null, "reporter", "broken", 1, 1, 0, 0],
        [null, "reporter", "metered", 1, 0, 7, 5],
      ],
    );
    const metered = rows[1]!;
    assert.ok(Math.abs((metered.cost_usd as number) - COST) < 1e-9);
    // One request: its p50 and p95 are its own duration, read back from a histogram bucket (within 4.4%).
    for (const [field, exact] of [
      ["p50_ms", raw.duration_ms],
      ["p95_ms", raw.duration_ms],
      ["ttft_p50_ms", raw.ttft_ms!],
    ] as const) {
      const value = metered[field] as number;
      assert.ok(Math.abs(value - exact) <= exact * 0.045 + 0.5, `${field} ${value} reads back the row's ${exact} ms`);
    }

    const byAlias = await harness.admin("GET", "/api/v1/usage?model=metered-alias&key=reporter&group_by=day");
    assert.equal(byAlias.status, 200);
    assert.equal(byAlias.body.data.length, 1);
    assert.equal(byAlias.body.data[0].period, `${raw.at.slice(0, 10)}T00:00:00.000Z`);
    assert.equal(byAlias.body.data[0].model, null, "not grouped by model, so null");
    assert.equal(byAlias.body.data[0].requests, 1);
    const byMinute = await harness.admin("GET", "/api/v1/usage?model=metered&group_by=minute");
    assert.equal(byMinute.status, 200, JSON.stringify(byMinute.body));
    assert.deepEqual(
      byMinute.body.data.map((row: { period: string; requests: number }) => [row.period, row.requests]),
      [[`${raw.at.slice(0, 16)}:00.000Z`, 1]],
      "the request's own minute",
    );
    const earlier = await harness.admin("GET", "/api/v1/usage?from=2020-01-01&to=2020-01-02");
    assert.deepEqual(earlier.body.data, [], "nothing outside the window");
    assert.equal(earlier.body.total.requests, 0);
    assert.equal(report.body.total.requests, 2, "the total line adds up every row");
    assert.equal(report.body.total.ttft_p50_ms, metered.ttft_p50_ms, "and its time to first token is the stream's alone");
  });

  test("a bad usage query is a 400 that names the field; a client key may not read usage", async () => {
    const cases: Array<[string, string, RegExp]> = [
      ["group_by=week", "group_by", /'week' is not one of key, model, minute, hour, day/],
      ["group_by=hour,day", "group_by", /one of minute, hour or day, not several/],
      ["group_by=minute&from=2026-11-01", "group_by", /per minute, the span from 'from' to 'to' may be at most 48 hours/],
      ["from=yesterday", "from", /ISO date/],
      ["from=2026-11-30T10:00:00", "from", /with a zone/],
      ["from=2026-11-30&to=2026-11-29", "to", /must be after from/],
      ["key=nobody", "key", /no API key has the name, id or prefix 'nobody'/],
      ["limit=5", "", /limit/],
    ];
    for (const [query, param, message] of cases) {
      const answer = await harness.admin("GET", `/api/v1/usage?${query}`);
      assert.equal(answer.status, 400, `${query}: ${JSON.stringify(answer.body)}`);
      if (param !== "") assert.equal(answer.body.error.param, param, query);
      assert.match(answer.body.error.message, message, query);
    }
    const forbidden = await fetch(`${harness.url}/api/v1/usage`, { headers: { authorization: `Bearer ${await harness.clientKey()}` } });
    assert.equal(forbidden.status, 403);
  });

  test("llmgw ctl usage prints the aggregates as a table, and JSON with --json", async () => {
    const ctl = (args: string[]) =>
      run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "usage", ...args], {
        env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
      });
    await eventually("both requests in the aggregates", async () => (await harness.admin("GET", "/api/v1/usage")).body.data[0]?.requests === 2);
    const { stdout } = await ctl(["--by", "model", "--since", "1d"]);
    const lines = stdout.trimEnd().split("\n");
    assert.match(lines[0]!, /^MODEL\s+REQUESTS\s+ERRORS\s+PROMPT TOK\s+COMPLETION TOK\s+ESTIMATED\s+COST\s+P50\s+P95\s+TTFT P50$/);
    // The 500 answered a request that was not streamed, so it has no time to first token.
    assert.match(lines[1]!, /^broken\s+1\s+1\s+0\s+0\s+0\s+\$0\s+\d+ ms\s+\d+ ms\s+-$/);
    assert.match(lines[2]!, /^metered\s+1\s+0\s+7\s+5\s+0\s+\$0\.000096\s+\d+ ms\s+\d+ ms\s+\d+ ms$/);
    assert.match(lines[3]!, /^TOTAL\s+2\s+1\s+7\s+5\s+0\s+\$0\.000096\s+\d+ ms\s+\d+ ms\s+\d+ ms$/, "the total has the percentiles of all requests");

    const { stdout: json } = await ctl(["--by", "key", "--key-name", "reporter", "--json"]);
    assert.deepEqual(
      (JSON.parse(json) as Array<{ key: string; requests: number }>).map((r) => [r.key, r.requests]),
      [["reporter", 2]],
    );
    const { stdout: none } = await ctl(["--model", "never-served", "--since", "7d", "--key-name", "reporter"]);
    assert.equal(none, "No usage in the last 7d for key 'reporter' of model 'never-served'.\n");
    await assert.rejects(ctl(["--since", "last week"]), (error: { stderr?: string }) => /Invalid --since 'last week'/.test(error.stderr ?? ""));
  });
});

test("a starting server deletes raw usage rows past the retention and keeps their aggregates", async () => {
  // A data dir whose database already holds a 40-day-old and a 1-day-old request.
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-usage-retention-"));
  const store = await openStore({ database: path.join(dataDir, "llmgw.db") });
  const recorder = new UsageRecorder({ store });
  const daysAgo = (days: number) => new Date(Date.now() - days * 86_400_000).toISOString();
  const yesterday = daysAgo(1);
  for (const at of [daysAgo(40), yesterday]) {
    recorder.record({
      at,
      key_id: "old-key",
      model: "m",
      replica_id: null,
      endpoint: "/v1/chat/completions",
      prompt_tokens: 1,
      completion_tokens: 1,
      ttft_ms: null,
      duration_ms: 10,
      status: 200,
      stream: 0,
      cost_usd: null,
      guard_ms: null,
    });
  }
  await recorder.close();
  await store.close();

  const harness = await startHarness({ dataDir });
  try {
    const left = await eventually("the 40-day-old row to go (default retention 30 days)", async () => {
      const rows = await harness.server.store.db.selectFrom("usage").select("at").execute();
      return rows.length === 1 && rows;
    });
    assert.equal(left[0]!.at, yesterday, "the recent row stays");
    const report = await harness.admin("GET", `/api/v1/usage?from=${encodeURIComponent(daysAgo(60))}`);
    assert.equal(report.body.data[0]?.requests, 2, "both requests are still in the aggregates");
  } finally {
    await harness.close();
  }
});
