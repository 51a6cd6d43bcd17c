// The console as a newcomer meets it: `llmgw up --demo` as a child process, its printed
// address opened in Chromium, the printed admin key typed into the login form, and a chat
// with the demo model in the Playground, streamed. Also: the session cookie's flags and
// that the browser keeps no key; escaping of what a user types; stopping an answer; every
// page at 1280×800 and at phone width (axe-core, no sideways scrolling); visible keyboard
// focus; a lost connection shown and recovered; logging out.
// biome-ignore-all lint/performance/useDomNodeTextContent: these are Playwright locators, not DOM nodes; innerText() is what the user sees (rendered, with table cells and hidden text laid out), which textContent() is not.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import type { Browser } from "playwright-core";
import { eventually } from "./support/eventually.ts";
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

const PAGES = ["Models", "Nodes", "Jobs", "Keys", "Usage", "Events", "Playground"];

describe("the console, as a newcomer uses it", () => {
  let up: ConsoleUp;
  let browser: Browser;

  before(async () => {
    up = await startConsoleUp();
    browser = await launchBrowser();
  });
  after(async () => {
    await browser?.close();
  });

  const demoReady = () =>
    eventually(
      "the demo model to have a ready replica",
      async () => {
        const response = await fetch(`${up.url}/api/v1/models/demo`, { headers: { authorization: `Bearer ${up.adminKey}` } });
        const model = (await response.json()) as { replicas: { state: string; lastError: string | null }[] };
        if (model.replicas.some((replica) => replica.state === "ready")) return true;
        throw new Error(`replicas: ${JSON.stringify(model.replicas.map((replica) => [replica.state, replica.lastError]))}`);
      },
      { timeoutMs: 120_000 },
    );

  test("logs in with the printed key and chats with the demo model, the answer streamed; the browser never holds the key", { timeout: 240_000 }, async () => {
    const consolePage = await openConsole(browser, up.url);
    const { page, context } = consolePage;

    await page.getByLabel("Admin key").fill("llmgw-not-a-real-key");
    await page.getByRole("button", { name: "Log in" }).click();
    await page.getByRole("alert").filter({ hasText: "The API key is not valid" }).waitFor();
    await screenshot(page, "login");
    await assertAccessible(page, "the login form");

    // By keyboard only: the field, the key, Enter.
    await page.getByLabel("Admin key").fill("");
    await page.getByLabel("Admin key").focus();
    await page.keyboard.type(up.adminKey);
    await page.keyboard.press("Enter");
    await page.getByRole("navigation", { name: "Console" }).waitFor();

    const cookies = await context.cookies();
    const session = cookies.find((cookie) => cookie.name === "llmgw_session");
    assert.ok(session !== undefined, "a session cookie is set");
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, "Strict");
    assert.notEqual(session.value, up.adminKey);
    const stored = await page.evaluate(() => {
      const w = globalThis as unknown as {
        document: { cookie: string; documentElement: { outerHTML: string } };
        localStorage: { length: number };
        sessionStorage: { length: number };
      };
      return { cookie: w.document.cookie, local: w.localStorage.length, session: w.sessionStorage.length, html: w.document.documentElement.outerHTML };
    });
    assert.equal(stored.cookie, "", "the page cannot read the session cookie");
    assert.equal(stored.local + stored.session, 0, "nothing kept in web storage");
    assert.ok(!stored.html.includes(up.adminKey), "the key is gone from the page once logged in");

    await demoReady();
    await goTo(page, "Playground");
    await page.getByLabel("Model").selectOption("demo");
    // Greedy decoding: a sampled answer of the random demo model may end at its first token.
    await page.getByLabel("Temperature").fill("0");
    // What a user types is shown as text, never run or parsed as markup.
    const typed = `<img src=x onerror="globalThis.injected=1">Hello`;
    await page.getByLabel("Message").fill(typed);
    await page.evaluate(() => {
      const w = globalThis as unknown as {
        lengths: number[];
        document: { querySelector(s: string): { querySelectorAll(s: string): { textContent: string | null }[] } };
        MutationObserver: new (cb: () => void) => { observe(target: unknown, options: unknown): void };
      };
      w.lengths = [];
      const log = w.document.querySelector("[role=log]");
      new w.MutationObserver(() => {
        const answers = log.querySelectorAll(".msg-assistant .text");
        const last = answers[answers.length - 1];
        if (last !== undefined) w.lengths.push((last.textContent ?? "").length);
      }).observe(log, { subtree: true, childList: true, characterData: true });
    });
    await page.getByRole("button", { name: "Send" }).click();
    const status = page.getByRole("status").filter({ hasText: "tokens/s" });
    await status.waitFor({ timeout: 120_000 });
    assert.match(await status.innerText(), /time to first token \d[\d,]* ms · [\d.,]+ tokens\/s · \d+ tokens/);
    const lengths = await page.evaluate(() => (globalThis as unknown as { lengths: number[] }).lengths);
    const distinct = new Set(lengths.filter((length) => length > 0));
    assert.ok(distinct.size >= 3, `the answer grew in steps as tokens streamed in (seen lengths: ${[...distinct].slice(0, 10).join(", ")})`);
    const log = page.getByRole("log");
    assert.ok((await log.innerText()).includes(typed), "the message is shown as typed");
    assert.equal(await log.locator("img").count(), 0, "no element was made from the message");
    assert.equal(await page.evaluate(() => (globalThis as unknown as { injected?: number }).injected), undefined);
    const answer = await log.locator(".msg-assistant .text").last().innerText();
    assert.ok(answer.length > 0, "the demo model answered");

    // Stop: greedy decoding of "Hello" runs to the context's end (a quarter minute here), so the click always lands mid-answer.
    await page.getByRole("button", { name: "Clear" }).click();
    await page.getByLabel("Temperature").fill("0");
    await page.getByLabel("Max tokens").fill("2000");
    await page.getByLabel("Message").fill("Hello");
    await page.getByRole("button", { name: "Send" }).click();
    await eventually("the first tokens of the long answer", async () => (await log.locator(".msg-assistant .text").last().innerText()).length > 0);
    await page.getByRole("button", { name: "Stop" }).click();
    await page.getByRole("status").filter({ hasText: "finished: stopped" }).waitFor();
    await log.getByText("(stopped)").waitFor();
    assert.equal(await page.getByRole("button", { name: "Send" }).isDisabled(), true, "Send waits for a new message");

    // Clear while an answer streams: nothing of it stays behind, and the next message goes through.
    await page.getByLabel("Message").fill("Hello");
    await page.getByRole("button", { name: "Send" }).click();
    await eventually("the first tokens of the answer to clear", async () => (await log.locator(".msg-assistant .text").last().innerText()).length > 0);
    await page.getByRole("button", { name: "Clear" }).click();
    await eventually("the conversation to be empty", async () => (await log.locator(".msg").count()) === 0);
    await page.getByLabel("Max tokens").fill("8");
    await page.getByLabel("Message").fill("Hi");
    await page.getByRole("button", { name: "Send" }).click();
    await page.getByRole("status").filter({ hasText: "finished: length" }).waitFor({ timeout: 60_000 });
    assert.deepEqual(await log.locator(".msg .who").allInnerTexts(), ["You:", "demo:"], "one question, one answer");
    assert.equal(await page.getByRole("alert").count(), 0, "no error");
    await screenshot(page, "playground");
    await assertAccessible(page, "the Playground after a chat");
    assertNoPageErrors(consolePage);
    await context.close();
  });

  for (const viewport of [
    { width: 1280, height: 800, name: "desktop" },
    { width: 390, height: 844, name: "phone" },
  ]) {
    test(`every page at ${viewport.width}×${viewport.height}: its heading, no serious axe-core violation, no sideways scrolling`, {
      timeout: 180_000,
    }, async () => {
      const consolePage = await openConsole(browser, up.url, { width: viewport.width, height: viewport.height });
      const { page, context } = consolePage;
      await logIn(page, up.adminKey);
      for (const name of PAGES) {
        await goTo(page, name);
        // The page is judged once its first load has landed, not while it says "Loading…".
        await eventually(
          `${name} to load`,
          async () =>
            (await page
              .getByRole("status")
              .filter({ hasText: /^Loading/ })
              .count()) === 0,
        );
        await assertAccessible(page, `${name} at ${viewport.name} width`);
        const overflow = await page.evaluate(() => {
          const w = globalThis as unknown as { document: { documentElement: { scrollWidth: number } }; innerWidth: number };
          return w.document.documentElement.scrollWidth - w.innerWidth;
        });
        assert.ok(overflow <= 1, `${name} at ${viewport.name} width scrolls sideways by ${overflow} px`);
      }
      if (viewport.name === "phone") await screenshot(page, "playground-phone");

      // The keyboard reaches the navigation (past the skip link), and the focused link is visibly marked.
      await page.locator("a.skip").focus();
      await page.keyboard.press("Tab");
      const outline = await page.evaluate(() => {
        const w = globalThis as unknown as {
          document: { activeElement: unknown };
          getComputedStyle(e: unknown): { outlineStyle: string; outlineWidth: string };
        };
        const style = w.getComputedStyle(w.document.activeElement);
        return `${style.outlineStyle} ${style.outlineWidth}`;
      });
      const focused = await page.evaluate(
        () => (globalThis as unknown as { document: { activeElement: { textContent: string | null } | null } }).document.activeElement?.textContent,
      );
      assert.equal(focused, "Models", "Tab from the skip link reaches the first link of the navigation");
      assert.doesNotMatch(outline, /^none|\s0px$/, `the focused link shows a focus ring (${outline})`);
      await page.keyboard.press("Enter");
      await page.getByRole("heading", { level: 1, name: "Models", exact: true }).waitFor();
      assertNoPageErrors(consolePage);
      await context.close();
    });
  }

  test("a lost connection is shown and recovers by itself; a session ended elsewhere returns to the login form; logging out ends the session", {
    timeout: 120_000,
  }, async () => {
    const consolePage = await openConsole(browser, up.url);
    const { page, context } = consolePage;
    await logIn(page, up.adminKey);
    await goTo(page, "Models");
    const banner = page.getByRole("alert").filter({ hasText: "Connection to the server lost" });
    await context.setOffline(true);
    await banner.waitFor({ timeout: 20_000 });
    await screenshot(page, "connection-lost");
    await context.setOffline(false);
    await banner.waitFor({ state: "detached", timeout: 20_000 });
    // What Chromium logged while this test held it offline is the test's doing, not the page's.
    consolePage.errors.splice(0, consolePage.errors.length, ...consolePage.errors.filter((error) => !error.includes("ERR_INTERNET_DISCONNECTED")));

    // A session ended elsewhere (another tab logged out, the key revoked) sends the page back to the login form.
    const endOutside = async () => {
      const current = (await context.cookies()).find((candidate) => candidate.name === "llmgw_session")!;
      const ended = await fetch(`${up.url}/api/v1/session`, { method: "DELETE", headers: { cookie: `llmgw_session=${current.value}` } });
      assert.equal(ended.status, 200);
    };
    await endOutside();
    await page.getByRole("status").filter({ hasText: "Your console session has ended" }).waitFor({ timeout: 20_000 });
    await logIn(page, up.adminKey);
    // The Playground reads nothing by itself: its next Send finds the session over.
    await goTo(page, "Playground");
    await page.getByLabel("Model").selectOption("demo");
    await endOutside();
    await page.getByLabel("Message").fill("Hello");
    await page.getByRole("button", { name: "Send" }).click();
    await page.getByRole("status").filter({ hasText: "Your console session has ended" }).waitFor({ timeout: 20_000 });
    await logIn(page, up.adminKey);

    const cookie = (await context.cookies()).find((candidate) => candidate.name === "llmgw_session")!;
    await page.getByRole("button", { name: "Log out" }).click();
    await page.getByRole("status").filter({ hasText: "You are logged out." }).waitFor();
    await page.getByLabel("Admin key").waitFor();
    const after = await fetch(`${up.url}/api/v1/models`, { headers: { cookie: `llmgw_session=${cookie.value}` } });
    assert.equal(after.status, 401, "the old session no longer works anywhere");
    // Reloading does not bring the session back.
    await page.reload();
    await page.getByLabel("Admin key").waitFor();
    assertNoPageErrors(consolePage);
    await context.close();
  });
});
