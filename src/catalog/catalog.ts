// The catalog: which models exist, under which names and aliases, with their profiles,
// scaling, prices and origin. It owns the `models`, `model_aliases` and `audit_log`
// tables and records who changed what. Readers on the hot path (the gateway) use the
// in-memory snapshot, rebuilt after every change made here and on `refresh()`, so
// resolving a model name never touches the database. Nothing is stored that cannot run:
// a new or changed definition passes the schema's bounds, the check of its engine_args
// (engines/engine-args-check.ts) and the weights check (weights-check.ts) before it is written.
// External servers' keys are stored sealed and opened only for the upstream calls (sealed-keys.ts).
import { randomUUID } from "node:crypto";
import { sql } from "kysely";
import { ConflictError, NotFoundError } from "../core/errors.ts";
import type { SecretBox } from "../core/secret-box.ts";
import { recordAudit as audit } from "../store/audit.ts";
import { isUniqueViolation, nowIso, type Store, type Tx } from "../store/store.ts";
import { assertEngineArgs } from "../engines/engine-args-check.ts";
import { assertGuardReferences } from "./guard-references.ts";
import type { KeyGuardReference } from "../policy/key-guards.ts";
import {
  adapterServedName,
  applyModelPatch,
  assertAdapterNames,
  modelDefinitionSchema,
  parseNewModel,
  type AdapterDefinition,
  type ModelDefinition,
  type Profile,
} from "./model-schema.ts";
import { apiKeySealedElsewhere, openApiKey, sealApiKeys, sealPlainApiKeys } from "./sealed-keys.ts";
import type { WeightsChecker } from "./weights-check.ts";

export interface CatalogModel {
  id: string;
  name: string;
  definition: ModelDefinition;
  created_by: string;
  created_at: string;
  updated_by: string;
  updated_at: string;
}

export type CatalogListener = (models: readonly CatalogModel[]) => void;

export interface CatalogOptions {
  store: Store;
  /**
   * Seals external servers' keys in the store: the server's box (the data dir's key, or on
   * PostgreSQL the cluster secret's, which every server sharing the database has).
   */
  box: SecretBox;
  /** Refuses a model whose weights cannot run (the server's: DiskWeightsChecker with its mirror). */
  weights: WeightsChecker;
  /** The guards active API keys name (the key service's), so a guard is not removed from under a key. */
  keyGuards?: () => Promise<readonly KeyGuardReference[]>;
  clock?: () => number;
}

export class Catalog {
  private readonly store: Store;
  private readonly box: SecretBox;
  private readonly weights: WeightsChecker;
  private readonly keyGuards: () => Promise<readonly KeyGuardReference[]>;
  private readonly clock: () => number;
  private models: readonly CatalogModel[] = [];
  private byName = new Map<string, CatalogModel>();
  /** Adapters' served names: the model they run on, and which adapter. */
  private adapterByName = new Map<string, { model: CatalogModel; adapter: AdapterDefinition; index: number }>();
  private readonly listeners = new Set<CatalogListener>();
  /** Stored models this version could not read, with why (shown by the admin API). */
  private unreadable: string[] = [];

  constructor(options: CatalogOptions) {
    this.store = options.store;
    this.box = options.box;
    this.weights = options.weights;
    this.keyGuards = options.keyGuards ?? (async () => []);
    this.clock = options.clock ?? Date.now;
  }

