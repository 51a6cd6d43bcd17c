// The console's Jobs page in Chromium, against `llmgw up --demo` that reads repositories
// from the stand-in Hugging Face Hub (test/support/stand-in-hub.ts, which speaks the Hub's
// API and CDN as huggingface.co does; the repository is the generated tiny GGUF one). A
// person fills the "Serve a model" form, looks at the plan, serves, and follows the job
// to the end: every step, the mirror's bar, the smoke test's reply and tokens/s, each
// compared with what GET /api/v1/jobs/:id says. Then a job held at the mirror (the hub
// drops the download and then hangs) shows its progress and is cancelled from the page,
// and the server's own messages appear for a bad repository, a taken name and a job that
// fails. axe-core and screenshots at 1280×800 and 390×844.
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
  type ConsoleUp,
} from "./support/console-browser.ts";
import { eventually } from "./support/eventually.ts";
import { startStandInHub, type StandInHub } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GGUF_REPO } from "./support/stand-in-repos.ts";

const PHONE = { width: 390, height: 844 };
/** A serve job mirrors, starts a real llama.cpp engine and smoke-tests it: tens of seconds on a loaded machine. */
const JOB_TIMEOUT_MS = 180_000;
const UI_TIMEOUT_MS = 30_000;

interface JobStep {
  name: string;
  state: string;
  detail: string | null;
  progress?: { bytes_done: number; bytes_total: number; files_done: number; files_total: number };
}
interface Job {
  id: string;
  kind: string;
  state: string;
  model: string | null;
  request: Record<string, unknown>;
  steps: JobStep[];
  error: string | null;
  result: { reply: string; tokens_per_second: number; completion_tokens: number; replica: string; node: string } | null;
}

