// The console's HTTP side: the page at `/`, its scripts and styles under /console/ (plain ES
// modules, no build step) with the few pinned libraries it uses served from this package's
// own node_modules (never a CDN), strict security headers on all of it, and the session
// endpoints (log in, who am I, log out) under /api/v1/session. Whether a request to the
// admin API carries a valid session, and comes from the console itself, is decided by
// `sessionOfRequest`, which the admin API's auth step and the playground's route share.
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { Context, Env, Hono } from "hono";
import { deleteCookie, setCookie } from "hono/cookie";
import { parse as parseCookies } from "hono/utils/cookie";
import { BadRequestError, LlmgwError, PermissionDeniedError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Principal } from "../keys/key-service.ts";
import { SESSION_COOKIE, type ConsoleSession, type ConsoleSessions } from "./console-sessions.ts";

// One folder whether this runs from src/ (tsx) or dist/ (compiled): the assets ship in src/.
const ASSETS_DIR = fileURLToPath(new URL("../../src/console/assets/", import.meta.url));
const require = createRequire(import.meta.url);
const packageDir = (name: string) => path.dirname(require.resolve(`${name}/package.json`));

/** The libraries the page imports, by the name it imports them under. Versions are pinned in package.json. */
const VENDOR_FILES = new Map<string, () => string>(
  Object.entries({
    // htm's package.json cannot be resolved (its exports leave it out); its main file sits in dist/.
    "preact-htm.js": () => path.join(path.dirname(require.resolve("htm")), "..", "preact", "standalone.mjs"),
    "uplot.js": () => path.join(packageDir("uplot"), "dist", "uPlot.esm.js"),
    "uplot.css": () => path.join(packageDir("uplot"), "dist", "uPlot.min.css"),
  }),
);

const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
};

/**
 * No inline script or style element anywhere, nothing from another origin, and the page may
 * not be framed (clickjacking). Styles set from script (element.style) are not inline styles
 * in CSP's sense, so charts and bars still draw.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "manifest-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join("; ");

const SECURITY_HEADERS: Record<string, string> = {
  "content-security-policy": CONSOLE_CSP,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  // Revalidated on every load: an upgraded server never runs a page against stale modules.
  "cache-control": "no-cache",
};

/** Asset names are plain relative paths (pages/models.js); anything else is not ours to serve. */
const ASSET_NAME = /^[a-z0-9_-]+(\/[a-z0-9_-]+)*\.(js|css|html|svg)$/;

/** An asset by its name under /console/ (vendor/NAME for the libraries); null for anything else. */
export async function readAsset(name: string): Promise<{ body: Buffer; type: string } | null> {
  let file: string;
  if (name.startsWith("vendor/")) {
    const vendor = VENDOR_FILES.get(name.slice("vendor/".length));
    if (vendor === undefined) return null;
    try {
      file = vendor();
    } catch {
      return null;
    }
  } else {
    if (!ASSET_NAME.test(name)) return null;
    file = path.join(ASSETS_DIR, name);
  }
  try {
    return { body: await readFile(file), type: CONTENT_TYPES[path.extname(file)] ?? "application/octet-stream" };
  } catch {
    return null;
  }
}

export interface ConsoleRoutesOptions {
  sessions: ConsoleSessions;
  /** Reads a JSON body within the admin API's limits. */
  jsonBody: (c: Context) => Promise<unknown>;
  logger: Logger;
}

/** The page, its assets and the session endpoints. Mount before the admin API's auth step: logging in needs no session. */
export function mountConsoleRoutes<E extends Env>(app: Hono<E>, options: ConsoleRoutesOptions): void {
  const { sessions } = options;
  const serve = async (c: Context, name: string) => {
    const asset = await readAsset(name);
    if (asset === null) {
      const message = name === "index.html" ? "The console's files are missing from this installation; reinstall llmgw." : "Not found.";
      return c.text(message, name === "index.html" ? 500 : 404, SECURITY_HEADERS);
    }
    return c.body(new Uint8Array(asset.body), 200, { ...SECURITY_HEADERS, "content-type": asset.type });
  };
  app.get("/", (c) => serve(c, "index.html"));
  app.on(["POST", "PUT", "PATCH", "DELETE"], "/", (c) => c.text("The console page is only read (GET).", 405, { ...SECURITY_HEADERS, allow: "GET, HEAD" }));
  app.get("/console", (c) => c.redirect("/", 301));
  app.get("/console/", (c) => c.redirect("/", 301));
  app.get("/console/*", (c) => serve(c, c.req.path.slice("/console/".length)));

  app.post("/api/v1/session", async (c) => {
    assertSameOrigin(requestFacts(c.req.raw.headers, "POST"), sessions.publicOrigin());
    const body = await options.jsonBody(c);
    const key = (body as { key?: unknown } | null)?.key;
    if (key !== undefined && typeof key !== "string") {
      throw new BadRequestError("Invalid login: field 'key': must be the admin key as a string.", { code: "invalid_field", param: "key" });
    }
    let session: { token: string } & ConsoleSession;
    try {
      session = await sessions.login(key);
    } catch (error) {
      // A person mistyping, or someone guessing: either way an operator may want to see it (never the key itself).
      if (error instanceof LlmgwError) options.logger.warn({ code: error.code, address: forwardedFor(c) }, "console login refused");
      throw error;
    }
    setCookie(c, SESSION_COOKIE, session.token, {
      path: "/",
      httpOnly: true,
      sameSite: "Strict",
      secure: isHttps(c, sessions.publicOrigin()),
      maxAge: Math.floor(sessions.ttlMs / 1000),
    });
    return c.json({ name: session.principal.name, role: session.principal.role, expires_at: new Date(session.expiresAt).toISOString() }, 201);
  });
  app.get("/api/v1/session", async (c) => {
    const session = await sessions.verify(sessionToken(c.req.header("cookie")));
    return c.json({ name: session.principal.name, role: session.principal.role, expires_at: new Date(session.expiresAt).toISOString() });
  });
  app.delete("/api/v1/session", async (c) => {
    assertSameOrigin(requestFacts(c.req.raw.headers, "DELETE"), sessions.publicOrigin());
    await sessions.logout(sessionToken(c.req.header("cookie")));
    deleteCookie(c, SESSION_COOKIE, { path: "/", secure: isHttps(c, sessions.publicOrigin()), httpOnly: true, sameSite: "Strict" });
    return c.json({ logged_out: true });
  });
}

