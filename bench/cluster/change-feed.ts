// How soon servers sharing one PostgreSQL see each other's changes: the latencies the
// cluster tests used to assert and now leave here (tests check what happens, not how fast).
//   1. change feed: a write on one server's store until another server's ChangeFeed calls
//      its subscriber (what carries a key revoked on one server to the others);
//   2. takeover: the leader's PostgreSQL session ends until a standby polling at the default
//      interval leads. The leader stops here; a leader killed with SIGKILL ends its session
//      the same way (the kernel closes its socket, PostgreSQL drops the session and its lock).
// Each is repeated and printed as p50, p95 and max. PostgreSQL: LLMGW_TEST_POSTGRES, a new schema.
//   npx tsx bench/cluster/change-feed.ts [--writes 200] [--takeovers 5]
import { randomBytes } from "node:crypto";
import { flagReader } from "../flags.ts";
import { ChangeFeed } from "../../src/cluster/change-feed.ts";
import { PostgresLeadership, type LeadershipListener } from "../../src/cluster/leadership.ts";
import { silentLogger } from "../../src/core/log.ts";
import { openStore } from "../../src/store/store.ts";
import { dropSchema, TEST_POSTGRES_URL } from "../../test/support/stores.ts";

const flag = flagReader(process.argv.slice(2));
const writes = Number(flag("writes", "BENCH_WRITES") ?? 200);
const takeovers = Number(flag("takeovers", "BENCH_TAKEOVERS") ?? 5);
const logger = silentLogger();
const spec = { database: TEST_POSTGRES_URL, schema: `llmgw_bench_${randomBytes(6).toString("hex")}` };

function summary(name: string, samples: number[]): string {
  const sorted = [...samples].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!.toFixed(1);
  return `${name}: ${samples.length} samples, p50 ${at(0.5)} ms, p95 ${at(0.95)} ms, max ${sorted[sorted.length - 1]!.toFixed(1)} ms`;
}

/** Resolves when `check` holds, polling every millisecond (a bench may spin; a test may not). */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 1));
}

const a = await openStore(spec);
const b = await openStore(spec);
try {
  const feed = new ChangeFeed({ store: b, logger, resyncMs: 3_600_000 });
  let heard = 0;
  feed.subscribe(["console_sessions"], () => {
    heard += 1;
  });
  await feed.start();
  await until(() => heard === 1); // the start's resync
  const feedMs: number[] = [];
  for (let i = 0; i < writes; i += 1) {
    const before = heard;
    const began = performance.now();
    await a.db
      .insertInto("console_sessions")
      .values({ id: `s${i}`, key_id: "k", key_hash: "h", created_at: "now", expires_at: "later" })
      .execute();
    await until(() => heard > before);
    feedMs.push(performance.now() - began);
  }
  await feed.stop();
  console.log(summary("change feed, write to heard", feedMs));

  const takeoverMs: number[] = [];
  const listener = (onLead: () => void): LeadershipListener => ({ lead: async () => onLead(), standBy: async () => undefined });
  for (let i = 0; i < takeovers; i += 1) {
    const leaderStore = await openStore(spec);
    const leader = new PostgresLeadership({ store: leaderStore, name: `leader-${i}`, logger });
    await leader.start(listener(() => undefined));
    let standbyLeads = false;
    const standby = new PostgresLeadership({ store: b, name: `standby-${i}`, logger });
    await standby.start(listener(() => (standbyLeads = true)));
    if (standbyLeads) throw new Error("the standby led while the leader's session was open");
    const began = performance.now();
    await leader.stop();
    await until(() => standbyLeads);
    takeoverMs.push(performance.now() - began);
    await standby.stop();
    await leaderStore.close();
  }
  console.log(summary("takeover, leader's session ends to standby leads", takeoverMs));
} finally {
  await a.close();
  await b.close();
  await dropSchema(spec.schema);
}
