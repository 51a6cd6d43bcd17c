// The guard models a key names (`guards` on the api_keys row, migration 0009_key_guards):
// every request made with the key is checked by them, on top of its model's own guards
// (GuardModels in guards.ts merges the two). The names travel with the Principal, so the
// hot path needs no lookup. Keys do not know the catalog: whether each name is a guard
// model is checked at the door by a checker the server passes in (the catalog's, through
// guard-references.ts), and the catalog asks the keys which guards they name before it
// lets a guard be removed.
import { z } from "zod";
import { MODEL_NAME_PATTERN } from "../catalog/model-schema.ts";

/** The guard model names a key adds to every request's, on each side. */
export interface KeyGuards {
  input: readonly string[];
  output: readonly string[];
}

/** Refuses guard names that are not guard models (throws a 400 naming `guards.<side>.<index>`). */
export type KeyGuardChecker = (guards: Partial<KeyGuards>) => void;

/** A key that names guards, as the catalog sees it when a guard is about to go away. */
export interface KeyGuardReference {
  name: string;
  guards: KeyGuards;
}

const guardNames = z.array(z.string().regex(MODEL_NAME_PATTERN, "must be a model name")).max(8, "at most 8 guard models");

/** POST /api/v1/keys: `guards: {input, output}` (each side optional) or null. */
export const keyGuardsField = z
  .strictObject({ input: guardNames.default([]), output: guardNames.default([]) })
  .nullable()
  .default(null);

/** PATCH /api/v1/keys/:ref: a side given replaces that side, a side left out stays; null removes both. */
export const keyGuardsPatchField = z.strictObject({ input: guardNames.optional(), output: guardNames.optional() }).nullable().optional();

export type KeyGuardsPatch = z.output<typeof keyGuardsPatchField>;

/** The guards after a PATCH; null when no side names a guard any more. */
export function mergeKeyGuards(current: KeyGuards | null, patch: NonNullable<KeyGuardsPatch> | null): KeyGuards | null {
  if (patch === null) return null;
  return normalized({ input: patch.input ?? current?.input ?? [], output: patch.output ?? current?.output ?? [] });
}

/** The JSON text column; null for a key without guards. */
export function guardsColumn(guards: KeyGuards | null): string | null {
  const kept = guards === null ? null : normalized(guards);
  return kept === null ? null : JSON.stringify(kept);
}

export function guardsOfColumn(column: string | null): KeyGuards | null {
  return column === null ? null : (JSON.parse(column) as KeyGuards);
}

/** Duplicates removed; null when both sides are empty. */
function normalized(guards: KeyGuards): KeyGuards | null {
  const input = [...new Set(guards.input)];
  const output = [...new Set(guards.output)];
  return input.length === 0 && output.length === 0 ? null : { input, output };
}
