// The mirror's view of the cluster: this server's name, the grants it signs and checks
// (grants.ts), and the servers that run now with where each is reached. The server wiring
// gives the live list through `MirrorClusterOptions`; when a holder is not running, its
// `cluster_members` row (read here, never written) says where it was and when it was
// last seen, so a refusal can name it.
import type { Store } from "../store/store.ts";
import { MirrorGrants } from "./grants.ts";
import type { MirrorClusterOptions, MirrorHolder } from "./mirror-types.ts";

export class MirrorCluster {
  readonly self: string;
  readonly grants: MirrorGrants;
  readonly #options: MirrorClusterOptions;
  readonly #store: Store;

  constructor(options: MirrorClusterOptions, store: Store, clock: () => number) {
    this.self = options.self;
    this.grants = new MirrorGrants((text) => options.mac(text), clock);
    this.#options = options;
    this.#store = store;
  }

  /** The servers running now (this one included), sorted by name. */
  async liveServers(): Promise<Array<{ name: string; url: string }>> {
    const live = await this.#options.liveServers();
    return [...live].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /** The named servers as holders: where each is reached, whether it runs, when it was last seen; sorted by name. */
  async describe(names: string[]): Promise<MirrorHolder[]> {
    if (names.length === 0) return [];
    const live = new Map((await this.liveServers()).map((server) => [server.name, server.url]));
    const rows = await this.#store.db.selectFrom("cluster_members").select(["name", "url", "last_seen"]).where("name", "in", names).execute();
    const known = new Map(rows.map((row) => [row.name, row]));
    return [...new Set(names)].sort().map((name) => ({
      name,
      url: live.get(name) ?? known.get(name)?.url ?? "",
      live: live.has(name),
      lastSeen: known.get(name)?.last_seen ?? null,
    }));
  }

  /** A server by name: whether the cluster knows it at all, and whether it runs. */
  async server(name: string): Promise<{ known: boolean; live: boolean; url: string; lastSeen: string | null }> {
    const [holder] = await this.describe([name]);
    const known = holder !== undefined && (holder.live || holder.lastSeen !== null);
    return { known, live: holder?.live ?? false, url: holder?.url ?? "", lastSeen: holder?.lastSeen ?? null };
  }
}
