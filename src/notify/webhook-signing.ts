// Standard Webhooks signatures (https://www.standardwebhooks.com): a secret is "whsec_"
// followed by the base64 of 24 to 64 random bytes; each request carries webhook-id (the
// same on every retry of one message, so receivers can drop repeats), webhook-timestamp
// (unix seconds of this attempt) and webhook-signature "v1,<base64 HMAC-SHA256 of
// id.timestamp.body>" keyed with the secret's decoded bytes. Receivers reject stale
// timestamps, so every attempt is signed again with its own time.
import { createHmac, randomBytes } from "node:crypto";
import { BadRequestError } from "../core/errors.ts";

const PREFIX = "whsec_";
const MIN_KEY_BYTES = 24;
const MAX_KEY_BYTES = 64;
/** The size of secrets llmgw makes: 32 bytes, as HMAC-SHA256's own block of security. */
const GENERATED_KEY_BYTES = 32;

export function generateWebhookSecret(): string {
  return PREFIX + randomBytes(GENERATED_KEY_BYTES).toString("base64");
}

/** The secret's key bytes; throws naming what is wrong with a secret an operator gave. */
export function webhookSecretKey(secret: string, param = "secret"): Buffer {
  if (!secret.startsWith(PREFIX)) {
    throw new BadRequestError(`${param} must start with '${PREFIX}' followed by base64 (a Standard Webhooks secret); leave it out and llmgw makes one.`, {
      code: "invalid_webhook_secret",
      param,
    });
  }
  const encoded = secret.slice(PREFIX.length);
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(encoded) || encoded.length % 4 !== 0) {
    throw new BadRequestError(`${param}: the part after '${PREFIX}' is not base64.`, { code: "invalid_webhook_secret", param });
  }
  const key = Buffer.from(encoded, "base64");
  if (key.length < MIN_KEY_BYTES || key.length > MAX_KEY_BYTES) {
    throw new BadRequestError(`${param} decodes to ${key.length} bytes; a Standard Webhooks secret has ${MIN_KEY_BYTES} to ${MAX_KEY_BYTES}.`, {
      code: "invalid_webhook_secret",
      param,
    });
  }
  return key;
}

export interface SignedHeaders {
  "webhook-id": string;
  "webhook-timestamp": string;
  "webhook-signature": string;
}

export function signWebhook(key: Buffer, messageId: string, timestampSeconds: number, body: string): SignedHeaders {
  const timestamp = String(Math.floor(timestampSeconds));
  const signature = createHmac("sha256", key).update(`${messageId}.${timestamp}.${body}`).digest("base64");
  return { "webhook-id": messageId, "webhook-timestamp": timestamp, "webhook-signature": `v1,${signature}` };
}
