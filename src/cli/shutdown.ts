// How a process that runs engines (`llmgw up`, `llmgw agent`) ends on a signal: the first
// SIGINT, SIGTERM or SIGHUP stops it in order (its own parts, then every engine group:
// SIGTERM, SIGKILL after the grace) and exits 0; a second signal means "now" and kills
// every engine group at once. SIGHUP (the terminal closed, an ssh session dropped) would
// otherwise end the process without its exit hooks, leaving the detached engines running.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { killAllSupervisedSync, stopAllSupervisors } from "../agent/engine-supervisor.ts";

export function stopOnSignals(options: { logger: Logger; stop: () => Promise<void> }): void {
  const { logger } = options;
  let stopping = false;
  const shutdown = (signal: NodeJS.Signals) => {
    if (stopping) {
      logger.warn({ signal }, "second signal: killing engines and exiting");
      killAllSupervisedSync();
      process.exit(1);
    }
    stopping = true;
    logger.info({ signal }, "shutting down");
    options
      .stop()
      .then(() => stopAllSupervisors())
      .then(
        () => process.exit(0),
        (error: unknown) => {
          logger.error({ err: describeError(error) }, "shutdown failed");
          process.exit(1);
        },
      );
  };
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(signal, shutdown);
}
