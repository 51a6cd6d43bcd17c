// API keys: admin keys (the admin API and every model) and client keys (the /v1 API,
// optionally limited to some models and an expiry, with budgets and rate limits
// (policy/key-limits.ts) and guard models of their own (policy/key-guards.ts)). Only a sha256 of each key is stored;
// the key itself is shown once, at creation. Verification sits on the request hot path,
// so verified keys are cached for a few seconds; a revocation made through this service
// clears the cache at once, and one made by another server as soon as its change reaches
// this one (forgetCached, within a second on PostgreSQL), at the latest within the TTL.
//
// The cache is also what keeps the gateway answering while the database cannot be reached
// (key-grace.ts): a key read from the database within the grace (--key-grace, default 10
// minutes) is served from memory while re-reading it fails with a storage fault, and
// re-checked in the background about once a second until the database answers again. A
// key not read within the grace, or never seen, gets 503 storage_unavailable at once.
// Two things make an entry unfit for the grace: another server's notified change to keys
// that no read has confirmed since (it may be a revocation: the key gets 503 until its row
// is read again), and no request for longer than the grace (the entry leaves the cache,
// and is not re-checked meanwhile, so a key unused since keeps no grace).
import { hash, randomBytes, randomUUID } from "node:crypto";
import { sql } from "kysely";
import { z } from "zod";
import { AuthenticationError, BadRequestError, ConflictError, NotFoundError, PermissionDeniedError, parseWith } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { ChangeSignal } from "../core/change-signal.ts";
import { recordAudit } from "../store/audit.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";
import { DEFAULT_KEY_GRACE_MS, KeyOutage } from "./key-grace.ts";
import { nowIso, type Store, type Tx } from "../store/store.ts";
import { MODEL_NAME_PATTERN } from "../catalog/model-schema.ts";
import {
  keyLimitFields,
  keyLimitsPatchFields,
  limitColumns,
  limitsOfRow,
  limitsView,
  type KeyLimitColumns,
  type KeyLimits,
  type KeyLimitsView,
} from "../policy/key-limits.ts";
import {
  guardsColumn,
  guardsOfColumn,
  keyGuardsField,
  keyGuardsPatchField,
  mergeKeyGuards,
  type KeyGuardChecker,
  type KeyGuardReference,
  type KeyGuards,
} from "../policy/key-guards.ts";

export type KeyRole = "admin" | "client";

export interface ApiKeyInfo extends KeyLimitsView {
  id: string;
  name: string;
  prefix: string;
  role: KeyRole;
  allowed_models: string[] | null;
  expires_at: string | null;
  revoked_at: string | null;
  created_at: string;
  created_by: string;
  last_used_at: string | null;
  /** Guard models every request with the key is checked by, besides its model's own; null: none. */
  guards: KeyGuards | null;
}

/** Who is calling, as the rest of the server sees it after authentication. */
export interface Principal {
  keyId: string;
  name: string;
  role: KeyRole;
  /** null: every model. */
  allowedModels: ReadonlySet<string> | null;
  expiresAt: number | null;
  /** Budget and rate limits; absent for a key without any (admission then costs no query). */
  limits?: KeyLimits;
  /** Guard models the key names (GuardModels adds them to the model's own); absent for a key without any. */
  guards?: KeyGuards;
}

export const newKeySchema = z.strictObject({
  name: z.string().min(1).max(100),
  role: z.enum(["admin", "client"]).default("client"),
  allowed_models: z.array(z.string().regex(MODEL_NAME_PATTERN, "must be a model name")).min(1).nullable().default(null),
  expires_at: z.iso.datetime({ offset: true, error: "must be an ISO-8601 date-time such as 2027-01-31T00:00:00Z" }).nullable().default(null),
  ...keyLimitFields,
  guards: keyGuardsField,
});

/** PATCH /api/v1/keys/:ref: limits and guards to change; null removes one. */
const keyPatchSchema = z
  .strictObject({ ...keyLimitsPatchFields, guards: keyGuardsPatchField })
  .refine((patch) => Object.keys(patch).length > 0, "give at least one of rpm, tpm, budget_usd, budget_period, model_limits, guards");

