// The pool before the fleet exists: this machine alone, as a node with its cores and
// memory and no GPUs (the bundled llama.cpp is the CPU build, and nothing here detects
// GPUs yet). `llmgw ctl model plan` and GET /api/v1/plan use it until nodes report their
// inventory.
import os from "node:os";
import type { Pool } from "./plan.ts";

export interface LocalSystem {
  hostname: string;
  cores: number;
  totalMemoryBytes: number;
  freeMemoryBytes: number;
}

export function localPool(system: Partial<LocalSystem> = {}): Pool {
  return {
    nodes: [
      {
        name: system.hostname ?? os.hostname(),
        cores: system.cores ?? os.availableParallelism(),
        memoryBytes: system.totalMemoryBytes ?? os.totalmem(),
        // On Linux libuv reads MemAvailable, which counts reclaimable page cache as free.
        memoryFreeBytes: system.freeMemoryBytes ?? os.freemem(),
        gpus: [],
      },
    ],
  };
}
