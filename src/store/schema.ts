// Row types of every table, as Kysely sees them. Both dialects store the same shapes:
// timestamps are ISO-8601 text (sortable, and identical in SQLite and PostgreSQL), and
// structured fields are JSON text, so one migration history serves both databases.
import type { Generated } from "kysely";

export interface ModelsTable {
  id: string;
  name: string;
  /** JSON: the whole model definition as the API accepts it, minus name and timestamps. */
  definition: string;
  created_by: string;
  created_at: string;
  updated_by: string;
  updated_at: string;
}

/** One row per alias, so the database itself refuses an alias used twice. */
export interface ModelAliasesTable {
  alias: string;
  model_id: string;
}

export interface AuditLogTable {
  id: Generated<number>;
  at: string;
  actor: string;
  action: string;
  target: string;
  /** JSON: what changed, never a secret. */
  detail: string;
}

export interface ApiKeysTable {
  id: string;
  name: string;
  /** The first characters of the key, shown in listings so people can tell keys apart. */
  prefix: string;
  /** sha256 of the whole key, hex. The key itself is never stored. */
  hash: string;
  role: string;
  /** JSON array of model names, or null for every model. */
  allowed_models: string | null;
  expires_at: string | null;
  revoked_at: string | null;
  created_at: string;
  created_by: string;
  last_used_at: string | null;
  /** Requests per minute; null: not limited (0007). */
  rpm: Generated<number | null>;
  /** Tokens per minute; null: not limited. */
  tpm: Generated<number | null>;
  budget_usd: Generated<number | null>;
  /** total | day | month (UTC); null before 0007. */
  budget_period: Generated<string | null>;
  /** JSON object: model name → {rpm, tpm}, limits of one model for this key. */
  model_limits: Generated<string | null>;
  /** JSON object {input: [...], output: [...]}: guard models every request with the key is checked by (0009). */
  guards: Generated<string | null>;
}

/** What a key spent and has reserved in one budget period (src/policy/limit-store.ts). */
export interface KeyBudgetsTable {
  key_id: string;
  /** 'total', a UTC day '2026-12-01' or a UTC month '2026-12'. */
  period: string;
  /** Settled cost, in nano-USD (integers keep sums exact). */
  spent_nano: number;
  /** Upper bounds of the requests in flight, in nano-USD. */
  reserved_nano: number;
  updated_at: string;
}

/** Requests and tokens of a key (or of one model for it) in one fixed one-minute window. */
export interface KeyRateWindowsTable {
  key_id: string;
  /** A model name, or '*' for the whole key. */
  model: string;
  /** ISO start of the minute. */
  window_start: string;
  requests: number;
  /** Reserved at admission, corrected to the actual count at settlement. */
  tokens: number;
}

export interface NodesTable {
  id: string;
  name: string;
  address: string;
  labels: string;
  inventory: string;
  /** ready | lost | draining | removed */
  state: string;
  last_heartbeat: string;
  /** sha256 of the node credential, hex; the credential itself is only on the node. */
  credential_hash: string | null;
  joined_at: string | null;
  removed_at: string | null;
}

export interface ReplicasTable {
  id: string;
  model_id: string;
  profile: string;
  /** JSON array of node ids. */
  node_ids: string;
  endpoint: string | null;
  /** The per-replica engine key: only the gateway and the engine know it; never returned by the API. */
  engine_key: string | null;
  state: string;
  attempt: number;
  failures: number;
  last_error: string | null;
  started_at: string | null;
  ready_at: string | null;
  updated_at: string;
  /** Hash of the model definition the replica was made from; another one means replace it. */
  fingerprint: string | null;
  /** JSON object: node id → GPU indexes the replica holds there. */
  gpus: string | null;
  /** run | stop: what the node is told to do with it. */
  desired: string | null;
  /** JSON {needs, files}: what it takes of its nodes, and the weights files it was placed with. */
  spec: string | null;
}

/** Runtime state of a model that must outlive a restart: parking. */
export interface ModelStatesTable {
  model_id: string;
  parked_reason: string | null;
  parked_at: string | null;
  updated_at: string;
}

/** What happened that an operator should know (node_lost, model_parked, ...). */
export interface EventsTable {
  id: Generated<number>;
  at: string;
  kind: string;
  /** info | warning | critical */
  severity: string;
  /** What it is about: "node:NAME", "model:NAME". */
  subject: string;
  message: string;
  /** JSON object of structured fields (model, node, key, job, revisions); null on rows before 0010. */
  data: string | null;
}

