// The chaos scenarios of test/chaos.e2e.test.ts at full length (20 s database faults by
// default): two servers on one PostgreSQL, two agents, HAProxy in front, a client sending a
// chat request every 100 ms with the OpenAI SDK's default retries. Prints, per scenario,
// the requests sent, those that failed, the longest request and the recovery time (from the
// end of the fault, or the kill, to the cluster being whole again), as a Markdown table for
// README ("Running several servers"). PostgreSQL: LLMGW_TEST_POSTGRES (default 127.0.0.1).
//   npx tsx bench/chaos/run.ts [--fault-ms 20000] [--only "database cut,node lost"]
import { flagReader } from "../flags.ts";
import { ChaosCluster } from "../../test/support/chaos-cluster.ts";
import {
  databaseBlackhole,
  databaseCut,
  databaseSlow,
  leaderKilledDuring,
  nodeLost,
  rollingUpdate,
  runScenario,
  type Scenario,
  type ScenarioReport,
} from "../../test/support/chaos-scenarios.ts";

const flag = flagReader(process.argv.slice(2));
const faultMs = Number(flag("fault-ms", "BENCH_FAULT_MS") ?? 20_000);
const only = flag("only", "BENCH_ONLY");
const scenarios: Scenario[] = [
  databaseCut,
  databaseBlackhole,
  databaseSlow(300),
  nodeLost,
  leaderKilledDuring("registry"),
  leaderKilledDuring("mirror"),
  leaderKilledDuring("check"),
  leaderKilledDuring("placement"),
  leaderKilledDuring("smoke_test"),
  rollingUpdate,
].filter((scenario) => only === undefined || only.split(",").includes(scenario.name));

const cluster = new ChaosCluster();
const reports: ScenarioReport[] = [];
try {
  await cluster.start();
  await cluster.addModel("tiny", 2);
  const key = await cluster.createKey("steady");
  for (const scenario of scenarios) {
    process.stderr.write(`chaos: ${scenario.name} ...\n`);
    const report = await runScenario(cluster, scenario, { faultMs, model: "tiny", key });
    reports.push(report);
    process.stderr.write(`chaos: ${scenario.name}: ${report.failed.length} of ${report.sent} failed; ${JSON.stringify(report.facts)}\n`);
    for (const failure of report.failed.slice(0, 3)) process.stderr.write(`  failed: ${failure.error}\n`);
  }
  const exits = cluster.unexpectedExits();
  console.log(`\nFaults of ${faultMs / 1000} s; a request every 100 ms; ${exits.length} processes exited unexpectedly.\n`);
  console.log("| scenario | requests | failed | longest request | recovery |");
  console.log("|---|---:|---:|---:|---:|");
  for (const report of reports) {
    console.log(
      `| ${report.scenario} | ${report.sent} | ${report.failed.length} | ${(report.longestMs / 1000).toFixed(1)} s | ${(report.recoveryMs / 1000).toFixed(1)} s |`,
    );
  }
  for (const exit of exits) console.log(`\nexited: ${exit}`);
} finally {
  await cluster.stop();
}
