// The metrics of one server, without a server: what requestEnded counts, what the
// collectors read from their sources at each scrape, that the output is valid text
// exposition format, and that two servers' metrics in one process stay apart.
import { test } from "node:test";
import assert from "node:assert/strict";
import { silentLogger } from "../core/log.ts";
import type { ReplicaState } from "../fleet/replica-table.ts";
import type { NodeState } from "../fleet/fleet-types.ts";
import { parsePrometheusText, type Exposition } from "../../test/support/prometheus-text.ts";
import { Metrics, type BudgetSpent, type MetricsModel, type MetricsSources } from "./metrics.ts";

/** A fleet in plain maps, changed by the tests between scrapes. */
function fakeFleet() {
  const models = new Map<string, string>([["m-chat", "chat"]]);
  /** Definitions by model id; a model without one has the catalog's defaults (min 1, queue_size 100). */
  const definitions = new Map<string, MetricsModel["definition"]>();
  const replicas = new Map<string, Array<{ id: string; state: ReplicaState }>>();
  const inFlight = new Map<string, number>();
  const waiting = new Map<string, number>();
  const parked = new Set<string>();
  const nodes: Array<{ name: string; state: NodeState }> = [];
  const sources: MetricsSources = {
    models: () => [...models].map(([id, name]) => ({ id, name, definition: definitions.get(id) ?? { scaling: { min: 1 }, queue_size: 100 } })),
    replicasOf: (modelId) => replicas.get(modelId) ?? [],
    inFlightAt: (replicaId) => inFlight.get(replicaId) ?? 0,
    waitingFor: (modelId) => waiting.get(modelId) ?? 0,
    isParked: (modelId) => parked.has(modelId),
    nodes: () => nodes,
  };
  return { models, definitions, replicas, inFlight, waiting, parked, nodes, sources };
}

async function scrape(metrics: Metrics): Promise<Exposition> {
  return parsePrometheusText(await metrics.render());
}

test("requests, latencies and tokens are counted by catalog model and status; a request without a model counts as '-'", async () => {
  const metrics = new Metrics({ sources: fakeFleet().sources, logger: silentLogger() });
  metrics.requestEnded({ model: "chat", status: 200, stream: true, seconds: 0.2, ttftSeconds: 0.03, usage: { prompt_tokens: 10, completion_tokens: 5 } });
  metrics.requestEnded({ model: "chat", status: 200, stream: false, seconds: 1.5, ttftSeconds: 1.4, usage: { prompt_tokens: 7, completion_tokens: 3 } });
  metrics.requestEnded({ model: "chat", status: 429, stream: true, seconds: 0.001, ttftSeconds: null, usage: null });
  metrics.requestEnded({ model: null, status: 401, stream: false, seconds: 0.002, ttftSeconds: null, usage: null });
  metrics.requestEnded({ model: null, status: 401, stream: false, seconds: 0.002, ttftSeconds: null, usage: null });

  const exposition = await scrape(metrics);
  assert.equal(exposition.families.get("llmgw_requests_total")?.type, "counter");
  assert.equal(exposition.value("llmgw_requests_total", { model: "chat", status: "200" }), 2);
  assert.equal(exposition.value("llmgw_requests_total", { model: "chat", status: "429" }), 1);
  assert.equal(exposition.value("llmgw_requests_total", { model: "-", status: "401" }), 2);
  assert.equal(exposition.samples("llmgw_requests_total").length, 3);

  assert.equal(exposition.families.get("llmgw_request_duration_seconds")?.type, "histogram");
  assert.equal(exposition.value("llmgw_request_duration_seconds_count", { model: "chat" }), 3);
  assert.equal(exposition.value("llmgw_request_duration_seconds_bucket", { model: "chat", le: "0.025" }), 1);
  assert.equal(exposition.value("llmgw_request_duration_seconds_bucket", { model: "chat", le: "0.25" }), 2);
  assert.equal(exposition.value("llmgw_request_duration_seconds_bucket", { model: "chat", le: "2.5" }), 3);
  assert.ok(Math.abs(exposition.value("llmgw_request_duration_seconds_sum", { model: "chat" })! - 1.701) < 1e-9);
  assert.equal(exposition.value("llmgw_request_duration_seconds_count", { model: "-" }), 2);

  // Only streams have a first token worth timing; a non-stream answer's first byte is its end.
  assert.equal(exposition.value("llmgw_time_to_first_token_seconds_count", { model: "chat" }), 1);
  assert.equal(exposition.value("llmgw_time_to_first_token_seconds_bucket", { model: "chat", le: "0.025" }), 0);
  assert.equal(exposition.value("llmgw_time_to_first_token_seconds_bucket", { model: "chat", le: "0.05" }), 1);

  assert.equal(exposition.value("llmgw_tokens_total", { model: "chat", direction: "input" }), 17);
  assert.equal(exposition.value("llmgw_tokens_total", { model: "chat", direction: "output" }), 8);
  assert.equal(exposition.samples("llmgw_tokens_total", { model: "-" }).length, 0);
});

