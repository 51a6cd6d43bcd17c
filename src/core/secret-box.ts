// Seals secrets the server must keep in its store but nobody may read there: engine keys
// (the gateway needs them after a restart to call engines its agents kept running). AES-
// 256-GCM with a 32-byte key from DATA_DIR/server.secret (made on first use, mode 0600);
// a sealed value is "v1:" + base64(iv ‖ tag ‖ ciphertext). Several servers sharing one
// database share one key instead, derived from the cluster secret (src/cluster/cluster-secret.ts).
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from "node:crypto";
import { chmodSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { errorCode, LlmgwError } from "./errors.ts";

export const SERVER_SECRET_FILE = "server.secret";
const VERSION = "v1:";
const IV_BYTES = 12;
const TAG_BYTES = 16;

export class SecretBox {
  private constructor(private readonly key: Buffer) {}

  static fromKey(key: Buffer): SecretBox {
    if (key.length !== 32) throw new Error(`A secret box key is 32 bytes, got ${key.length}.`);
    return new SecretBox(key);
  }

  /** The data dir's key, created (whole, 0600) when it is not there yet. */
  static forDataDir(dataDir: string): SecretBox {
    const file = path.join(dataDir, SERVER_SECRET_FILE);
    try {
      return SecretBox.fromKey(Buffer.from(readFileSync(file, "utf8").trim(), "base64"));
    } catch (error) {
      if (errorCode(error) !== "ENOENT") {
        throw new LlmgwError({
          message: `Cannot read the server secret ${file}: ${error instanceof Error ? error.message : String(error)}. It must hold the base64 of 32 bytes; restore it from a backup (replicas placed with another secret are started again with new keys).`,
          code: "server_secret_unreadable",
          status: 500,
          cause: error,
        });
      }
    }
    const key = randomBytes(32);
    const scratch = `${file}.${process.pid}.new`;
    try {
      writeFileSync(scratch, `${key.toString("base64")}\n`, { mode: 0o600 });
      chmodSync(scratch, 0o600);
      renameSync(scratch, file);
    } finally {
      rmSync(scratch, { force: true });
    }
    return new SecretBox(key);
  }

  /**
   * A value that is equal for two boxes exactly when their keys are: an HMAC of a fixed
   * text. Servers compare it to find out they were given different secrets; it tells
   * nothing about the key.
   */
  checkValue(): string {
    return createHmac("sha256", this.key).update("llmgw secret check v1").digest("hex");
  }

  /**
   * An HMAC-SHA256 (hex) of `text` under a key derived from this box's, for what servers
   * sharing the box sign for each other (the mirror's redirect grants); not a check value.
   */
  mac(text: string): string {
    const macKey = createHmac("sha256", this.key).update("llmgw mac key v1").digest();
    return createHmac("sha256", macKey).update(text).digest("hex");
  }

  seal(plain: string): string {
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv("aes-256-gcm", this.key, iv);
    const body = Buffer.concat([cipher.update(plain, "utf8"), cipher.final()]);
    return VERSION + Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64");
  }

  /** The plain text, or null when the value was sealed with another key or is damaged. */
  open(sealed: string): string | null {
    if (!sealed.startsWith(VERSION)) return null;
    const raw = Buffer.from(sealed.slice(VERSION.length), "base64");
    if (raw.length < IV_BYTES + TAG_BYTES) return null;
    try {
      const decipher = createDecipheriv("aes-256-gcm", this.key, raw.subarray(0, IV_BYTES));
      decipher.setAuthTag(raw.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
      return Buffer.concat([decipher.update(raw.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString("utf8");
    } catch {
      return null;
    }
  }
}
