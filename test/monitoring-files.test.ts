// Keeps deploy/ honest about the metrics it reads: every llmgw_* name in the alert rules
// and in the Grafana dashboard's queries must be a series that a real server's GET /metrics
// serves, so renaming a metric without its alerts and panels fails here instead of leaving
// alerts that can never fire. promtool and amtool check the files' own syntax and the
// rules' behaviour (scripts/check-monitoring.sh); this test needs neither tool.
//
// The server runs in this process with an external model behind a stand-in upstream, a
// client key with a budget, a node joined through the fleet's own join call and requests
// streamed and not, so every family has samples and "exists" means more than a HELP line.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startHarness } from "./support/server-harness.ts";
import { startFakeUpstream } from "./support/fake-upstream.ts";
import { eventually } from "./support/eventually.ts";
import { parsePrometheusText, type Exposition } from "./support/prometheus-text.ts";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const alertsFile = path.join(root, "deploy/prometheus/alerts.yml");
const alertTestsFile = path.join(root, "deploy/prometheus/alerts.test.yml");
const dashboardFile = path.join(root, "deploy/grafana/llmgw-dashboard.json");

/** llmgw's metric names in a piece of text (a rule file, a PromQL query). */
function metricNames(text: string): Set<string> {
  return new Set(text.match(/\bllmgw_[a-zA-Z0-9_]+/g) ?? []);
}

/**
 * The queries of a dashboard: each panel's targets (rows hold panels of their own when
 * collapsed) and the template variables' queries.
 */
function dashboardQueries(dashboard: unknown): string[] {
  const queries: string[] = [];
  const visit = (panel: { targets?: Array<{ expr?: string }>; panels?: unknown[] }) => {
    for (const target of panel.targets ?? []) if (typeof target.expr === "string") queries.push(target.expr);
    for (const inner of panel.panels ?? []) visit(inner as typeof panel);
  };
  const parsed = dashboard as { panels: unknown[]; templating?: { list: Array<{ query?: unknown; definition?: unknown }> } };
  for (const panel of parsed.panels) visit(panel as Parameters<typeof visit>[0]);
  for (const variable of parsed.templating?.list ?? []) {
    if (typeof variable.definition === "string") queries.push(variable.definition);
    // Grafana keeps a variable's query as a string, or as an object holding it.
    const query = variable.query as { query?: unknown } | string | undefined;
    if (typeof query === "string") queries.push(query);
    else if (typeof query === "object" && typeof query.query === "string") queries.push(query.query);
  }
  return queries;
}

/** The samples a name used in PromQL selects: its own, or those of the histogram it is the base name of. */
function samplesOf(exposition: Exposition, name: string): number {
  const own = exposition.samples(name).length;
  if (own > 0) return own;
  return exposition.families.get(name)?.samples.length ?? 0;
}