/** A notification channel (issue 10): where events are sent, and which. */
export interface NotifyChannelsTable {
  id: string;
  name: string;
  /** webhook | slack */
  kind: string;
  /** The URL, sealed with the server's secret box: Slack's URLs are credentials, and webhook URLs often carry tokens. */
  url_sealed: string;
  /** What the API shows of the URL: scheme, host and first path segment only. */
  url_shown: string;
  /** webhook: the whsec_ signing secret, sealed; slack: null. */
  secret_sealed: string | null;
  /** JSON array of event kinds; null: every kind. */
  events: string | null;
  min_severity: string;
  /** Set when the receiver answered 410 Gone; nothing is sent until it is enabled again. */
  disabled_at: string | null;
  disabled_reason: string | null;
  created_by: string;
  created_at: string;
}

/** One event to send to one channel, with its retries (the channel's delivery log). */
export interface NotifyDeliveriesTable {
  id: Generated<number>;
  channel_id: string;
  /** The events row it came from; null for `ctl notify test`. */
  event_id: number | null;
  kind: string;
  subject: string;
  /** The event as it is sent (JSON), so a delivery does not depend on the events row. */
  event: string;
  /** pending | delivered | failed | cancelled */
  state: string;
  attempts: number;
  next_attempt_at: string | null;
  last_status: number | null;
  last_error: string | null;
  created_at: string;
  updated_at: string;
}

/** The notifier's place in the events table: events above it have been fanned out to channels. */
export interface NotifyCursorTable {
  id: number;
  last_event_id: number;
}

export interface UsageTable {
  id: Generated<number>;
  at: string;
  key_id: string | null;
  model: string;
  replica_id: string | null;
  endpoint: string;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  ttft_ms: number | null;
  duration_ms: number;
  status: number;
  stream: number;
  /** What the request cost at the model's prices, when its token counts are known (0008). */
  cost_usd: number | null;
  /** Milliseconds the guard models took on the request, when any applied (0008). */
  guard_ms: number | null;
  /** 1 when the token counts are the gateway's estimate: the upstream reported no usage (0013). */
  estimated: Generated<number>;
}

/**
 * Usage added up per minute, key and model (src/usage): kept long after the raw rows,
 * and added to by every server's flush (an upsert that adds), so reports need no raw rows.
 */
export interface UsageMinutesTable {
  /** The minute's start, ISO text (2026-11-30T10:05:00.000Z). */
  minute: string;
  /** The key's id; "" for a row without a key (a primary key column cannot be null). */
  key_id: string;
  model: string;
  requests: number;
  /** Requests that ended with a status of 400 or more (499: the client went away). */
  errors: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd: number;
  /** Requests whose token counts are the gateway's estimate (0013). */
  estimated_requests: number;
  /** JSON: sparse latency histogram of the durations (src/usage/latency-histogram.ts). */
  duration_hist: string;
  /** JSON: the same for the time to first token, of the streamed requests that got a first byte. */
  ttft_hist: string;
}

/** The same sums per hour (usage-aggregates.ts), so a report over a month reads 60 times fewer rows. */
export interface UsageHoursTable extends Omit<UsageMinutesTable, "minute"> {
  /** The hour's start, ISO text (2026-11-30T10:00:00.000Z). */
  hour: string;
}

/** One file of a mirrored model version (DATA_DIR/mirror/{model}/{version}/{file}). */
export interface MirrorFilesTable {
  model: string;
  version: string;
  file: string;
  repo: string;
  /** Full commit sha (or local content id) the file belongs to. */
  revision: string;
  /** pending | fetching | complete | failed */
  state: string;
  /** The sha256 the registry published (null when it published none). */
  sha256: string | null;
  /** The sha256 actually computed, when it differed or once complete. */
  actual_sha256: string | null;
  bytes_done: number;
  bytes_total: number | null;
  error: string | null;
  source_url: string;
  /** Size of the file on disk when its bytes were last hashed and matched (null: never, or before 0003). */
  verified_size: number | null;
  /** Its mtime then, in nanoseconds (text: exact, and wider than a double). */
  verified_mtime_ns: string | null;
  /** When that was. */
  verified_at: string | null;
  created_at: string;
  updated_at: string;
  /** The server whose disk holds this fetch's bytes (it ran or runs the fetch); null before 0012. */
  fetched_by: string | null;
}

/** What the leader read of a model's weights for one definition (fleet/weights-knowledge.ts): JSON of ModelWeights. */
export interface ModelWeightsTable {
  model_id: string;
  /** The weights source they were read from (JSON): a changed source is read anew. */
  source: string;
  weights: string;
  updated_at: string;
}