const KEY_PREFIX = "llmgw-";
const KEY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const KEY_BODY_LENGTH = 40;
const SHOWN_PREFIX_LENGTH = KEY_PREFIX.length + 6;
const CACHE_TTL_MS = 5000;
const LAST_USED_RESOLUTION_MS = 60_000;
const UNKNOWN_TTL_MS = 2000;
const UNKNOWN_MAX = 10_000;
/** How often verification also drops cache entries unused for longer than the grace (an O(n) pass). */
const EVICT_INTERVAL_MS = 60_000;
/** Any number, the same in every llmgw: the PostgreSQL advisory lock admin-key revocations hold. */
const ADMIN_KEYS_LOCK_KEY = 0x6c6b6579;

function invalidKey(): AuthenticationError {
  return new AuthenticationError("The API key is not valid. Check that it was copied whole, or create a new one.");
}

export interface KeyServiceOptions {
  store: Store;
  /**
   * Refuses guard names that are not guard models (the server's checks the catalog). Without
   * one, names are only checked for their shape, and a request naming a missing guard is
   * refused (fail closed) when it runs.
   */
  guardChecker?: KeyGuardChecker;
  clock?: () => number;
  /**
   * How long after its last database read a key is still served from memory while the
   * database cannot be reached (default 10 minutes; 0: never).
   */
  keyGraceMs?: number;
  /** Told when an outage of the database starts and ends (once each, never per request). */
  logger?: Logger;
}

/** A verified key as cached: what it grants, when the database last said so, and whether that may be stale. */
interface CachedKey {
  principal: Principal;
  /** When its row was last read (the service's clock): the TTL and the grace count from here. */
  checkedAt: number;
  /** Keys may have changed since (a change notified, a resync): read the row again before trusting this (except on a storage fault). */
  stale: boolean;
  /** Another server's change to keys was notified since the row was read: it may be this key's revocation, so no grace until it is read again. */
  doubted: boolean;
  /** When a request last presented it: entries unused for longer than the grace are dropped, not re-checked. */
  usedAt: number;
}

/** Why cached keys are read again: another server's notified change (strict), or the feed's periodic resync. */
export type KeysChange = "notified" | "resync";

export class KeyService {
  private readonly store: Store;
  private readonly clock: () => number;
  private readonly cache = new Map<string, CachedKey>();
  /**
   * Hashes of keys found unknown, briefly, so a client retrying a bad key does not cost a
   * database query each time. Bounded: a flood of random keys only refills it.
   */
  private readonly unknown = new Map<string, number>();
  /** Bumped by every revocation: a lookup that started before one must not refill the cache. */
  private generation = 0;
  /** Raised by a revocation here or a change elsewhere (forgetCached): open event streams check their key again at once. */
  readonly changes = new ChangeSignal();
  private readonly lastUsedWritten = new Map<string, number>();
  private readonly guardChecker: KeyGuardChecker;
  private readonly keyGraceMs: number;
  /** Whether the database is known to be failing now, and the background re-checks while it is. */
  private readonly outage: KeyOutage;
  private lastEvictionAt: number;

  constructor(options: KeyServiceOptions) {
    this.store = options.store;
    this.guardChecker = options.guardChecker ?? (() => undefined);
    this.clock = options.clock ?? Date.now;
    this.keyGraceMs = options.keyGraceMs ?? DEFAULT_KEY_GRACE_MS;
    this.outage = new KeyOutage({
      keyGraceMs: this.keyGraceMs,
      ...(options.logger === undefined ? {} : { logger: options.logger }),
      recheck: (hashes) => this.recheck(hashes),
    });
    this.lastEvictionAt = this.clock();
  }

  /** Creates a key and returns it in clear text: the only time it exists outside the caller. */
  async create(body: unknown, actor: string): Promise<{ key: string; info: ApiKeyInfo }> {
    const request = parseWith(newKeySchema, body, "key");
    if (request.expires_at !== null && Date.parse(request.expires_at) <= this.clock()) {
      throw new BadRequestError(`Invalid key: field 'expires_at': ${request.expires_at} is in the past.`, { param: "expires_at", code: "invalid_field" });
    }
    if (request.guards !== null) this.guardChecker(request.guards);
    const key = generateKey();
    const now = nowIso(this.clock);
    const row = {
      id: randomUUID(),
      name: request.name,
      prefix: key.slice(0, SHOWN_PREFIX_LENGTH),
      hash: hashKey(key),
      role: request.role,
      allowed_models: request.allowed_models === null ? null : JSON.stringify(request.allowed_models),
      expires_at: request.expires_at === null ? null : new Date(request.expires_at).toISOString(),
      revoked_at: null,
      created_at: now,
      created_by: actor,
      last_used_at: null,
      ...limitColumns(request),
      guards: guardsColumn(request.guards),
    };
    this.unknown.clear();
    await this.store.db.transaction().execute(async (trx) => {
      await trx.insertInto("api_keys").values(row).execute();
      await recordAudit(trx, {
        at: now,
        actor,
        action: "key.create",
        target: row.prefix,
        detail: {
          id: row.id,
          name: row.name,
          role: row.role,
          allowed_models: request.allowed_models,
          expires_at: row.expires_at,
          ...limitsView(row),
          guards: guardsOfColumn(row.guards),
        },
      });
    });
    return { key, info: toInfo(row) };
  }

