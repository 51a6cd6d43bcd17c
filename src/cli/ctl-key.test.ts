// `llmgw ctl key create|update|show` as child processes against a real server: the limit
// and guard flags become the API's fields, `show` prints spent/limit, the rate use of this
// minute and the key's guards, and a wrong flag is refused before anything is sent.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { guardFields, limitFields } from "./ctl-key.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

test("limit flags become API fields; 'none' removes a limit; nonsense is refused with the flag named", () => {
  assert.deepEqual(limitFields({ rpm: "60", tpm: "none", budget: "$12.50", budgetPeriod: "month", modelLimit: ["big:rpm=5,tpm=2000", "small:tpm=10"] }), {
    rpm: 60,
    tpm: null,
    budget_usd: 12.5,
    budget_period: "month",
    model_limits: { big: { rpm: 5, tpm: 2000 }, small: { tpm: 10 } },
  });
  assert.deepEqual(limitFields({ modelLimit: ["none"] }), { model_limits: null });
  assert.throws(() => limitFields({ rpm: "ten" }), /Invalid --rpm 'ten': give a whole number of requests per minute/);
  assert.throws(() => limitFields({ budget: "lots" }), /Invalid --budget 'lots'/);
  assert.throws(() => limitFields({ modelLimit: ["big:rps=5"] }), /Invalid --model-limit 'big:rps=5': write MODEL:rpm=N,tpm=N/);
});

test("guard flags become the guards field: a side given replaces it, 'none' empties it, a side not given is left out", () => {
  assert.deepEqual(guardFields({ inputGuards: "lg, jg", outputGuards: "lg" }), { guards: { input: ["lg", "jg"], output: ["lg"] } });
  assert.deepEqual(guardFields({ outputGuards: "none" }), { guards: { output: [] } });
  assert.deepEqual(guardFields({}), {});
  assert.throws(() => guardFields({ inputGuards: " , " }), /Invalid --input-guards ' , ': give comma-separated guard model names, or 'none'/);
});

describe("ctl key against a server", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  const ctl = (...args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "key", ...args], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
    });

  before(async () => {
    // A clock that stands still in the middle of a minute: this minute's use, shown by
    // `key show`, must not roll over into the next window while the test runs.
    harness = await startHarness({ limitsClock: () => Date.parse("2027-03-10T10:00:30.000Z") });
    upstream = await startFakeUpstream();
    await harness.addModel({
      name: "priced",
      prices: { input_per_million: 1000, output_per_million: 1000 },
      profiles: [{ name: "p", engine: "external", url: upstream.url }],
    });
    await harness.addModel({ name: "jg", role: "guard", guard_format: "json", profiles: [{ name: "g", engine: "external", url: upstream.url }] });
  });
  after(async () => {
    await harness.close();
    await upstream.close();
  });

  test("create with limits, use the key, show spent/limit and rate use, update", async () => {
    const created = JSON.parse(
      (await ctl("create", "team-a", "--rpm", "60", "--tpm", "100000", "--budget", "20", "--budget-period", "month", "--json")).stdout,
    );
    assert.equal(created.rpm, 60);
    assert.equal(created.budget_usd, 20);
    assert.equal(created.budget_period, "month");
    const client = new OpenAI({ apiKey: created.key, baseURL: `${harness.url}/v1`, maxRetries: 0 });
    await client.chat.completions.create({ model: "priced", messages: [{ role: "user", content: "hi" }], max_tokens: 5 });
    // 7 prompt and 5 completion tokens at $1000 per million each, once settled.
    await eventually("the request to settle", async () => JSON.parse((await ctl("show", "team-a", "--json")).stdout).usage.budget.spent_usd === 0.012);
    const { stdout } = await ctl("show", "team-a");
    assert.match(stdout, /budget: \$0\.012 spent of \$20 this month \(\d{4}-\d{2}, UTC\); \$19\.99 left; resets at \d{4}-\d{2}-01T00:00:00\.000Z/);
    assert.match(stdout, /\(key\)\s+1\/60\s+12\/100000/);
    const updated = (await ctl("update", "team-a", "--rpm", "none", "--model-limit", "priced:rpm=5")).stdout;
    assert.match(updated, /Updated key 'team-a' \(llmgw-\w+…\): 100000 tpm, \$20 per month, priced: 5 rpm; guards: none\./);
    const list = (await ctl("list")).stdout;
    assert.match(list, /team-a .*100000 tpm, \$20 per month, priced: 5 rpm/);
    await assert.rejects(ctl("update", "team-a"), (error: { stderr: string }) =>
      /Nothing to update: give --rpm, --tpm, --budget, --budget-period, --model-limit, --input-guards or --output-guards/.test(error.stderr),
    );
    await assert.rejects(ctl("update", "team-a", "--budget-period", "week"), (error: { stderr: string }) => /budget_period/.test(error.stderr));
    await assert.rejects(ctl("create", "one", "--name", "two"), (error: { stderr: string }) => /Two names given: 'one' and --name 'two'/.test(error.stderr));
    await assert.rejects(ctl("create", "--rpm", "5"), (error: { stderr: string }) => /Name the key: llmgw ctl key create NAME/.test(error.stderr));
  });

  test("create with guards, show them, change one side, clear it; a name that is not a guard is refused with its field", async () => {
    const created = JSON.parse((await ctl("create", "--name", "kiosk", "--input-guards", "jg", "--output-guards", "jg", "--json")).stdout);
    assert.deepEqual(created.guards, { input: ["jg"], output: ["jg"] });
    assert.match((await ctl("show", "kiosk")).stdout, /^guards: input jg; output jg$/m);
    assert.match((await ctl("update", "kiosk", "--output-guards", "none")).stdout, /guards: input jg; output none\.$/m);
    assert.deepEqual(JSON.parse((await ctl("show", "kiosk", "--json")).stdout).guards, { input: ["jg"], output: [] });
    await assert.rejects(ctl("update", "kiosk", "--input-guards", "jg,priced"), (error: { stderr: string }) =>
      /guards\.input\.1': 'priced' is not a guard model/.test(error.stderr),
    );
    assert.match((await ctl("update", "kiosk", "--input-guards", "none")).stdout, /guards: none\.$/m, "both sides empty: no guards");
    assert.match((await ctl("show", "kiosk")).stdout, /^guards: none$/m);
  });
});
