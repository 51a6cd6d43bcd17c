// Who may read /metrics, decided from the peer address and the headers: open to this
// machine when the Host header names this server, a key (the metrics key or an admin key)
// from anywhere else, through a proxy, or under another Host name (DNS rebinding).
import { test } from "node:test";
import assert from "node:assert/strict";
import { hostname } from "node:os";
import { AuthenticationError, BadRequestError, PermissionDeniedError } from "../core/errors.ts";
import type { KeyVerifier } from "../gateway/gateway-ports.ts";
import type { Principal } from "../keys/key-service.ts";
import { MetricsKey, authorizeMetrics, isLoopback, isLocalScrape } from "./metrics-access.ts";
import { MetricsHosts, parseMetricsHosts, type MetricsHostsOptions } from "./metrics-hosts.ts";

const METRICS_KEY = "m".repeat(32);

/** Stands for the key service: one admin key, one client key, everything else unknown. */
const keys: KeyVerifier = {
  verify: async (token) => {
    const principal = (role: "admin" | "client"): Principal => ({ keyId: role, name: role, role, allowedModels: null, expiresAt: null });
    if (token === "admin-key") return principal("admin");
    if (token === "client-key") return principal("client");
    throw new AuthenticationError("The API key is not valid.");
  },
};

const remote = (authorization?: string) => ({ remoteAddress: "10.1.2.3", headers: authorization === undefined ? {} : { authorization } });

