// The console's shell: the login form, then a header with the navigation, the connection
// state and log out, and the page the address's #/hash names. The session lives in an
// HttpOnly cookie the page cannot read; the page only learns who is logged in and until
// when (GET /api/v1/session), and goes back to the login form when the server says the
// session is over.
import { html, render, useEffect, useRef, useState } from "./vendor/preact-htm.js";
import { api, connection, onConnectionChange, whenSessionEnds } from "./lib/api.js";
import { closeEvents } from "./lib/live.js";
import { ErrorNote } from "./lib/ui.js";
import { ModelsPage } from "./pages/models.js";
import { NodesPage } from "./pages/nodes.js";
import { JobsPage } from "./pages/jobs.js";
import { KeysPage } from "./pages/keys.js";
import { UsagePage } from "./pages/usage.js";
import { EventsPage } from "./pages/events.js";
import { PlaygroundPage } from "./pages/playground.js";

const PAGES = [
  { path: "models", title: "Models", Page: ModelsPage },
  { path: "nodes", title: "Nodes", Page: NodesPage },
  { path: "jobs", title: "Jobs", Page: JobsPage },
  { path: "keys", title: "Keys", Page: KeysPage },
  { path: "usage", title: "Usage", Page: UsagePage },
  { path: "events", title: "Events", Page: EventsPage },
  { path: "playground", title: "Playground", Page: PlaygroundPage },
];

/** #/jobs/abc → { page: "jobs", rest: ["abc"] }; anything unknown is the Models page. */
function readRoute() {
  const parts = location.hash
    .replace(/^#\/?/, "")
    .split("/")
    .filter(Boolean)
    .map((part) => {
      // A mistyped address (a broken %-escape) is taken as written rather than blanking the console.
      try {
        return decodeURIComponent(part);
      } catch {
        return part;
      }
    });
  const page = PAGES.find((candidate) => candidate.path === parts[0]) ?? PAGES[0];
  return { page, rest: parts.slice(1) };
}

function useRoute() {
  const [route, setRoute] = useState(readRoute);
  useEffect(() => {
    const changed = () => setRoute(readRoute());
    addEventListener("hashchange", changed);
    return () => removeEventListener("hashchange", changed);
  }, []);
  return route;
}

function LoginForm({ notice, onLoggedIn }) {
  const [key, setKey] = useState("");
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const session = await api("/api/v1/session", { method: "POST", body: { key } });
      setKey("");
      onLoggedIn(session);
    } catch (failure) {
      setError(failure);
    } finally {
      setBusy(false);
    }
  };
  return html`<main class="login" id="main">
    <h1>llmgw console</h1>
    <p>Log in with an admin key. <code>llmgw up</code> prints one at its first start and keeps it in the data dir as <code>admin.key</code>.</p>
    ${notice ? html`<p class="notice" role="status">${notice}</p>` : null}
    <form onSubmit=${submit}>
      <label for="admin-key">Admin key</label>
      <input id="admin-key" name="admin-key" type="password" autocomplete="off" spellcheck=${false} required value=${key} onInput=${(event) => setKey(event.currentTarget.value)} />
      <button type="submit" disabled=${busy}>Log in</button>
    </form>
    <${ErrorNote} error=${error} />
  </main>`;
}

function ConnectionBanner() {
  const [state, setState] = useState(connection());
  useEffect(() => onConnectionChange(setState), []);
  if (state.online) return null;
  return html`<div class="banner" role="alert">Connection to the server lost at ${new Date(state.since).toLocaleTimeString()}; retrying. What you see may be out of date.</div>`;
}

function Shell({ session, onLogout }) {
  const route = useRoute();
  const main = useRef(null);
  const { page } = route;
  const firstPage = useRef(true);
  useEffect(() => {
    document.title = `${page.title} · llmgw console`;
    // After a move to another page, focus goes to its content, so a screen reader announces it.
    if (firstPage.current) firstPage.current = false;
    else main.current?.focus();
  }, [page]);
  const logout = async () => {
    try {
      await api("/api/v1/session", { method: "DELETE" });
    } finally {
      onLogout("You are logged out.");
    }
  };
  const Page = page.Page;
  return html`<a class="skip" href="#main" onClick=${(event) => {
    event.preventDefault();
    main.current?.focus();
  }}>Skip to content</a>
    <header class="top">
      <span class="brand">llmgw</span>
      <nav aria-label="Console">
        <ul>
          ${PAGES.map((candidate) => html`<li><a href=${`#/${candidate.path}`} aria-current=${candidate === page ? "page" : undefined}>${candidate.title}</a></li>`)}
        </ul>
      </nav>
      <span class="who">${session.name}</span>
      <button type="button" class="secondary" onClick=${logout}>Log out</button>
    </header>
    <${ConnectionBanner} />
    <main id="main" ref=${main} tabindex="-1">
      <${Page} key=${page.path} route=${route} session=${session} />
    </main>`;
}

function App() {
  // undefined: still asking the server whether this browser has a session.
  const [session, setSession] = useState(undefined);
  const [notice, setNotice] = useState(null);
  useEffect(() => {
    api("/api/v1/session")
      .then(setSession)
      .catch(() => setSession(null));
    whenSessionEnds((message) => {
      closeEvents();
      setNotice(message);
      setSession(null);
    });
  }, []);
  // A session ends at its expiry even on a page that asks the server nothing.
  useEffect(() => {
    if (!session) return undefined;
    const left = Date.parse(session.expires_at) - Date.now();
    const timer = setTimeout(
      () => {
        closeEvents();
        setNotice("Your console session has expired. Log in again.");
        setSession(null);
      },
      Math.max(0, Math.min(left, 2 ** 31 - 1)),
    );
    return () => clearTimeout(timer);
  }, [session]);
  if (session === undefined) return html`<main class="boot" id="main"><p role="status">Loading…</p></main>`;
  if (session === null)
    return html`<${LoginForm} notice=${notice} onLoggedIn=${(next) => {
      setNotice(null);
      setSession(next);
    }} />`;
  return html`<${Shell} session=${session} onLogout=${(message) => {
    closeEvents();
    setNotice(message);
    setSession(null);
  }} />`;
}

render(html`<${App} />`, document.getElementById("app"));