test("usage whose counts are not whole numbers >= 0 is not counted, and the scrape still works", async () => {
  const metrics = new Metrics({ sources: fakeFleet().sources, logger: silentLogger() });
  metrics.requestEnded({ model: "chat", status: 200, stream: false, seconds: 0.1, ttftSeconds: 0.1, usage: { prompt_tokens: 4, completion_tokens: 2 } });
  for (const usage of [
    { prompt_tokens: -5, completion_tokens: 3 },
    { prompt_tokens: 5, completion_tokens: -3 },
    { prompt_tokens: Number.NaN, completion_tokens: 1 },
    { prompt_tokens: 1.5, completion_tokens: 1 },
  ]) {
    metrics.requestEnded({ model: "chat", status: 200, stream: false, seconds: 0.1, ttftSeconds: 0.1, usage });
  }
  const exposition = await scrape(metrics);
  assert.equal(exposition.value("llmgw_requests_total", { model: "chat", status: "200" }), 5, "the requests count");
  assert.equal(exposition.value("llmgw_tokens_total", { model: "chat", direction: "input" }), 4);
  assert.equal(exposition.value("llmgw_tokens_total", { model: "chat", direction: "output" }), 2);
});

test("in flight, queue depth and replicas by state are read from the fleet at each scrape", async () => {
  const fleet = fakeFleet();
  fleet.models.set("m-embed", "embed");
  fleet.replicas.set("m-chat", [
    { id: "r1", state: "ready" },
    { id: "r2", state: "ready" },
    { id: "r3", state: "starting" },
  ]);
  fleet.inFlight.set("r1", 3).set("r2", 1);
  fleet.waiting.set("m-chat", 4);
  const metrics = new Metrics({ sources: fleet.sources, logger: silentLogger() });

  let exposition = await scrape(metrics);
  assert.equal(exposition.families.get("llmgw_inflight_requests")?.type, "gauge");
  assert.equal(exposition.value("llmgw_inflight_requests", { model: "chat" }), 4);
  assert.equal(exposition.value("llmgw_inflight_requests", { model: "embed" }), 0);
  assert.equal(exposition.value("llmgw_queue_depth", { model: "chat" }), 4);
  assert.equal(exposition.value("llmgw_queue_depth", { model: "embed" }), 0);
  assert.equal(exposition.value("llmgw_replicas", { model: "chat", state: "ready" }), 2);
  assert.equal(exposition.value("llmgw_replicas", { model: "chat", state: "starting" }), 1);
  assert.equal(exposition.value("llmgw_replicas", { model: "chat", state: "failed" }), 0);
  assert.equal(exposition.samples("llmgw_replicas", { model: "embed" }).length, 9, "every state, 0 included");

  fleet.inFlight.set("r1", 0);
  fleet.waiting.delete("m-chat");
  fleet.replicas.set("m-chat", [
    { id: "r2", state: "ready" },
    { id: "r3", state: "failed" },
  ]);
  exposition = await scrape(metrics);
  assert.equal(exposition.value("llmgw_inflight_requests", { model: "chat" }), 1);
  assert.equal(exposition.value("llmgw_queue_depth", { model: "chat" }), 0);
  assert.equal(exposition.value("llmgw_replicas", { model: "chat", state: "ready" }), 1);
  assert.equal(exposition.value("llmgw_replicas", { model: "chat", state: "starting" }), 0);
  assert.equal(exposition.value("llmgw_replicas", { model: "chat", state: "failed" }), 1);
});

