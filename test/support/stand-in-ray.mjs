#!/usr/bin/env node
// A stand-in for `ray start` (Ray cannot run here: it needs its own install and, for vLLM,
// GPUs). It stands for these real behaviours (reference/engines.md, "vLLM": `ray start
// --head` on one node, `ray start --address HEAD:PORT` on the others; Ray's dashboard
// routes where engines.md is silent):
//
// - `ray start --head --port GCS --dashboard-port P --node-ip-address H --block`: the GCS
//   listens on H:GCS; the dashboard answers `/api/gcs_healthz` 200 on H:P once up.
// - `ray start --address HEAD:GCS --dashboard-agent-listen-port P --node-ip-address H
//   --block`: the worker connects to the head's GCS; it cannot start without it (exits 1,
//   "Unable to connect to GCS"); once joined, `/api/local_raylet_healthz` answers 200 on
//   H:P. A worker whose head goes away ends too.
// - `--block` keeps the process in the foreground until it is stopped.
//
// STAND_IN_RECORD: a file to which one JSON line {pid, argv, env} is appended at start.
import { appendFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";

const argv = process.argv.slice(2);
const flag = (name) => {
  const i = argv.indexOf(name);
  return i === -1 ? undefined : argv[i + 1];
};
if (process.env.STAND_IN_RECORD) appendFileSync(process.env.STAND_IN_RECORD, `${JSON.stringify({ pid: process.pid, argv, env: process.env })}\n`);
if (argv[0] !== "start" || !argv.includes("--block")) {
  console.error("usage: ray start (--head | --address HEAD:PORT) ... --block");
  process.exit(2);
}
const host = flag("--node-ip-address") ?? "127.0.0.1";

function health(port, path) {
  http
    .createServer((req, res) => {
      res.writeHead((req.url ?? "").split("?")[0] === path ? 200 : 404, { "content-type": "text/plain" });
      res.end("success");
    })
    .listen(port, host);
}

if (argv.includes("--head")) {
  const gcsPort = Number(flag("--port") ?? "6379");
  const workers = new Set();
  net
    .createServer((socket) => {
      workers.add(socket);
      socket.on("error", () => undefined);
      socket.on("close", () => workers.delete(socket));
    })
    .listen(gcsPort, host, () => {
      console.log(`Ray runtime started. GCS at ${host}:${gcsPort}`);
      health(Number(flag("--dashboard-port") ?? "8265"), "/api/gcs_healthz");
    });
} else {
  const address = flag("--address") ?? "";
  const [headHost, headPort] = [address.slice(0, address.lastIndexOf(":")), Number(address.slice(address.lastIndexOf(":") + 1))];
  const socket = net.connect(headPort, headHost, () => {
    console.log(`Ray runtime started. Joined the cluster at ${address}`);
    health(Number(flag("--dashboard-agent-listen-port") ?? "52365"), "/api/local_raylet_healthz");
  });
  socket.on("error", (error) => {
    console.error(`ConnectionError: Unable to connect to GCS at ${address}: ${error.message}`);
    process.exit(1);
  });
  socket.on("close", () => {
    console.error(`The GCS at ${address} went away; this node leaves the cluster.`);
    process.exit(1);
  });
}