/** A server that holds the verified bytes of a mirror file (one row per server). */
export interface MirrorHoldersTable {
  model: string;
  version: string;
  file: string;
  /** The holding server's name (cluster_members.name). */
  server: string;
  sha256: string;
  size: number;
  verified_at: string;
}

/** An autoscaled model's replicas wanted, as its leader decided (src/fleet/autoscaling.ts). */
export interface ModelScalingTable {
  model_id: string;
  desired: number;
  /** The last decision (JSON: direction, from, to, why, at), or null before the first. */
  last_decision: string | null;
  updated_at: string;
}

/** A response the Responses API kept (src/gateway/responses/response-store.ts). */
export interface ResponsesTable {
  /** resp_…, made by llmgw. */
  id: string;
  /** The key that asked for it: only that key reads, chains on or deletes it. */
  key_id: string;
  previous_response_id: string | null;
  /** The model name the client asked for. */
  model: string;
  /** JSON: the input items of the request, each with its id. */
  input: string;
  /** JSON: the response object as the client got it. */
  response: string;
  created_at: string;
  expires_at: string;
}

/** One server's gateway load (src/cluster/gateway-loads.ts): JSON `{models, replicas}` of requests in flight and queued. */
export interface GatewayLoadsTable {
  server: string;
  loads: string;
  /** The database's clock (PostgreSQL) when written. */
  reported_at: string;
}

/** One llmgw server of those sharing this database (its name is its data dir's, across restarts). */
export interface ClusterMembersTable {
  name: string;
  /** Random per start of the server. */
  instance: string;
  /** Random per data dir (DATA_DIR/server.id): a restart of the same server takes its name back at once. */
  data_dir_id: string;
  /** Where the other servers reach it (its --advertise-url, else where it listens). */
  url: string;
  version: string;
  /** HMAC-SHA256 of a fixed text under the cluster secret: equal values mean equal secrets. */
  secret_check: string;
  started_at: string;
  last_seen: string;
  stopped_at: string | null;
}

/** The single row (id 1) of leadership: term is the fencing token. */
export interface ClusterLeaderTable {
  id: number;
  term: number;
  leader: string | null;
  since: string | null;
}

export interface ClusterSettingsTable {
  name: string;
  value: string;
  updated_at: string;
}

/** One row the store rewrites to learn whether writes work again after a storage fault. */
export interface StoreProbeTable {
  name: string;
  at: string;
}

/** A serve or update job: request, steps and outcome as JSON text (serve/job-rows.ts). */
export interface JobsTable {
  id: string;
  kind: string;
  state: string;
  request: string;
  steps: string;
  context: string | null;
  model: string | null;
  error: string | null;
  result: string | null;
  resumed: number;
  created_by: string;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
}

/** What the last update check found for a model with an origin repository. */
export interface ModelUpdatesTable {
  model_id: string;
  repo: string;
  /** The revision the model serves (its origin's). */
  revision: string;
  /** The newest commit of the repository's branch, or null when the check failed. */
  latest_revision: string | null;
  checked_at: string;
  error: string | null;
}

/** A console login: the browser holds the token, the store its sha256 (id) and the key's hash. */
export interface ConsoleSessionsTable {
  id: string;
  key_id: string;
  key_hash: string;
  created_at: string;
  expires_at: string;
}

export interface Database {
  models: ModelsTable;
  model_aliases: ModelAliasesTable;
  audit_log: AuditLogTable;
  api_keys: ApiKeysTable;
  nodes: NodesTable;
  replicas: ReplicasTable;
  usage: UsageTable;
  usage_minutes: UsageMinutesTable;
  usage_hours: UsageHoursTable;
  mirror_files: MirrorFilesTable;
  store_probe: StoreProbeTable;
  model_states: ModelStatesTable;
  events: EventsTable;
  notify_channels: NotifyChannelsTable;
  notify_deliveries: NotifyDeliveriesTable;
  notify_cursor: NotifyCursorTable;
  console_sessions: ConsoleSessionsTable;
  jobs: JobsTable;
  model_updates: ModelUpdatesTable;
  key_budgets: KeyBudgetsTable;
  key_rate_windows: KeyRateWindowsTable;
  mirror_holders: MirrorHoldersTable;
  model_weights: ModelWeightsTable;
  cluster_members: ClusterMembersTable;
  cluster_leader: ClusterLeaderTable;
  cluster_settings: ClusterSettingsTable;
  model_scaling: ModelScalingTable;
  gateway_loads: GatewayLoadsTable;
  responses: ResponsesTable;
}
