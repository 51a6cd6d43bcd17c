// The agent's protocol client failing over between the servers of a cluster. Two small
// node:http servers on loopback stand for two llmgw servers' /agent/v1: each answers a
// heartbeat, a long poll or a join as the server does, or answers what a test sets (503
// from a follower without a leader, 401 for a refused credential), or is down (its port
// not listening). Each counts the requests it got, so a test can tell where a call went.
import { afterEach, describe, test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { LlmgwError } from "../core/errors.ts";
import type { HeartbeatReport } from "../fleet/agent-protocol.ts";
import { parseServerList } from "../cli/run-agent.ts";
import { eventually } from "../../test/support/eventually.ts";
import { HttpAssignments } from "./http-assignments.ts";

const CREDENTIAL = "node-credential-for-tests";

const REPORT = {
  name: "node-a",
  address: "127.0.0.1",
  inventory: { cores: 2, memoryBytes: 1 << 30, gpus: [], engines: [] },
  labels: {},
  replicas: [],
} as unknown as HeartbeatReport;

interface Failure {
  status: number;
  code: string;
  message: string;
}

/** Stands for one llmgw server's /agent/v1 (the leader, or a follower that forwards to it). */
class StandInServer {
  /** Requests received, by path without the query. */
  readonly seen: string[] = [];
  /** What every call is answered with; null: the normal answer. */
  failure: Failure | null = null;
  /** Long polls are held unanswered (a set that does not change), until the server stops. */
  holdPolls = false;
  #server: http.Server | null = null;
  #port = 0;

  constructor(readonly label: string) {}

  get url(): string {
    return `http://127.0.0.1:${this.#port}`;
  }

  get requests(): number {
    return this.seen.length;
  }

  /** Listens on its earlier port when it had one: a server that comes back keeps its URL. */
  async start(): Promise<void> {
    const server = http.createServer((req, res) => {
      const pathname = new URL(req.url ?? "/", "http://x").pathname;
      this.seen.push(pathname);
      req.resume();
      req.on("end", () => this.#answer(pathname, req, res));
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.#port, "127.0.0.1", () => resolve());
    });
    this.#server = server;
    this.#port = (server.address() as AddressInfo).port;
  }

  /** Down: the port no longer listens, and open connections (kept alive, held polls) are cut. */
  async stop(): Promise<void> {
    const server = this.#server;
    if (server === null) return;
    this.#server = null;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  #answer(pathname: string, req: http.IncomingMessage, res: http.ServerResponse): void {
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (this.failure !== null) {
      json(this.failure.status, { error: { message: this.failure.message, type: "server_error", param: null, code: this.failure.code } });
      return;
    }
    if (pathname === "/agent/v1/join") {
      json(200, { nodeId: "node-1", name: "node-a", credential: CREDENTIAL });
      return;
    }
    if (req.headers.authorization !== `Bearer ${CREDENTIAL}`) {
      json(401, {
        error: { message: "This node credential is not valid.", type: "authentication_error", param: null, code: "invalid_node_credential" },
      });
      return;
    }
    if (pathname === "/agent/v1/heartbeat") {
      json(200, { nodeId: "node-1", state: "ready", assignmentsVersion: "v1", heartbeatIntervalMs: 5000 });
      return;
    }
    if (pathname === "/agent/v1/assignments") {
      if (!this.holdPolls) json(200, { version: "v1", assignments: [] });
      return;
    }
    json(404, { error: { message: `No route ${pathname}.`, type: "not_found_error", param: null, code: "not_found" } });
  }
}

describe("HttpAssignments over the servers of a cluster", () => {
  let servers: StandInServer[] = [];
  let clients: HttpAssignments[] = [];

  afterEach(async () => {
    await Promise.all(clients.map((client) => client.close()));
    await Promise.all(servers.map((server) => server.stop()));
    servers = [];
    clients = [];
  });

  /** Two servers, both up, and a client that lists them in order and records its switches. */
  async function cluster(): Promise<{
    a: StandInServer;
    b: StandInServer;
    client: HttpAssignments;
    switches: Array<{ from: string; to: string; why: string }>;
  }> {
    const a = new StandInServer("a");
    const b = new StandInServer("b");
    servers.push(a, b);
    await a.start();
    await b.start();
    const switches: Array<{ from: string; to: string; why: string }> = [];
    const client = new HttpAssignments([a.url, b.url], { onSwitch: (from, to, why) => switches.push({ from, to, why }) });
    clients.push(client);
    return { a, b, client, switches };
  }

  test("a server that does not listen: the call goes to the next, which stays current", async () => {
    const { a, b, client, switches } = await cluster();
    assert.equal(client.current, a.url);
    await a.stop();

    const reply = await client.heartbeat(CREDENTIAL, REPORT);
    assert.equal(reply.assignmentsVersion, "v1");
    assert.equal(b.requests, 1);
    assert.equal(client.current, b.url);
    assert.equal(switches.length, 1);
    assert.equal(switches[0]?.from, a.url);
    assert.equal(switches[0]?.to, b.url);
    assert.match(switches[0]?.why ?? "", /could not be reached/);

    // The first server is back, but the client stays with the one that answered.
    await a.start();
    await client.heartbeat(CREDENTIAL, REPORT);
    assert.equal(a.requests, 0);
    assert.equal(b.requests, 2);
    assert.equal(switches.length, 1);
  });

  test("503 (a follower without a leader) fails over; 401 comes back without trying another server", async () => {
    const { a, b, client, switches } = await cluster();
    a.failure = { status: 503, code: "no_leader", message: "No server of the cluster leads right now." };
    await client.heartbeat(CREDENTIAL, REPORT);
    assert.deepEqual([a.requests, b.requests], [1, 1]);
    assert.equal(client.current, b.url);
    assert.match(switches[0]?.why ?? "", /answered 503: No server of the cluster leads/);

    // The current server refuses the credential: another server of the cluster would say the same.
    b.failure = { status: 401, code: "invalid_node_credential", message: "This node credential is not valid." };
    a.failure = null;
    await assert.rejects(client.heartbeat(CREDENTIAL, REPORT), (error: unknown) => {
      assert.ok(error instanceof LlmgwError);
      assert.equal(error.status, 401);
      assert.equal(error.code, "invalid_node_credential");
      assert.equal(error.retryable, false);
      assert.match(error.message, new RegExp(`server at ${b.url} answered 401`));
      return true;
    });
    assert.deepEqual([a.requests, b.requests], [1, 2]);
    assert.equal(client.current, b.url);
  });

  test("a 404 (node removed) from the first server is not failed over either", async () => {
    const { a, b, client } = await cluster();
    a.failure = { status: 404, code: "node_not_found", message: "This node was removed from the fleet." };
    await assert.rejects(client.assignments(CREDENTIAL, { knownVersion: null, waitMs: 0, signal: new AbortController().signal }), {
      status: 404,
      code: "node_not_found",
    });
    assert.deepEqual([a.requests, b.requests], [1, 0]);
    assert.equal(client.current, a.url);
  });

  test("both servers down: a retryable server_unreachable that names both, after one round", async () => {
    const { a, b, client, switches } = await cluster();
    await a.stop();
    await b.stop();
    await assert.rejects(client.heartbeat(CREDENTIAL, REPORT), (error: unknown) => {
      assert.ok(error instanceof LlmgwError);
      assert.equal(error.code, "server_unreachable");
      assert.equal(error.retryable, true);
      assert.ok(error.message.includes(a.url), error.message);
      assert.ok(error.message.includes(b.url), error.message);
      assert.match(error.message, /the agent keeps its engines running and retries/);
      return true;
    });
    assert.equal(client.current, a.url);
    assert.equal(switches.length, 0);
  });

  test("one down, the other answering 503: the last error comes back with its status", async () => {
    const { a, b, client } = await cluster();
    await a.stop();
    b.failure = { status: 503, code: "no_leader", message: "No server of the cluster leads right now." };
    await assert.rejects(client.heartbeat(CREDENTIAL, REPORT), (error: unknown) => {
      assert.ok(error instanceof LlmgwError);
      assert.equal(error.status, 503);
      assert.equal(error.code, "no_leader");
      assert.equal(error.retryable, true);
      assert.ok(error.message.includes(a.url) && error.message.includes(b.url), error.message);
      return true;
    });
  });

  test("the current server goes down while the other comes back: the client switches back", async () => {
    const { a, b, client, switches } = await cluster();
    await a.stop();
    await client.heartbeat(CREDENTIAL, REPORT);
    assert.equal(client.current, b.url);

    await a.start();
    await b.stop();
    await client.heartbeat(CREDENTIAL, REPORT);
    assert.equal(client.current, a.url);
    assert.equal(a.requests, 1);
    assert.deepEqual(
      switches.map((change) => [change.from, change.to]),
      [
        [a.url, b.url],
        [b.url, a.url],
      ],
    );
  });

  test("a long poll aborted by the agent does not try the next server", async () => {
    const { a, b, client, switches } = await cluster();
    a.holdPolls = true;
    const controller = new AbortController();
    const poll = client.assignments(CREDENTIAL, { knownVersion: "v1", waitMs: 30_000, signal: controller.signal });
    await eventually("the long poll to reach the first server", () => a.requests === 1);
    controller.abort();
    await assert.rejects(poll, { code: "server_unreachable" });
    assert.equal(b.requests, 0);
    assert.equal(client.current, a.url);
    assert.equal(switches.length, 0);
  });

  test("a join goes through the failover too, and current names the server that took it", async () => {
    const { a, b, client } = await cluster();
    a.failure = { status: 502, code: "leader_unreachable", message: "The leader did not answer." };
    const joined = await client.join({ joinToken: "join-token", name: "node-a", address: "127.0.0.1", inventory: REPORT.inventory, labels: {} });
    assert.equal(joined.credential, CREDENTIAL);
    assert.equal(b.seen.at(-1), "/agent/v1/join");
    assert.equal(client.current, b.url);
  });

  test("one server, down: the error is today's, naming it", async () => {
    const a = new StandInServer("a");
    servers.push(a);
    await a.start();
    const client = new HttpAssignments(a.url);
    clients.push(client);
    await a.stop();
    await assert.rejects(client.heartbeat(CREDENTIAL, REPORT), (error: unknown) => {
      assert.ok(error instanceof LlmgwError);
      assert.equal(error.code, "server_unreachable");
      assert.match(error.message, new RegExp(`^Cannot reach the llmgw server at ${a.url} `));
      return true;
    });
  });
});

describe("--server lists", () => {
  test("a comma-separated list becomes origins in order, without duplicates", () => {
    assert.deepEqual(parseServerList("http://10.0.0.5:8700, http://10.0.0.6:8700/,http://10.0.0.5:8700/agent"), [
      "http://10.0.0.5:8700",
      "http://10.0.0.6:8700",
    ]);
    assert.deepEqual(parseServerList("https://gw.example"), ["https://gw.example"]);
  });

  test("a bad entry is named", () => {
    assert.throws(
      () => parseServerList("http://10.0.0.5:8700,ftp://10.0.0.6"),
      (error: unknown) => {
        assert.ok(error instanceof LlmgwError);
        assert.equal(error.code, "invalid_server");
        assert.match(error.message, /'ftp:\/\/10\.0\.0\.6'/);
        return true;
      },
    );
    assert.throws(() => parseServerList("http://10.0.0.5:8700,not a url"), { code: "invalid_server", message: /'not a url'/ });
  });

  test("an empty entry is an error; no value at all asks for --server", () => {
    assert.throws(() => parseServerList("http://10.0.0.5:8700,,http://10.0.0.6:8700"), { code: "invalid_server", message: /entry 2 is empty/ });
    assert.throws(() => parseServerList("http://10.0.0.5:8700,"), { code: "invalid_server", message: /entry 2 is empty/ });
    assert.throws(() => parseServerList(undefined), { code: "server_missing" });
    assert.throws(() => parseServerList(" "), { code: "server_missing" });
  });
});
