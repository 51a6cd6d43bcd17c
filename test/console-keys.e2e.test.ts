// The console's Keys, Usage and Events pages in Chromium against `llmgw up --demo`: a key
// created from the form is shown once and works, and is gone from the page once dismissed;
// revoked through its confirmation it stops working; chat requests made while the Usage page
// is open show in its table and its requests chart; a job that fails while the Events page
// is open shows there without a reload. Every page passes axe-core and is photographed at
// 1280×800 and at phone width. The registry is a closed port, so a serve job fails at once
// (as it does when the Hub is unreachable) and records a job_failed event.
// biome-ignore-all lint/performance/useDomNodeTextContent: these are Playwright locators, not DOM nodes; innerText() is what the user sees (rendered, with table cells and hidden text laid out), which textContent() is not.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { Browser, Page } from "playwright-core";
import {
  assertAccessible,
  assertNoPageErrors,
  goTo,
  launchBrowser,
  logIn,
  openConsole,
  screenshot,
  startConsoleUp,
  type ConsolePage,
  type ConsoleUp,
} from "./support/console-browser.ts";
import { eventually } from "./support/eventually.ts";
import type { StoredEvent } from "../src/events/event-log.ts";
import type { ModelHealth } from "../src/fleet/model-health.ts";
import type { ApiKeyInfo } from "../src/keys/key-service.ts";
import type { KeyLimitsUse } from "../src/policy/limits.ts";
import type { JobView } from "../src/serve/job-rows.ts";
import type { UsageReportRow } from "../src/usage/usage-query.ts";

/** A list answer of the admin API. */
interface ListOf<T> {
  data: T[];
}

const PHONE = { width: 390, height: 844 };
const CHATS = 3;

