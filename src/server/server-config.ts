// What a running llmgw server is configured with (ServerConfig, from the command line or
// a test) and what it hands to what runs alongside it (ServerParts: `up`'s local agent)
// and to its caller (RunningServer). server.ts assembles it.
import type { Logger } from "../core/log.ts";
import type { Catalog } from "../catalog/catalog.ts";
import type { KeyService } from "../keys/key-service.ts";
import type { ReplicaTable } from "../fleet/replica-table.ts";
import type { Fleet } from "../fleet/fleet.ts";
import type { Gateway } from "../gateway/gateway.ts";
import type { ImageSettings } from "../gateway/image-parts.ts";
import type { LimitsService } from "../policy/limits.ts";
import type { Store } from "../store/store.ts";
import type { Mirror } from "../mirror/mirror.ts";
import type { SmokeTest } from "../serve/smoke-test.ts";
import type { Metrics, BudgetSpent } from "../metrics/metrics.ts";
import type { EventLog } from "../events/event-log.ts";
import type { BudgetAlerts } from "../policy/budget-alerts.ts";
import type { Notifier, NOTIFY_DEFAULTS } from "../notify/notifier.ts";
import type { ClusterMembers } from "../cluster/cluster-members.ts";
import type { Leadership } from "../cluster/leadership.ts";

export interface ServerConfig {
  dataDir: string;
  host: string;
  port: number;
  /** SQLite file path or postgres:// URL. */
  database: string;
  /** PostgreSQL only: the schema llmgw's tables live in (default public); tests give each its own. */
  databaseSchema?: string;
  maxBodyBytes?: number;
  /** A request body must arrive whole within this (408 and the connection closes). Default 30 s. */
  bodyTimeoutMs?: number;
  /** Request headers must arrive within this (408 and the connection closes). Default 60 s. */
  headerTimeoutMs?: number;
  /** How long one guard model may take on one check, a wait in its queue included. Default 10 s. */
  guardTimeoutMs?: number;
  /** An idle keep-alive connection is closed after this. Default 65 s (above common load balancers' 60 s). */
  keepAliveTimeoutMs?: number;
  /** A /v1 client that reads nothing of its answer for this long is cut off. Default 60 s. */
  stalledReaderMs?: number;
  /** Hugging Face Hub endpoint (default https://huggingface.co) and token. */
  registryEndpoint?: string;
  registryToken?: string;
  /** Fleet timings (tests shorten them): a node without a heartbeat this long is lost (default 15 s). */
  nodeTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  /** The fleet's clock (heartbeats, idle time); tests move it. */
  fleetClock?: () => number;
  /** The clock of budget periods and rate windows; tests move it. */
  limitsClock?: () => number;
  /** How often the server checks served repositories for newer revisions (default 6 h; 0: never on a schedule). */
  updateCheckIntervalMs?: number;
  /** How long a serve or update job waits for a ready replica (default 30 min). */
  replicaTimeoutMs?: number;
  /**
   * Keys read from the database within this long keep working from memory while it cannot
   * be reached (default 10 min; 0: never). --key-grace.
   */
  keyGraceMs?: number;
  /** Days raw usage rows are kept (default 30; 0: forever); the per-minute aggregates stay 400 days. */
  usageRetentionDays?: number;
  /** Days the Responses API keeps a stored response (default 30; 0: until deleted). */
  responsesRetentionDays?: number;
  /** The jobs' smoke test (default: a hello sent to the replica); tests make a revision fail it. */
  smokeTest?: SmokeTest;
  /** A secret that lets a scraper on another machine read GET /metrics (admin keys may too; loopback needs none). */
  metricsKey?: string;
  /** --metrics-host: more Host names (`name` or `name:port`) a local scraper may read /metrics by without a key. */
  metricsHosts?: string[];
  /** Spending per key in its current budget period, read at each scrape for llmgw_budget_spent_usd. */
  budgetSpent?: () => Promise<readonly BudgetSpent[]>;
  /** The address people reach this server at (behind a proxy); notifications link to its console. Default: the listening URL. */
  publicUrl?: string;
  /** The share of a key's budget announced as budget_threshold (default 0.8). */
  budgetAlertShare?: number;
  /** How often budgets' spend is read for budget events (default 5 s). */
  budgetCheckIntervalMs?: number;
  /** How long a console login lasts (default 12 h). */
  consoleSessionTtlMs?: number;
  /** Notification timings (tests shorten the backoff). */
  notify?: Partial<typeof NOTIFY_DEFAULTS>;
  /** --allow-private-webhooks: notification channels may send to private, loopback and link-local addresses (default: refused). */
  allowPrivateWebhooks?: boolean;
  /** Image parts of chat requests: limits, and whether image URLs are fetched (--image-urls, --max-image-bytes, ...; gateway/image-parts.ts). */
  images?: Partial<ImageSettings>;
  /** This server's name among those sharing the database (default: the host name). */
  serverName?: string;
  /** Where the other servers reach this one (default: where it listens). */
  advertiseUrl?: string;
  /** --cluster-secret-file, and LLMGW_CLUSTER_SECRET's value: what every server sharing the database is given. */
  clusterSecretFile?: string;
  clusterSecret?: string;
  /** How often a standby tries for the lead (default 1 s). */
  leaderPollMs?: number;
  /** Several servers: mirror fetches run on this server (by name) instead of the leader. */
  mirrorOn?: string;
  logger: Logger;
}

export interface ServerParts {
  store: Store;
  /** This server among those sharing the store, and who leads. */
  members: ClusterMembers;
  leadership: Leadership;
  mirror: Mirror;
  catalog: Catalog;
  keys: KeyService;
  replicas: ReplicaTable;
  /** This server's Fleet; only while it leads (always, on SQLite). */
  readonly fleet: Fleet;
  /** The join token agents join with (DATA_DIR/join.token). */
  joinToken: () => string;
  logger: Logger;
  config: ServerConfig;
}

/** Something started alongside the server (the local agent) that must stop with it. */
export interface Attachment {
  stop(): Promise<void>;
}

export interface RunningServer extends ServerParts {
  url: string;
  /** The /v1 gateway (its admission counters are read by tests and metrics). */
  gateway: Gateway;
  /** Budgets and rate limits of keys (spend per key for metrics: spentByKey). */
  limits: LimitsService;
  /** What GET /metrics renders. */
  metrics: Metrics;
  /** Events operators hear about, and the notifier that sends them on. */
  events: EventLog;
  notifier: Notifier;
  budgetAlerts: BudgetAlerts;
  /** The admin key created by this start (first start only); shown once, never again. */
  createdAdminKey: string | null;
  close(): Promise<void>;
}
