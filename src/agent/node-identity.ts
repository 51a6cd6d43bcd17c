// The node's identity on disk: AGENT_DATA_DIR/node.json (mode 0600) holds the server it
// joined through, its node id, name and credential, and the servers it was last started
// with. Written when the node joins; every later start uses it instead of the join token.
// Deleting it (and `llmgw ctl node remove` on the server) is how a machine leaves the
// fleet for good.
import { chmodSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { BadRequestError, errorCode } from "../core/errors.ts";

export const NODE_IDENTITY_FILE = "node.json";

export interface NodeIdentity {
  /** The server URL the node joined through (one URL, as node.json has always held it). */
  server: string;
  /**
   * The servers of the cluster the agent was last started with (`--server`); files written
   * before agents took several servers lack it.
   */
  servers?: string[];
  nodeId: string;
  name: string;
  credential: string;
}

export function readNodeIdentity(dataDir: string): NodeIdentity | null {
  const file = path.join(dataDir, NODE_IDENTITY_FILE);
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if (errorCode(error) === "ENOENT") return null;
    throw error;
  }
  try {
    const parsed = JSON.parse(text) as Partial<NodeIdentity>;
    if (typeof parsed.nodeId === "string" && typeof parsed.credential === "string" && typeof parsed.name === "string" && typeof parsed.server === "string") {
      const servers = Array.isArray(parsed.servers) && parsed.servers.every((server) => typeof server === "string") ? { servers: parsed.servers } : {};
      return { server: parsed.server, ...servers, nodeId: parsed.nodeId, name: parsed.name, credential: parsed.credential };
    }
  } catch {
    // Reported below with what to do.
  }
  throw new BadRequestError(
    `${file} is damaged (it should hold the node's id, name and credential as JSON). Delete it, remove the node on the server ('llmgw ctl node remove NAME') and join again.`,
    {
      code: "node_identity_damaged",
    },
  );
}

export function writeNodeIdentity(dataDir: string, identity: NodeIdentity): void {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const file = path.join(dataDir, NODE_IDENTITY_FILE);
  const scratch = `${file}.${process.pid}.new`;
  try {
    writeFileSync(scratch, `${JSON.stringify(identity, null, 2)}\n`, { mode: 0o600 });
    chmodSync(scratch, 0o600);
    renameSync(scratch, file);
  } finally {
    rmSync(scratch, { force: true });
  }
}

export function forgetNodeIdentity(dataDir: string): void {
  rmSync(path.join(dataDir, NODE_IDENTITY_FILE), { force: true });
}
