// Console sessions: on both stores with an injected clock (what is stored, expiry, key
// revocation, logout, audit), and over HTTP on a real server (the cookie's flags, the admin
// API taking the cookie, cross-site refusal, the page's security headers and assets).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { AuthenticationError, PermissionDeniedError } from "../core/errors.ts";
import { KeyService } from "../keys/key-service.ts";
import { auditTrail, readAudit } from "../store/audit.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { eventually } from "../../test/support/eventually.ts";
import { ConsoleSessions } from "./console-sessions.ts";
import { readAsset } from "./console-routes.ts";

/** GET with the path exactly as given, as a hostile client would send it. */
function rawStatus(base: string, rawPath: string): Promise<number> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    http
      .get({ host: hostname, port, path: rawPath }, (response) => {
        response.resume();
        resolve(response.statusCode ?? 0);
      })
      .on("error", reject);
  });
}

const isCode = (code: string) => (error: unknown) => error instanceof AuthenticationError && error.code === code;

testBothStores("a session acts as its admin key until it expires, is logged out, or the key is revoked; no secret is stored", async (store) => {
  let now = Date.parse("2026-12-01T09:00:00Z");
  const clock = () => now;
  const keys = new KeyService({ store, clock });
  const sessions = new ConsoleSessions({ store, keys, audit: auditTrail(store, clock), ttlMs: 60 * 60 * 1000, clock });
  const admin = await keys.create({ name: "ops", role: "admin" }, "system:test");
  const client = await keys.create({ name: "app", role: "client" }, "system:test");

  await assert.rejects(sessions.login(client.key), (error: unknown) => error instanceof PermissionDeniedError && error.code === "admin_required");
  await assert.rejects(sessions.login(`${admin.key}x`), isCode("invalid_api_key"));
  await assert.rejects(sessions.login(""), isCode("missing_api_key"));

  const session = await sessions.login(admin.key);
  assert.equal(session.principal.name, "ops");
  assert.equal(session.expiresAt, now + 60 * 60 * 1000);
  assert.equal((await sessions.verify(session.token)).principal.keyId, admin.info.id);
  const rows = await store.db.selectFrom("console_sessions").selectAll().execute();
  assert.equal(rows.length, 1);
  assert.doesNotMatch(JSON.stringify(rows), new RegExp(`${session.token}|${admin.key}`), "neither the session token nor the key is stored");

  // Expiry: a minute before, the session holds; at its end, it is refused.
  now += 59 * 60 * 1000;
  await sessions.verify(session.token);
  now += 60 * 1000;
  await assert.rejects(sessions.verify(session.token), isCode("session_expired"));

  // Revoking the key ends its sessions at the next request (another admin key stays: the last one cannot be revoked).
  const other = await keys.create({ name: "ops2", role: "admin" }, "system:test");
  const second = await sessions.login(admin.key);
  await keys.revoke(admin.info.prefix, "system:test");
  await assert.rejects(sessions.verify(second.token), isCode("revoked_api_key"));

  // Logout ends the session for good.
  const third = await sessions.login(other.key);
  await sessions.logout(third.token);
  await assert.rejects(sessions.verify(third.token), isCode("session_expired"));
  await assert.rejects(sessions.verify("not-a-session"), isCode("session_expired"));

  const trail = await readAudit(store.db, { action: "console." });
  assert.deepEqual(trail.map((entry) => `${entry.actor} ${entry.action}`).reverse(), [
    "admin:ops console.login",
    "admin:ops console.login",
    "admin:ops2 console.login",
    "admin:ops2 console.logout",
  ]);
});

