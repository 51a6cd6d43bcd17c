// A TCP fault proxy for chaos tests: it sits between a client (a server, an agent) and
// what it talks to (PostgreSQL, another server, an engine) and breaks the link on
// purpose, the ways a network breaks:
// - "forward": bytes pass both ways (the normal state);
// - "reset": every open connection is destroyed with a TCP RST and new ones are reset at
//   once (a database restarting, a firewall rejecting);
// - "refuse": the listening socket closes, so connecting gets ECONNREFUSED;
// - "blackhole": connections stay open, new ones are accepted, and no byte passes either
//   way (a partition, a machine that vanished without FIN or RST);
// - "slow": every chunk is held `delayMs` before it passes (a long link); with `paced`,
//   the sender is held too (nothing more is read until the chunk passed), so a link
//   carries at most one chunk per `delayMs` (a narrow link: a big download takes a while).
// Going back to "forward" releases held connections: bytes a blackhole swallowed are
// dropped (as a real partition loses them), so the protocol on top must recover by itself.
import net from "node:net";

export type FaultMode = "forward" | "reset" | "refuse" | "blackhole" | "slow";

export interface FaultProxy {
  /** host:port clients connect to. */
  readonly host: string;
  readonly port: number;
  /** Rewrites a URL (postgres://…, http://…) to go through the proxy. */
  via(url: string): string;
  /** Switches the mode; connections open now are treated as the new mode says. */
  set(mode: FaultMode, options?: { delayMs?: number; paced?: boolean }): Promise<void>;
  readonly mode: FaultMode;
  /** Connections accepted since start (for asserting that a client reconnected). */
  readonly accepted: number;
  /** Bytes passed from the target to clients since start (for asserting how much a client fetched). */
  readonly bytesToClients: number;
  close(): Promise<void>;
}

interface Pair {
  client: net.Socket;
  upstream: net.Socket;
}

export async function startFaultProxy(target: { host: string; port: number }, listenPort = 0): Promise<FaultProxy> {
  let mode: FaultMode = "forward";
  let delayMs = 0;
  let paced = false;
  let accepted = 0;
  let bytesToClients = 0;
  const pairs = new Set<Pair>();

  const relay = (from: net.Socket, to: net.Socket, counted: boolean) => {
    const pass = (chunk: Buffer) => {
      if (to.destroyed) return;
      if (counted) bytesToClients += chunk.length;
      to.write(chunk);
    };
    from.on("data", (chunk: Buffer) => {
      if (mode === "blackhole") return;
      if (mode === "slow") {
        const holdSender = paced;
        if (holdSender) from.pause();
        setTimeout(() => {
          pass(chunk);
          if (holdSender) from.resume();
        }, delayMs);
        return;
      }
      pass(chunk);
    });
  };

  const onConnection = (client: net.Socket) => {
    accepted += 1;
    client.on("error", () => undefined);
    if (mode === "reset") {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(target.port, target.host);
    upstream.on("error", () => client.destroy());
    const pair = { client, upstream };
    pairs.add(pair);
    const drop = () => {
      pairs.delete(pair);
      if (!client.destroyed) client.destroy();
      if (!upstream.destroyed) upstream.destroy();
    };
    client.on("close", drop);
    upstream.on("close", drop);
    // An end passes only while forwarding: a blackhole swallows FINs too.
    client.on("end", () => mode !== "blackhole" && upstream.end());
    upstream.on("end", () => mode !== "blackhole" && client.end());
    relay(client, upstream, false);
    relay(upstream, client, true);
  };

  let server = net.createServer({ allowHalfOpen: true }, onConnection);
  const listen = (port: number) =>
    new Promise<number>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => resolve((server.address() as net.AddressInfo).port));
    });
  const port = await listen(listenPort);

  const resetAll = () => {
    for (const pair of pairs) {
      pair.client.resetAndDestroy();
      pair.upstream.destroy();
    }
    pairs.clear();
  };

  return {
    host: "127.0.0.1",
    port,
    via(url) {
      const parsed = new URL(url);
      parsed.hostname = "127.0.0.1";
      parsed.port = String(port);
      return parsed.toString();
    },
    get mode() {
      return mode;
    },
    get accepted() {
      return accepted;
    },
    get bytesToClients() {
      return bytesToClients;
    },
    async set(next, options = {}) {
      const previous = mode;
      mode = next;
      delayMs = options.delayMs ?? 0;
      paced = options.paced ?? false;
      if (next === "reset" || next === "refuse") resetAll();
      if (next === "refuse" && previous !== "refuse") await new Promise<void>((resolve) => server.close(() => resolve()));
      if (previous === "refuse" && next !== "refuse") {
        server = net.createServer({ allowHalfOpen: true }, onConnection);
        await listen(port);
      }
      if (previous === "blackhole" && next !== "blackhole") {
        // What the blackhole swallowed is gone: connections that lived through it are
        // out of step with their peer, as after a real partition. End them the way the
        // peer's kernel would once it answers again: with a reset.
        resetAll();
      }
    },
    async close() {
      resetAll();
      if (mode !== "refuse") await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
