// The 503 a client gets when no replica of a model can take its request, worded from the
// model's health (fleet/model-health.ts, the same line the admin API shows), so the
// gateway never re-derives health on its own. Client keys learn what is wrong and what
// to do; the replica's recorded error (engine log lines, file paths of the server) is
// for administrators, who see it in this message and in /api/v1/replicas. Likewise a
// storage fault, which names the server's data dir or database (withoutServerDetails).
import { LlmgwError, UnavailableError } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { modelHealth, type FleetStatusOfModel } from "../fleet/model-health.ts";
import type { Replica } from "../fleet/replica-table.ts";

export function unavailableError(
  model: CatalogModel,
  replicas: readonly Replica[],
  audience: "admin" | "client",
  fleet?: FleetStatusOfModel,
): UnavailableError {
  const health = modelHealth(model, replicas, fleet);
  const name = model.name;
  const detail = audience === "admin" && health.reason !== null ? ` (${health.reason})` : "";
  switch (health.state) {
    case "parked":
      return new UnavailableError(
        `Model '${name}' is parked: its replicas failed to start repeatedly${detail}. An administrator can see why with 'llmgw ctl model show ${name}' and run 'llmgw ctl model unpark ${name}' once it is fixed.`,
        { code: "model_parked", retryAfterSeconds: 60 },
      );
    case "unplaceable":
      return new UnavailableError(
        `Model '${name}' cannot run now: no node can take a replica${detail}. An administrator can see what each node lacks with 'llmgw ctl model show ${name}'.`,
        { code: "model_unplaceable", retryAfterSeconds: 30 },
      );
    case "starting":
      return new UnavailableError(`Model '${name}' is starting; retry in a few seconds.`, { code: "model_starting", retryAfterSeconds: 5 });
    case "failed":
      return new UnavailableError(
        `Model '${name}' has no ready replica: its last start failed and is being retried${detail}. Retry shortly; if it persists, tell an administrator.`,
        {
          code: "model_failed",
          retryAfterSeconds: 10,
        },
      );
    case "no-replicas":
      return new UnavailableError(
        model.definition.scaling.min === 0
          ? `Model '${name}' runs on demand (scaling.min is 0) and no replica could be started for this request${detail}. Retry shortly; if it persists, tell an administrator.`
          : `Model '${name}' has no replica yet; it has not been placed. An administrator can check 'llmgw ctl model list'.`,
        { code: "no_ready_replica", retryAfterSeconds: 10 },
      );
    case "stopped":
    case "ready":
      // Ready replicas exist but this request could use none (each failed it) or they are stopping.
      return new UnavailableError(`No replica of model '${name}' could answer this request right now; retry shortly.`, {
        code: "no_ready_replica",
        retryAfterSeconds: 5,
      });
  }
}

/**
 * What a caller who is not an administrator (a client key, or no key yet) may read of a
 * failure: a storage fault names the data dir or the database's address, so it becomes
 * the same 503 in words that say what to do instead. The wait stays the fault's own (a
 * few seconds for a database that went away, longer for a full disk). Keys in the grace
 * are still answered then, so the words speak of this request's key and limits only.
 */
export function withoutServerDetails(error: unknown): unknown {
  if (!(error instanceof LlmgwError) || error.code !== "storage_unavailable") return error;
  const retryAfterSeconds = Number(error.headers["retry-after"] ?? 30);
  return new UnavailableError(
    `llmgw cannot use its database right now, so it cannot check this key or its limits. Retry in ${retryAfterSeconds} s; if it persists, tell an administrator (the server's log and /readyz say why).`,
    { code: "storage_unavailable", retryAfterSeconds },
  );
}
