// GET /api/v1/events/stream ends as soon as its caller may no longer read: a console
// logout or the revocation of the key it was opened with closes the open stream (not at
// the next keep-alive, 15 s later), on this server and, on PostgreSQL, on another server
// sharing the database (heard through the change feed). No event is recorded while the
// tests wait, so nothing but the logout or revocation can end the stream; their waits
// are bounded at 5 s, well under the keep-alive, so a stream that waits for it fails them.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { eventually } from "../../test/support/eventually.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { dropSchema, postgresSchemaOrSkip } from "../../test/support/stores.ts";

/** Far below the 15 s keep-alive, at which streams used to notice; a loaded machine still ends them well within it. */
const ENDS_WITHIN = { timeoutMs: 5000 };

interface OpenStream {
  text(): string;
  ended(): boolean;
  close(): Promise<void>;
}

/** Opens the event stream with these headers and reads it in the background until it ends. */
async function openStream(url: string, headers: Record<string, string>): Promise<OpenStream> {
  const response = await fetch(`${url}/api/v1/events/stream`, { headers });
  assert.equal(response.status, 200, await (response.ok ? Promise.resolve("") : response.text()));
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let ended = false;
  const pump = (async () => {
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += decoder.decode(value, { stream: true });
      }
    } catch {
      // A connection cut by the server ends the stream as well as a clean end does.
    }
    ended = true;
  })();
  // The server subscribes before it writes this line: from here on, the stream is live.
  await eventually("the stream to open", () => text.includes("llmgw events from id"));
  return {
    text: () => text,
    ended: () => ended,
    close: async () => {
      await reader.cancel().catch(() => undefined);
      await pump;
    },
  };
}

/** Logs in to the console with an admin key; the session cookie, as a browser would send it back. */
async function login(url: string, key: string): Promise<string> {
  const response = await fetch(`${url}/api/v1/session`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ key }) });
  assert.equal(response.status, 201, await response.text());
  return response.headers.get("set-cookie")!.split(";")[0]!;
}

const asConsole = (cookie: string) => ({ cookie, "sec-fetch-site": "same-origin" });
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

async function logout(url: string, cookie: string): Promise<void> {
  const response = await fetch(`${url}/api/v1/session`, { method: "DELETE", headers: asConsole(cookie) });
  assert.equal(response.status, 200, await response.text());
}

/** Creates a second admin key (the last one cannot be revoked); its key and id. */
async function adminKey(harness: Harness, name: string): Promise<{ key: string; id: string }> {
  const created = await harness.admin("POST", "/api/v1/keys", { name, role: "admin" });
  assert.equal(created.status, 201, JSON.stringify(created.body));
  return { key: created.body.key, id: created.body.id };
}

describe("event streams end with their caller's access", () => {
  let harness: Harness;
  const streams: OpenStream[] = [];
  const open = async (headers: Record<string, string>) => {
    const stream = await openStream(harness.url, headers);
    streams.push(stream);
    return stream;
  };

  before(async () => {
    harness = await startHarness();
  });
  after(async () => {
    for (const stream of streams) await stream.close();
    await harness.close();
  });

  test("a console logout ends the session's open stream; a stream of another session goes on", async () => {
    const cookie = await login(harness.url, harness.adminKey);
    const otherCookie = await login(harness.url, harness.adminKey);
    const stream = await open(asConsole(cookie));
    const other = await open(asConsole(otherCookie));
    await logout(harness.url, cookie);
    await eventually("the logged-out session's stream to end", () => stream.ended(), ENDS_WITHIN);

    await harness.server.events.record({ kind: "node_back", subject: "node:still-open", message: "the other session still reads" });
    await eventually("the other session's stream to get the next event", () => other.text().includes("node:still-open"));
    assert.equal(other.ended(), false);
  });

  test("revoking a key ends its open stream and those of console sessions it logged in; other keys' streams go on", async () => {
    const doomed = await adminKey(harness, "doomed-admin");
    const byKey = await open(bearer(doomed.key));
    const bySession = await open(asConsole(await login(harness.url, doomed.key)));
    const bystander = await open(bearer(harness.adminKey));
    const revoked = await harness.admin("DELETE", `/api/v1/keys/${doomed.id}`);
    assert.equal(revoked.status, 200, JSON.stringify(revoked.body));
    await eventually("the revoked key's stream to end", () => byKey.ended(), ENDS_WITHIN);
    await eventually("the stream of the session the revoked key logged in to end", () => bySession.ended(), ENDS_WITHIN);

    await harness.server.events.record({ kind: "node_back", subject: "node:bystander", message: "the other key still reads" });
    await eventually("the other key's stream to get the next event", () => bystander.text().includes("node:bystander"));
    assert.equal(bystander.ended(), false);
    // Reconnecting is refused: the stream ended because the key no longer works.
    assert.equal((await fetch(`${harness.url}/api/v1/events/stream`, { headers: bearer(doomed.key) })).status, 401);
  });
});

test("on PostgreSQL, a revocation or logout on one server ends the streams open on another", async (t) => {
  const database = await postgresSchemaOrSkip(t);
  if (database === null) return;
  const streams: OpenStream[] = [];
  const servers: Harness[] = [];
  try {
    const a = await startHarness({ database });
    servers.push(a);
    const b = await startHarness({ database, adminKey: a.adminKey });
    servers.push(b);
    const doomed = await adminKey(a, "doomed-admin");
    const cookie = await login(a.url, a.adminKey);
    // Both opened on B; the revocation and the logout are made on A.
    const byKey = await openStream(b.url, bearer(doomed.key));
    streams.push(byKey);
    const bySession = await openStream(b.url, asConsole(cookie));
    streams.push(bySession);
    const bystander = await openStream(b.url, bearer(a.adminKey));
    streams.push(bystander);

    assert.equal((await a.admin("DELETE", `/api/v1/keys/${doomed.id}`)).status, 200);
    await eventually("B's stream of the key revoked on A to end", () => byKey.ended(), ENDS_WITHIN);
    await logout(a.url, cookie);
    await eventually("B's stream of the session logged out on A to end", () => bySession.ended(), ENDS_WITHIN);

    await b.server.events.record({ kind: "node_back", subject: "node:pg-bystander", message: "the other key still reads" });
    await eventually("the other key's stream on B to get the next event", () => bystander.text().includes("node:pg-bystander"));
    assert.equal(bystander.ended(), false);
  } finally {
    for (const stream of streams) await stream.close();
    for (const server of servers.reverse()) await server.close();
    await dropSchema(database.schema);
  }
});
