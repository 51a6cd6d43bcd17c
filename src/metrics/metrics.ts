// Prometheus metrics of one llmgw server: what the gateway counts as requests end
// (requests, latencies, tokens), what is read from the fleet and the gateway when
// Prometheus scrapes (in flight, queued, replicas by state, parking, nodes, budgets), and
// the process's own metrics. GET /metrics renders them (metrics-route.ts). The alert
// rules in deploy/prometheus/alerts.yml compare these series with each other: a replica
// count with the model's scaling.min, a queue depth with its queue_size, spending with
// the budget, so each setting an alert needs is exported next to what it limits.
//
// Each server has its own prom-client Registry, never the library's global one, so two
// servers in one process (tests, `up` with its agent) keep apart. Process metrics are the
// exception: they describe the process, not a server, and prom-client's collectors for
// them (event loop delay, GC) start monitors that can never be stopped, so they are made
// once per process in a registry of their own and rendered after the server's.
//
// Label values are bounded: `model` is a catalog name or "-" (a request refused before
// its model was resolved, a model name the catalog does not know), `status` an HTTP
// status, `state` a replica or node state, `node` a joined node's name (unique: a join
// under a taken name is refused), `key` a key name with `prefix` the key's shown prefix
// (names are not unique, so the prefix tells keys of one name apart). Series of models
// removed from the catalog, and of nodes removed from the fleet, are dropped at the next
// scrape, so an alert on them ends instead of firing on forever.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import type { Logger } from "../core/log.ts";
import { describeError } from "../core/errors.ts";
import type { ReplicaState } from "../fleet/replica-table.ts";
import type { NodeState } from "../fleet/fleet-types.ts";
import type { TokenUsage } from "../core/token-usage.ts";
import { isTokenUsage } from "../gateway/usage-tap.ts";

/** The label of requests whose model is not (yet) a catalog model. */
export const UNKNOWN_MODEL = "-";

/**
 * Request latency buckets, in seconds. LLM answers span four orders of magnitude: refusals
 * and embeddings answer in milliseconds, short chats in a second or two, long generations
 * on a CPU or a busy GPU in minutes (4,096 tokens at 30 tokens/s is 137 s). Finer steps
 * below a second would only add series; the tail up to 300 s keeps long answers out of +Inf.
 */
export const DURATION_BUCKETS = [0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300];

/**
 * Time to first token buckets, in seconds: queueing plus prompt processing. A ready GPU
 * answers within tens of milliseconds, a long prompt on a CPU or a wait in the model's
 * queue (queue_timeout defaults to 30 s) takes seconds.
 */
export const TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30];

/** Every replica state, so each model has a series for each (0 included) and alerts on "no ready replica" work. */
const REPLICA_STATES = Object.keys({
  pending: true,
  placed: true,
  fetching: true,
  starting: true,
  ready: true,
  stopping: true,
  stopped: true,
  failed: true,
  parked: true,
} satisfies Record<ReplicaState, true>) as ReplicaState[];

/** Every node state, so each node has a series for each (0 included) and "lost == 1" needs no absent(). */
const NODE_STATES = Object.keys({ ready: true, lost: true, draining: true } satisfies Record<NodeState, true>) as NodeState[];

/** What the gateway reports when a /v1 request ends, whatever its outcome. */
export interface EndedRequest {
  /** The catalog name of the model, or null when the request never resolved one. */
  model: string | null;
  /** The HTTP status it ended with (499: the client left). */
  status: number;
  stream: boolean;
  /** From the request's arrival to its end. */
  seconds: number;
  /** From the arrival to the upstream's first byte; null when no replica answered. */
  ttftSeconds: number | null;
  usage: TokenUsage | null;
}

/** What the gateway calls, once per request (GatewayOptions.metrics). */
export interface RequestMetrics {
  requestEnded(ended: EndedRequest): void;
}

/** One key's spending in its current budget period. */
export interface BudgetSpent {
  /** The key's name. */
  key: string;
  /** The key's shown prefix, which tells apart keys of one name; without it the series has only `key`. */
  prefix?: string;
  spent_usd: number;
  /** The key's budget for the period; absent: no limit series for this key. */
  limit_usd?: number;
}

