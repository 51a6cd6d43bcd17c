// Node credentials and the join token. A node joins once with the server's join token
// (DATA_DIR/join.token, `llmgw ctl node join-token`) and gets its own credential, bound to
// its node id: `lnc.<node id>.<secret>`. The server keeps only the sha256 of it, so a
// leaked database does not let anyone act as a node; the id inside lets the server name
// the node a refused credential belongs to.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { chmodSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { errorCode } from "../core/errors.ts";

export const JOIN_TOKEN_FILE = "join.token";
const CREDENTIAL_PREFIX = "lnc.";

export function newNodeId(): string {
  return `n-${randomBytes(6).toString("hex")}`;
}

export function mintNodeCredential(nodeId: string): string {
  return `${CREDENTIAL_PREFIX}${nodeId}.${randomBytes(24).toString("base64url")}`;
}

/** The node id a credential claims, or null when it is not shaped like one. */
export function credentialNodeId(credential: string): string | null {
  if (!credential.startsWith(CREDENTIAL_PREFIX)) return null;
  const rest = credential.slice(CREDENTIAL_PREFIX.length);
  const dot = rest.indexOf(".");
  return dot <= 0 ? null : rest.slice(0, dot);
}

export function hashSecret(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

/** Compares two hex hashes in constant time. */
export function sameHash(a: string, b: string): boolean {
  const left = Buffer.from(a, "hex");
  const right = Buffer.from(b, "hex");
  return left.length === right.length && timingSafeEqual(left, right);
}

/** The data dir's join token, created (0600, whole) on first use; `rotate` replaces it. */
export function ensureJoinToken(dataDir: string, options: { rotate?: boolean } = {}): string {
  const file = path.join(dataDir, JOIN_TOKEN_FILE);
  if (options.rotate !== true) {
    try {
      const token = readFileSync(file, "utf8").trim();
      if (token.length > 0) return token;
    } catch (error) {
      if (errorCode(error) !== "ENOENT") throw error;
    }
  }
  return writeJoinToken(dataDir, `ljt_${randomBytes(24).toString("base64url")}`);
}

/** Writes the join token to DATA_DIR/join.token (0600, whole or not at all); returns it. */
export function writeJoinToken(dataDir: string, token: string): string {
  const file = path.join(dataDir, JOIN_TOKEN_FILE);
  const scratch = `${file}.${process.pid}.new`;
  try {
    writeFileSync(scratch, `${token}\n`, { mode: 0o600 });
    chmodSync(scratch, 0o600);
    renameSync(scratch, file);
  } finally {
    rmSync(scratch, { force: true });
  }
  return token;
}