test("every llmgw_* metric in deploy/'s alert rules and dashboard is served, with samples, by a real server", async () => {
  const alertNames = metricNames(readFileSync(alertsFile, "utf8"));
  const dashboard: unknown = JSON.parse(readFileSync(dashboardFile, "utf8"));
  const queries = dashboardQueries(dashboard);
  const dashboardNames = metricNames(queries.join("\n"));
  // What the files are expected to read at least: a reader that found nothing would make this test pass on nothing.
  for (const name of [
    "llmgw_model_parked",
    "llmgw_model_min_replicas",
    "llmgw_replicas",
    "llmgw_nodes",
    "llmgw_requests_total",
    "llmgw_request_duration_seconds_bucket",
    "llmgw_queue_depth",
    "llmgw_queue_capacity",
    "llmgw_budget_spent_usd",
    "llmgw_budget_limit_usd",
  ]) {
    assert.ok(alertNames.has(name), `alerts.yml uses ${name}`);
  }
  assert.ok(queries.length >= 15, `the dashboard has its queries (found ${queries.length})`);
  for (const name of [
    "llmgw_time_to_first_token_seconds_bucket",
    "llmgw_tokens_total",
    "llmgw_inflight_requests",
    "llmgw_queue_depth",
    "llmgw_replicas",
    "llmgw_model_desired_replicas",
    "llmgw_budget_spent_usd",
  ]) {
    assert.ok(dashboardNames.has(name), `the dashboard uses ${name}`);
  }

  const upstream = await startFakeUpstream({ reply: "one two three" });
  const harness = await startHarness();
  try {
    await harness.addModel({ name: "ext", profiles: [{ name: "p", engine: "external", url: upstream.url }] });
    const key = await harness.clientKey({ name: "team-a", budget_usd: 5, budget_period: "month" });
    const joinToken = readFileSync(path.join(harness.dataDir, "join.token"), "utf8").trim();
    await harness.server.fleet.join({
      joinToken,
      name: "gpu-01",
      address: "127.0.0.1",
      inventory: { cores: 4, memoryBytes: 8 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] },
      labels: {},
    });
    for (const stream of [false, true]) {
      const response = await fetch(`${harness.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "ext", stream, messages: [{ role: "user", content: "hi" }] }),
      });
      assert.equal(response.status, 200, await response.clone().text());
      await response.text();
    }

    // Metrics are counted when a request ends, after its answer; the stream is the last to end.
    const exposition = await eventually("both requests counted", async () => {
      const response = await fetch(`${harness.url}/metrics`);
      assert.equal(response.status, 200);
      const seen = parsePrometheusText(await response.text());
      return seen.value("llmgw_time_to_first_token_seconds_count", { model: "ext" }) === 1 ? seen : undefined;
    });

    const missing = [...new Set([...alertNames, ...dashboardNames])].filter((name) => samplesOf(exposition, name) === 0).sort();
    assert.deepEqual(
      missing,
      [],
      "metric names in deploy/ that the server does not serve (renamed? update deploy/prometheus/alerts.yml, alerts.test.yml and deploy/grafana/llmgw-dashboard.json)",
    );

    // The server's sources behind the gauges the alerts compare: the model's settings, its parking, the node, the budget.
    assert.equal(exposition.value("llmgw_model_parked", { model: "ext" }), 0);
    assert.equal(exposition.value("llmgw_model_min_replicas", { model: "ext" }), 1, "scaling.min's default");
    assert.equal(exposition.value("llmgw_model_desired_replicas", { model: "ext" }), 1, "a model that does not autoscale wants its scaling.min");
    assert.equal(exposition.value("llmgw_queue_capacity", { model: "ext" }), 256, "queue_size's default");
    assert.equal(exposition.value("llmgw_nodes", { node: "gpu-01", state: "ready" }), 1);
    assert.equal(exposition.value("llmgw_nodes", { node: "gpu-01", state: "lost" }), 0);
    const budgetLabels = exposition.samples("llmgw_budget_limit_usd", { key: "team-a" })[0]?.labels;
    assert.ok(budgetLabels !== undefined, "the budgeted key has a limit series");
    assert.equal(exposition.value("llmgw_budget_limit_usd", budgetLabels), 5);
    assert.ok(
      exposition.value("llmgw_budget_spent_usd", budgetLabels) !== undefined,
      "and a spent series with the same labels, which alerts.yml divides by it",
    );
  } finally {
    await harness.close();
    await upstream.close();
  }
});

test("every alert in alerts.yml has unit tests in alerts.test.yml, and the tests name no alert that is gone", () => {
  const alerts = new Set([...readFileSync(alertsFile, "utf8").matchAll(/^\s*- alert: (\S+)\s*$/gm)].map((match) => match[1]));
  const tested = new Set([...readFileSync(alertTestsFile, "utf8").matchAll(/^\s*alertname: (\S+)\s*$/gm)].map((match) => match[1]));
  assert.ok(alerts.size >= 7, `alerts.yml has its alerts (found ${[...alerts].join(", ")})`);
  assert.deepEqual([...alerts].sort(), [...tested].sort());
});