describe("console: the Jobs page", () => {
  let hub: StandInHub;
  let up: ConsoleUp;
  let browser: Browser;

  before(async () => {
    hub = await startStandInHub({ repos: [(await buildStandInRepos()).gguf] });
    up = await startConsoleUp(["--registry", hub.url]);
    browser = await launchBrowser();
  });

  after(async () => {
    await browser?.close();
    await hub?.close();
  });

  const admin = async <T>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> => {
    const response = await fetch(`${up.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${up.adminKey}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    return { status: response.status, body: (await response.json()) as T };
  };
  const job = async (id: string) => (await admin<Job>("GET", `/api/v1/jobs/${id}`)).body;

  /** Fills the Serve form; fields not given are left empty. */
  async function fillServeForm(page: Page, fields: { repo: string; quant?: string; name?: string; aliases?: string; context?: string }): Promise<void> {
    await page.getByLabel("Repository").fill(fields.repo);
    await page.getByLabel("Quant").fill(fields.quant ?? "");
    await page.getByLabel("Name", { exact: true }).fill(fields.name ?? "");
    await page.getByLabel("Aliases").fill(fields.aliases ?? "");
    await page.getByLabel("Context (tokens)").fill(fields.context ?? "");
  }

  async function showPlan(page: Page): Promise<void> {
    await page.getByRole("button", { name: "Show plan" }).click();
    await page.getByRole("heading", { level: 3, name: /^Plan for a / }).waitFor({ timeout: UI_TIMEOUT_MS });
  }

  /** Clicks Serve and returns the id of the job the page went to. */
  async function serve(page: Page): Promise<string> {
    await page.getByRole("button", { name: "Serve", exact: true }).click();
    await page.waitForURL(/#\/jobs\/[^/]+$/, { timeout: UI_TIMEOUT_MS });
    const id = decodeURIComponent(new URL(page.url()).hash.replace(/^#\/jobs\//, ""));
    await page.getByRole("heading", { level: 2, name: `Job ${id}` }).waitFor({ timeout: UI_TIMEOUT_MS });
    return id;
  }

  /** What the page shows of each step: name, state and detail. */
  const shownSteps = (page: Page) =>
    page.locator("ol.job-steps > li").evaluateAll((items) =>
      items.map((item) => ({
        name: item.querySelector(".job-step-name")?.textContent ?? "",
        state: item.querySelector(".badge")?.textContent ?? "",
        detail: item.querySelector(".job-step-detail")?.textContent ?? null,
      })),
    );

  test("the Serve form shows the plan, starts the job and follows it to the end", { timeout: 300_000 }, async () => {
    const desk = await openConsole(browser, up.url);
    const { page } = desk;
    await logIn(page, up.adminKey);
    await goTo(page, "Jobs");
    await page.getByText("No jobs yet.").waitFor({ timeout: UI_TIMEOUT_MS });
    await page.getByRole("heading", { level: 2, name: "Serve a model" }).waitFor();
    assert.equal(await page.getByRole("button", { name: "Serve", exact: true }).isDisabled(), true, "Serve waits for the plan");
    await assertAccessible(page, "jobs, empty");

    // Step 1: the plan, as GET /api/v1/plan has it, with the pool's node and the file the job will take.
    await fillServeForm(page, { repo: GGUF_REPO, name: "tiny", aliases: "tiny-alias, small", context: "4096" });
    await showPlan(page);
    const planned = (
      await admin<{
        plan: {
          options: unknown[];
          recommendation: { artifact: { id: string; label: string } };
          artifacts: Array<{ id: string; files: string[] }>;
          explanation: string;
        };
      }>("GET", `/api/v1/plan?repo=${encodeURIComponent(GGUF_REPO)}&context=4096`)
    ).body.plan;
    const chosenFile = planned.artifacts.find((artifact) => artifact.id === planned.recommendation.artifact.id)?.files[0];
    assert.ok(chosenFile !== undefined, "the plan names the recommended artifact's file");
    await page.getByRole("heading", { level: 3, name: "Plan for a 4,096-token context" }).waitFor();
    await page.getByText(planned.explanation).waitFor();
    const planTable = page.locator("table.plan-table");
    assert.equal(await planTable.locator("tbody tr").count(), planned.options.length, "a row per option of the plan");
    const recommendedRow = planTable.locator("tbody tr", { hasText: "Recommended" });
    assert.equal(await recommendedRow.count(), 1, "one row is marked recommended");
    assert.match(
      await recommendedRow.innerText(),
      new RegExp(`${planned.recommendation.artifact.label}[\\s\\S]*${chosenFile.replace(/\./g, "\\.")}[\\s\\S]*CPU[\\s\\S]*yes`),
    );
    assert.match(
      await page.locator("section.plan").innerText(),
      new RegExp(`Serve takes ${planned.recommendation.artifact.label} \\(recommended\\): ${chosenFile.replace(/\./g, "\\.")}`),
    );
    const nodes = (await admin<{ data: Array<{ name: string }> }>("GET", "/api/v1/nodes")).body.data;
    assert.ok(nodes.length >= 1);
    for (const node of nodes) await page.locator("table.plan-nodes").getByRole("cell", { name: node.name, exact: true }).waitFor();
    await assertAccessible(page, "jobs, plan");
    await screenshot(page, "jobs-plan");

    // Step 2: serve; the page goes to the job and follows it until it is done.
    const id = await serve(page);
    const started = await job(id);
    assert.equal(started.kind, "serve");
    assert.deepEqual(
      {
        repo: started.request.repo,
        name: started.request.name,
        aliases: started.request.aliases,
        ctx_pool: started.request.ctx_pool,
        replicas: started.request.replicas,
      },
      { repo: GGUF_REPO, name: "tiny", aliases: ["tiny-alias", "small"], ctx_pool: 4096, replicas: 1 },
      "the job was asked what the form says",
    );
    await page.locator(".job-state .badge", { hasText: /^done$/ }).waitFor({ timeout: JOB_TIMEOUT_MS });
    const finished = await job(id);
    assert.equal(finished.state, "done", `the job ended done: ${finished.error}`);
    assert.ok(
      finished.steps.every((step) => step.state === "done"),
      "every step is done",
    );
    // The page polls: once it shows done it shows the finished job's steps as the API has them.
    await eventually(
      "the page's steps to match the API's",
      async () => {
        assert.deepEqual(
          await shownSteps(page),
          finished.steps.map((step) => ({ name: step.name, state: step.state, detail: step.detail })),
        );
        return true;
      },
      { timeoutMs: UI_TIMEOUT_MS },
    );
    const mirror = finished.steps.find((step) => step.name === "mirror");
    assert.ok(mirror?.progress !== undefined, "the mirror step reported progress");
    const bar = page.locator('li[data-step="mirror"] [role="meter"]');
    assert.equal(await bar.getAttribute("aria-valuenow"), String(mirror.progress.bytes_done));
    assert.equal(await bar.getAttribute("aria-valuemax"), String(mirror.progress.bytes_total));
    assert.equal(mirror.progress.bytes_done, mirror.progress.bytes_total);
    await page.locator('li[data-step="mirror"]').getByText(`${mirror.progress.files_done} of ${mirror.progress.files_total} file`).waitFor();
    // The smoke test's reply and speed.
    assert.ok(finished.result !== null, "the smoke test left its result");
    await page.getByRole("heading", { level: 3, name: "Smoke test" }).waitFor();
    assert.equal(await page.locator(".smoke-reply").textContent(), finished.result.reply);
    assert.equal(await page.locator(".smoke-speed").textContent(), finished.result.tokens_per_second.toFixed(1));
    // The model is in the catalog, under the form's name and aliases.
    const models = (await admin<{ data: Array<{ name: string; aliases: string[] }> }>("GET", "/api/v1/models")).body.data;
    assert.deepEqual(models.find((model) => model.name === "tiny")?.aliases, ["tiny-alias", "small"]);
    // The list below names the job with its kind, model and state.
    const row = page.locator(`tr[data-job="${id}"]`);
    await row.filter({ hasText: "done" }).waitFor({ timeout: UI_TIMEOUT_MS });
    assert.match(await row.innerText(), /serve\s+tiny\s+done\s+smoke_test/);
    await assertAccessible(page, "jobs, a finished job");
    await screenshot(page, "jobs");
    assertNoPageErrors(desk);

    // At phone width: the form with its plan, and the job.
    const phone = await openConsole(browser, up.url, PHONE);
    await logIn(phone.page, up.adminKey);
    await goTo(phone.page, "Jobs");
    await fillServeForm(phone.page, { repo: GGUF_REPO, context: "4096" });
    await showPlan(phone.page);
    await assertAccessible(phone.page, "jobs, plan, phone");
    await screenshot(phone.page, "jobs-plan-phone");
    await phone.page.locator(`tr[data-job="${id}"]`).getByRole("link", { name: id }).click();
    await phone.page.locator(".job-state .badge", { hasText: /^done$/ }).waitFor({ timeout: UI_TIMEOUT_MS });
    await phone.page.locator(".smoke-reply").waitFor();
    await assertAccessible(phone.page, "jobs, a finished job, phone");
    await screenshot(phone.page, "jobs-phone");
    assertNoPageErrors(phone);
    await phone.context.close();
    await desk.context.close();
  });

  test("a job held at the mirror shows its progress, and Cancel stops it", { timeout: 120_000 }, async () => {
    const desk = await openConsole(browser, up.url);
    const { page } = desk;
    await logIn(page, up.adminKey);
    await goTo(page, "Jobs");
    await fillServeForm(page, { repo: GGUF_REPO, quant: "Q8_0", name: "tiny-held" });
    // On demand is replicas 0 (no replica until the first request); the Replicas field steps aside.
    await page.getByLabel("On demand").check();
    assert.equal(await page.getByLabel("Replicas").isDisabled(), true);
    await showPlan(page);
    await page.getByText("Serve takes Q8_0 (asked for)").waitFor();
    // The download of the weights is cut after 200,000 bytes and its resume never answers,
    // so the job stays in its mirror step (a quant is given, so the registry step reads no headers).
    hub.setFault([
      { kind: "drop", afterBytes: 200_000, match: "/cdn/", times: 1 },
      { kind: "hang", match: "/cdn/" },
    ]);
    try {
      const id = await serve(page);
      assert.equal((await job(id)).request.replicas, 0, "On demand asks for replicas 0");
      const bar = page.locator('li[data-step="mirror"] [role="meter"]');
      await bar.waitFor({ timeout: UI_TIMEOUT_MS });
      // The bar shows the bytes the job reports, once the two agree (the job writes its progress once a second).
      const progress = await eventually(
        "the page's bar to show the API's mirror progress",
        async () => {
          const mirror = (await job(id)).steps.find((step) => step.name === "mirror");
          if (mirror?.state !== "running" || mirror.progress === undefined) return undefined;
          const shown = { now: await bar.getAttribute("aria-valuenow"), max: await bar.getAttribute("aria-valuemax") };
          return shown.now === String(mirror.progress.bytes_done) && shown.max === String(mirror.progress.bytes_total) ? mirror.progress : undefined;
        },
        { timeoutMs: UI_TIMEOUT_MS },
      );
      assert.ok(progress.bytes_done < progress.bytes_total, "the download is held part way");
      assert.equal(await page.locator('li[data-step="mirror"] .badge').first().textContent(), "running");
      await assertAccessible(page, "jobs, a running job");
      await screenshot(page, "jobs-progress");

      await page.getByRole("button", { name: "Cancel", exact: true }).click();
      const dialog = page.getByRole("dialog", { name: "Cancel the job?" });
      await dialog.getByText(`Cancel job ${id} (serve ${GGUF_REPO} as 'tiny-held')?`).waitFor();
      await dialog.getByRole("button", { name: "Cancel job" }).click();
      await page.locator(".job-state .badge", { hasText: /^cancelled$/ }).waitFor({ timeout: UI_TIMEOUT_MS });
      const cancelled = await job(id);
      assert.equal(cancelled.state, "cancelled");
      assert.equal(cancelled.steps.find((step) => step.name === "mirror")?.state, "cancelled");
      await page.locator('li[data-step="mirror"] .badge', { hasText: /^cancelled$/ }).waitFor({ timeout: UI_TIMEOUT_MS });
      assert.equal(await page.getByRole("button", { name: "Cancel", exact: true }).count(), 0, "no Cancel once the job has stopped");
      await page.locator(`tr[data-job="${id}"]`).filter({ hasText: "cancelled" }).waitFor({ timeout: UI_TIMEOUT_MS });
      assert.match(await page.locator(`tr[data-job="${id}"]`).innerText(), /serve\s+tiny-held\s+cancelled\s+mirror/, "the list says where the job stopped");
    } finally {
      hub.setFault(null);
    }
    assertNoPageErrors(desk);
    await desk.context.close();
  });

  test("the server's message shows for a bad repository, a taken name and a job that fails", { timeout: 120_000 }, async () => {
    const desk = await openConsole(browser, up.url);
    const { page } = desk;
    await logIn(page, up.adminKey);
    await goTo(page, "Jobs");

    // A repository that is no owner/name: the plan is refused with the server's words.
    await fillServeForm(page, { repo: "not a repository" });
    await page.getByRole("button", { name: "Show plan" }).click();
    const refusedPlan = await admin<{ error: { message: string } }>("GET", `/api/v1/plan?repo=${encodeURIComponent("not a repository")}`);
    assert.equal(refusedPlan.status, 400);
    await page
      .getByRole("alert")
      .filter({ hasText: `Could not plan: ${refusedPlan.body.error.message}` })
      .waitFor({ timeout: UI_TIMEOUT_MS });
    assert.equal(await page.getByRole("button", { name: "Serve", exact: true }).isDisabled(), true, "no Serve without a plan");

    // A name the catalog already has: the job is refused at the door.
    await fillServeForm(page, { repo: GGUF_REPO, name: "tiny" });
    await showPlan(page);
    await page.getByRole("button", { name: "Serve", exact: true }).click();
    const refusedServe = await admin<{ error: { message: string } }>("POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, name: "tiny" });
    assert.equal(refusedServe.status, 409);
    await page
      .getByRole("alert")
      .filter({ hasText: `Could not start the job: ${refusedServe.body.error.message}` })
      .waitFor({ timeout: UI_TIMEOUT_MS });
    assert.match(new URL(page.url()).hash, /^#\/jobs$/, "the page stays on the form");

    // A quant the repository does not have: the plan says so, and the job fails at its registry step.
    await fillServeForm(page, { repo: GGUF_REPO, quant: "Q3_K_S", name: "tiny-q3" });
    await showPlan(page);
    await page.getByText("The repository has no Q3_K_S artifact").waitFor();
    const id = await serve(page);
    await page.locator(".job-state .badge", { hasText: /^failed$/ }).waitFor({ timeout: UI_TIMEOUT_MS });
    const failed = await job(id);
    assert.equal(failed.state, "failed");
    assert.ok(failed.error !== null);
    assert.equal(failed.steps.find((step) => step.state === "failed")?.name, "registry");
    await page
      .getByRole("alert")
      .filter({ hasText: `Failed at step registry: ${failed.error}` })
      .waitFor({ timeout: UI_TIMEOUT_MS });
    await page.locator(`tr[data-job="${id}"]`).filter({ hasText: "failed" }).waitFor({ timeout: UI_TIMEOUT_MS });
    assert.match(await page.locator(`tr[data-job="${id}"]`).innerText(), /serve\s+tiny-q3\s+failed\s+registry/, "the list says where the job failed");
    await assertAccessible(page, "jobs, a failed job");
    await screenshot(page, "jobs-failed");

    // The refused requests were the point: Chromium logs each as a failed resource, nothing else may be logged.
    const refusals = desk.errors.filter((error) => /the server responded with a status of (400|409)/.test(error));
    assert.equal(refusals.length, 2, `the plan's 400 and the serve's 409: ${desk.errors.join("\n")}`);
    desk.errors.splice(0, desk.errors.length, ...desk.errors.filter((error) => !refusals.includes(error)));
    assertNoPageErrors(desk);
    await desk.context.close();
  });
});