  async list(): Promise<ApiKeyInfo[]> {
    const rows = await this.store.db.selectFrom("api_keys").selectAll().orderBy("created_at").execute();
    return rows.map(toInfo);
  }

  /**
   * Revokes by id, shown prefix or name (a name must be unambiguous). The last active
   * admin key cannot be revoked: nobody could use the admin API afterwards. The check and
   * the revocation are one transaction, so two admins revoking the last two admin keys at
   * once leave one of them.
   */
  async revoke(reference: string, actor: string): Promise<ApiKeyInfo> {
    const row = await this.find(reference, "revoke");
    const now = nowIso(this.clock);
    if (row.revoked_at === null) {
      await this.store.db.transaction().execute(async (trx) => {
        // PostgreSQL: revocations wait for each other, so each counts the others' result.
        // SQLite needs nothing: it runs one write transaction at a time, and the update
        // below is this one's first statement.
        if (this.store.dialect === "postgres") await sql`select pg_advisory_xact_lock(${ADMIN_KEYS_LOCK_KEY})`.execute(trx);
        const revoked = await trx.updateTable("api_keys").set({ revoked_at: now }).where("id", "=", row.id).where("revoked_at", "is", null).executeTakeFirst();
        if (Number(revoked.numUpdatedRows) === 0) return; // Someone else revoked it meanwhile.
        if (row.role === "admin" && (await countActiveAdminKeys(trx, now)) === 0) {
          throw new ConflictError(
            `The key '${row.name}' (${row.prefix}…) is the last active admin key: without it nobody could use the admin API. Create another admin key first ('llmgw ctl key create --name NAME --admin'), then revoke this one.`,
            { code: "last_admin_key" },
          );
        }
        await recordAudit(trx, { at: now, actor, action: "key.revoke", target: row.prefix, detail: { id: row.id, name: row.name, role: row.role } });
      });
    }
    // Only this key's entry goes: the others stay, so the grace still covers them if the database goes away next.
    this.generation += 1;
    this.cache.delete(row.hash);
    this.changes.notify();
    return toInfo({ ...row, revoked_at: row.revoked_at ?? now });
  }

  /**
   * Another server changed keys (src/cluster/change-feed.ts: "notified"), or the feed
   * resynced (periodically, or after reconnecting: "resync"): what is cached here may be
   * stale, a revoked key above all, so the next request of each key reads its row again,
   * and every key used within the grace is re-read in the background at once. The entries
   * stay, marked stale. After a resync the grace still serves them while the database
   * cannot be reached; after a notified change it does not until a read confirms them,
   * since the change may be their revocation (so a revocation seen holds even if the
   * database goes away before the re-check).
   */
  forgetCached(change: KeysChange = "notified"): void {
    this.generation += 1;
    const now = this.clock();
    this.evictUnused(now);
    const recheck: string[] = [];
    for (const [hash, entry] of this.cache) {
      entry.stale = true;
      if (change === "notified") entry.doubted = true;
      if (now - entry.usedAt < this.keyGraceMs) recheck.push(hash);
    }
    this.unknown.clear();
    this.outage.recheckSoon(recheck);
    this.changes.notify();
  }

  /** Drops the entries no request used for longer than the grace (and the cache's TTL): the grace no longer covers them. */
  private evictUnused(now: number): void {
    this.lastEvictionAt = now;
    const keepMs = this.keepUnusedMs();
    for (const [hash, entry] of this.cache) if (now - entry.usedAt >= keepMs) this.cache.delete(hash);
  }

  /** How long an entry no request uses is kept: the grace, or the TTL when that is longer. */
  private keepUnusedMs(): number {
    return Math.max(this.keyGraceMs, CACHE_TTL_MS);
  }

