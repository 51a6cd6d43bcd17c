// The cluster secret: what every server sharing one PostgreSQL is given so that each can
// open what another sealed (engine keys, notification channels, the shared join token).
// It comes from --cluster-secret-file or LLMGW_CLUSTER_SECRET; the AES-256-GCM key is
// derived from it with HKDF-SHA256, so any long random text will do (`openssl rand
// -base64 48`). Without one, a server uses its data dir's own key (DATA_DIR/server.secret),
// which is right for a server alone; a second server on the same database then has a
// different key, and cluster-members.ts refuses to start it, naming the flag to pass.
import { hkdfSync } from "node:crypto";
import { readFileSync } from "node:fs";
import { BadRequestError, describeError } from "../core/errors.ts";
import { SecretBox } from "../core/secret-box.ts";

export const CLUSTER_SECRET_ENV = "LLMGW_CLUSTER_SECRET";
/** Shorter than this is too easy to guess for a key that opens every engine key. */
const MIN_SECRET_CHARS = 32;

export interface ClusterSecret {
  box: SecretBox;
  /** Where it came from, for messages (never the secret itself). */
  source: "--cluster-secret-file" | typeof CLUSTER_SECRET_ENV | "data dir";
}

export interface ClusterSecretOptions {
  /** --cluster-secret-file */
  file?: string;
  /** LLMGW_CLUSTER_SECRET's value */
  env?: string;
  /** The data dir's own box, used when no cluster secret is given. */
  dataDirBox: () => SecretBox;
}

export function loadClusterSecret(options: ClusterSecretOptions): ClusterSecret {
  if (options.file !== undefined) {
    let text: string;
    try {
      text = readFileSync(options.file, "utf8");
    } catch (error) {
      throw new BadRequestError(
        `Cannot read --cluster-secret-file ${options.file}: ${describeError(error)}. Give a file holding the cluster secret (one line of at least ${MIN_SECRET_CHARS} characters).`,
        {
          code: "cluster_secret_unreadable",
        },
      );
    }
    return { box: boxFromSecret(text, `--cluster-secret-file ${options.file}`), source: "--cluster-secret-file" };
  }
  if (options.env !== undefined && options.env !== "") return { box: boxFromSecret(options.env, CLUSTER_SECRET_ENV), source: CLUSTER_SECRET_ENV };
  return { box: options.dataDirBox(), source: "data dir" };
}

function boxFromSecret(raw: string, where: string): SecretBox {
  const secret = raw.trim();
  if (secret.length < MIN_SECRET_CHARS) {
    throw new BadRequestError(
      `The cluster secret in ${where} has ${secret.length} characters; it needs at least ${MIN_SECRET_CHARS}. Make one with 'openssl rand -base64 48' and give the same one to every server.`,
      {
        code: "cluster_secret_too_short",
      },
    );
  }
  const key = Buffer.from(hkdfSync("sha256", secret, "llmgw-cluster", "llmgw sealed values v1", 32));
  return SecretBox.fromKey(key);
}
