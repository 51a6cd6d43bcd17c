// A Fleet of its own on a test's store, with the test's clock, for tests that play the
// agents themselves (join, heartbeat and assignments as `llmgw agent` calls them, no
// engines): a catalog that accepts every definition (the fleet's own read of the weights
// is what these tests look at), a mirror that is never asked (the models are local
// files), and no tick of its own (the test runs it with checkNow). Also the report an
// agent sends for a replica it runs.
import { randomBytes } from "node:crypto";
import { Catalog } from "../../src/catalog/catalog.ts";
import { silentLogger } from "../../src/core/log.ts";
import { SecretBox } from "../../src/core/secret-box.ts";
import type { ReplicaReport, ReportedState } from "../../src/fleet/agent-protocol.ts";
import { Fleet } from "../../src/fleet/fleet.ts";
import type { FleetOptions } from "../../src/fleet/fleet-options.ts";
import { ReplicaTable } from "../../src/fleet/replica-table.ts";
import type { Store } from "../../src/store/store.ts";

/** The join token the fleet accepts. */
export const JOIN_TOKEN = "ljt_test";

export interface ClockedFleet {
  fleet: Fleet;
  catalog: Catalog;
  /** The gateway's table of replicas, as the fleet keeps it. */
  table: ReplicaTable;
  /** The fleet's clock now (ms). */
  now(): number;
  /** Moves the fleet's clock on. */
  advance(ms: number): void;
}

/** What a clocked fleet takes from the test; the rest is fixed as the module comment says. */
export type ClockedFleetOptions = Required<Pick<FleetOptions, "nodeTimeoutMs">> &
  Partial<Pick<FleetOptions, "heartbeatIntervalMs" | "inFlight" | "drainTimeoutMs" | "load">>;

/** Starts the fleet (its clock at a fixed instant); the test stops it with `fleet.stop()`. */
export async function startClockedFleet(store: Store, options: ClockedFleetOptions): Promise<ClockedFleet> {
  let now = 1_700_000_000_000;
  const table = new ReplicaTable();
  const box = SecretBox.fromKey(randomBytes(32));
  const catalog = new Catalog({ store, box, weights: { check: async () => undefined } });
  await catalog.refresh();
  const fleet = new Fleet({
    store,
    catalog,
    replicas: table,
    mirror: {
      check: async () => {
        throw new Error("these models are local files; the mirror is not asked");
      },
    },
    box,
    joinToken: () => JOIN_TOKEN,
    logger: silentLogger(),
    clock: () => now,
    // Node ages too: the test's steps are real time passing, not a wall clock jumping.
    monotonic: () => now,
    // The test runs the tick itself (checkNow).
    tickMs: 3_600_000,
    ...options,
  });
  await fleet.start();
  return {
    fleet,
    catalog,
    table,
    now: () => now,
    advance: (ms) => {
      now += ms;
    },
  };
}

/** An agent's report of a replica it runs in `state`, started at `at`; an endpoint on loopback `port` once ready. */
export function replicaReport(id: string, state: ReportedState, port: number, at: number): ReplicaReport {
  return {
    id,
    state,
    endpoint: state === "ready" ? { host: "127.0.0.1", port } : null,
    attempt: 1,
    failures: 0,
    lastError: null,
    lastErrorCode: null,
    startedAt: at,
    readyAt: state === "ready" ? at : null,
    weightsVerified: true,
  };
}