  /** Reloads the snapshot from the store (after start, and to see other servers' changes). */
  async refresh(): Promise<void> {
    const read = () => this.store.db.selectFrom("models").selectAll().orderBy("name").execute();
    let rows = await read();
    if (await this.sealPlainKeys(rows)) rows = await read();
    const models: CatalogModel[] = [];
    const unreadable: string[] = [];
    for (const row of rows) {
      // One row this version cannot read (written by a newer llmgw sharing the database, or
      // edited by hand) must not take the whole catalog down: skip it and say so.
      const parsed = modelDefinitionSchema.safeParse(safeJson(row.definition));
      if (!parsed.success) {
        unreadable.push(`${row.name}: ${parsed.error.issues[0]?.path.join(".") || "definition"} ${parsed.error.issues[0]?.message ?? "is invalid"}`);
        continue;
      }
      // A plain key written after the sealing above (by an older llmgw beside this one) is
      // sealed here in memory, so the snapshot never holds one; the next refresh seals the row.
      models.push({ ...row, definition: sealApiKeys(parsed.data, this.box) });
      for (const profile of parsed.data.profiles.filter((p) => apiKeySealedElsewhere(p, this.box))) {
        unreadable.push(
          `${row.name}: profile '${profile.name}' has an api_key sealed with another secret than this server's (a replaced server.secret, or a cluster secret given later); send the profile again with its api_key ('llmgw ctl model edit ${row.name} --patch' with the profiles), or give this server the secret it was sealed with`,
        );
      }
    }
    this.unreadable = unreadable;
    const byName = new Map<string, CatalogModel>();
    const adapterByName = new Map<string, { model: CatalogModel; adapter: AdapterDefinition; index: number }>();
    for (const model of models) {
      byName.set(model.name, model);
      for (const alias of model.definition.aliases) byName.set(alias, model);
      model.definition.adapters.forEach((adapter, index) => {
        const served = adapterServedName(model.name, adapter);
        byName.set(served, model);
        adapterByName.set(served, { model, adapter, index });
      });
    }
    this.adapterByName = adapterByName;
    const changed = JSON.stringify(models) !== JSON.stringify(this.models);
    this.models = models;
    this.byName = byName;
    if (changed) for (const listener of this.listeners) listener(models);
  }

