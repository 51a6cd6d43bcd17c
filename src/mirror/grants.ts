// Redirect grants: how one server of a cluster lets a caller fetch a mirror file from
// another. A server that does not hold a file answers a node with a 307 to a server that
// does; the node's client drops its Authorization header on that cross-origin hop (our
// agents do, as browsers and undici do), so the redirect carries `?grant=EXPIRES.MAC`
// instead: an HMAC, under the secret every server of the cluster shares, of the exact file
// path and the expiry. The holder serves a request with a valid, unexpired grant for
// exactly that path without asking for a key. Replication signs its own grants the same
// way to copy a file from a holder.
//
// A grant is a credential for one file for a few minutes: it is never logged or stored
// (the mirror's messages name only a URL's origin).
import { timingSafeEqual } from "node:crypto";
import { PermissionDeniedError } from "../core/errors.ts";

/** How long a redirect's grant is good for. */
export const GRANT_TTL_SECONDS = 600;

/** The query parameter that carries a grant. */
export const GRANT_PARAM = "grant";

const GRANT_SHAPE = /^(\d{1,12})\.([0-9a-f]{64})$/;

/** The text a grant's MAC covers: a fixed label, the file's path, and the expiry (epoch seconds). */
export function grantText(model: string, version: string, file: string, expires: number): string {
  return `mirror-grant\n${model}/${version}/${file}\n${expires}`;
}

export class MirrorGrants {
  readonly #mac: (text: string) => string;
  readonly #clock: () => number;

  constructor(mac: (text: string) => string, clock: () => number = Date.now) {
    this.#mac = mac;
    this.#clock = clock;
  }

  /** A grant (`EXPIRES.MAC`) for one file, good for `ttlSeconds`. */
  sign(model: string, version: string, file: string, ttlSeconds = GRANT_TTL_SECONDS): string {
    const expires = Math.floor(this.#clock() / 1000) + ttlSeconds;
    return `${expires}.${this.#mac(grantText(model, version, file, expires))}`;
  }

  /** Throws a 403 unless `grant` is a grant for exactly this file that has not expired. */
  check(grant: string, model: string, version: string, file: string): void {
    const named = `${model}/${version}/${file}`;
    const match = GRANT_SHAPE.exec(grant);
    const expected = match === null ? null : this.#mac(grantText(model, version, file, Number(match[1])));
    if (match === null || expected === null || !sameHex(expected, match[2] ?? "")) {
      throw new PermissionDeniedError(
        `The grant in this request is not valid for /mirror/${named}: it was not signed by a server of this cluster for that file (or was changed). ` +
          `Ask the server you first asked again: it redirects here with a fresh grant.`,
        { code: "mirror_grant_invalid" },
      );
    }
    const expires = Number(match[1]);
    if (expires * 1000 < this.#clock()) {
      throw new PermissionDeniedError(
        `The grant for /mirror/${named} expired at ${new Date(expires * 1000).toISOString()}. Ask the server you first asked again: it redirects here with a fresh grant.`,
        { code: "mirror_grant_expired" },
      );
    }
  }
}

function sameHex(a: string, b: string): boolean {
  const left = Buffer.from(a, "hex");
  const right = Buffer.from(b, "hex");
  return left.length === right.length && timingSafeEqual(left, right);
}