test("loopback addresses are this machine's: 127.0.0.0/8, ::1 and IPv4-mapped 127.x", () => {
  for (const address of ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"]) assert.equal(isLoopback(address), true, address);
  for (const address of [undefined, "", "10.0.0.1", "0.0.0.0", "::", "::ffff:10.0.0.1", "fe80::1", "128.0.0.1", "::2", "127.evil.example"]) {
    assert.equal(isLoopback(address), false, String(address));
  }
});

test("a local request is open unless a proxy says it forwards someone else's", () => {
  assert.equal(isLocalScrape({ remoteAddress: "127.0.0.1", headers: {} }), true);
  assert.equal(isLocalScrape({ remoteAddress: "::1", headers: { "user-agent": "Prometheus/2.53" } }), true);
  for (const header of ["forwarded", "x-forwarded-for", "x-real-ip"]) {
    assert.equal(isLocalScrape({ remoteAddress: "127.0.0.1", headers: { [header]: "203.0.113.9" } }), false, header);
  }
  assert.equal(isLocalScrape({ remoteAddress: "192.168.1.5", headers: {} }), false);
});

test("from another machine: the metrics key or an admin key passes, no key and wrong keys get 401, a client key 403", async () => {
  const metricsKey = new MetricsKey(METRICS_KEY);
  await authorizeMetrics({ remoteAddress: "127.0.0.1", headers: {} }, { metricsKey, keys, hosts: null });
  await authorizeMetrics(remote(`Bearer ${METRICS_KEY}`), { metricsKey, keys, hosts: null });
  await authorizeMetrics(remote("Bearer admin-key"), { metricsKey: null, keys, hosts: null });
  await authorizeMetrics(remote("Bearer admin-key"), { metricsKey, keys, hosts: null });

  await assert.rejects(
    authorizeMetrics(remote(), { metricsKey, keys, hosts: null }),
    (error: unknown) => error instanceof AuthenticationError && error.code === "missing_api_key" && /metrics key/.test(error.message),
  );
  await assert.rejects(
    authorizeMetrics({ remoteAddress: "127.0.0.1", headers: { "x-forwarded-for": "203.0.113.9" } }, { metricsKey, keys, hosts: null }),
    (error: unknown) => error instanceof AuthenticationError && error.status === 401,
  );
  await assert.rejects(
    authorizeMetrics(remote(`Bearer ${METRICS_KEY}x`), { metricsKey, keys, hosts: null }),
    (error: unknown) =>
      error instanceof AuthenticationError && error.code === "invalid_api_key" && /neither the metrics key nor an admin key/.test(error.message),
  );
  await assert.rejects(
    authorizeMetrics(remote(`Bearer ${METRICS_KEY}`), { metricsKey: null, keys, hosts: null }),
    (error: unknown) => error instanceof AuthenticationError && /this server has none/.test(error.message),
  );
  await assert.rejects(
    authorizeMetrics(remote("Bearer client-key"), { metricsKey, keys, hosts: null }),
    (error: unknown) => error instanceof PermissionDeniedError && error.status === 403,
  );
});

test("a metrics key shorter than 16 characters is refused", () => {
  assert.throws(
    () => new MetricsKey("short-secret"),
    (error: unknown) => error instanceof BadRequestError && error.code === "invalid_metrics_key" && /12 characters long; use at least 16/.test(error.message),
  );
  assert.equal(new MetricsKey("x".repeat(16)).matches("x".repeat(16)), true);
  assert.equal(new MetricsKey("x".repeat(16)).matches("x".repeat(15)), false);
});

const listeningOn = (options: Partial<MetricsHostsOptions> & { host: string; port: number }) =>
  new MetricsHosts({ bound: () => ({ address: options.host, port: options.port }), ...options });

test("on loopback, the listen address and the loopback names with the listen port are this server's; other names are not", () => {
  const hosts = listeningOn({ host: "127.0.0.1", port: 8700 });
  for (const host of ["127.0.0.1:8700", "localhost:8700", "LocalHost:8700", "[::1]:8700", undefined]) assert.equal(hosts.allows(host), true, String(host));
  for (const host of [
    "evil.example:8700",
    "evil.example",
    "localhost:8701",
    "localhost",
    "127.0.0.1.evil.example:8700",
    "localhost.evil.example:8700",
    "127.0.0.1:8700:8700",
    "",
    "[::1",
    "localhost:99999",
  ]) {
    assert.equal(hosts.allows(host), false, host);
  }
  // Port 80 is what a Host without a port means.
  assert.equal(listeningOn({ host: "127.0.0.1", port: 80 }).allows("localhost"), true);
});

test("listening on every interface adds the machine's name; port 0 (tests) answers to the bound port", () => {
  const everywhere = listeningOn({ host: "0.0.0.0", port: 8700 });
  for (const host of ["0.0.0.0:8700", "localhost:8700", "127.0.0.1:8700", `${hostname()}:8700`]) assert.equal(everywhere.allows(host), true, host);
  assert.equal(everywhere.allows("evil.example:8700"), false);
  const v6 = listeningOn({ host: "::", port: 8700 });
  assert.equal(v6.allows("[::]:8700"), true);
  assert.equal(v6.allows("[::1]:8700"), true);
  const ephemeral = new MetricsHosts({ host: "127.0.0.1", port: 0, bound: () => ({ address: "127.0.0.1", port: 41234 }) });
  assert.equal(ephemeral.allows("127.0.0.1:41234"), true);
  assert.equal(ephemeral.allows("localhost:41234"), true);
  // What server.ts fills in for an HTTP/1.0 request without a Host.
  assert.equal(ephemeral.allows("127.0.0.1:0"), true);
  assert.equal(ephemeral.allows("localhost:41235"), false);
  // A specific non-loopback address is not reached by the loopback names.
  assert.equal(listeningOn({ host: "10.0.0.5", port: 8700 }).allows("localhost:8700"), false);
  assert.equal(listeningOn({ host: "10.0.0.5", port: 8700 }).allows("10.0.0.5:8700"), true);
});

test("--public-url, --advertise-url and --metrics-host names are this server's too", () => {
  const hosts = listeningOn({
    host: "127.0.0.1",
    port: 8700,
    publicUrl: "https://LLM.example.com",
    advertiseUrl: "http://10.0.0.5:8700",
    metricsHosts: parseMetricsHosts(["prom.internal,named.internal:9000", " second.internal "]),
  });
  for (const host of ["llm.example.com", "llm.example.com:443", "10.0.0.5:8700", "prom.internal:1234", "named.internal:9000", "second.internal"]) {
    assert.equal(hosts.allows(host), true, host);
  }
  for (const host of ["named.internal:9001", "example.com", "evil.example:8700"]) assert.equal(hosts.allows(host), false, host);
});

test("--metrics-host takes names and addresses with an optional port, nothing else", () => {
  assert.deepEqual(parseMetricsHosts(["A.example,b.example:8700", "[::1]:8700", "10.0.0.1"]), ["a.example", "b.example:8700", "[::1]:8700", "10.0.0.1"]);
  assert.deepEqual(parseMetricsHosts([" , "]), []);
  for (const bad of ["http://a.example", "a.example/metrics", "a b", "a.example:99999", "-a.example", "::1", "a.example:"]) {
    assert.throws(
      () => parseMetricsHosts([bad]),
      (error: unknown) => error instanceof BadRequestError && error.code === "invalid_metrics_host" && error.message.includes(`'${bad}'`),
      bad,
    );
  }
});

test("a local request for another Host name needs a key, as a remote one does (a rebinding page has none)", async () => {
  const metricsKey = new MetricsKey(METRICS_KEY);
  const hosts = listeningOn({ host: "127.0.0.1", port: 8700 });
  const local = (host: string, authorization?: string) => ({
    remoteAddress: "127.0.0.1",
    headers: { host, ...(authorization === undefined ? {} : { authorization }) },
  });
  await authorizeMetrics(local("127.0.0.1:8700"), { metricsKey, keys, hosts });
  await authorizeMetrics(local("localhost:8700"), { metricsKey, keys, hosts });
  await assert.rejects(
    authorizeMetrics(local("evil.example:8700"), { metricsKey, keys, hosts }),
    (error: unknown) =>
      error instanceof PermissionDeniedError &&
      error.code === "metrics_host_not_allowed" &&
      error.message.includes("'evil.example:8700'") &&
      error.message.includes("--metrics-host"),
  );
  await authorizeMetrics(local("evil.example:8700", `Bearer ${METRICS_KEY}`), { metricsKey, keys, hosts });
  await authorizeMetrics(local("evil.example:8700", "Bearer admin-key"), { metricsKey, keys, hosts });
  await assert.rejects(
    authorizeMetrics(local("evil.example:8700", "Bearer client-key"), { metricsKey, keys, hosts }),
    (error: unknown) => error instanceof PermissionDeniedError && error.code === "admin_required",
  );
  await assert.rejects(
    authorizeMetrics(local("evil.example:8700", "Bearer wrong"), { metricsKey, keys, hosts }),
    (error: unknown) => error instanceof AuthenticationError && error.code === "invalid_api_key",
  );
  // From another machine the Host does not matter: a key is needed anyway.
  await authorizeMetrics({ remoteAddress: "10.1.2.3", headers: { host: "evil.example", authorization: `Bearer ${METRICS_KEY}` } }, { metricsKey, keys, hosts });
});