test("parking, scaling.min and queue_size are read per model at each scrape, so alerts can compare replicas and queues with them", async () => {
  const fleet = fakeFleet();
  fleet.models.set("m-embed", "embed");
  fleet.definitions.set("m-chat", { scaling: { min: 2 }, queue_size: 50 });
  fleet.definitions.set("m-embed", { scaling: { min: 0 }, queue_size: 0 });
  fleet.parked.add("m-chat");
  const metrics = new Metrics({ sources: fleet.sources, logger: silentLogger() });

  let exposition = await scrape(metrics);
  for (const name of ["llmgw_model_parked", "llmgw_model_min_replicas", "llmgw_queue_capacity"]) {
    assert.equal(exposition.families.get(name)?.type, "gauge", name);
    assert.ok((exposition.families.get(name)?.help ?? "").length > 20, `${name} has a help text`);
  }
  assert.equal(exposition.value("llmgw_model_parked", { model: "chat" }), 1);
  assert.equal(exposition.value("llmgw_model_parked", { model: "embed" }), 0, "an unparked model has a 0 series, not none");
  assert.equal(exposition.value("llmgw_model_min_replicas", { model: "chat" }), 2);
  assert.equal(exposition.value("llmgw_model_min_replicas", { model: "embed" }), 0);
  assert.equal(exposition.value("llmgw_queue_capacity", { model: "chat" }), 50);
  assert.equal(exposition.value("llmgw_queue_capacity", { model: "embed" }), 0);

  // Unparked and edited: the next scrape says so; a removed model's series go.
  fleet.parked.delete("m-chat");
  fleet.definitions.set("m-chat", { scaling: { min: 1 }, queue_size: 200 });
  fleet.models.delete("m-embed");
  exposition = await scrape(metrics);
  assert.equal(exposition.value("llmgw_model_parked", { model: "chat" }), 0);
  assert.equal(exposition.value("llmgw_model_min_replicas", { model: "chat" }), 1);
  assert.equal(exposition.value("llmgw_queue_capacity", { model: "chat" }), 200);
  for (const name of ["llmgw_model_parked", "llmgw_model_min_replicas", "llmgw_queue_capacity"]) {
    assert.deepEqual(exposition.samples(name, { model: "embed" }), [], name);
  }
});

test("nodes have a series per state, 1 for the current one; a removed node's series go, so a lost-node alert ends", async () => {
  const fleet = fakeFleet();
  fleet.nodes.push({ name: "gpu-a", state: "ready" }, { name: "gpu-b", state: "lost" }, { name: "gpu-c", state: "draining" });
  const metrics = new Metrics({ sources: fleet.sources, logger: silentLogger() });

  let exposition = await scrape(metrics);
  assert.equal(exposition.families.get("llmgw_nodes")?.type, "gauge");
  assert.equal(exposition.samples("llmgw_nodes").length, 9, "three states for each of three nodes");
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-a", state: "ready" }), 1);
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-a", state: "lost" }), 0);
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-b", state: "lost" }), 1);
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-b", state: "ready" }), 0);
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-c", state: "draining" }), 1);

  // gpu-b sends a heartbeat again; gpu-c is removed by an operator.
  fleet.nodes.splice(0, 3, { name: "gpu-a", state: "ready" }, { name: "gpu-b", state: "ready" });
  exposition = await scrape(metrics);
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-b", state: "lost" }), 0);
  assert.equal(exposition.value("llmgw_nodes", { node: "gpu-b", state: "ready" }), 1);
  assert.deepEqual(exposition.samples("llmgw_nodes", { node: "gpu-c" }), []);
  assert.equal(exposition.samples("llmgw_nodes").length, 6);
});

test("a model removed from the catalog leaves the metrics at the next scrape", async () => {
  const fleet = fakeFleet();
  fleet.models.set("m-old", "old");
  const metrics = new Metrics({ sources: fleet.sources, logger: silentLogger() });
  metrics.requestEnded({ model: "old", status: 200, stream: true, seconds: 0.5, ttftSeconds: 0.1, usage: { prompt_tokens: 1, completion_tokens: 1 } });
  metrics.requestEnded({ model: "chat", status: 200, stream: false, seconds: 0.5, ttftSeconds: 0.4, usage: null });
  assert.equal((await scrape(metrics)).value("llmgw_requests_total", { model: "old", status: "200" }), 1);

  fleet.models.delete("m-old");
  const exposition = await scrape(metrics);
  for (const name of [
    "llmgw_requests_total",
    "llmgw_request_duration_seconds_count",
    "llmgw_time_to_first_token_seconds_count",
    "llmgw_tokens_total",
    "llmgw_replicas",
    "llmgw_queue_depth",
  ]) {
    assert.deepEqual(exposition.samples(name, { model: "old" }), [], name);
  }
  assert.equal(exposition.value("llmgw_requests_total", { model: "chat", status: "200" }), 1);

  // Created again under the same name, it starts from zero.
  fleet.models.set("m-old-2", "old");
  metrics.requestEnded({ model: "old", status: 200, stream: false, seconds: 0.5, ttftSeconds: 0.4, usage: null });
  assert.equal((await scrape(metrics)).value("llmgw_requests_total", { model: "old", status: "200" }), 1);
});