/** A catalog model as the metrics read it: its name and the settings alerts compare against. */
export interface MetricsModel {
  id: string;
  name: string;
  definition: {
    /** scaling.min: replicas kept running without traffic (0: on demand). */
    scaling: { min: number };
    /** Requests that may wait for a free replica. */
    queue_size: number;
  };
}

/** What is read at scrape time. */
export interface MetricsSources {
  /** The catalog's models: the only names that become `model` label values. */
  models(): readonly MetricsModel[];
  replicasOf(modelId: string): readonly { id: string; state: ReplicaState }[];
  /** Requests in flight at a replica (the gateway's admission). */
  inFlightAt(replicaId: string): number;
  /** Requests waiting in a model's queue. */
  waitingFor(modelId: string): number;
  /** Replicas the fleet wants for the model now (scaling.min, on-demand demand or autoscaling, at most max), or null when not known (then scaling.min). */
  desiredReplicas?: (modelId: string) => number | null;
  /** Whether the fleet parked the model (its supervisor gave up; `llmgw ctl model unpark` ends it). */
  isParked(modelId: string): boolean;
  /** The joined nodes; a removed node is not among them. */
  nodes(): readonly { name: string; state: NodeState }[];
  /** Spending per key in its current period (the limits' store); absent: no budget series. */
  budgetSpent?: () => Promise<readonly BudgetSpent[]>;
  /** Usage rows lost since start, and waiting in the spool for the store (usage-recorder.ts); absent: no usage row series. */
  usageRows?: () => { dropped: number; spooled: number };
}

export interface MetricsOptions {
  sources: MetricsSources;
  logger: Logger;
}

/**
 * What one model's requests have added up to. Counters are plain numbers, handed to
 * prom-client at scrape time: a prom-client increment hashes its labels every time
 * (~0.3 µs each), and a request ends with up to five of them. Histograms keep
 * prom-client's children, made once per model.
 */
interface ModelSeries {
  model: string;
  byStatus: Map<number, number>;
  duration: { observe(value: number): void };
  ttft: { observe(value: number): void };
  inputTokens: number;
  outputTokens: number;
}

export class Metrics implements RequestMetrics {
  private readonly registry = new Registry();
  private readonly duration: Histogram<"model">;
  private readonly ttft: Histogram<"model">;
  private readonly series = new Map<string, ModelSeries>();
  /** The budgets read for the scrape being rendered; cleared when a render starts. */
  private budgetRead: Promise<readonly BudgetSpent[] | null> | undefined;

