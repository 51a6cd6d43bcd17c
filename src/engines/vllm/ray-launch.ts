// The Ray processes under a vLLM replica that spans nodes (engines.md: `ray start --head`
// on one node, `ray start --address HEAD:6379` on the others, then `vllm serve ...
// --distributed-executor-backend ray` on the head, see vllm-launch.ts). Each is an
// EngineLaunch like any engine, so the agent supervises it the same way: its own process
// group (`--block` keeps `ray start` in the foreground, holding its raylet and GCS as
// children), its own state folder and offline environment, restart with backoff.
//
// Readiness (not in engines.md; Ray's dashboard routes, the ones KubeRay's probes use):
// the head answers `/api/gcs_healthz` on its dashboard port and a worker answers
// `/api/local_raylet_healthz` on its dashboard agent's port, both 200 once up. That needs
// Ray's dashboard (the `ray[default]` install vLLM's multi-node guide uses); a bare `ray`
// install has no HTTP health route, and its launch would never become ready. Limitations,
// documented rather than hidden: the supervisor checks only the health port free before
// start, not the GCS port (6379) nor the ports Ray picks for its raylet and object
// manager; Ray has no key, so its ports are open to whoever reaches the node address,
// like any Ray cluster; and nothing here validates which cluster a worker joined.
//
// Unix sockets: Ray puts its raylet and plasma store sockets in its session folder below
// TMPDIR by default (`<TMPDIR>/ray/session_<date>_<pid>/sockets/plasma_store`), which a
// state folder of ordinary depth pushes past the 107 bytes a socket path may have. The
// socket paths are named explicitly here (`--raylet-socket-name`,
// `--plasma-store-socket-name`), short and still inside the state folder.
import { join } from "node:path";
import type { EngineLaunch } from "../../agent/supervisor-options.ts";
import { LlmgwError } from "../../core/errors.ts";
import { UNIX_SOCKET_PATH_MAX } from "./vllm-launch.ts";

/** Ray's default GCS port, the one engines.md's `ray start --address HEAD:6379` names. */
export const RAY_GCS_PORT = 6379;

interface RayLaunchCommon {
  /** The node's `ray` (a path, or a name on PATH). */
  executable: string;
  /** The node address Ray binds to and advertises (--node-ip-address). */
  host: string;
  /** The health port: the head's dashboard, or a worker's dashboard agent (AttemptContext.port). */
  port: number;
  /** The run's state folder (AttemptContext.stateDir). */
  stateDir: string;
  /** GPU indexes placement gave the replica on this node; Ray then offers that many (--num-gpus). */
  gpus?: number[];
}

export interface RayHeadLaunchOptions extends RayLaunchCommon {
  /** The GCS port workers and vLLM connect to. Default 6379. */
  gcsPort?: number;
}

export interface RayWorkerLaunchOptions extends RayLaunchCommon {
  /** The head's GCS address, HOST:PORT (for example "10.0.0.5:6379"). */
  headAddress: string;
}

/** `ray start --head ... --block` on the replica's first node; ready when its GCS answers the dashboard's health route. */
export function rayHeadLaunch(options: RayHeadLaunchOptions): EngineLaunch {
  const gcsPort = options.gcsPort ?? RAY_GCS_PORT;
  return rayLaunch(options, {
    args: [
      "start",
      "--head",
      "--port",
      String(gcsPort),
      "--include-dashboard",
      "true",
      "--dashboard-host",
      options.host,
      "--dashboard-port",
      String(options.port),
    ],
    healthPath: "/api/gcs_healthz",
    settings: { engine: "ray", role: "head", gcsPort },
  });
}

/** `ray start --address HEAD:6379 ... --block` on each other node; ready when its raylet answers the dashboard agent's health route. */
export function rayWorkerLaunch(options: RayWorkerLaunchOptions): EngineLaunch {
  return rayLaunch(options, {
    args: ["start", "--address", options.headAddress, "--dashboard-agent-listen-port", String(options.port)],
    healthPath: "/api/local_raylet_healthz",
    settings: { engine: "ray", role: "worker", headAddress: options.headAddress },
  });
}

function rayLaunch(options: RayLaunchCommon, role: { args: string[]; healthPath: string; settings: Record<string, unknown> }): EngineLaunch {
  // Below the supervisor's TMPDIR (engine-env.ts), with the shortest names that say what they are.
  const tmp = join(options.stateDir, "tmp");
  const rayletSocket = join(tmp, "raylet");
  const plasmaSocket = join(tmp, "plasma");
  const longest = Math.max(Buffer.byteLength(rayletSocket), Buffer.byteLength(plasmaSocket));
  if (longest > UNIX_SOCKET_PATH_MAX) {
    throw new LlmgwError({
      code: "state_path_too_long",
      status: 500,
      message: `Ray's sockets below ${tmp} would need ${longest} bytes, more than the ${UNIX_SOCKET_PATH_MAX} a socket path may have; give the agent a data dir at least ${longest - UNIX_SOCKET_PATH_MAX} bytes shorter.`,
    });
  }
  const args = [
    ...role.args,
    "--node-ip-address",
    options.host,
    "--raylet-socket-name",
    rayletSocket,
    "--plasma-store-socket-name",
    plasmaSocket,
    // Stay in the foreground: the supervisor watches this process and stops its group.
    "--block",
  ];
  if (options.gpus !== undefined) args.push("--num-gpus", String(options.gpus.length));
  // Ray's own usage reporting; the supervisor's offline flags (DO_NOT_TRACK) are not what Ray reads.
  const env: Record<string, string> = { RAY_USAGE_STATS_ENABLED: "0" };
  if (options.gpus !== undefined) env.CUDA_VISIBLE_DEVICES = options.gpus.join(",");
  return {
    command: options.executable,
    args,
    env,
    host: options.host,
    port: options.port,
    healthPath: role.healthPath,
    settings: { ...role.settings, ...(options.gpus === undefined ? {} : { gpus: options.gpus }) },
  };
}