  /** Cached keys: for tests that check unused ones leave. */
  cachedKeys(): number {
    return this.cache.size;
  }

  /** One key by id, shown prefix or name (a name must be unambiguous). */
  async get(reference: string): Promise<ApiKeyInfo> {
    return toInfo(await this.find(reference, "show"));
  }

  /**
   * Changes a key's budget, rate limits and guards (null removes one; a guards side given
   * replaces that side). Applies to the key's next request on this server (the cache is
   * cleared) and within the cache's 5 s on others. Spending so far stays: a raised budget
   * admits more in the same period.
   */
  async update(reference: string, body: unknown, actor: string): Promise<ApiKeyInfo> {
    const { guards: guardsPatch, ...limitsPatch } = parseWith(keyPatchSchema, body, "key update");
    // Only the names sent are checked: a guard named before and removed since does not block other changes.
    if (guardsPatch !== undefined && guardsPatch !== null) this.guardChecker(guardsPatch);
    const row = await this.find(reference, "update");
    // Only the columns the patch names are written, so two PATCHes of different fields at
    // once both take effect (a read-merge-write of all of them would lose one). A guards
    // side given replaces that side, merged with the other side as stored.
    const allLimits = limitColumns({ ...limitsView(row), ...limitsPatch });
    const columns: Record<string, unknown> = Object.fromEntries(Object.keys(limitsPatch).map((field) => [field, allLimits[field as keyof KeyLimitColumns]]));
    if (guardsPatch !== undefined) columns.guards = guardsColumn(mergeKeyGuards(guardsOfColumn(row.guards), guardsPatch));
    const patch = { ...limitsPatch, ...(guardsPatch === undefined ? {} : { guards: guardsOfColumn(columns.guards as string | null) }) };
    const now = nowIso(this.clock);
    const updated = await this.store.db.transaction().execute(async (trx) => {
      await trx.updateTable("api_keys").set(columns).where("id", "=", row.id).execute();
      await recordAudit(trx, { at: now, actor, action: "key.update", target: row.prefix, detail: { id: row.id, name: row.name, ...patch } });
      return trx.selectFrom("api_keys").selectAll().where("id", "=", row.id).executeTakeFirstOrThrow();
    });
    // A cached entry is replaced by the row just written (a cleared one would drop out of
    // the grace); a key not cached here gets none: an update is not a use.
    this.generation += 1;
    const usedAt = this.cache.get(updated.hash)?.usedAt;
    if (usedAt !== undefined) this.cache.set(updated.hash, { principal: principalOf(updated), checkedAt: this.clock(), stale: false, doubted: false, usedAt });
    return toInfo(updated);
  }

  private async find(reference: string, verb: string) {
    const rows = await this.store.db
      .selectFrom("api_keys")
      .selectAll()
      .where((eb) => eb.or([eb("id", "=", reference), eb("prefix", "=", reference), eb("name", "=", reference)]))
      .execute();
    if (rows.length === 0)
      throw new NotFoundError(`No API key matches '${reference}'. List keys with 'llmgw ctl key list' and use the id or prefix.`, { code: "key_not_found" });
    if (rows.length > 1) throw new ConflictError(`${rows.length} keys match '${reference}'; ${verb} by id or prefix instead.`, { code: "ambiguous_key" });
    return rows[0]!;
  }

  /**
   * Checks a presented key; throws a 401 when it is unknown, revoked or expired. The
   * lookup is by hash, so the comparison leaks nothing about stored keys.
   */
  verify(presented: string | undefined): Promise<Principal> {
    if (presented === undefined || presented === "") {
      return Promise.reject(new AuthenticationError("No API key given. Send it as 'Authorization: Bearer <key>'.", { code: "missing_api_key" }));
    }
    // Not async itself: the request hot path pays for one promise, not two.
    return this.verifyHash(hashKey(presented));
  }

