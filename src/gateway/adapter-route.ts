// Requests for a LoRA adapter (a model's adapter, asked for by its served name, MODEL:NAME
// by default): they run on the base model's replicas, with the same keys, limits and usage
// as the model, and each engine is told which adapter in its own terms:
// - llama.cpp (llama-server, and the bundled engine, which takes the same field): the base
//   model's name and `"lora": [{"id": N, "scale": S}]`, N being the adapter's position in the
//   model's list (the order the engine loaded them in, each at scale 0 by default). A request
//   for the base model of a model with adapters says so too (`[{"id": 0, "scale": 0}]`):
//   llama-server (at node-llama-cpp's llama.cpp) clears a slot's cached prompt when a
//   request's adapters differ from the slot's last ones, but not for a request without the
//   field, which would then reuse a prompt evaluated with an adapter and answer neither as
//   the base nor as the adapter;
// - vLLM: the adapter's served name as `model` (its --lora-modules name), nothing else.
// External profiles never carry adapters (model-schema.ts refuses them).
import type { Replica } from "../fleet/replica-table.ts";

export interface AdapterChoice {
  /** Its position in the model's adapters: the id llama.cpp engines know it by. */
  index: number;
  /** 0 for the base model of a model with adapters. */
  scale: number;
  /** The name the client asked for, which vLLM serves it under; null for the base model. */
  servedName: string | null;
}

/** What the gateway reads of the catalog for adapters. */
export interface AdapterResolver {
  adapterOf?(servedName: string): { adapter: { scale: number }; index: number } | undefined;
}

/** The adapter a requested name stands for; the base (scale 0) for a model with adapters asked by its own name or an alias; else null. */
export function adapterChoice(catalog: AdapterResolver, requested: string, model: { definition: { adapters: readonly unknown[] } }): AdapterChoice | null {
  const found = catalog.adapterOf?.(requested);
  if (found !== undefined) return { index: found.index, scale: found.adapter.scale, servedName: requested };
  return model.definition.adapters.length > 0 ? { index: 0, scale: 0, servedName: null } : null;
}

/** No extra fields (shared, so a request without adapters allocates nothing for them). */
export const NO_FIELDS: Readonly<Record<string, unknown>> = Object.freeze({});

/**
 * The model name and extra fields the body sent to `replica` carries for the adapter. The id
 * is the adapter's position in the replica's OWN list (what its engine loaded), not the
 * catalog's: while a change to the adapters rolls out, an older replica still runs its old
 * list (the gateway keeps requests for an adapter away from replicas without it).
 */
export function upstreamOf(replica: Replica, choice: AdapterChoice | null): { model: string; fields: Readonly<Record<string, unknown>> } {
  if (choice === null) return { model: replica.upstreamModel, fields: NO_FIELDS };
  if (replica.engine === "vllm") return { model: choice.servedName ?? replica.upstreamModel, fields: NO_FIELDS };
  const loaded = replica.adapters ?? [];
  if (choice.servedName === null) return { model: replica.upstreamModel, fields: loaded.length === 0 ? NO_FIELDS : BASE_FIELDS };
  return { model: replica.upstreamModel, fields: { lora: [{ id: loaded.indexOf(choice.servedName), scale: choice.scale }] } };
}

/** The base model of an engine with adapters: every adapter at 0, said explicitly (see the header). */
const BASE_FIELDS: Readonly<Record<string, unknown>> = Object.freeze({ lora: [{ id: 0, scale: 0 }] });
