// Port checks for engine processes. The supervisor picks a free port for each engine
// attempt and checks, right before spawning, that the port the launch names is still
// free: an engine that finds its port taken fails late and with a message that is easy
// to misread (or, worse, another server answers the health check and the replica looks
// ready while it is not ours).
import { createServer } from "node:net";
import { ConflictError, LlmgwError, describeError, errorCode } from "../core/errors.ts";
import { formatHost } from "../core/format.ts";

/** Asks the kernel for a port that is free on `host` right now (bind to port 0, read, close). */
export async function findFreePort(host: string): Promise<number> {
  const server = createServer();
  try {
    await listen(server, host, 0);
    const address = server.address();
    if (address === null || typeof address === "string") {
      throw new LlmgwError({ code: "port_check_failed", status: 500, message: `Could not read the port bound on ${host}.` });
    }
    return address.port;
  } catch (error) {
    if (error instanceof LlmgwError) throw error;
    throw bindError(error, host, 0);
  } finally {
    await close(server);
  }
}

/**
 * Throws a ConflictError (code `port_in_use`) naming host:port when something already
 * listens there, and an error naming the reason when the address cannot be bound at all.
 */
export async function assertPortFree(host: string, port: number): Promise<void> {
  const server = createServer();
  try {
    await listen(server, host, port);
  } catch (error) {
    throw bindError(error, host, port);
  } finally {
    await close(server);
  }
}

function bindError(error: unknown, host: string, port: number): LlmgwError {
  const code = errorCode(error);
  const where = `${formatHost(host)}:${port}`;
  if (code === "EADDRINUSE") {
    return new ConflictError(`Port ${where} is already in use by another process; stop what listens there or let llmgw choose a free port.`, {
      code: "port_in_use",
      cause: error,
    });
  }
  if (code === "EACCES") {
    return new LlmgwError({
      code: "port_not_permitted",
      status: 500,
      message: `Not permitted to listen on ${where}; ports below 1024 need privileges, use a higher port.`,
      cause: error,
    });
  }
  if (code === "EADDRNOTAVAIL") {
    return new LlmgwError({
      code: "address_not_available",
      status: 500,
      message: `Cannot listen on ${where}: ${host} is not an address of this machine; use one of its own addresses.`,
      cause: error,
    });
  }
  return new LlmgwError({
    code: "port_check_failed",
    status: 500,
    message: `Could not check port ${where}: ${describeError(error)}.`,
    cause: error,
  });
}

function listen(server: ReturnType<typeof createServer>, host: string, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (error: Error): void => reject(error);
    server.once("error", onError);
    // `exclusive` keeps the check honest in a cluster worker (no handle sharing with the primary).
    server.listen({ host, port, exclusive: true }, () => {
      server.off("error", onError);
      resolve();
    });
  });
}

function close(server: ReturnType<typeof createServer>): Promise<void> {
  return new Promise((resolve) => {
    if (!server.listening) return resolve();
    server.close(() => resolve());
  });
}