  /** Calls `listener` with the whole catalog after every change; returns the unsubscribe. */
  onChange(listener: CatalogListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * The key an external profile's requests carry, opened from its sealed form: for the
   * replica that calls the upstream server only. Null when the profile has none, or when it
   * was sealed with another secret (unreadableModels says so).
   */
  apiKeyOf(profile: Profile): string | null {
    return openApiKey(profile, this.box);
  }

  list(): readonly CatalogModel[] {
    return this.models;
  }

  /** The model a name, alias or adapter's served name stands for, from the snapshot. */
  resolve(nameOrAlias: string): CatalogModel | undefined {
    return this.byName.get(nameOrAlias);
  }

  /** The adapter a served name stands for (its position is the id engines know it by), or undefined for any other name. */
  adapterOf(servedName: string): { model: CatalogModel; adapter: AdapterDefinition; index: number } | undefined {
    return this.adapterByName.get(servedName);
  }

  get(name: string): CatalogModel {
    const model = this.byName.get(name);
    if (model === undefined) throw modelNotFound(name);
    return model;
  }

  /** Models stored in the database that this version could not read (or whose key this server cannot open), with the reason. */
  unreadableModels(): readonly string[] {
    return this.unreadable;
  }

  /**
   * The model a change is about, by its own name only. Changing or deleting through an
   * alias would touch a model the caller may not have meant (and record a false rename).
   */
  private getForChange(name: string): CatalogModel {
    const model = this.byName.get(name);
    if (model !== undefined && model.name !== name) {
      const what = this.adapterByName.has(name) ? "an adapter" : "an alias";
      throw new NotFoundError(`'${name}' is ${what} of model '${model.name}'; change or delete the model by its name.`, {
        code: "model_is_alias",
        param: "name",
      });
    }
    return this.get(name);
  }

  async create(body: unknown, actor: string): Promise<CatalogModel> {
    const { name, ...parsed } = parseNewModel(body);
    const definition = sealApiKeys(parsed, this.box);
    assertEngineArgs(definition.profiles);
    assertAdapterNames(name, definition);
    assertGuardReferences([...this.models, { name, definition }], { name, previousNames: [] });
    await this.weights.check({ name, definition });
    const now = nowIso(this.clock);
    const id = randomUUID();
    await this.write(async (trx) => {
      await assertNamesFree(trx, [name, ...otherNames(name, definition)], null);
      await trx
        .insertInto("models")
        .values({ id, name, definition: JSON.stringify(definition), created_by: actor, created_at: now, updated_by: actor, updated_at: now })
        .execute();
      await insertAliases(trx, id, otherNames(name, definition));
      await audit(trx, { at: now, actor, action: "model.create", target: name, detail: describeDefinition(definition) });
    }, name);
    return this.get(name);
  }

  async update(name: string, patch: unknown, actor: string): Promise<CatalogModel> {
    const current = this.getForChange(name);
    const { name: newName, definition: patched } = applyModelPatch(current.definition, patch);
    const definition = sealApiKeys(patched, this.box, current.definition.profiles);
    const finalName = newName ?? current.name;
    assertAdapterNames(finalName, definition);
    // Like the weights below, engine_args are checked when the profiles change: a model
    // stored before this check must still take other changes (scaling.min 0, a description).
    const profilesChanged = JSON.stringify(definition.profiles) !== JSON.stringify(current.definition.profiles);
    if (profilesChanged) assertEngineArgs(definition.profiles);
    assertGuardReferences(
      [...this.models.filter((model) => model.id !== current.id), { name: finalName, definition }],
      { name: finalName, previousNames: [current.name, ...current.definition.aliases] },
      await this.keysNamingGuards(current),
    );
    // Only a change to where the weights are or what loads them is checked against the
    // disk: a model whose file went bad must still take other changes (scaling.min 0 to
    // stop it, a description); its replicas park with the reason meanwhile.
    if (
      JSON.stringify(definition.source) !== JSON.stringify(current.definition.source) ||
      JSON.stringify(definition.adapters) !== JSON.stringify(current.definition.adapters) ||
      profilesChanged
    ) {
      await this.weights.check({ name: finalName, definition });
    }
    const now = nowIso(this.clock);
    await this.write(async (trx) => {
      await assertNamesFree(trx, [finalName, ...otherNames(finalName, definition)], current.id);
      await trx
        .updateTable("models")
        .set({ name: finalName, definition: JSON.stringify(definition), updated_by: actor, updated_at: now })
        .where("id", "=", current.id)
        .execute();
      await trx.deleteFrom("model_aliases").where("model_id", "=", current.id).execute();
      await insertAliases(trx, current.id, otherNames(finalName, definition));
      await audit(trx, {
        at: now,
        actor,
        action: "model.update",
        target: finalName,
        detail: { ...(finalName === name ? {} : { renamed_from: name }), changed: changedFields(current.definition, definition) },
      });
    }, finalName);
    return this.get(finalName);
  }

  async delete(name: string, actor: string): Promise<void> {
    const current = this.getForChange(name);
    assertGuardReferences(
      this.models.filter((model) => model.id !== current.id),
      { name: null, previousNames: [current.name, ...current.definition.aliases] },
      await this.keysNamingGuards(current),
    );
    await this.write(async (trx) => {
      await trx.deleteFrom("model_aliases").where("model_id", "=", current.id).execute();
      await trx.deleteFrom("models").where("id", "=", current.id).execute();
      await audit(trx, { at: nowIso(this.clock), actor, action: "model.delete", target: current.name, detail: {} });
    }, name);
  }

  /**
   * Seals the plain api_keys of rows an older llmgw wrote (or one still running beside this
   * one on PostgreSQL); true when it changed any. The update names the row's old text, so
   * servers doing this at once seal each row once. On SQLite the old text is overwritten
   * with zeros (secure_delete) and the WAL emptied, so it does not stay in free pages.
   */
  private async sealPlainKeys(rows: readonly { id: string; name: string; definition: string }[]): Promise<boolean> {
    const plain = rows.flatMap((row) => {
      const sealed = sealPlainApiKeys(row.definition, this.box);
      return sealed === null ? [] : [{ row, sealed }];
    });
    if (plain.length === 0) return false;
    const sqlite = this.store.dialect === "sqlite";
    const secureDelete = sqlite ? ((await sql<{ secure_delete: number }>`pragma secure_delete`.execute(this.store.db)).rows[0]?.secure_delete ?? 0) : 0;
    if (sqlite) await sql`pragma secure_delete = on`.execute(this.store.db);
    try {
      await this.store.db.transaction().execute(async (trx) => {
        for (const { row, sealed } of plain) {
          const result = await trx
            .updateTable("models")
            .set({ definition: sealed.json })
            .where("id", "=", row.id)
            .where("definition", "=", row.definition)
            .executeTakeFirst();
          if (Number(result.numUpdatedRows) === 0) continue;
          await audit(trx, { at: nowIso(this.clock), actor: "llmgw", action: "model.seal_keys", target: row.name, detail: { profiles: sealed.profiles } });
        }
      });
    } finally {
      if (sqlite) await sql`pragma secure_delete = ${sql.raw(String(Number(secureDelete)))}`.execute(this.store.db);
    }
    if (sqlite) await sql`pragma wal_checkpoint(truncate)`.execute(this.store.db);
    return true;
  }

  /** The keys that name guards, asked only when the model changed is a guard (no query otherwise). */
  private async keysNamingGuards(model: CatalogModel): Promise<readonly KeyGuardReference[]> {
    return model.definition.role === "guard" ? this.keyGuards() : [];
  }

  private async write(body: (trx: Tx) => Promise<void>, name: string): Promise<void> {
    try {
      await this.store.db.transaction().execute(body);
    } catch (error) {
      // Another writer may have taken the name between our check and the insert.
      if (isUniqueViolation(error))
        throw new ConflictError(`The name or an alias of model '${name}' is already in use; choose another.`, { code: "model_exists", cause: error });
      throw error;
    }
    await this.refresh();
  }
}

export function modelNotFound(name: string): NotFoundError {
  return new NotFoundError(`The model '${name}' does not exist. List the models with GET /v1/models (or 'llmgw ctl model list').`, {
    code: "model_not_found",
    param: "model",
  });
}

/** Refuses names or aliases that another model already uses as a name or an alias. */
async function assertNamesFree(trx: Tx, names: string[], ownId: string | null): Promise<void> {
  if (names.length === 0) return;
  const asNames = await trx.selectFrom("models").select(["id", "name"]).where("name", "in", names).execute();
  const asAliases = await trx.selectFrom("model_aliases").select(["model_id as id", "alias as name"]).where("alias", "in", names).execute();
  const taken = [...asNames, ...asAliases].find((row) => row.id !== ownId);
  if (taken !== undefined) {
    throw new ConflictError(`The name '${taken.name}' is already used by another model (as its name or an alias); choose another or change that model first.`, {
      code: "model_exists",
      param: "name",
    });
  }
}

/**
 * The names a model answers to besides its own: aliases, and its adapters' served names. All
 * are reserved in model_aliases, whose unique key keeps them apart across models and servers.
 */
function otherNames(name: string, definition: ModelDefinition): string[] {
  return [...definition.aliases, ...definition.adapters.map((adapter) => adapterServedName(name, adapter))];
}

async function insertAliases(trx: Tx, modelId: string, aliases: string[]): Promise<void> {
  if (aliases.length > 0)
    await trx
      .insertInto("model_aliases")
      .values(aliases.map((alias) => ({ alias, model_id: modelId })))
      .execute();
}

/** What an audit line says about a new model: its shape, never a profile's key. */
function describeDefinition(definition: ModelDefinition): Record<string, unknown> {
  return { profiles: definition.profiles.map((p) => `${p.name}:${p.engine}`), aliases: definition.aliases, scaling: definition.scaling };
}

function changedFields(before: ModelDefinition, after: ModelDefinition): string[] {
  const keys = new Set([...Object.keys(before), ...Object.keys(after)]) as Set<keyof ModelDefinition>;
  return [...keys].filter((key) => JSON.stringify(before[key]) !== JSON.stringify(after[key])).sort();
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
