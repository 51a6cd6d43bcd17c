// GET /api/v1/cluster: the servers sharing this store, where each is reached, its version,
// when it was last seen and whether it counts as running, and which one leads (with its
// term, the fencing token). `llmgw ctl cluster status` prints it.
import type { Hono } from "hono";
import type { Principal } from "../keys/key-service.ts";
import type { Store } from "../store/store.ts";
import type { ClusterMembers } from "./cluster-members.ts";

export interface ClusterRoutesOptions {
  store: Store;
  members: ClusterMembers;
}

export interface ClusterView {
  /** The server that answered. */
  self: string;
  leader: { name: string; term: number; since: string | null } | null;
  servers: Array<{ name: string; url: string; version: string; started_at: string; last_seen: string; stopped_at: string | null; live: boolean; leader: boolean }>;
}

export async function clusterView(options: ClusterRoutesOptions): Promise<ClusterView> {
  const row = await options.store.db.selectFrom("cluster_leader").selectAll().where("id", "=", 1).executeTakeFirst();
  const members = await options.members.list();
  const leaderName = row?.leader ?? null;
  const leaderLive = members.some((member) => member.name === leaderName && member.live);
  return {
    self: options.members.name,
    // A leader that is no longer seen is not presented as leading (another takes over).
    leader: leaderName === null || !leaderLive ? null : { name: leaderName, term: Number(row!.term), since: row!.since },
    servers: members.map((member) => ({ ...member, leader: leaderLive && member.name === leaderName })),
  };
}

type Env = { Variables: { principal: Principal } };

export function mountClusterRoutes(app: Hono<Env>, options: ClusterRoutesOptions): void {
  app.get("/api/v1/cluster", async (c) => c.json(await clusterView(options)));
}