test("budget spent and limit per key come from one callback read per scrape; a failing one leaves only those metrics out", async () => {
  const fleet = fakeFleet();
  let spent: BudgetSpent[] = [
    { key: "team-a", spent_usd: 1.25, limit_usd: 10 },
    { key: "team-b", spent_usd: 0 },
  ];
  let failing = false;
  let reads = 0;
  const metrics = new Metrics({
    sources: {
      ...fleet.sources,
      budgetSpent: async () => {
        reads += 1;
        if (failing) throw new Error("database is locked");
        return spent;
      },
    },
    logger: silentLogger(),
  });
  let exposition = await scrape(metrics);
  assert.equal(exposition.families.get("llmgw_budget_spent_usd")?.type, "gauge");
  assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "team-a" }), 1.25);
  assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "team-b" }), 0);
  assert.equal(exposition.families.get("llmgw_budget_limit_usd")?.type, "gauge");
  assert.equal(exposition.value("llmgw_budget_limit_usd", { key: "team-a" }), 10);
  assert.equal(exposition.value("llmgw_budget_limit_usd", { key: "team-b" }), undefined, "a row without a limit has no limit series");
  assert.equal(reads, 1, "spending and limits come from one read of the store per scrape");

  spent = [{ key: "team-a", spent_usd: 2.5 }];
  exposition = await scrape(metrics);
  assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "team-a" }), 2.5);
  assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "team-b" }), undefined, "a key no longer listed is gone");

  // Key names are not unique: the shown prefix, when the source gives it, tells two keys of one name apart.
  spent = [
    { key: "ci", prefix: "llmgw_AAAA", spent_usd: 1, limit_usd: 5 },
    { key: "ci", prefix: "llmgw_BBBB", spent_usd: 3, limit_usd: 4 },
  ];
  exposition = await scrape(metrics);
  assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "ci", prefix: "llmgw_AAAA" }), 1);
  assert.equal(exposition.value("llmgw_budget_spent_usd", { key: "ci", prefix: "llmgw_BBBB" }), 3);
  assert.equal(exposition.samples("llmgw_budget_spent_usd").length, 2);
  assert.equal(exposition.value("llmgw_budget_limit_usd", { key: "ci", prefix: "llmgw_AAAA" }), 5);
  assert.equal(exposition.value("llmgw_budget_limit_usd", { key: "ci", prefix: "llmgw_BBBB" }), 4);
  assert.equal(exposition.samples("llmgw_budget_limit_usd").length, 2, "the key no longer listed has no limit series either");
  assert.equal(reads, 3);

  failing = true;
  exposition = await scrape(metrics);
  assert.deepEqual(exposition.samples("llmgw_budget_spent_usd"), []);
  assert.deepEqual(exposition.samples("llmgw_budget_limit_usd"), []);
  assert.equal(exposition.value("llmgw_queue_depth", { model: "chat" }), 0, "the rest of the scrape is there");

  const withoutBudgets = await scrape(new Metrics({ sources: fleet.sources, logger: silentLogger() }));
  assert.equal(withoutBudgets.families.has("llmgw_budget_spent_usd"), false);
  assert.equal(withoutBudgets.families.has("llmgw_budget_limit_usd"), false);
});

test("two servers' metrics in one process keep apart, and both carry the process metrics", async () => {
  const first = new Metrics({ sources: fakeFleet().sources, logger: silentLogger() });
  const second = new Metrics({ sources: fakeFleet().sources, logger: silentLogger() });
  first.requestEnded({ model: "chat", status: 200, stream: false, seconds: 0.1, ttftSeconds: 0.1, usage: null });
  const [a, b] = [await scrape(first), await scrape(second)];
  assert.equal(a.value("llmgw_requests_total", { model: "chat", status: "200" }), 1);
  assert.deepEqual(b.samples("llmgw_requests_total"), []);
  for (const exposition of [a, b]) {
    assert.equal(exposition.families.get("process_cpu_seconds_total")?.type, "counter");
    assert.ok(exposition.value("process_cpu_seconds_total")! > 0);
    assert.ok(exposition.families.has("nodejs_eventloop_lag_seconds"));
    assert.ok(exposition.families.has("process_resident_memory_bytes"));
  }
});

test("the format check refuses what Prometheus would refuse", () => {
  const valid = '# HELP x_total A counter.\n# TYPE x_total counter\nx_total{a="1"} 3\n';
  assert.equal(parsePrometheusText(valid).value("x_total", { a: "1" }), 3);
  for (const [text, why] of [
    ['x_total{a="1"} 3', /line feed/],
    ['x_total{a="1} 3\n', /unterminated|expected/],
    ['x_total{1a="1"} 3\n', /bad label/],
    ['x_total{a="\\t"} 3\n', /bad escape/],
    ["x_total three\n", /invalid value/],
    ['x_total{a="1"} 3\nx_total{a="1"} 4\n', /same series twice/],
    ["x 1\n# TYPE x gauge\n", /TYPE after/],
    ['x 1\ny 1\nx{a="b"} 2\n', /two places/],
    ['# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n', /cumulative/],
    ['# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n', /differs from _count/],
  ] as const) {
    assert.throws(() => parsePrometheusText(text), why, text);
  }
});
