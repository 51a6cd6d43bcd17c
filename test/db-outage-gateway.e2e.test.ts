// The gateway through a database outage: a real `llmgw server` on PostgreSQL reached
// through the TCP fault proxy, an `external` model on a fake upstream (no engine needed),
// and a client sending a request every 100 ms with one key. The database is cut (open
// connections reset, new ones refused) for about 8 s: the key, read within --key-grace,
// keeps being answered throughout; a key never seen before gets 503 storage_unavailable
// with Retry-After at once; and the usage rows of the outage, spooled meanwhile, are in
// the database once it is back.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { eventually } from "./support/eventually.ts";
import { startFakeUpstream, type FakeUpstream } from "./support/fake-upstream.ts";
import { spawnServerViaProxy, type ServerViaProxy } from "./support/postgres-via-proxy.ts";

/** Requests the client sends while the database is cut: at one every 100 ms, about 8 s of outage. */
const REQUESTS_DURING_CUT = 80;
/** "Quickly" for a key never seen: far below the request deadlines a silent database would cost. */
const UNKNOWN_KEY_BOUND_MS = 2_000;

describe("the gateway through a database outage", { timeout: 120_000 }, () => {
  let served: ServerViaProxy | undefined;
  let upstream: FakeUpstream | undefined;

  const admin = (method: string, pathname: string, body?: unknown) => served!.admin<{ key?: string; id?: string }>(method, pathname, body);
  const chat = async (key: string) => {
    const response = await fetch(`${served!.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "ext", messages: [{ role: "user", content: "hi" }], max_tokens: 5 }),
      signal: AbortSignal.timeout(30_000),
    });
    const text = await response.text();
    return { status: response.status, retryAfter: response.headers.get("retry-after"), text };
  };

  before(async () => {
    upstream = await startFakeUpstream({ reply: "fine thanks" });
    served = await spawnServerViaProxy({
      requiredBy: "the database outage test",
      clusterSecret: "a-cluster-secret-for-the-database-outage-test-0123456789",
    });
  });

  after(async () => {
    await served?.close();
    await upstream?.close();
  });

  test("a key in use keeps being answered through an 8 s cut, a new key gets 503 at once, and the outage's usage rows reach the database", async () => {
    const model = await admin("POST", "/api/v1/models", { name: "ext", profiles: [{ name: "up", engine: "external", url: `${upstream!.url}/v1` }] });
    assert.equal(model.status, 201, JSON.stringify(model.body));
    const used = await admin("POST", "/api/v1/keys", { name: "in-use" });
    const unseen = await admin("POST", "/api/v1/keys", { name: "never-seen" });
    assert.equal(used.status, 201);
    const key = used.body.key!;
    await eventually("the model to answer", async () => (await chat(key)).status === 200);

    // The client loop: one request every 100 ms, each outcome kept.
    const outcomes: Array<{ status: number; text: string; duringCut: boolean }> = [];
    let cut = false;
    let running = true;
    const loop = (async () => {
      while (running) {
        const duringCut = cut;
        const started = Date.now();
        const answer = await chat(key).catch((error: unknown) => ({ status: 0, text: String(error), retryAfter: null }));
        outcomes.push({ status: answer.status, text: answer.text, duringCut });
        await new Promise((resolve) => setTimeout(resolve, Math.max(0, 100 - (Date.now() - started))));
      }
    })();
    try {
      await eventually("a few requests before the cut", () => outcomes.length >= 10);
      await served!.proxy.set("reset");
      await served!.proxy.set("refuse");
      cut = true;
      const cutFrom = outcomes.length;
      await eventually("requests through the cut", () => outcomes.length - cutFrom >= REQUESTS_DURING_CUT / 2);
      // Past the key cache's 5 s by now: the database is known to be unreachable.
      const askedAt = Date.now();
      const refused = await chat(unseen.body.key!);
      const refusedMs = Date.now() - askedAt;
      assert.equal(refused.status, 503, refused.text);
      assert.equal(JSON.parse(refused.text).error.code, "storage_unavailable");
      assert.ok(refused.retryAfter !== null, "the 503 says when to come back");
      assert.ok(refusedMs < UNKNOWN_KEY_BOUND_MS, `a key never seen is refused at once (took ${refusedMs} ms)`);
      // Counted by when each request started: the one in flight as the cut began started before it.
      await eventually("the rest of the cut", () => outcomes.filter((outcome) => outcome.duringCut).length >= REQUESTS_DURING_CUT);
      cut = false;
      await served!.proxy.set("forward");
      const backFrom = outcomes.length;
      await eventually("requests after the database is back", () => outcomes.length - backFrom >= 10);
    } finally {
      running = false;
      await loop;
    }

    const failed = outcomes.filter((outcome) => outcome.status !== 200);
    assert.deepEqual(failed, [], `every request of the key in use was answered (${outcomes.length} sent)`);
    assert.ok(outcomes.filter((outcome) => outcome.duringCut).length >= REQUESTS_DURING_CUT);
    assert.equal(served!.server.child.exitCode, null, `the server process exited:\n${served!.server.output()}`);

    // Usage rows: every answered request of the key, those of the outage included (spooled, then written).
    const direct = new pg.Client({ connectionString: served!.databaseUrl });
    await direct.connect();
    try {
      await eventually(
        "the usage rows of the outage in the database",
        async () => {
          const { rows } = await direct.query<{ count: string }>("select count(*) from usage where key_id = $1", [used.body.id]);
          return Number(rows[0]!.count) >= outcomes.length;
        },
        { timeoutMs: 30_000 },
      );
    } finally {
      await direct.end();
    }
    assert.match(served!.server.output(), /keys read within the last 10 min keep working from memory/);
    assert.doesNotMatch(served!.server.output(), /Unhandled 'error' event/);
  });
});
