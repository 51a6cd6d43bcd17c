// The console in a real browser: Debian's Chromium driven by playwright-core, against a
// `llmgw up --demo` started as a user starts it (its printed address and admin key are
// what the tests log in with). Each page can be checked with axe-core and photographed into
// test/artifacts/. Anything the page logs as an error (a CSP refusal, an uncaught
// exception) is collected, and `assertNoPageErrors` fails the test on it.
import { after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { CHROMIUM, findTool } from "./tools.ts";
import { chromium, type Browser, type BrowserContext, type Page } from "playwright-core";
import { findFreePort } from "../../src/agent/free-port.ts";
import { startUp } from "./up-demo.ts";

const ARTIFACTS = fileURLToPath(new URL("../artifacts/", import.meta.url));

/** Data dirs of the `up`s this file started, removed when the file ends (after up-demo.ts has stopped them). */
const dataDirs: string[] = [];
after(() => {
  for (const dir of dataDirs) rmSync(dir, { recursive: true, force: true });
});
const require = createRequire(import.meta.url);
const AXE_SOURCE = readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");

/** Where Chromium is: CHROMIUM_PATH, else Debian's package (scripts/provision.sh installs it when missing). */
export function chromiumPath(): string {
  return findTool(CHROMIUM);
}

export async function launchBrowser(): Promise<Browser> {
  return chromium.launch({
    executablePath: chromiumPath(),
    // The flags this machine needs: no sandbox as root, no GPU, and no calls home (the network is closed).
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
    ],
  });
}

export interface ConsoleUp {
  url: string;
  adminKey: string;
  dataDir: string;
  stdout: () => string;
}

/** `llmgw up --demo` on a free port with a fresh data dir; the address and key are read from what it prints. */
export async function startConsoleUp(extraArgs: string[] = []): Promise<ConsoleUp> {
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-console-"));
  dataDirs.push(dataDir);
  const port = await findFreePort("127.0.0.1");
  const up = await startUp(dataDir, port, extraArgs);
  const out = up.stdout();
  const url = /^console: (\S+)\/ /m.exec(out)?.[1];
  const adminKey = /Admin key \(shown once[^\n]*\n\s+(\S+)/.exec(out)?.[1];
  assert.ok(url !== undefined, `llmgw up printed the console's address:\n${out}`);
  assert.ok(adminKey !== undefined, `llmgw up printed the admin key:\n${out}`);
  return { url, adminKey, dataDir, stdout: up.stdout };
}

export interface ConsolePage {
  context: BrowserContext;
  page: Page;
  /** Errors the page logged (CSP refusals, uncaught exceptions), in order. */
  errors: string[];
}

/** A fresh browser context (its own cookies) at the console, 1280×800 unless told otherwise. */
export async function openConsole(browser: Browser, url: string, viewport = { width: 1280, height: 800 }): Promise<ConsolePage> {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("console", (message) => {
    // A 401 (a session that ended, a wrong key typed on purpose) is logged by Chromium too; it is the page's to handle, not an error of the page.
    if (message.type() === "error" && !/the server responded with a status of 401/.test(message.text())) errors.push(message.text());
  });
  page.on("pageerror", (error) => errors.push(`uncaught: ${error.message}`));
  await page.goto(`${url}/`);
  return { context, page, errors };
}

/** Logs in through the form, as a person does. */
export async function logIn(page: Page, adminKey: string): Promise<void> {
  await page.getByLabel("Admin key").fill(adminKey);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.getByRole("navigation", { name: "Console" }).waitFor();
}

/** Opens a page through the navigation and waits for its heading. */
export async function goTo(page: Page, name: string): Promise<void> {
  await page.getByRole("navigation", { name: "Console" }).getByRole("link", { name, exact: true }).click();
  await page.getByRole("heading", { level: 1, name, exact: true }).waitFor();
}

/** axe-core on the page as it is now; fails on any serious or critical violation, naming each. */
export async function assertAccessible(page: Page, what: string): Promise<void> {
  // Evaluated through the debugging protocol, which the page's CSP does not govern.
  await page.evaluate(AXE_SOURCE);
  const violations = await page.evaluate(async () => {
    const axe = (
      globalThis as unknown as {
        axe: {
          run(context: unknown, options: unknown): Promise<{ violations: { id: string; impact: string; help: string; nodes: { target: string[] }[] }[] }>;
        };
      }
    ).axe;
    const result = await axe.run((globalThis as unknown as { document: unknown }).document, { resultTypes: ["violations"] });
    return result.violations.map((violation) => ({
      id: violation.id,
      impact: violation.impact,
      help: violation.help,
      targets: violation.nodes.map((node) => node.target.join(" ")).slice(0, 5),
    }));
  });
  const severe = violations.filter((violation) => violation.impact === "serious" || violation.impact === "critical");
  assert.deepEqual(severe, [], `${what}: axe-core found serious or critical violations:\n${JSON.stringify(severe, null, 2)}`);
}

/** A full-page screenshot under test/artifacts/ (kept by CI for a person to look at). */
export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(ARTIFACTS, { recursive: true });
  const file = path.join(ARTIFACTS, `console-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

export function assertNoPageErrors(consolePage: ConsolePage): void {
  assert.deepEqual(consolePage.errors, [], "the page logged no errors (CSP refusals, uncaught exceptions)");
}
