// The console's HTTP side: the page at `/`, its scripts and styles under /console/ (plain ES
// modules, no build step) with the few pinned libraries it uses served from this package's
// own node_modules (never a CDN), strict security headers on all of it, and the session
// endpoints (log in, who am I, log out) under /api/v1/session. Whether a request to the
// admin API carries a valid session is decided by `sessionPrincipal`, which the admin API's
// auth step and the playground's route share.
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { Context, Hono } from "hono";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { PermissionDeniedError } from "../core/errors.ts";
import type { Principal } from "../keys/key-service.ts";
import { SESSION_COOKIE, type ConsoleSessions } from "./console-sessions.ts";

// One folder whether this runs from src/ (tsx) or dist/ (compiled): the assets ship in src/.
const ASSETS_DIR = fileURLToPath(new URL("../../src/console/assets/", import.meta.url));
const require = createRequire(import.meta.url);
const packageDir = (name: string) => path.dirname(require.resolve(`${name}/package.json`));

/** The libraries the page imports, by the name it imports them under. Versions are pinned in package.json. */
const VENDOR_FILES: Record<string, () => string> = {
  // htm's package.json cannot be resolved (its exports leave it out); its main file sits in dist/.
  "preact-htm.js": () => path.join(path.dirname(require.resolve("htm")), "..", "preact", "standalone.mjs"),
  "uplot.js": () => path.join(packageDir("uplot"), "dist", "uPlot.esm.js"),
  "uplot.css": () => path.join(packageDir("uplot"), "dist", "uPlot.min.css"),
};

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

async function readAsset(name: string): Promise<{ body: Buffer; type: string } | null> {
  let file: string;
  if (name.startsWith("vendor/")) {
    const vendor = VENDOR_FILES[name.slice("vendor/".length)];
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
}

/** The page, its assets and the session endpoints. Mount before the admin API's auth step: logging in needs no session. */
export function mountConsoleRoutes(app: Hono<any>, options: ConsoleRoutesOptions): void {
  const { sessions } = options;
  const page = async (c: Context) => {
    const asset = await readAsset("index.html");
    if (asset === null) return c.text("The console's files are missing from this installation; reinstall llmgw.", 500);
    return c.body(new Uint8Array(asset.body), 200, { ...SECURITY_HEADERS, "content-type": asset.type });
  };
  app.get("/", page);
  app.get("/console", (c) => c.redirect("/", 301));
  app.get("/console/*", async (c) => {
    const asset = await readAsset(c.req.path.slice("/console/".length));
    if (asset === null) return c.text("Not found.", 404, SECURITY_HEADERS);
    return c.body(new Uint8Array(asset.body), 200, { ...SECURITY_HEADERS, "content-type": asset.type });
  });

  app.post("/api/v1/session", async (c) => {
    const body = (await options.jsonBody(c)) as { key?: unknown } | null;
    const key = typeof body?.key === "string" ? body.key : undefined;
    const session = await sessions.login(key);
    setCookie(c, SESSION_COOKIE, session.token, {
      path: "/",
      httpOnly: true,
      sameSite: "Strict",
      secure: isHttps(c),
      maxAge: Math.floor(sessions.ttlMs / 1000),
    });
    return c.json({ name: session.principal.name, role: session.principal.role, expires_at: new Date(session.expiresAt).toISOString() }, 201);
  });
  app.get("/api/v1/session", async (c) => {
    const session = await sessions.verify(getCookie(c, SESSION_COOKIE));
    return c.json({ name: session.principal.name, role: session.principal.role, expires_at: new Date(session.expiresAt).toISOString() });
  });
  app.delete("/api/v1/session", async (c) => {
    assertSameOrigin(c.req.header("sec-fetch-site"));
    await sessions.logout(getCookie(c, SESSION_COOKIE));
    deleteCookie(c, SESSION_COOKIE, { path: "/", secure: isHttps(c), httpOnly: true, sameSite: "Strict" });
    return c.json({ logged_out: true });
  });
}

/** Behind a TLS-terminating proxy the request arrives as http; the proxy says so in X-Forwarded-Proto. */
function isHttps(c: Context): boolean {
  return new URL(c.req.url).protocol === "https:" || c.req.header("x-forwarded-proto")?.split(",")[0]?.trim() === "https";
}

/**
 * A cookie rides along with any request the browser makes to this origin, so a change made
 * with one must come from the console itself. SameSite=Strict keeps other sites out; this
 * also refuses a sibling site (same-site but another origin), which Strict lets through.
 */
export function assertSameOrigin(fetchSite: string | undefined): void {
  if (fetchSite !== undefined && fetchSite !== "same-origin" && fetchSite !== "none") {
    throw new PermissionDeniedError("A console session only acts for pages of this server; this request came from another site.", { code: "cross_site_request" });
  }
}

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/** The principal of a request's session cookie, or null when it has none (it may use a key instead). */
export async function sessionPrincipal(sessions: ConsoleSessions, cookieHeader: string | undefined, method: string, fetchSite: string | undefined): Promise<Principal | null> {
  const token = readCookie(cookieHeader, SESSION_COOKIE);
  if (token === undefined) return null;
  if (!SAFE_METHODS.has(method)) assertSameOrigin(fetchSite);
  return (await sessions.verify(token)).principal;
}

function readCookie(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return decodeURIComponent(part.slice(eq + 1).trim());
  }
  return undefined;
}