  /**
   * verify() for a key known by its hash: a console session keeps the hash of the key that
   * logged in (never the key), so the session ends when that key is revoked or expires.
   */
  async verifyHash(hash: string): Promise<Principal> {
    const now = this.clock();
    if (now - this.lastEvictionAt >= EVICT_INTERVAL_MS) this.evictUnused(now);
    let cached = this.cache.get(hash);
    if (cached !== undefined && now - cached.usedAt >= this.keepUnusedMs()) {
      // Unused for longer than the grace: as if never seen (the periodic pass may not have come by yet).
      this.cache.delete(hash);
      cached = undefined;
    }
    if (cached !== undefined) cached.usedAt = now;
    let principal: Principal;
    if (cached !== undefined && !cached.stale && now - cached.checkedAt < CACHE_TTL_MS) {
      principal = cached.principal;
    } else if (cached !== undefined && this.withinGrace(cached, now) && (this.outage.active() || this.store.health.fault() !== null)) {
      // The database is failing (or was, last it was used): no request waits on it. The
      // key is re-read in the background; its answer applies to the next request.
      principal = cached.principal;
      this.outage.recheckSoon([hash]);
    } else {
      // Nothing in memory may stand in: ask the store, even while key reads were failing
      // lately. A database known down answers at once (the store's outage gate), and one
      // that is back answers now rather than after the next background re-check.
      const unknownAt = this.unknown.get(hash);
      if (unknownAt !== undefined && now - unknownAt < UNKNOWN_TTL_MS) throw invalidKey();
      try {
        principal = await this.lookup(hash, now);
      } catch (error) {
        if (!(error instanceof StorageUnavailableError)) throw error;
        this.outage.failed(error);
        const still = this.cache.get(hash);
        if (still === undefined || !this.withinGrace(still, now)) throw error;
        principal = still.principal;
      }
    }
    if (principal.expiresAt !== null && principal.expiresAt <= now) {
      throw new AuthenticationError(
        `The API key '${principal.name}' expired at ${new Date(principal.expiresAt).toISOString()}. Ask an administrator for a new key.`,
        { code: "expired_api_key" },
      );
    }
    this.noteUse(principal.keyId, now);
    return principal;
  }

  /** Reads a key's row and caches what it grants; throws a 401 for an unknown or revoked key. */
  private async lookup(hash: string, now: number): Promise<Principal> {
    const generation = this.generation;
    const row = await this.store.db.selectFrom("api_keys").selectAll().where("hash", "=", hash).executeTakeFirst();
    this.outage.answered();
    if (row === undefined) {
      this.cache.delete(hash);
      if (this.unknown.size >= UNKNOWN_MAX) this.unknown.clear();
      this.unknown.set(hash, now);
      throw invalidKey();
    }
    if (row.revoked_at !== null) {
      this.cache.delete(hash);
      throw new AuthenticationError(`The API key ${row.prefix}… was revoked at ${row.revoked_at}. Ask an administrator for a new key.`, {
        code: "revoked_api_key",
      });
    }
    const principal = principalOf(row);
    if (generation === this.generation) this.cache.set(hash, { principal, checkedAt: now, stale: false, doubted: false, usedAt: now });
    return principal;
  }

  /**
   * The background re-check (key-grace.ts): reads the rows of cached keys again, in one
   * query; a key revoked or gone meanwhile leaves the cache. Throws what the store threw.
   */
  private async recheck(hashes: readonly string[]): Promise<void> {
    const generation = this.generation;
    const rows = await this.store.db.selectFrom("api_keys").selectAll().where("hash", "in", hashes).execute();
    // A revocation or another server's change that happened meanwhile wins: the rows read may predate it.
    if (generation !== this.generation) return;
    const now = this.clock();
    const found = new Map(rows.map((row) => [row.hash, row]));
    for (const hash of hashes) {
      const row = found.get(hash);
      const entry = this.cache.get(hash);
      if (row === undefined || row.revoked_at !== null) this.cache.delete(hash);
      else if (entry !== undefined) this.cache.set(hash, { principal: principalOf(row), checkedAt: now, stale: false, doubted: false, usedAt: entry.usedAt });
    }
  }

  /** Whether cached keys wait to be read again in the background (forgetCached, an outage): for tests that wait on it. */
  rechecksPending(): boolean {
    return this.outage.pending();
  }

  /**
   * Whether a cached key may still be served while the database cannot confirm it: read
   * within the grace, and no change notified since that may be its revocation.
   */
  private withinGrace(entry: CachedKey, now: number): boolean {
    return !entry.doubted && now - entry.checkedAt < this.keyGraceMs;
  }

  /** verify(), then require the admin role. */
  async verifyAdmin(presented: string | undefined): Promise<Principal> {
    return requireAdmin(await this.verify(presented));
  }

  /** verifyHash(), then require the admin role. */
  async verifyAdminHash(hash: string): Promise<Principal> {
    return requireAdmin(await this.verifyHash(hash));
  }

