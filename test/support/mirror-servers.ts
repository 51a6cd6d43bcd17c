// Mirrors served over real HTTP for the mirror tests: a Mirror's file server on loopback
// behind a stand-in for the node-credential check (the node key below), alone or as two
// servers `a` and `b` of a cluster on one store, each with its own mirror folder; and the
// request a node makes to them, redirects not followed. In the two-server case "live" is a
// set the test changes: it stands for the cluster's heartbeat rows
// (src/cluster/cluster-members.ts), whose liveness the server passes to its Mirror.
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import http, { type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { AuthenticationError } from "../../src/core/errors.ts";
import { SecretBox } from "../../src/core/secret-box.ts";
import { createMirrorFileHandler, isMirrorFileRequest } from "../../src/mirror/mirror-file-server.ts";
import { Mirror } from "../../src/mirror/mirror.ts";
import type { Store } from "../../src/store/store.ts";
import { startFaultProxy, type FaultProxy } from "./fault-proxy.ts";

/** The key nodes send for mirror files (stands for a node credential). */
export const NODE_KEY = "node-key-for-tests";

export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

export interface NodeRequestOptions {
  /** The bearer key; null sends no Authorization (as a client does after a cross-origin redirect). Default: the node key. */
  key?: string | null;
  method?: string;
  headers?: Record<string, string>;
  /** Sent as JSON. */
  body?: unknown;
}

/**
 * One request with the node's key, redirects not followed. A URL string is parsed (so `..`
 * is resolved); request options (host, port, path) send the path exactly as given.
 */
export function nodeRequest(target: string | http.RequestOptions, options: NodeRequestOptions = {}): Promise<Answer> {
  const key = options.key === undefined ? NODE_KEY : options.key;
  const init: http.RequestOptions = {
    method: options.method ?? "GET",
    headers: {
      ...(key === null ? {} : { authorization: `Bearer ${key}` }),
      ...(options.body === undefined ? {} : { "content-type": "application/json" }),
      ...(options.headers ?? {}),
    },
  };
  return new Promise((resolve, reject) => {
    const onResponse = (res: http.IncomingMessage) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    };
    const req = typeof target === "string" ? http.request(target, init, onResponse) : http.request({ ...target, ...init }, onResponse);
    req.on("error", reject);
    req.end(options.body === undefined ? undefined : JSON.stringify(options.body));
  });
}

/** The error of an answer in OpenAI's shape. */
export function errorOf(answer: Answer): { code: string; message: string } {
  return (JSON.parse(answer.body.toString()) as { error: { code: string; message: string } }).error;
}

/** A handler for the requests a server answers besides mirror files. */
export type OtherRequests = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

export interface MirrorFileServer {
  server: http.Server;
  /** http://127.0.0.1:port */
  url: string;
  close(): Promise<void>;
}

/**
 * The mirror's file server on a loopback port, its node check accepting only the node key;
 * other requests go to `otherRequests` (an admin app, say), or get a 404.
 */
export async function serveMirrorFiles(mirror: Mirror, otherRequests?: OtherRequests): Promise<MirrorFileServer> {
  const files = createMirrorFileHandler({
    mirror,
    // Stands for the server's node-credential check.
    authorize: async (req) => {
      if (req.headers.authorization !== `Bearer ${NODE_KEY}`) throw new AuthenticationError("The key is not valid for mirror files.");
    },
  });
  const server = http.createServer((req, res) => {
    if (isMirrorFileRequest(req.url)) void files(req, res);
    else if (otherRequests !== undefined) void otherRequests(req, res);
    else res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    server,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

export type ServerName = "a" | "b";

export interface MirrorServer {
  name: ServerName;
  mirror: Mirror;
  /** The Mirror's folder. */
  root: string;
  /** The file server's own address (not the fault proxy's, where it stands behind one). */
  url: string;
}

export interface TwoMirrorServers {
  a: MirrorServer;
  b: MirrorServer;
  /** The key the cluster's grants are signed with. */
  box: SecretBox;
  /** The servers that count as running; the test removes and adds names. */
  live: Set<string>;
  /** The fault proxy in front of a server named in `behindFaultProxy`. */
  proxyOf(name: ServerName): FaultProxy;
  /** Stops the proxies, the Mirrors and the file servers, and removes the folders. */
  close(): Promise<void>;
}

export interface TwoMirrorServersOptions {
  /** The registry's headers for a URL the Mirror fetches from an origin. */
  originHeaders?: (url: string) => Record<string, string>;
  /** What a server answers besides mirror files (its admin routes, say). */
  otherRequests?: (mirror: Mirror) => OtherRequests;
  /** Servers the others reach through a TCP fault proxy, so the link can break without closing connections. */
  behindFaultProxy?: readonly ServerName[];
}

/** Servers `a` and `b` on one store: a Mirror each with the cluster option, and its file server. */
export async function twoMirrorServers(store: Store, options: TwoMirrorServersOptions = {}): Promise<TwoMirrorServers> {
  const box = SecretBox.fromKey(randomBytes(32));
  const live = new Set<string>(["a", "b"]);
  // Where the servers reach each other: a file server's own URL, or its fault proxy's.
  const urls = new Map<string, string>();
  const proxies = new Map<ServerName, FaultProxy>();
  const fileServers: MirrorFileServer[] = [];
  const dirs: string[] = [];
  const make = async (name: ServerName): Promise<MirrorServer> => {
    const dir = await mkdtemp(path.join(tmpdir(), `llmgw-mirror-${name}-`));
    dirs.push(dir);
    const root = path.join(dir, "mirror");
    const mirror = new Mirror({
      store,
      root,
      retries: 0,
      retryDelayMs: 5,
      ...(options.originHeaders === undefined ? {} : { originHeaders: options.originHeaders }),
      cluster: {
        self: name,
        liveServers: async () => [...live].filter((server) => urls.has(server)).map((server) => ({ name: server, url: urls.get(server) as string })),
        mac: (text) => box.mac(text),
      },
    });
    const files = await serveMirrorFiles(mirror, options.otherRequests?.(mirror));
    fileServers.push(files);
    if (options.behindFaultProxy?.includes(name)) {
      const proxy = await startFaultProxy({ host: "127.0.0.1", port: (files.server.address() as AddressInfo).port });
      proxies.set(name, proxy);
      urls.set(name, proxy.via(files.url));
    } else {
      urls.set(name, files.url);
    }
    return { name, mirror, root, url: files.url };
  };
  const a = await make("a");
  const b = await make("b");
  return {
    a,
    b,
    box,
    live,
    proxyOf: (name) => {
      const proxy = proxies.get(name);
      if (proxy === undefined) throw new Error(`Server '${name}' is not behind a fault proxy: name it in behindFaultProxy.`);
      return proxy;
    },
    close: async () => {
      for (const proxy of proxies.values()) await proxy.close();
      await Promise.all([a.mirror.close(), b.mirror.close()]);
      for (const files of fileServers) await files.close();
      await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
    },
  };
}
