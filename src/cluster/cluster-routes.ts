// GET /api/v1/cluster: the servers sharing this store, where each is reached, its version,
// when it was last seen and whether it counts as running, and which one leads (with its
// term, the fencing token). `llmgw ctl cluster status` prints it.
//
// The answering server's own leadership comes first: on SQLite (one server, SoleLeadership)
// nothing writes the leader row, yet that server leads; on PostgreSQL a server that holds
// the lock wrote the row itself when it took the lead. Other servers are read from the row.
import type { Hono } from "hono";
import type { Principal } from "../keys/key-service.ts";
import type { Store } from "../store/store.ts";
import type { ClusterMembers } from "./cluster-members.ts";
import type { Leadership } from "./leadership.ts";

export interface ClusterRoutesOptions {
  store: Store;
  members: ClusterMembers;
  /** This server's leadership: whether it leads now, and with which term. */
  leadership: Pick<Leadership, "leading" | "term">;
}

export interface ClusterView {
  /** The server that answered. */
  self: string;
  leader: { name: string; term: number; since: string | null } | null;
  servers: Array<{
    name: string;
    url: string;
    version: string;
    started_at: string;
    last_seen: string;
    stopped_at: string | null;
    live: boolean;
    leader: boolean;
  }>;
}

export async function clusterView(options: ClusterRoutesOptions): Promise<ClusterView> {
  const row = await options.store.db.selectFrom("cluster_leader").selectAll().where("id", "=", 1).executeTakeFirst();
  const members = await options.members.list();
  const self = options.members.name;
  if (options.leadership.leading) {
    const since = row?.leader === self ? row.since : (members.find((member) => member.name === self)?.started_at ?? null);
    return {
      self,
      leader: { name: self, term: options.leadership.term ?? Number(row?.term ?? 0), since },
      servers: members.map((member) => ({ ...member, leader: member.name === self })),
    };
  }
  // Another server leads: what the row says, while that server is seen. This one does not
  // lead, whatever the row says of it (a lead it lost and has not been taken yet).
  const leaderName = row?.leader === self ? null : (row?.leader ?? null);
  const leaderLive = members.some((member) => member.name === leaderName && member.live);
  return {
    self,
    // A leader that is no longer seen is not presented as leading (another takes over).
    leader: leaderName === null || !leaderLive ? null : { name: leaderName, term: Number(row!.term), since: row!.since },
    servers: members.map((member) => ({ ...member, leader: leaderLive && member.name === leaderName })),
  };
}

type Env = { Variables: { principal: Principal } };

export function mountClusterRoutes(app: Hono<Env>, options: ClusterRoutesOptions): void {
  app.get("/api/v1/cluster", async (c) => c.json(await clusterView(options)));
}