function forwardedFor(c: Context): string | undefined {
  return c.req.header("x-forwarded-for")?.split(",")[0]?.trim();
}

/**
 * Behind a TLS-terminating proxy the request arrives as http; the proxy says so
 * (X-Forwarded-Proto, or RFC 7239's Forwarded), or --public-url is an https address.
 */
function isHttps(c: Context, publicOrigin: string | null): boolean {
  if (new URL(c.req.url).protocol === "https:" || publicOrigin?.startsWith("https:") === true) return true;
  if (c.req.header("x-forwarded-proto")?.split(",")[0]?.trim() === "https") return true;
  return /(^|[;,\s])proto=https(\b|$)/i.test(c.req.header("forwarded") ?? "");
}

/** What the cross-site check reads of a request. */
export interface RequestFacts {
  method: string;
  cookie: string | undefined;
  fetchSite: string | undefined;
  origin: string | undefined;
  host: string | undefined;
  forwardedHost: string | undefined;
  contentType: string | undefined;
  hasBody: boolean;
}

export function requestFacts(headers: Headers | Record<string, string | string[] | undefined>, method: string): RequestFacts {
  const get = (name: string): string | undefined => {
    if (headers instanceof Headers) return headers.get(name) ?? undefined;
    const value = headers[name];
    return Array.isArray(value) ? value[0] : value;
  };
  const length = get("content-length");
  return {
    method,
    cookie: get("cookie"),
    fetchSite: get("sec-fetch-site"),
    origin: get("origin"),
    host: get("host"),
    forwardedHost: get("x-forwarded-host")?.split(",")[0]?.trim(),
    contentType: get("content-type"),
    hasBody: (length !== undefined && length !== "0") || get("transfer-encoding") !== undefined,
  };
}

function crossSite(): PermissionDeniedError {
  return new PermissionDeniedError(
    "A console session only acts for pages of this server; this request came from another site. Use the console itself, or send an admin key in the Authorization header.",
    { code: "cross_site_request" },
  );
}

/**
 * A cookie rides along with any request the browser makes to this host, so a change made
 * with one must come from the console itself. SameSite=Strict is not enough: it lets in
 * every other port of the same host and sibling subdomains. So:
 * - Sec-Fetch-Site, where the browser sends it (https and loopback), must say same-origin;
 * - otherwise (plain http on a LAN address) the Origin, which browsers send with every
 *   POST, PUT, PATCH and DELETE, must be this server (its Host, the proxy's forwarded host,
 *   or --public-url);
 * - a body must be JSON: an HTML form on another site can only send form or plain-text
 *   bodies without the browser asking first (CORS), which this server never allows.
 * A request with neither header is not a browser's (curl with a copied cookie); that is the
 * cookie's holder acting, not a forged request.
 */
export function assertSameOrigin(facts: RequestFacts, publicOrigin: string | null): void {
  if (facts.fetchSite !== undefined) {
    if (facts.fetchSite !== "same-origin" && facts.fetchSite !== "none") throw crossSite();
  } else if (facts.origin !== undefined) {
    let origin: URL;
    try {
      origin = new URL(facts.origin);
    } catch {
      throw crossSite();
    }
    const ours = origin.host === facts.host || origin.host === facts.forwardedHost || origin.origin === publicOrigin;
    if (!ours) throw crossSite();
  }
  if (facts.hasBody && !/^application\/json\s*(;|$)/i.test(facts.contentType ?? "")) {
    throw new BadRequestError("A console request with a body must send it as JSON (Content-Type: application/json).", { code: "unsupported_media_type" });
  }
}

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/** The session token in a Cookie header (Hono's parser: malformed values are skipped, not fatal). */
export function sessionToken(cookieHeader: string | undefined): string | undefined {
  if (cookieHeader === undefined) return undefined;
  return parseCookies(cookieHeader, SESSION_COOKIE)[SESSION_COOKIE];
}

/** The session of a request's cookie, or null when it has none (it may use a key instead). */
export async function sessionOfRequest(sessions: ConsoleSessions, facts: RequestFacts): Promise<{ principal: Principal; token: string } | null> {
  const token = sessionToken(facts.cookie);
  if (token === undefined) return null;
  if (!SAFE_METHODS.has(facts.method)) assertSameOrigin(facts, sessions.publicOrigin());
  return { principal: (await sessions.verify(token)).principal, token };
}
