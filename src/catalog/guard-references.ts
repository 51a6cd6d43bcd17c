// The references from serving models and API keys to their guard models (`guards.input`
// and `guards.output` name models with role guard). The catalog stores nothing that breaks
// them: a model or a key may only name guards that exist and are guards, and a guard that
// a model or an active key names cannot be deleted, renamed away or turned into a serving
// model. A request whose guard is missing would otherwise be refused (fail closed) long
// after the change that caused it.
import { BadRequestError, ConflictError } from "../core/errors.ts";
import type { KeyGuardReference, KeyGuards } from "../policy/key-guards.ts";
import type { ModelDefinition } from "./model-schema.ts";

interface NamedDefinition {
  name: string;
  definition: ModelDefinition;
}

const LISTS = ["input", "output"] as const;

/**
 * Checks the catalog as it would be after a change (`after`: every model, the changed one
 * included or the deleted one left out). `changed` is the model the change is about: its
 * name after (null when deleted) and the names and aliases it had before (none when new).
 * Only references to or from that model are checked, so an old broken reference elsewhere
 * does not block unrelated changes.
 */
export function assertGuardReferences(
  after: readonly NamedDefinition[],
  changed: { name: string | null; previousNames: readonly string[] },
  keys: readonly KeyGuardReference[] = [],
): void {
  const byName = new Map<string, NamedDefinition>();
  for (const model of after) {
    byName.set(model.name, model);
    for (const alias of model.definition.aliases) byName.set(alias, model);
  }
  const own = after.find((model) => model.name === changed.name);
  if (own !== undefined) assertGuardsExist(own.definition.guards ?? {}, (name) => byName.get(name), "model");
  // Models and keys that named the changed model as a guard must still find a guard under that name.
  const orphans = (guards: Partial<KeyGuards> | undefined) =>
    LISTS.flatMap((list) => guards?.[list] ?? []).some(
      (guardName) => changed.previousNames.includes(guardName) && byName.get(guardName)?.definition.role !== "guard",
    );
  const orphanedModels = after.filter((model) => model.name !== changed.name && orphans(model.definition.guards)).map((model) => model.name);
  const orphanedKeys = keys.filter((key) => orphans(key.guards)).map((key) => key.name);
  const count = orphanedModels.length + orphanedKeys.length;
  if (count > 0) {
    const named = (noun: string, names: string[]) => `${noun}${names.length === 1 ? "" : "s"} ${names.map((name) => `'${name}'`).join(", ")}`;
    const users = [
      ...(orphanedModels.length > 0 ? [named("model", orphanedModels)] : []),
      ...(orphanedKeys.length > 0 ? [named("key", orphanedKeys)] : []),
    ].join(" and ");
    const where = orphanedKeys.length === 0 ? "PATCH guards" : "PATCH guards; for a key, PATCH /api/v1/keys/:ref or 'llmgw ctl key update'";
    throw new ConflictError(
      `Model '${changed.previousNames[0]}' is a guard of ${users}, and this change would leave ${count === 1 ? "it" : "them"} without it. Take it out of their guards first (${where}), or keep its name as an alias.`,
      { code: "guard_in_use" },
    );
  }
}

/**
 * Refuses guard lists (a model's or a key's `guards`) that name a model that does not
 * exist or is not a guard; the 400 names the field, e.g. `guards.input.0`.
 */
export function assertGuardsExist(guards: Partial<KeyGuards>, resolve: (nameOrAlias: string) => NamedDefinition | undefined, subject: "model" | "key"): void {
  for (const list of LISTS) {
    (guards[list] ?? []).forEach((guardName, index) => {
      const guard = resolve(guardName);
      const param = `guards.${list}.${index}`;
      const what = subject === "model" ? "Invalid model" : "Invalid key";
      if (guard === undefined) {
        throw new BadRequestError(
          `${what}: field '${param}': guard model '${guardName}' does not exist. Add it first (with role guard and a guard_format), or take it out of the list.`,
          {
            code: "invalid_field",
            param,
          },
        );
      }
      if (guard.definition.role !== "guard") {
        throw new BadRequestError(
          `${what}: field '${param}': '${guardName}' is not a guard model (its role is ${guard.definition.role}). Name a model with role guard.`,
          {
            code: "invalid_field",
            param,
          },
        );
      }
    });
  }
}