describe("the console over HTTP", () => {
  let harness: Harness;
  before(async () => {
    harness = await startHarness();
  });
  after(() => harness.close());

  const login = async (key: string) => {
    const response = await fetch(`${harness.url}/api/v1/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key }),
    });
    return { status: response.status, body: (await response.json()) as Record<string, unknown>, cookie: response.headers.get("set-cookie") };
  };
  const withCookie = (cookie: string, pathname: string, init: RequestInit = {}) =>
    fetch(`${harness.url}${pathname}`, {
      ...init,
      headers: { cookie, "content-type": "application/json", "sec-fetch-site": "same-origin", ...(init.headers as Record<string, string> | undefined) },
    });

  test("logging in sets an HttpOnly, SameSite=Strict cookie; the admin API takes it and audits as the key; logout ends it", async () => {
    const refused = await login("llmgw-wrong");
    assert.equal(refused.status, 401);
    assert.equal(refused.cookie, null, "no cookie for a wrong key");

    const done = await login(harness.adminKey);
    assert.equal(done.status, 201);
    assert.equal(done.body.name, "admin");
    assert.doesNotMatch(JSON.stringify(done.body), new RegExp(harness.adminKey), "the answer does not repeat the key");
    const setCookie = done.cookie ?? "";
    assert.match(setCookie, /^llmgw_session=[A-Za-z0-9_-]{43};/);
    assert.match(setCookie, /; HttpOnly/);
    assert.match(setCookie, /; SameSite=Strict/);
    assert.match(setCookie, /; Path=\//);
    assert.match(setCookie, /; Max-Age=43200(;|$)/, "12 hours by default");
    assert.doesNotMatch(setCookie, /; Secure/, "plain http: a Secure cookie would never come back");
    assert.doesNotMatch(setCookie, new RegExp(harness.adminKey));
    const cookie = setCookie.split(";")[0]!;

    assert.equal((await withCookie(cookie, "/api/v1/models")).status, 200);
    const who = (await (await withCookie(cookie, "/api/v1/session")).json()) as { name: string };
    assert.equal(who.name, "admin");

    // A change made with the cookie from another site is refused; from the console itself it is made, as the key.
    const crossSite = await withCookie(cookie, "/api/v1/keys", {
      method: "POST",
      body: JSON.stringify({ name: "from-elsewhere" }),
      headers: { "sec-fetch-site": "same-site" },
    });
    assert.equal(crossSite.status, 403);
    assert.equal(((await crossSite.json()) as { error: { code: string } }).error.code, "cross_site_request");
    const created = await withCookie(cookie, "/api/v1/keys", { method: "POST", body: JSON.stringify({ name: "from-console" }) });
    assert.equal(created.status, 201);
    const createdPrefix = ((await created.json()) as { prefix: string }).prefix;
    const audit = await harness.admin("GET", "/api/v1/audit?action=key.create");
    const entries = audit.body.data.filter((entry: { detail: { name: string } }) => entry.detail.name.startsWith("from-"));
    assert.deepEqual(
      entries.map((entry: { actor: string; target: string }) => `${entry.actor} ${entry.target}`),
      [`admin:admin ${createdPrefix}`],
      "only the console's key was made, audited as the key that logged in",
    );

    const out = await withCookie(cookie, "/api/v1/session", { method: "DELETE" });
    assert.equal(out.status, 200);
    assert.match(out.headers.get("set-cookie") ?? "", /llmgw_session=;.*Max-Age=0/);
    const after = await withCookie(cookie, "/api/v1/models");
    assert.equal(after.status, 401);
    assert.equal(((await after.json()) as { error: { code: string } }).error.code, "session_expired");
  });

  test("a change with the cookie must come from the console: Origin where Sec-Fetch-Site is not sent, and a JSON body", async () => {
    const cookie = (await login(harness.adminKey)).cookie!.split(";")[0]!;
    const host = new URL(harness.url).host;
    // Plain http on a LAN address: browsers send Origin but no Sec-Fetch-Site.
    const post = (pathname: string, headers: Record<string, string>, body: string) =>
      fetch(`${harness.url}${pathname}`, { method: "POST", headers: { cookie, ...headers }, body });
    const codeOf = async (response: Response) => ((await response.json()) as { error: { code: string } }).error.code;
    const foreign = await post(
      "/api/v1/keys",
      { origin: `http://${new URL(harness.url).hostname}:9999`, "content-type": "application/json" },
      JSON.stringify({ name: "from-another-port" }),
    );
    assert.equal(foreign.status, 403, "another port of the same host is another origin");
    assert.equal(await codeOf(foreign), "cross_site_request");
    const ours = await post("/api/v1/keys", { origin: `http://${host}`, "content-type": "application/json" }, JSON.stringify({ name: "from-this-origin" }));
    assert.equal(ours.status, 201);
    // What an HTML form on another site can send without asking first: refused even when the headers say nothing.
    const form = await post("/api/v1/keys", { "content-type": "text/plain" }, JSON.stringify({ name: "form-post" }));
    assert.equal(form.status, 400);
    assert.equal(await codeOf(form), "unsupported_media_type");
    const loginForm = await fetch(`${harness.url}/api/v1/session`, {
      method: "POST",
      headers: { "content-type": "text/plain" },
      body: JSON.stringify({ key: harness.adminKey }),
    });
    assert.equal(loginForm.status, 400);
    const names = ((await harness.admin("GET", "/api/v1/keys")).body.data as { name: string }[]).map((key) => key.name);
    assert.ok(names.includes("from-this-origin") && !names.includes("from-another-port") && !names.includes("form-post"), names.join(", "));

    // The playground is a change too (it spends the key's budget).
    const chat = JSON.stringify({ model: "none", messages: [{ role: "user", content: "hi" }] });
    const playgroundForeign = await post(
      "/api/v1/playground/chat/completions",
      { origin: "https://elsewhere.example", "content-type": "application/json" },
      chat,
    );
    assert.equal(playgroundForeign.status, 403);
    assert.equal(await codeOf(playgroundForeign), "cross_site_request");
    const playgroundSiteHeader = await post("/api/v1/playground/chat/completions", { "sec-fetch-site": "same-site", "content-type": "application/json" }, chat);
    assert.equal(playgroundSiteHeader.status, 403);
    const playgroundOurs = await post("/api/v1/playground/chat/completions?x=1", { origin: `http://${host}`, "content-type": "application/json" }, chat);
    assert.equal(playgroundOurs.status, 404, "past the session check, the gateway answers: no such model");
    assert.equal(await codeOf(playgroundOurs), "model_not_found");
  });

  test("bad cookies and bad login bodies get clear answers, never a 500", async () => {
    const broken = await fetch(`${harness.url}/api/v1/models`, { headers: { cookie: "llmgw_session=%E0%A4%A" } });
    assert.equal(broken.status, 401);
    const brokenPlayground = await fetch(`${harness.url}/api/v1/playground/chat/completions`, {
      method: "POST",
      headers: { cookie: "llmgw_session=%E0%A4%A", "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(brokenPlayground.status, 401);
    const numeric = await fetch(`${harness.url}/api/v1/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key: 5 }),
    });
    assert.equal(numeric.status, 400);
    assert.equal(((await numeric.json()) as { error: { param: string } }).error.param, "key");
  });

  test("the event stream of a session ends once the session does", { timeout: 60_000 }, async () => {
    const cookie = (await login(harness.adminKey)).cookie!.split(";")[0]!;
    const stream = await withCookie(cookie, "/api/v1/events/stream");
    assert.equal(stream.status, 200);
    const reader = stream.body!.getReader();
    let ended = false;
    const drained = (async () => {
      for (;;) if ((await reader.read()).done) break;
      ended = true;
    })();
    assert.equal((await withCookie(cookie, "/api/v1/session", { method: "DELETE" })).status, 200);
    // Events keep coming; the stream checks the session again before sending one (at most 5 s after its last check).
    await eventually(
      "the stream to close after logout",
      async () => {
        await harness.server.events.record({ kind: "node_back", subject: "node:test", message: "a test event" });
        return ended;
      },
      { timeoutMs: 30_000, intervalMs: 500 },
    );
    await drained;
  });

  test("the playground needs a session or an admin key", async () => {
    const response = await fetch(`${harness.url}/api/v1/playground/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "x", messages: [] }),
    });
    assert.equal(response.status, 401);
    const client = await harness.clientKey();
    const asClient = await fetch(`${harness.url}/api/v1/playground/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${client}`, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(asClient.status, 403);
  });

  test("the page and its assets carry a CSP without inline scripts; nothing outside the assets is served", async () => {
    const page = await fetch(`${harness.url}/`);
    assert.equal(page.status, 200);
    assert.match(page.headers.get("content-type") ?? "", /^text\/html/);
    const csp = page.headers.get("content-security-policy") ?? "";
    assert.match(csp, /script-src 'self'(;|$)/);
    assert.match(csp, /frame-ancestors 'none'/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/);
    const html = await page.text();
    assert.doesNotMatch(html, /<script(?![^>]*\ssrc=)[^>]*>/, "no inline script in the page");
    assert.doesNotMatch(html, /\sstyle=|<style/, "no inline style in the page");

    for (const [asset, type] of [
      ["/console/app.js", /javascript/],
      ["/console/vendor/preact-htm.js", /javascript/],
      ["/console/vendor/uplot.js", /javascript/],
      ["/console/vendor/uplot.css", /css/],
      ["/console/style.css", /css/],
    ] as const) {
      const response = await fetch(`${harness.url}${asset}`);
      assert.equal(response.status, 200, asset);
      assert.match(response.headers.get("content-type") ?? "", type, asset);
      assert.equal(response.headers.get("x-content-type-options"), "nosniff");
    }
    // Sent as written (fetch would tidy the dots away before they reach the server).
    for (const outside of [
      "/console/../../package.json",
      "/console/%2e%2e/%2e%2e/package.json",
      "/console/pages/..%2f..%2fconsole-routes.ts",
      "/console/pages/..%5c..%5cconsole-routes.ts",
      "/console/%252e%252e/%252e%252e/package.json",
      "/console/vendor/../../../package.json",
      "/console/console-routes.ts",
      "/console/vendor/other.js",
      "/console/vendor/toString",
      "/console/vendor/__proto__",
    ]) {
      assert.equal(await rawStatus(harness.url, outside), 404, outside);
    }
    assert.equal(await rawStatus(harness.url, "/console/pages/models.js"), 200, "the raw requests reach real assets");
    // Below HTTP (which already tidies paths), the asset lookup itself takes only plain names.
    for (const name of ["../console-routes.ts", "pages/../../console-routes.ts", "/etc/passwd", "lib/../app.js", "vendor/toString", "vendor/../app.js"]) {
      assert.equal(await readAsset(name), null, name);
    }
    assert.notEqual(await readAsset("vendor/preact-htm.js"), null);
  });
});

test("a session expires on its own", async () => {
  const harness = await startHarness({ consoleSessionTtlMs: 1500 });
  try {
    const response = await fetch(`${harness.url}/api/v1/session`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key: harness.adminKey }),
    });
    assert.match(response.headers.get("set-cookie") ?? "", /; Max-Age=1(;|$)/);
    const cookie = response.headers.get("set-cookie")!.split(";")[0]!;
    await eventually("the 1.5 s session to expire", async () => (await fetch(`${harness.url}/api/v1/models`, { headers: { cookie } })).status === 401, {
      timeoutMs: 15_000,
    });
  } finally {
    await harness.close();
  }
});

test("behind an https proxy the cookie is Secure", async () => {
  const harness = await startHarness();
  try {
    for (const header of [{ "x-forwarded-proto": "https" }, { forwarded: "for=10.0.0.1;proto=https" }] as Record<string, string>[]) {
      const response = await fetch(`${harness.url}/api/v1/session`, {
        method: "POST",
        headers: { "content-type": "application/json", ...header },
        body: JSON.stringify({ key: harness.adminKey }),
      });
      assert.match(response.headers.get("set-cookie") ?? "", /; Secure/, JSON.stringify(header));
    }
  } finally {
    await harness.close();
  }
});
