// Who may read /metrics, decided from the peer address and the headers: open to this
// machine, a key (the metrics key or an admin key) from anywhere else or through a proxy.
import { test } from "node:test";
import assert from "node:assert/strict";
import { AuthenticationError, BadRequestError, PermissionDeniedError } from "../core/errors.ts";
import type { KeyVerifier } from "../gateway/gateway-ports.ts";
import type { Principal } from "../keys/key-service.ts";
import { MetricsKey, authorizeMetrics, isLoopback, isLocalScrape } from "./metrics-access.ts";

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
  await authorizeMetrics({ remoteAddress: "127.0.0.1", headers: {} }, { metricsKey, keys });
  await authorizeMetrics(remote(`Bearer ${METRICS_KEY}`), { metricsKey, keys });
  await authorizeMetrics(remote("Bearer admin-key"), { metricsKey: null, keys });
  await authorizeMetrics(remote("Bearer admin-key"), { metricsKey, keys });

  await assert.rejects(
    authorizeMetrics(remote(), { metricsKey, keys }),
    (error: unknown) => error instanceof AuthenticationError && error.code === "missing_api_key" && /metrics key/.test(error.message),
  );
  await assert.rejects(
    authorizeMetrics({ remoteAddress: "127.0.0.1", headers: { "x-forwarded-for": "203.0.113.9" } }, { metricsKey, keys }),
    (error: unknown) => error instanceof AuthenticationError && error.status === 401,
  );
  await assert.rejects(
    authorizeMetrics(remote(`Bearer ${METRICS_KEY}x`), { metricsKey, keys }),
    (error: unknown) =>
      error instanceof AuthenticationError && error.code === "invalid_api_key" && /neither the metrics key nor an admin key/.test(error.message),
  );
  await assert.rejects(
    authorizeMetrics(remote(`Bearer ${METRICS_KEY}`), { metricsKey: null, keys }),
    (error: unknown) => error instanceof AuthenticationError && /this server has none/.test(error.message),
  );
  await assert.rejects(
    authorizeMetrics(remote("Bearer client-key"), { metricsKey, keys }),
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
