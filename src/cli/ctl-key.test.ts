// `llmgw ctl key create|update|show` as child processes against a real server: the limit
// flags become the API's fields, `show` prints spent/limit and the rate use of this minute,
// and a wrong flag is refused before anything is sent.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startFakeUpstream, type FakeUpstream } from "../../test/support/fake-upstream.ts";
import { eventually } from "../../test/support/eventually.ts";
import { limitFields } from "./ctl-key.ts";

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

describe("ctl key against a server", () => {
  let harness: Harness;
  let upstream: FakeUpstream;
  const ctl = (...args: string[]) => run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, "key", ...args], { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });

  before(async () => {
    harness = await startHarness();
    upstream = await startFakeUpstream();
    await harness.addModel({ name: "priced", prices: { input_per_million: 1000, output_per_million: 1000 }, profiles: [{ name: "p", engine: "external", url: upstream.url }] });
  });
  after(async () => {
    await harness.close();
    await upstream.close();
  });

  test("create with limits, use the key, show spent/limit and rate use, update", async () => {
    const created = JSON.parse((await ctl("create", "--name", "team-a", "--rpm", "60", "--tpm", "100000", "--budget", "20", "--budget-period", "month", "--json")).stdout);
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
    assert.match(updated, /Updated key 'team-a' \(llmgw-\w+…\): 100000 tpm, \$20 per month, priced: 5 rpm\./);
    const list = (await ctl("list")).stdout;
    assert.match(list, /team-a .*100000 tpm, \$20 per month, priced: 5 rpm/);
    await assert.rejects(ctl("update", "team-a"), (error: { stderr: string }) => /Nothing to update: give --rpm, --tpm, --budget, --budget-period or --model-limit/.test(error.stderr));
    await assert.rejects(ctl("update", "team-a", "--budget-period", "week"), (error: { stderr: string }) => /budget_period/.test(error.stderr));
  });
});
