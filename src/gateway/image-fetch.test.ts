// The parts of image fetching that stand apart from a request (image-fetch.ts): the
// resolver image URLs' names go through, against a DNS server on loopback UDP, and the
// process's budget of image bytes in flight. Requests through the gateway are in
// image-parts.test.ts.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import dgram from "node:dgram";
import { eventually } from "../../test/support/eventually.ts";
import { dnsResolver, ImageFetchBudget } from "./image-fetch.ts";

/**
 * A DNS server on loopback UDP, standing in for the resolvers of /etc/resolv.conf as
 * c-ares asks them: A queries for the names in `answers` get that address, AAAA queries
 * get no records, names in `silent` get no reply at all, any other name NXDOMAIN.
 */
async function startFakeDns(answers: Record<string, string>, silent: string[]): Promise<{ server: string; queries: string[]; close(): void }> {
  const queries: string[] = [];
  const socket = dgram.createSocket("udp4");
  socket.on("message", (query, from) => {
    const labels: string[] = [];
    let at = 12;
    while (query[at] !== 0 && at < query.length) {
      labels.push(query.subarray(at + 1, at + 1 + query[at]!).toString());
      at += 1 + query[at]!;
    }
    const name = labels.join(".");
    const type = query.readUInt16BE(at + 1);
    queries.push(name);
    if (silent.includes(name)) return;
    const address = type === 1 ? answers[name] : undefined;
    const header = Buffer.alloc(12);
    header.writeUInt16BE(query.readUInt16BE(0), 0);
    header.writeUInt16BE(name in answers ? 0x8180 : 0x8183, 2); // a response, recursion available; NOERROR or NXDOMAIN
    header.writeUInt16BE(1, 4);
    header.writeUInt16BE(address === undefined ? 0 : 1, 6);
    const question = query.subarray(12, at + 5);
    const answer =
      address === undefined
        ? Buffer.alloc(0)
        : Buffer.concat([Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]), Buffer.from(address.split(".").map(Number))]);
    socket.send(Buffer.concat([header, question, answer]), from.port, from.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, "127.0.0.1", resolve));
  return { server: `127.0.0.1:${socket.address().port}`, queries, close: () => socket.close() };
}

describe("image host names", () => {
  test("are resolved by c-ares through the DNS servers it is given, a missing name failing as DNS says", async () => {
    const dns = await startFakeDns({ "cats.test": "192.0.2.7" }, []);
    try {
      const resolve = dnsResolver({ servers: [dns.server] });
      const signal = new AbortController().signal;
      // getaddrinfo would ask the system's resolver, which knows no cats.test.
      assert.deepEqual(await resolve("cats.test", signal), [{ address: "192.0.2.7", family: 4 }]);
      assert.ok(dns.queries.includes("cats.test"), "the configured server was asked");
      await assert.rejects(resolve("missing.test", signal), { code: "ENOTFOUND" });
    } finally {
      dns.close();
    }
  });

  test("a lookup a DNS server never answers ends when its signal does, not at c-ares's own timeouts", async () => {
    const dns = await startFakeDns({}, ["silent.test"]);
    try {
      // c-ares alone would wait a minute here (two tries of 30 s) before answering ETIMEOUT.
      const resolve = dnsResolver({ servers: [dns.server], timeoutMs: 30_000 });
      const stop = new AbortController();
      const pending = resolve("silent.test", stop.signal);
      await eventually("the silent server is asked", () => dns.queries.includes("silent.test"));
      stop.abort();
      await assert.rejects(pending, { code: "ECANCELLED" });
      await assert.rejects(resolve("silent.test", stop.signal), { name: "AbortError" }, "an ended request starts no lookup");
    } finally {
      dns.close();
    }
  });

  test("localhost and names under it are loopback without asking DNS (RFC 6761), as c-ares does not read /etc/hosts", async () => {
    const dns = await startFakeDns({}, []);
    try {
      const resolve = dnsResolver({ servers: [dns.server] });
      const loopback = [
        { address: "127.0.0.1", family: 4 },
        { address: "::1", family: 6 },
      ];
      assert.deepEqual(await resolve("localhost", new AbortController().signal), loopback);
      assert.deepEqual(await resolve("Images.LOCALHOST.", new AbortController().signal), loopback);
      assert.deepEqual(dns.queries, []);
    } finally {
      dns.close();
    }
  });
});

describe("the budget of image bytes in flight", () => {
  test("refuses bytes past its limit while others hold some, lets a lone holder past it, and frees what is given back", () => {
    const budget = new ImageFetchBudget(100);
    assert.equal(budget.take(60, 0), true);
    assert.equal(budget.take(30, 0), true, "a second holder, within the limit");
    assert.equal(budget.take(20, 30), false, "over the limit while the first holds 60");
    assert.equal(budget.inUse, 90);
    budget.give(60);
    assert.equal(budget.take(200, 30), true, "the only holder left may go past the limit");
    assert.equal(budget.take(1, 0), false, "and nobody else may take any until it gives back");
    budget.give(230);
    assert.equal(budget.inUse, 0);
  });
});
