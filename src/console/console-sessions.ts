// Console sessions: an operator logs in once with an admin key, and the browser then holds
// only a random session token in an HttpOnly, SameSite=Strict cookie. The store keeps the
// sha256 of that token and the hash the key service already keeps of the key (neither
// secret), so any server on the same database accepts the session, and a session ends at
// its expiry, on logout, or as soon as its key is revoked or expires. Requests made with a
// session act as the key that logged in: the audit trail and usage name that key.
import { createHash, randomBytes } from "node:crypto";
import { AuthenticationError } from "../core/errors.ts";
import { ChangeSignal } from "../core/change-signal.ts";
import { hashKey, type KeyService, type Principal } from "../keys/key-service.ts";
import type { AuditTrail } from "../store/audit.ts";
import type { Store } from "../store/store.ts";

export const SESSION_COOKIE = "llmgw_session";
/** Twelve hours: a working day at the console, then the key is asked for again. */
export const DEFAULT_SESSION_TTL_MS = 12 * 60 * 60 * 1000;
/** A session checked this recently is not read again; a logout here drops it at once. */
const CACHE_TTL_MS = 5000;
const CACHE_MAX = 1000;
/** Expired rows are removed at most this often (at a login), so the table does not grow. */
const PRUNE_EVERY_MS = 60 * 60 * 1000;

export interface ConsoleSessionsOptions {
  store: Store;
  keys: KeyService;
  audit: AuditTrail;
  ttlMs?: number;
  clock?: () => number;
  /** The address people open the console at behind a proxy (--public-url): requests from it are the console's own. */
  publicUrl?: string;
}

export interface ConsoleSession {
  principal: Principal;
  expiresAt: number;
}

interface SessionRow {
  keyHash: string;
  expiresAt: number;
}

function sessionId(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

function sessionExpired(): AuthenticationError {
  return new AuthenticationError("Your console session has ended (it expired, or you logged out). Log in again with an admin key.", {
    code: "session_expired",
  });
}

export class ConsoleSessions {
  readonly ttlMs: number;
  private readonly clock: () => number;
  private readonly cache = new Map<string, { row: SessionRow; checkedAt: number }>();
  /** Sessions logged out here lately: a read that began before the logout must not cache them again. */
  private readonly ended = new Map<string, number>();
  private lastPrune = 0;
  /** Raised when a session ends here (logout) or may have ended on another server: open event streams check theirs at once. */
  readonly changes = new ChangeSignal();

  constructor(private readonly options: ConsoleSessionsOptions) {
    this.ttlMs = options.ttlMs ?? DEFAULT_SESSION_TTL_MS;
    this.clock = options.clock ?? Date.now;
  }

  /** The origin of --public-url, or null. */
  publicOrigin(): string | null {
    return this.options.publicUrl === undefined ? null : new URL(this.options.publicUrl).origin;
  }

  /** Checks the admin key and opens a session for it; the token goes to the browser only. */
  async login(presentedKey: string | undefined): Promise<{ token: string } & ConsoleSession> {
    if (presentedKey === undefined || presentedKey.trim() === "") {
      throw new AuthenticationError(
        "No admin key given. Paste the admin key that `llmgw up` or `llmgw server` printed at its first start (also in the data dir's admin.key).",
        { code: "missing_api_key" },
      );
    }
    const principal = await this.options.keys.verifyAdmin(presentedKey.trim());
    const now = this.clock();
    const token = randomBytes(32).toString("base64url");
    const expiresAt = now + this.ttlMs;
    await this.options.store.db
      .insertInto("console_sessions")
      .values({
        id: sessionId(token),
        key_id: principal.keyId,
        key_hash: hashKey(presentedKey.trim()),
        created_at: new Date(now).toISOString(),
        expires_at: new Date(expiresAt).toISOString(),
      })
      .execute();
    await this.options.audit.record({
      actor: `admin:${principal.name}`,
      action: "console.login",
      target: principal.name,
      detail: { expires_at: new Date(expiresAt).toISOString() },
    });
    if (now - this.lastPrune > PRUNE_EVERY_MS) {
      this.lastPrune = now;
      await this.options.store.db.deleteFrom("console_sessions").where("expires_at", "<", new Date(now).toISOString()).execute();
    }
    return { token, principal, expiresAt };
  }

  /** The key behind a session token; 401 when the session is unknown, over, or its key is no longer valid. */
  async verify(token: string | undefined): Promise<ConsoleSession> {
    if (token === undefined || token === "") throw sessionExpired();
    const id = sessionId(token);
    const now = this.clock();
    if (this.ended.has(id)) throw sessionExpired();
    let row = this.cache.get(id);
    if (row === undefined || now - row.checkedAt >= CACHE_TTL_MS) {
      const stored = await this.options.store.db.selectFrom("console_sessions").select(["key_hash", "expires_at"]).where("id", "=", id).executeTakeFirst();
      if (stored === undefined || this.ended.has(id)) {
        this.cache.delete(id);
        throw sessionExpired();
      }
      if (this.cache.size >= CACHE_MAX) this.cache.clear();
      row = { row: { keyHash: stored.key_hash, expiresAt: Date.parse(stored.expires_at) }, checkedAt: now };
      this.cache.set(id, row);
    }
    if (row.row.expiresAt <= now) throw sessionExpired();
    // The key's own checks (revoked, expired, still admin) run on every request, from the key service's cache.
    const principal = await this.options.keys.verifyAdminHash(row.row.keyHash);
    return { principal, expiresAt: row.row.expiresAt };
  }

  /** Another server changed sessions (a logout there): each is read again at its next request. */
  forgetCached(): void {
    this.cache.clear();
    this.changes.notify();
  }

  /** Ends a session; an unknown or ended one is simply gone already. */
  async logout(token: string | undefined): Promise<void> {
    if (token === undefined || token === "") return;
    const id = sessionId(token);
    this.cache.delete(id);
    let principal: Principal | null = null;
    try {
      principal = (await this.verify(token)).principal;
    } catch {
      // Ended already, or its key is gone: there is nothing to audit, only a row to remove.
    }
    this.cache.delete(id);
    const now = this.clock();
    for (const [endedId, at] of this.ended) if (now - at >= CACHE_TTL_MS) this.ended.delete(endedId);
    this.ended.set(id, now);
    // Before the row goes: the ended set already refuses the session on this server.
    this.changes.notify();
    await this.options.store.db.deleteFrom("console_sessions").where("id", "=", id).execute();
    if (principal !== null) await this.options.audit.record({ actor: `admin:${principal.name}`, action: "console.logout", target: principal.name, detail: {} });
  }
}
