// The references between serving models and their guard models (`guards.input` and
// `guards.output` name models with role guard). The catalog stores nothing that breaks
// them: a model may only name guards that exist and are guards, and a guard that another
// model names cannot be deleted, renamed away or turned into a serving model. A request
// whose guard is missing would otherwise be refused (fail closed) long after the change
// that caused it.
import { BadRequestError, ConflictError } from "../core/errors.ts";
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
export function assertGuardReferences(after: readonly NamedDefinition[], changed: { name: string | null; previousNames: readonly string[] }): void {
  const byName = new Map<string, NamedDefinition>();
  for (const model of after) {
    byName.set(model.name, model);
    for (const alias of model.definition.aliases) byName.set(alias, model);
  }
  const own = after.find((model) => model.name === changed.name);
  if (own !== undefined) {
    for (const list of LISTS) {
      (own.definition.guards?.[list] ?? []).forEach((guardName, index) => {
        const guard = byName.get(guardName);
        const param = `guards.${list}.${index}`;
        if (guard === undefined) {
          throw new BadRequestError(`Invalid model: field '${param}': guard model '${guardName}' does not exist. Add it first (with role guard and a guard_format), or take it out of the list.`, {
            code: "invalid_field",
            param,
          });
        }
        if (guard.definition.role !== "guard") {
          throw new BadRequestError(`Invalid model: field '${param}': '${guardName}' is not a guard model (its role is ${guard.definition.role}). Name a model with role guard.`, {
            code: "invalid_field",
            param,
          });
        }
      });
    }
  }
  // Models that named the changed model as a guard must still find a guard under that name.
  const orphaned: string[] = [];
  for (const model of after) {
    if (model.name === changed.name) continue;
    const names = LISTS.flatMap((list) => model.definition.guards?.[list] ?? []);
    if (names.some((guardName) => changed.previousNames.includes(guardName) && byName.get(guardName)?.definition.role !== "guard")) orphaned.push(model.name);
  }
  if (orphaned.length > 0) {
    const list = orphaned.map((name) => `'${name}'`).join(", ");
    throw new ConflictError(
      `Model '${changed.previousNames[0]}' is a guard of ${orphaned.length === 1 ? "model" : "models"} ${list}, and this change would leave ${orphaned.length === 1 ? "it" : "them"} without it. Take it out of their guards first (PATCH guards), or keep its name as an alias.`,
      { code: "guard_in_use" },
    );
  }
}
