// The console's Models and Nodes pages in Chromium against `llmgw up --demo`: what each
// shows is compared with what the admin API answers at the same time (the demo model's
// state and replicas, the node's memory bar, the join token), and the pages' actions are
// checked by their effect on the API (scaling the demo model, removing it through the
// confirmation dialog). Both pages are checked with axe-core and photographed at desktop and
// phone width. The tests run in order and share one server and one browser page.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
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

const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const WAIT = { timeout: 60_000 };

interface ModelView {
  name: string;
  routing: string;
  scaling: { min: number; max: number; idle_seconds: number };
  health: { state: string; ready: number; replicas: number; reason: string | null };
  replicas: Array<{ id: string; state: string; nodeIds: string[] }>;
}

interface NodeView {
  id: string;
  name: string;
  state: string;
  memory_bytes: { used: number; total: number };
  cores: { used: number; total: number };
}

let up: ConsoleUp;
let browser: Browser;
let consolePage: ConsolePage;
let page: Page;

async function adminGet<T>(path: string): Promise<T> {
  const response = await fetch(`${up.url}${path}`, { headers: { authorization: `Bearer ${up.adminKey}` } });
  const body = await response.text();
  assert.equal(response.status, 200, `GET ${path} answered ${response.status}: ${body}`);
  return JSON.parse(body) as T;
}

const models = async () => (await adminGet<{ data: ModelView[] }>("/api/v1/models")).data;
const nodes = async () => (await adminGet<{ data: NodeView[] }>("/api/v1/nodes")).data;

/** A model's or node's section on its page: a region named by its heading. */
const section = (name: string) => page.getByRole("region", { name, exact: true });

/** axe-core and a screenshot at desktop width, then the same at phone width, and back. */
async function checkBothWidths(name: string): Promise<void> {
  await assertAccessible(page, `${name} at ${DESKTOP.width}x${DESKTOP.height}`);
  await screenshot(page, name);
  await page.setViewportSize(PHONE);
  await assertAccessible(page, `${name} at ${PHONE.width}x${PHONE.height}`);
  await screenshot(page, `${name}-phone`);
  await page.setViewportSize(DESKTOP);
}

