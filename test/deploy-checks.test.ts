// The deploy/ files checked by the programs that will read them, as part of `npm test`:
// scripts/check-monitoring.sh (promtool and amtool on the Prometheus and Alertmanager files,
// PromQL of the Grafana dashboard) and scripts/check-load-balancer.sh (`haproxy -c` on the
// example load balancer). scripts/provision.sh installs the tools; where one is missing the
// script's own sentence names it and says how to install it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

function runScript(name: string): { status: number | null; output: string } {
  const script = fileURLToPath(new URL(`../scripts/${name}`, import.meta.url));
  const result = spawnSync("bash", [script], { encoding: "utf8", timeout: 120_000 });
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}

test("deploy/'s Prometheus, Alertmanager and Grafana files pass promtool and amtool", () => {
  const { status, output } = runScript("check-monitoring.sh");
  assert.equal(status, 0, output);
  assert.match(output, /deploy\/ passed promtool, amtool and the dashboard's query check/);
});

test("the example load balancer config passes haproxy -c", () => {
  const { status, output } = runScript("check-load-balancer.sh");
  assert.equal(status, 0, output);
  assert.match(output, /Configuration file is valid/);
});
