// A real `llmgw server` process on PostgreSQL reached through the TCP fault proxy: the link
// is reset for a while and the server's sessions terminated, then the database goes
// silent (a blackhole). The process must live through all of it and serve again by
// itself; while the database is silent, /readyz and admin calls answer 503 within 5 s
// instead of hanging, and /readyz is 200 again soon after the link is back.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { eventually } from "./support/eventually.ts";
import { spawnServerViaProxy, type ServerViaProxy } from "./support/postgres-via-proxy.ts";
import { TEST_POSTGRES_URL } from "./support/stores.ts";

/** The bound: with a silent database, /readyz and admin calls answer 503 within this. */
const SILENT_BOUND_MS = 5_000;

/** What the admin calls below read of an answer. */
interface AdminBody {
  error?: { code: string };
  leader?: { name?: string };
}

describe("a server process through database faults", { timeout: 120_000 }, () => {
  const applicationName = `llmgw_dbf_${randomBytes(4).toString("hex")}`;
  let served: ServerViaProxy | undefined;

  const call = (method: string, pathname: string, body?: unknown) => served!.admin<AdminBody | null>(method, pathname, body);
  const readyz = async () => (await fetch(`${served!.url}/readyz`)).status;
  const newKey = () => call("POST", "/api/v1/keys", { name: `k-${randomBytes(4).toString("hex")}` });
  /** A key made: 201, or the answer and the server's log in the failure. */
  const keyMade = async () => {
    const made = await newKey();
    assert.equal(made.status, 201, `${JSON.stringify(made.body)}\n${served!.server.output().slice(-3000)}`);
  };
  const stillRunning = () => {
    const { server } = served!;
    assert.equal(server.child.exitCode, null, `the server process exited:\n${server.output()}`);
    assert.equal(server.child.signalCode, null, `the server process was killed:\n${server.output()}`);
  };
  /** Ends the server's PostgreSQL sessions from outside (an administrator, a failover). */
  const terminateSessions = async () => {
    const admin = new pg.Client({ connectionString: TEST_POSTGRES_URL });
    await admin.connect();
    try {
      await admin.query("select pg_terminate_backend(pid) from pg_stat_activity where application_name = $1", [applicationName]);
    } finally {
      await admin.end();
    }
  };

  before(async () => {
    served = await spawnServerViaProxy({
      requiredBy: "the database fault test",
      clusterSecret: "a-cluster-secret-for-the-database-fault-test-0123456789",
      // Marks the server's sessions, so that exactly those can be terminated.
      applicationName,
    });
    await eventually("the server to be ready", async () => (await readyz()) === 200);
  });

  after(async () => {
    await served?.close();
  });

  test("a reset link, then a silence with a write in flight and terminated sessions: 503s meanwhile, no exit, and it serves again by itself", async () => {
    await keyMade();
    await served!.proxy.set("reset");
    const during = await newKey();
    assert.equal(during.status, 503, JSON.stringify(during.body));
    assert.equal(during.body?.error?.code, "storage_unavailable");
    assert.ok(during.retryAfter !== null, "a 503 says when to come back");
    await eventually("/readyz to say not ready", async () => (await readyz()) === 503);
    // The leader's session and the change feed's were cut too; both keep trying without ending the process.
    await eventually("the leader to step down", () => /no longer leads the cluster/.test(served!.server.output()));
    await served!.proxy.set("forward");
    await eventually("the server to reconnect", async () => (await readyz()) === 200);
    await keyMade();

    // The recipe: forwarding stops with a write in flight, the server's sessions are
    // terminated meanwhile, then forwarding resumes, which resets every connection that
    // lived through it (pooled ones checked out included).
    await served!.proxy.set("blackhole");
    const inFlight = newKey();
    await eventually("/readyz to say not ready", async () => (await readyz()) === 503, { timeoutMs: 15_000 });
    await terminateSessions();
    await served!.proxy.set("forward");
    assert.equal((await inFlight).status, 503, "the write caught in the silence ends with a 503");
    await eventually("admin writes to work again", async () => (await newKey()).status === 201, { timeoutMs: 30_000 });
    await eventually("the server to lead again", async () => (await call("GET", "/api/v1/cluster")).body?.leader?.name !== undefined);
    stillRunning();
    assert.doesNotMatch(served!.server.output(), /Unhandled 'error' event|uncaught/i);
  });

  test("a silent database: /readyz and admin calls answer 503 within 5 s, and /readyz is 200 soon after it answers again", async () => {
    await keyMade();
    await served!.proxy.set("blackhole");
    const cutAt = Date.now();
    const write = await newKey();
    const writeMs = Date.now() - cutAt;
    assert.equal(write.status, 503, JSON.stringify(write.body));
    assert.equal(write.body?.error?.code, "storage_unavailable");
    assert.ok(writeMs < SILENT_BOUND_MS, `an admin write answered 503 within ${SILENT_BOUND_MS} ms (took ${writeMs} ms)`);
    await eventually("/readyz to say not ready", async () => (await readyz()) === 503);
    const notReadyMs = Date.now() - cutAt;
    assert.ok(notReadyMs < SILENT_BOUND_MS, `/readyz turned 503 within ${SILENT_BOUND_MS} ms (took ${notReadyMs} ms)`);
    // Known down now: a read fails at once rather than waiting on the database again.
    const readAt = Date.now();
    assert.equal((await call("GET", "/api/v1/audit")).status, 503);
    assert.ok(Date.now() - readAt < SILENT_BOUND_MS);

    await served!.proxy.set("forward");
    const backAt = Date.now();
    await eventually("/readyz to say ready again", async () => (await readyz()) === 200);
    const readyAgainMs = Date.now() - backAt;
    // The goal is 2 s (a probe a second while down); the bound here leaves room for a loaded CI machine.
    assert.ok(readyAgainMs < SILENT_BOUND_MS, `/readyz was 200 again within ${SILENT_BOUND_MS} ms (took ${readyAgainMs} ms)`);
    await eventually("admin writes to work again", async () => (await newKey()).status === 201, { timeoutMs: 30_000 });
    stillRunning();
    assert.doesNotMatch(served!.server.output(), /Unhandled 'error' event|uncaught/i);
    process.stdout.write(`# silent database: admin 503 after ${writeMs} ms, /readyz 503 after ${notReadyMs} ms, 200 again ${readyAgainMs} ms after recovery\n`);
  });
});