  constructor(private readonly options: MetricsOptions) {
    const registers = [this.registry];
    const { sources } = options;
    const series = this.series;
    new Counter({
      name: "llmgw_requests_total",
      help: "Requests to /v1, by catalog model ('-' when none was resolved) and HTTP status (499: the client left).",
      labelNames: ["model", "status"],
      registers,
      collect() {
        this.reset();
        for (const { model, byStatus } of series.values()) {
          for (const [status, count] of byStatus) this.inc({ model, status: String(status) }, count);
        }
      },
    });
    this.duration = new Histogram({
      name: "llmgw_request_duration_seconds",
      help: "Time from a /v1 request's arrival to its end, by catalog model.",
      labelNames: ["model"],
      buckets: DURATION_BUCKETS,
      registers,
    });
    this.ttft = new Histogram({
      name: "llmgw_time_to_first_token_seconds",
      help: "Streamed requests: time from arrival to the replica's first byte (queueing and prompt processing), by catalog model.",
      labelNames: ["model"],
      buckets: TTFT_BUCKETS,
      registers,
    });
    new Counter({
      name: "llmgw_tokens_total",
      help: "Tokens of answered requests as the replica counted them, by catalog model and direction (input: prompt, output: completion).",
      labelNames: ["model", "direction"],
      registers,
      collect() {
        this.reset();
        for (const { model, inputTokens, outputTokens } of series.values()) {
          // A model whose requests never came with token counts (refusals only) has no token series.
          if (inputTokens + outputTokens === 0) continue;
          this.inc({ model, direction: "input" }, inputTokens);
          this.inc({ model, direction: "output" }, outputTokens);
        }
      },
    });
    new Gauge({
      name: "llmgw_inflight_requests",
      help: "Requests being answered by a replica now, by catalog model.",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) {
          let inFlight = 0;
          for (const replica of sources.replicasOf(model.id)) inFlight += sources.inFlightAt(replica.id);
          this.set({ model: model.name }, inFlight);
        }
      },
    });
    new Gauge({
      name: "llmgw_queue_depth",
      help: "Requests waiting in a model's queue for a free replica now, by catalog model.",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) this.set({ model: model.name }, sources.waitingFor(model.id));
      },
    });
    new Gauge({
      name: "llmgw_replicas",
      help: "Replicas by catalog model and state (every state is listed, 0 included).",
      labelNames: ["model", "state"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) {
          const counts = new Map<ReplicaState, number>(REPLICA_STATES.map((state) => [state, 0]));
          for (const replica of sources.replicasOf(model.id)) counts.set(replica.state, (counts.get(replica.state) ?? 0) + 1);
          for (const [state, count] of counts) this.set({ model: model.name, state }, count);
        }
      },
    });
    new Gauge({
      name: "llmgw_model_parked",
      help: "1 while the fleet has parked the model (its replica's supervisor gave up; 'llmgw ctl model unpark NAME' ends it), else 0, by catalog model.",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) this.set({ model: model.name }, sources.isParked(model.id) ? 1 : 0);
      },
    });
    new Gauge({
      name: "llmgw_model_min_replicas",
      help: "The model's scaling.min: replicas kept running without traffic (0: started on demand), by catalog model.",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) this.set({ model: model.name }, model.definition.scaling.min);
      },
    });
    new Gauge({
      name: "llmgw_model_desired_replicas",
      help: "Replicas the fleet wants for the model now: scaling.min, or while on demand what requests ask for, or what autoscaling decided, at most scaling.max, by catalog model.",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) this.set({ model: model.name }, sources.desiredReplicas?.(model.id) ?? model.definition.scaling.min);
      },
    });
    new Gauge({
      name: "llmgw_queue_capacity",
      help: "The model's queue_size: requests that may wait for a free replica before more get 429, by catalog model.",
      labelNames: ["model"],
      registers,
      collect() {
        this.reset();
        for (const model of sources.models()) this.set({ model: model.name }, model.definition.queue_size);
      },
    });
    new Gauge({
      name: "llmgw_nodes",
      help: "1 for each joined node's current state and 0 for its other states (ready, lost, draining), by node name; a removed node has no series.",
      labelNames: ["node", "state"],
      registers,
      collect() {
        this.reset();
        for (const node of sources.nodes()) {
          for (const state of NODE_STATES) this.set({ node: node.name, state }, node.state === state ? 1 : 0);
        }
      },
    });
    if (sources.budgetSpent !== undefined) this.registerBudgets(sources.budgetSpent);
    if (sources.usageRows !== undefined) this.registerUsageRows(sources.usageRows);
  }

  /** The usage recorder's spool: rows waiting while the store refuses them, and rows lost past its bounds. */
  private registerUsageRows(usageRows: () => { dropped: number; spooled: number }): void {
    const registers = [this.registry];
    new Counter({
      name: "llmgw_usage_rows_dropped_total",
      help: "Usage rows lost since the server started: refused by the store beyond the spool's bounds (or for a reason retrying cannot fix).",
      registers,
      collect() {
        this.reset();
        this.inc(usageRows().dropped);
      },
    });
    new Gauge({
      name: "llmgw_usage_rows_spooled",
      help: "Usage rows the store refused that wait in the spool (memory, then files in the data dir) to be written when it takes them again.",
      registers,
      collect() {
        this.set(usageRows().spooled);
      },
    });
  }

  /**
   * Spending and limits come from one read of the store per scrape: both gauges' collectors
   * await the same promise, made by the first of them to run in this render.
   */
  private registerBudgets(budgetSpent: () => Promise<readonly BudgetSpent[]>): void {
    const registers = [this.registry];
    const logger = this.options.logger;
    const read = (): Promise<readonly BudgetSpent[] | null> => {
      // Through then(): a source that throws before its promise exists is caught too.
      this.budgetRead ??= Promise.resolve()
        .then(budgetSpent)
        .catch((error: unknown) => {
          // A store that cannot answer leaves the budget metrics empty; the rest of the scrape still works.
          logger.warn(
            { err: describeError(error) },
            "metrics: reading the budgets' spending failed; llmgw_budget_spent_usd and llmgw_budget_limit_usd are left out of this scrape",
          );
          return null;
        });
      return this.budgetRead;
    };
    const labelsOf = (row: BudgetSpent) => (row.prefix === undefined ? { key: row.key } : { key: row.key, prefix: row.prefix });
    new Gauge({
      name: "llmgw_budget_spent_usd",
      help: "USD spent by each key with a budget in its current budget period, by key name and shown prefix.",
      labelNames: ["key", "prefix"],
      registers,
      async collect() {
        this.reset();
        for (const row of (await read()) ?? []) this.set(labelsOf(row), row.spent_usd);
      },
    });
    new Gauge({
      name: "llmgw_budget_limit_usd",
      help: "The budget in USD of each key with one, for its current budget period, by key name and shown prefix (spent / limit is how near the key is to being refused).",
      labelNames: ["key", "prefix"],
      registers,
      async collect() {
        this.reset();
        for (const row of (await read()) ?? []) if (row.limit_usd !== undefined) this.set(labelsOf(row), row.limit_usd);
      },
    });
  }

  /** The hot path: a map lookup, a few additions and one or two histogram observations. */
  requestEnded(ended: EndedRequest): void {
    const series = this.seriesOf(ended.model ?? UNKNOWN_MODEL);
    series.byStatus.set(ended.status, (series.byStatus.get(ended.status) ?? 0) + 1);
    series.duration.observe(ended.seconds);
    if (ended.stream && ended.ttftSeconds !== null) series.ttft.observe(ended.ttftSeconds);
    // Counts the gateway read are checked already (usage-tap.ts); a caller's that are not
    // whole numbers >= 0 are left out here too, since one negative count would make every
    // later scrape throw.
    if (ended.usage !== null && isTokenUsage(ended.usage)) {
      series.inputTokens += ended.usage.prompt_tokens;
      series.outputTokens += ended.usage.completion_tokens;
    }
  }

  /** The text exposition format: this server's metrics, then the process's. */
  async render(): Promise<string> {
    this.dropRemovedModels();
    this.budgetRead = undefined;
    const [own, process] = await Promise.all([this.registry.metrics(), processRegistry().metrics()]);
    return own + process;
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  private seriesOf(model: string): ModelSeries {
    let series = this.series.get(model);
    if (series === undefined) {
      series = {
        model,
        byStatus: new Map(),
        duration: this.duration.labels(model),
        ttft: this.ttft.labels(model),
        inputTokens: 0,
        outputTokens: 0,
      };
      this.series.set(model, series);
    }
    return series;
  }

  /** A model gone from the catalog stops being reported (its name cannot come back by a request). */
  private dropRemovedModels(): void {
    if (this.series.size === 0) return;
    const current = new Set(this.options.sources.models().map((model) => model.name));
    for (const model of this.series.keys()) {
      if (model === UNKNOWN_MODEL || current.has(model)) continue;
      this.duration.remove(model);
      this.ttft.remove(model);
      this.series.delete(model);
    }
  }
}

let sharedProcessRegistry: Registry | undefined;

/** Node.js and process metrics (process_cpu_seconds_total, nodejs_eventloop_lag_seconds, ...), unprefixed as dashboards expect. */
function processRegistry(): Registry {
  if (sharedProcessRegistry === undefined) {
    sharedProcessRegistry = new Registry();
    collectDefaultMetrics({ register: sharedProcessRegistry });
  }
  return sharedProcessRegistry;
}