// In a describe block: startConsoleUp registers the data dir's removal with `after`, which
// inside a top-level `before` would attach to the first test and remove the data dir (and
// the demo's weights) when that test ends.
describe("the Models and Nodes pages", () => {
  before(async () => {
    up = await startConsoleUp();
    browser = await launchBrowser();
    consolePage = await openConsole(browser, up.url, DESKTOP);
    page = consolePage.page;
    await logIn(page, up.adminKey);
  });

  after(async () => {
    await browser?.close();
  });

  test("Models shows the demo model as the API does, and it reaches ready", { timeout: 180_000 }, async () => {
    await goTo(page, "Models");
    const demo = section("demo");
    await demo.waitFor(WAIT);
    // The API first: the demo's replica starts after `up` listens.
    const ready = await eventually(
      "the API to show 'demo' ready",
      async () => {
        const demoNow = (await models()).find((model) => model.name === "demo");
        // Thrown, not returned: a timeout then says what the model's health was.
        if (demoNow?.health.state !== "ready") throw new Error(`demo's health is ${JSON.stringify(demoNow?.health)}`);
        return demoNow;
      },
      { timeoutMs: 120_000 },
    );
    await demo.locator(".model-head .badge", { hasText: "ready" }).waitFor(WAIT);
    await demo.getByText(`${ready.health.ready} of ${ready.scaling.min} ready`, { exact: true }).waitFor(WAIT);

    // Each replica is listed with its state and the node it runs on, by the node's name.
    const nodeNames = new Map((await nodes()).map((node) => [node.id, node.name]));
    const replicaTable = demo.getByRole("table", { name: "Replicas of demo" });
    for (const replica of ready.replicas) {
      const row = replicaTable.getByRole("row").filter({ hasText: replica.id });
      await row.waitFor(WAIT);
      const nodeName = replica.nodeIds.map((id) => nodeNames.get(id)).join(", ");
      assert.ok(nodeName !== "", `replica ${replica.id} runs on a known node`);
      await row.getByRole("cell", { name: nodeName, exact: true }).waitFor(WAIT);
      await row.getByText(replica.state, { exact: true }).waitFor(WAIT);
    }
    // Routing as the API has it (least-busy by default).
    await demo.getByText(`${ready.routing} (the replica with the fewest requests in flight)`, { exact: true }).waitFor(WAIT);
    // The demo's weights are a local file: no origin, so nothing to update or roll back.
    await demo.getByText("not followed (no origin repository)").waitFor(WAIT);
    assert.equal(await demo.getByRole("button", { name: "Update" }).count(), 0, "no Update without an origin");
    assert.equal(await demo.getByRole("button", { name: "Unpark" }).count(), 0, "no Unpark for a model that is not parked");

    await checkBothWidths("models");
  });

  test("scaling the demo model from the page changes it in the API", { timeout: 120_000 }, async () => {
    const demo = section("demo");
    const before = (await models()).find((model) => model.name === "demo");
    assert.ok(before !== undefined);
    const newMax = before.scaling.max + 1;
    await demo.getByRole("button", { name: "Scale" }).click();
    const maxField = demo.getByLabel("Max replicas");
    assert.equal(await maxField.inputValue(), String(before.scaling.max), "the form starts from the model's scaling");
    await maxField.fill(String(newMax));
    await demo.getByRole("button", { name: "Save scaling" }).click();
    const after = await eventually("the API to show the new max", async () =>
      (await models()).find((model) => model.name === "demo" && model.scaling.max === newMax),
    );
    assert.equal(after.scaling.min, before.scaling.min, "min replicas unchanged");
    assert.equal(after.scaling.idle_seconds, before.scaling.idle_seconds, "idle seconds unchanged");
    // The form closes and the page follows the change.
    await demo.getByText(`wanted ready (autoscaled between ${Math.max(after.scaling.min, 1)} and ${newMax})`).waitFor(WAIT);
    assert.equal(await demo.getByLabel("Max replicas").count(), 0, "the scale form closed after saving");
    // Its max now above its min, it autoscales: the page shows the target, load and decision as the leader has them.
    const scaling = await eventually("the API's autoscaling view of demo", async () => {
      const health = await adminGet<{ autoscaling: { desired: number; min: number; max: number; target: number } | null }>("/api/v1/models/demo/health");
      return health.autoscaling ?? undefined;
    });
    assert.deepEqual([scaling.min, scaling.max], [after.scaling.min, newMax]);
    await demo
      .getByText(`${scaling.desired} wanted (${scaling.min} to ${scaling.max}); target ${scaling.target} in flight and queued per replica`)
      .waitFor(WAIT);
  });

  test("a model no node can take shows the placement explanation the API gives", { timeout: 120_000 }, async () => {
    // A GPU profile on the demo's CPU-only node: placement refuses it, and says why per node.
    const created = await fetch(`${up.url}/api/v1/models`, {
      method: "POST",
      headers: { authorization: `Bearer ${up.adminKey}`, "content-type": "application/json" },
      body: JSON.stringify({
        name: "needs-gpu",
        profiles: [{ name: "gpu", engine: "llamacpp", hardware: { gpu: { class: "H200" } } }],
        source: { kind: "file", path: path.join(up.dataDir, "models", "demo.gguf") },
      }),
    });
    assert.equal(created.status, 201, await created.text());
    const health = await eventually("the API to explain why 'needs-gpu' has no replica", async () => {
      const answer = await adminGet<{ state: string; placement: string[] | null }>("/api/v1/models/needs-gpu/health");
      return answer.state === "unplaceable" && answer.placement !== null && answer.placement.length > 0 ? answer : undefined;
    });
    const card = section("needs-gpu");
    await card.locator(".model-head .badge", { hasText: "unplaceable" }).waitFor(WAIT);
    const reasons = card.getByRole("list");
    await eventually("the page to list the API's placement lines", async () => {
      const shown = (await reasons.getByRole("listitem").allTextContents()).map((line) => line.trim());
      return JSON.stringify(shown) === JSON.stringify(health.placement) ? shown : undefined;
    });
    // Leave the page before removing it through the API, so the page never asks for a model that just went.
    await goTo(page, "Nodes");
    const removed = await fetch(`${up.url}/api/v1/models/needs-gpu`, { method: "DELETE", headers: { authorization: `Bearer ${up.adminKey}` } });
    assert.equal(removed.status, 200, await removed.text());
  });

  test("Nodes shows the node's memory as the API does, and the join command with the real token", { timeout: 120_000 }, async () => {
    await goTo(page, "Nodes");
    const [node] = await nodes();
    assert.ok(node !== undefined, "the demo has its local node");
    const card = section(node.name);
    await card.waitFor(WAIT);
    await card.locator(".node-head .badge", { hasText: node.state }).waitFor(WAIT);

    const memory = card.getByRole("meter", { name: `Memory of ${node.name}`, exact: true });
    await memory.waitFor(WAIT);
    // The page's own formatter (the module it already loaded), so the expected text is the one it must show.
    const uiModule = "/console/lib/ui.js";
    const expected = await eventually("the memory bar to match the API", async () => {
      const { used, total } = (await nodes()).find((candidate) => candidate.id === node.id)!.memory_bytes;
      const text = await page.evaluate(
        async ({ url, used, total }) => {
          const { formatBytes } = (await import(url)) as { formatBytes: (bytes: number) => string };
          return `${formatBytes(used)} of ${formatBytes(total)}`;
        },
        { url: uiModule, used, total },
      );
      const shown = {
        text: await memory.getAttribute("aria-valuetext"),
        now: await memory.getAttribute("aria-valuenow"),
        max: await memory.getAttribute("aria-valuemax"),
      };
      return shown.text === text && shown.now === String(used) && shown.max === String(total) ? { text, used, total } : undefined;
    });
    assert.match(expected.text, /^\d+(\.\d)? (B|KB|MB|GB|TB) of \d+(\.\d)? (B|KB|MB|GB|TB)$/, "memory in bytes units, used of total");
    assert.ok(expected.total > 0, "the node reported its memory");
    await card.getByText(expected.text, { exact: true }).waitFor(WAIT);
    // The demo's replica reserves a quarter core (plan/cpu-share.ts): the bar shows the fraction, not "0 of N".
    const cores = (await nodes()).find((candidate) => candidate.id === node.id)!.cores;
    assert.equal(cores.used, 0.25);
    assert.equal(await card.getByRole("meter", { name: `Cores of ${node.name}`, exact: true }).getAttribute("aria-valuetext"), `0.25 of ${cores.total}`);

    const { token } = await adminGet<{ token: string }>("/api/v1/nodes/join-token");
    const addNode = section("Add a node");
    const command = addNode.locator("pre.join-command");
    await command.waitFor(WAIT);
    assert.equal((await command.textContent())?.trim(), `llmgw agent --server ${up.url} --join-token ${token}`);
    await addNode.getByRole("button", { name: "Copy the join command" }).waitFor(WAIT);
    // A node on another machine needs its address in the command.
    await addNode.getByLabel("Address of the new node", { exact: false }).fill("10.0.0.12");
    assert.equal((await command.textContent())?.trim(), `llmgw agent --server ${up.url} --join-token ${token} --advertise 10.0.0.12`);
    await addNode.getByLabel("Address of the new node", { exact: false }).fill("");
    await addNode.getByLabel("Address of the new node", { exact: false }).blur();

    await checkBothWidths("nodes");
  });

  test("removing the demo model asks first, naming it, and then the API no longer has it", { timeout: 120_000 }, async () => {
    await goTo(page, "Models");
    const demo = section("demo");
    await demo.waitFor(WAIT);

    // Cancel first: nothing happens.
    await demo.getByRole("button", { name: "Remove", exact: true }).click();
    const dialog = page.getByRole("dialog", { name: "Remove model 'demo'?" });
    await dialog.waitFor(WAIT);
    await assertAccessible(page, "models with the remove dialog open");
    await dialog.getByRole("button", { name: "Cancel" }).click();
    await dialog.waitFor({ state: "detached", ...WAIT });
    assert.ok(
      (await models()).some((model) => model.name === "demo"),
      "cancelling removes nothing",
    );

    await demo.getByRole("button", { name: "Remove", exact: true }).click();
    await dialog.waitFor(WAIT);
    assert.match((await dialog.textContent()) ?? "", /'demo'/, "the dialog names the model");
    await dialog.getByRole("button", { name: "Remove 'demo'" }).click();
    await eventually("the API to forget 'demo'", async () => !(await models()).some((model) => model.name === "demo"));
    await section("demo").waitFor({ state: "detached", ...WAIT });
    await page.getByText("No models yet.").waitFor(WAIT);

    assertNoPageErrors(consolePage);
  });
});