// In a describe block: startConsoleUp registers the data dir's removal with `after`, which
// inside a top-level `before` would attach to the first test and remove it when that ends.
describe("the Keys, Usage and Events pages", () => {
  let up: ConsoleUp;
  let browser: Browser;
  let desktop: ConsolePage;

  before(async () => {
    up = await startConsoleUp(["--registry", "http://127.0.0.1:9"]);
    browser = await launchBrowser();
    desktop = await openConsole(browser, up.url);
    await logIn(desktop.page, up.adminKey);
  });

  after(async () => {
    await browser?.close();
  });

  /** Calls the API (with the admin key unless told another); `Body` is the answer's shape as the route sends it. */
  async function call<Body = unknown>(path: string, init: { method?: string; body?: unknown; key?: string } = {}): Promise<{ status: number; body: Body }> {
    const response = await fetch(`${up.url}${path}`, {
      method: init.method ?? "GET",
      headers: { authorization: `Bearer ${init.key ?? up.adminKey}`, ...(init.body === undefined ? {} : { "content-type": "application/json" }) },
      body: init.body === undefined ? undefined : JSON.stringify(init.body),
    });
    const text = await response.text();
    return { status: response.status, body: (text === "" ? null : JSON.parse(text)) as Body };
  }

  /** Whether `text` is anywhere the page keeps things: its document, its storage or its address. */
  async function pageHas(page: Page, text: string): Promise<boolean> {
    if ((await page.content()).includes(text)) return true;
    return page.evaluate((needle) => {
      const browser = globalThis as unknown as { localStorage: object; sessionStorage: object; location: { href: string } };
      return [JSON.stringify({ ...browser.localStorage }), JSON.stringify({ ...browser.sessionStorage }), browser.location.href].some((place) =>
        place.includes(needle),
      );
    }, text);
  }

  test("Keys: a key created from the form is shown once and works; revoked through the dialog it is refused", { timeout: 90_000 }, async () => {
    const { page } = desktop;
    await goTo(page, "Keys");
    // Markup in a name is text: the page must show it as typed, never as elements.
    const name = "console-ci <i>team</i>";
    await page.getByLabel("Name", { exact: true }).fill(name);
    await page.getByLabel("Role").selectOption("client");
    await page.getByLabel("Allowed models").fill("demo");
    await page.getByLabel("Budget USD").fill("5");
    await page.getByLabel("Budget period").selectOption("month");
    await page.getByLabel("RPM").fill("60");
    await page.getByLabel("TPM").fill("10000");
    await page.getByRole("button", { name: "Create key" }).click();

    const panel = page.locator("section.new-key");
    await panel.getByRole("heading", { name: `New key '${name}'` }).waitFor({ timeout: 20_000 });
    assert.match(await panel.innerText(), /will not be shown again/);
    await panel.getByRole("button", { name: "Copy key" }).waitFor();
    const key = (await panel.locator(".new-key-text").innerText()).trim();
    assert.match(key, /^llmgw-[A-Za-z0-9]{40}$/, "the panel shows the whole key");
    const models = await call("/v1/models", { key });
    assert.equal(models.status, 200, "the key shown works on the /v1 API");

    // The list shows the key as the API has it: its limits, and a budget bar of what it spent.
    const listed = (await call<ListOf<ApiKeyInfo>>("/api/v1/keys")).body.data.find((candidate) => candidate.name === name);
    assert.ok(listed, "GET /api/v1/keys lists the new key");
    assert.deepEqual(
      [listed.role, listed.allowed_models, listed.budget_usd, listed.budget_period, listed.rpm, listed.tpm],
      ["client", ["demo"], 5, "month", 60, 10000],
    );
    assert.equal(key.slice(0, listed.prefix.length), listed.prefix);
    const row = page.locator(`tr[data-key-id="${listed.id}"]`);
    await row.waitFor({ timeout: 20_000 });
    const rowText = await row.innerText();
    for (const fact of [listed.prefix, "client", "demo", "60 rpm", "10,000 tpm", "active"])
      assert.ok(rowText.includes(fact), `the row shows ${fact}: ${rowText}`);
    assert.equal(await row.locator(".key-name").innerText(), name, "the name is shown as typed");
    assert.equal(await row.locator(".key-name i").count(), 0, "markup in the name is not markup on the page");
    const budgetBar = row.getByRole("meter", { name: `Budget of key '${name}' spent` });
    const spent = (await call<ApiKeyInfo & { usage: KeyLimitsUse | null }>(`/api/v1/keys/${listed.id}`)).body.usage!.budget!.spent_usd;
    assert.equal(await budgetBar.getAttribute("aria-valuetext"), `$${spent.toFixed(4)} of $5.00`);
    assert.equal(await pageHas(page, key), true, "the key is on the page while its panel is open");
    await assertAccessible(page, "Keys with a new key shown");

    await panel.getByRole("button", { name: /^Done/ }).click();
    await panel.waitFor({ state: "detached" });
    assert.equal(await pageHas(page, key), false, "dismissed, the key is nowhere on the page, in its storage or its address");
    await page.reload();
    await page.getByRole("heading", { level: 1, name: "Keys" }).waitFor();
    await row.waitFor({ timeout: 20_000 });
    assert.equal(await pageHas(page, key), false, "after a reload the key is not shown again");

    await row.getByRole("button", { name: `Revoke key '${name}'` }).click();
    const dialog = page.getByRole("dialog", { name: `Revoke key '${name}'?` });
    await dialog.waitFor();
    assert.ok((await dialog.innerText()).includes(`Key '${name}' (${listed.prefix}…) will be refused`), "the dialog names the key");
    await assertAccessible(page, "Keys with the revoke dialog open");
    await dialog.getByRole("button", { name: "Revoke key" }).click();
    await row.locator(".badge", { hasText: "revoked" }).waitFor({ timeout: 20_000 });
    assert.equal(await row.getByRole("button", { name: /Revoke/ }).count(), 0, "a revoked key has no revoke button");
    const revoked = (await call<ApiKeyInfo>(`/api/v1/keys/${listed.id}`)).body;
    assert.ok(revoked.revoked_at !== null, "the API has the key revoked");
    assert.equal((await call("/v1/models", { key })).status, 401, "the revoked key is refused");

    await assertAccessible(page, "Keys");
    await screenshot(page, "keys");
  });

  test("Usage: chat requests made while the page is open show in its table and its requests chart", { timeout: 120_000 }, async () => {
    const { page } = desktop;
    await eventually(
      "the demo model to be ready",
      async () => {
        const demo = (await call<ListOf<{ name: string; health: ModelHealth }>>("/api/v1/models")).body.data.find((model) => model.name === "demo");
        if (demo?.health?.state === "ready" && demo.health.ready >= 1) return true;
        throw new Error(`demo is ${JSON.stringify(demo?.health)}`);
      },
      { timeoutMs: 90_000, intervalMs: 250 },
    );
    await goTo(page, "Usage");
    await page.getByRole("heading", { level: 2, name: "Totals by model" }).waitFor({ timeout: 20_000 });
    const lastHour = () => `from=${encodeURIComponent(new Date(Date.now() - 3_600_000).toISOString())}`;
    const demoRequests = async () =>
      (await call<ListOf<UsageReportRow>>(`/api/v1/usage?${lastHour()}&group_by=model`)).body.data.find((row) => row.model === "demo")?.requests ?? 0;
    const before = await demoRequests();
    for (let sent = 0; sent < CHATS; sent += 1) {
      const chat = await call("/v1/chat/completions", {
        method: "POST",
        body: { model: "demo", messages: [{ role: "user", content: `Hello ${sent}` }], max_tokens: 4 },
      });
      assert.equal(chat.status, 200, JSON.stringify(chat.body));
    }
    const expected = before + CHATS;
    await eventually("the usage records to count the chats", async () => (await demoRequests()) === expected, { timeoutMs: 30_000, intervalMs: 250 });

    // The page follows by itself (no reload): the table's row for demo, then the chart's summary.
    const demoRow = page.locator('table.usage-totals tr[data-group="demo"]');
    await eventually("the Usage table to show the chats", async () => (await demoRow.locator("td").first().innerText()) === String(expected), {
      timeoutMs: 30_000,
      intervalMs: 250,
    });
    const perMinute = (await call<ListOf<UsageReportRow>>(`/api/v1/usage?${lastHour()}&group_by=minute`)).body.data;
    const busiestMinute = Math.max(...perMinute.map((row) => row.requests));
    const requestsChart = page.getByRole("figure", { name: "Requests" });
    const summary = await eventually(
      "the requests chart's summary",
      async () => {
        const text = await requestsChart.locator("figcaption").innerText();
        return text.startsWith(`Requests: ${expected} in the last hour`) ? text : false;
      },
      { timeoutMs: 30_000, intervalMs: 250 },
    );
    assert.match(summary, new RegExp(`at most ${busiestMinute} in one minute .*demo ${expected}`), summary);
    // uPlot drew on a canvas as wide as its box.
    const canvas = requestsChart.locator("canvas");
    const [canvasBox, figureBox] = [await canvas.boundingBox(), await requestsChart.boundingBox()];
    assert.ok(
      canvasBox !== null && figureBox !== null && canvasBox.width > 300 && canvasBox.width <= figureBox.width,
      `the chart fits its box (${canvasBox?.width} in ${figureBox?.width})`,
    );

    // By key: the chats were made with the admin key, named 'admin'.
    await page.getByLabel("By", { exact: true }).selectOption("key");
    await page.getByRole("heading", { level: 2, name: "Totals by key" }).waitFor({ timeout: 20_000 });
    const adminUsage = (await call<ListOf<UsageReportRow>>(`/api/v1/usage?${lastHour()}&group_by=key`)).body.data.find((row) => row.key === "admin")!;
    const adminRow = page.locator('table.usage-totals tr[data-group="admin"]');
    await eventually("the Usage table by key", async () => (await adminRow.locator("td").first().innerText()) === String(adminUsage.requests), {
      timeoutMs: 20_000,
      intervalMs: 250,
    });
    await page.getByLabel("By", { exact: true }).selectOption("model");
    await demoRow.waitFor({ timeout: 20_000 });

    await assertAccessible(page, "Usage");
    await screenshot(page, "usage");
  });

  test("Events: a job that fails while the page is open shows there live", { timeout: 90_000 }, async () => {
    const { page } = desktop;
    await goTo(page, "Events");
    await page.getByLabel("Kind", { exact: true }).waitFor();
    await page.evaluate(() => ((globalThis as unknown as { notReloaded: boolean }).notReloaded = true));
    // Once the list has loaded, it is not read again (its next read hangs): the event can only come over the stream.
    await page.locator(".event-count", { hasText: "shown" }).waitFor();
    const listReads = /\/api\/v1\/events\?/;
    await page.route(listReads, () => undefined);

    const job = await call<JobView>("/api/v1/jobs/serve", { method: "POST", body: { repo: "nobody/no-such-model-GGUF" } });
    assert.equal(job.status, 202, JSON.stringify(job.body));
    const item = page.locator("li.event", { hasText: `job:${job.body.id}` });
    await item.waitFor({ timeout: 60_000 });
    assert.equal(await page.evaluate(() => (globalThis as unknown as { notReloaded?: boolean }).notReloaded), true, "the event came without a reload");
    await page.unroute(listReads);

    const event = (await call<ListOf<StoredEvent>>("/api/v1/events?kind=job_failed")).body.data.find((candidate) => candidate.subject === `job:${job.body.id}`);
    assert.ok(event, "the API has the job_failed event");
    assert.equal(await item.getAttribute("data-kind"), "job_failed");
    assert.equal(await item.locator(".event-title").innerText(), "Job failed");
    assert.equal(await item.locator(".badge").innerText(), event.severity);
    assert.equal(await item.locator(".event-message").innerText(), event.message);
    assert.equal(await item.locator("time").getAttribute("datetime"), event.at);

    // Newest first: the job's event is above any older one.
    const firstId = await page.locator("li.event").first().getAttribute("data-event-id");
    assert.equal(Number(firstId), Math.max(...(await call<ListOf<StoredEvent>>("/api/v1/events")).body.data.map((candidate) => candidate.id)));

    await page.getByLabel("Kind", { exact: true }).selectOption("node_lost");
    await item.waitFor({ state: "detached" });
    await page.getByText("No 'Node lost' events yet.").waitFor();
    await page.getByLabel("Kind", { exact: true }).selectOption("job_failed");
    await item.waitFor();
    assert.equal(await item.getByRole("link", { name: `job:${job.body.id}` }).getAttribute("href"), `#/jobs/${job.body.id}`, "the subject links to the job");
    await page.getByLabel("Kind", { exact: true }).selectOption("");

    await assertAccessible(page, "Events");
    await screenshot(page, "events");
    assertNoPageErrors(desktop);
  });

  test("Keys, Usage and Events at phone width", { timeout: 90_000 }, async () => {
    const phone = await openConsole(browser, up.url, PHONE);
    const { page } = phone;
    await logIn(page, up.adminKey);
    const pageWidth = () =>
      page.evaluate(() => (globalThis as unknown as { document: { documentElement: { scrollWidth: number } } }).document.documentElement.scrollWidth);

    await goTo(page, "Keys");
    await page.locator("table.keys-table").waitFor({ timeout: 20_000 });
    assert.ok((await pageWidth()) <= PHONE.width, "the Keys page does not scroll sideways (its table scrolls in its box)");
    await assertAccessible(page, "Keys at phone width");
    await screenshot(page, "keys-phone");

    await goTo(page, "Usage");
    const canvas = page.getByRole("figure", { name: "Requests" }).locator("canvas");
    await canvas.waitFor({ timeout: 20_000 });
    const canvasBox = await canvas.boundingBox();
    assert.ok(canvasBox !== null && canvasBox.width <= PHONE.width, `the chart fits a phone (${canvasBox?.width} px)`);
    assert.ok((await pageWidth()) <= PHONE.width, "the Usage page does not scroll sideways");
    await assertAccessible(page, "Usage at phone width");
    await screenshot(page, "usage-phone");

    await goTo(page, "Events");
    await page.locator("li.event").first().waitFor({ timeout: 20_000 });
    assert.ok((await pageWidth()) <= PHONE.width, "the Events page does not scroll sideways");
    await assertAccessible(page, "Events at phone width");
    await screenshot(page, "events-phone");

    assertNoPageErrors(phone);
    await phone.context.close();
  });
});
