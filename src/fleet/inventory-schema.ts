// TEMPORARY stand-in until the inventory branch lands (replaced by its version at merge).
import { BadRequestError } from "../core/errors.ts";
import type { NodeInventory } from "./fleet-types.ts";

export function checkInventory(raw: unknown): NodeInventory {
  const inv = raw as NodeInventory;
  if (typeof inv !== "object" || inv === null || !Number.isInteger(inv.cores) || inv.cores < 1) {
    throw new BadRequestError("Invalid inventory: field 'inventory.cores' must be a positive integer.", { code: "invalid_inventory", param: "inventory.cores" });
  }
  return inv;
}