  /** Active (not revoked, not expired) keys that name guards: what the catalog keeps guards for. */
  async guardReferences(): Promise<KeyGuardReference[]> {
    const now = nowIso(this.clock);
    const rows = await this.store.db
      .selectFrom("api_keys")
      .select(["name", "guards"])
      .where("guards", "is not", null)
      .where("revoked_at", "is", null)
      .where((eb) => eb.or([eb("expires_at", "is", null), eb("expires_at", ">", now)]))
      .orderBy("name")
      .execute();
    return rows.map((row) => ({ name: row.name, guards: guardsOfColumn(row.guards)! }));
  }

  async hasActiveAdminKey(): Promise<boolean> {
    const row = await this.store.db.selectFrom("api_keys").select("id").where("role", "=", "admin").where("revoked_at", "is", null).executeTakeFirst();
    return row !== undefined;
  }

  /** Records last use at most once a minute per key, off the request path. */
  private noteUse(keyId: string, now: number): void {
    const last = this.lastUsedWritten.get(keyId) ?? 0;
    if (now - last < LAST_USED_RESOLUTION_MS) return;
    this.lastUsedWritten.set(keyId, now);
    this.store.db
      .updateTable("api_keys")
      .set({ last_used_at: nowIso(() => now) })
      .where("id", "=", keyId)
      .execute()
      .catch(() => {
        // Losing one last-used stamp is harmless, and the next try waits its minute like
        // any other: on a full disk, retrying on every request would only add a failing
        // write to each one.
      });
  }
}

/** Admin keys that work now: not revoked, not expired. */
async function countActiveAdminKeys(trx: Tx, now: string): Promise<number> {
  const { count } = await trx
    .selectFrom("api_keys")
    .select((eb) => eb.fn.countAll<number>().as("count"))
    .where("role", "=", "admin")
    .where("revoked_at", "is", null)
    .where((eb) => eb.or([eb("expires_at", "is", null), eb("expires_at", ">", now)]))
    .executeTakeFirstOrThrow();
  return Number(count);
}

/** What a key's row grants. */
function principalOf(
  row: { id: string; name: string; role: string; allowed_models: string | null; expires_at: string | null; guards: string | null } & KeyLimitColumns,
): Principal {
  const principal: Principal = {
    keyId: row.id,
    name: row.name,
    role: row.role as KeyRole,
    allowedModels: row.allowed_models === null ? null : new Set(JSON.parse(row.allowed_models) as string[]),
    expiresAt: row.expires_at === null ? null : Date.parse(row.expires_at),
  };
  const limits = limitsOfRow(row);
  if (limits !== undefined) principal.limits = limits;
  const guards = guardsOfColumn(row.guards);
  if (guards !== null) principal.guards = guards;
  return principal;
}

function requireAdmin(principal: Principal): Principal {
  if (principal.role !== "admin") {
    throw new PermissionDeniedError(`The key '${principal.name}' is a client key; the admin API needs an admin key.`, { code: "admin_required" });
  }
  return principal;
}

export function hashKey(key: string): string {
  // The one-shot hash avoids creating a Hash object on every request (Node 20.12+).
  return hash("sha256", key, "hex");
}

function generateKey(): string {
  // Rejection sampling keeps every character equally likely (62 does not divide 256).
  let body = "";
  while (body.length < KEY_BODY_LENGTH) {
    for (const byte of randomBytes(64)) {
      if (byte < 248 && body.length < KEY_BODY_LENGTH) body += KEY_ALPHABET[byte % 62];
    }
  }
  return KEY_PREFIX + body;
}

function toInfo(
  row: {
    id: string;
    name: string;
    prefix: string;
    role: string;
    allowed_models: string | null;
    expires_at: string | null;
    revoked_at: string | null;
    created_at: string;
    created_by: string;
    last_used_at: string | null;
    guards: string | null;
  } & KeyLimitColumns,
): ApiKeyInfo {
  return {
    id: row.id,
    name: row.name,
    prefix: row.prefix,
    role: row.role as KeyRole,
    allowed_models: row.allowed_models === null ? null : (JSON.parse(row.allowed_models) as string[]),
    expires_at: row.expires_at,
    revoked_at: row.revoked_at,
    created_at: row.created_at,
    created_by: row.created_by,
    last_used_at: row.last_used_at,
    ...limitsView(row),
    guards: guardsOfColumn(row.guards),
  };
}
