// Storage faults: a full disk, a read-only file system or database, an I/O error, a
// database file that cannot be opened, a database server that cannot be reached or does
// not answer in time. They are recognised here, once, by error code (SQLite's extended
// result codes, Node's errno codes, PostgreSQL's SQLSTATE), and by message text only for
// the few errors of the pg driver itself that carry no code (see PG_DRIVER_FAULTS), and
// become one StorageUnavailableError: 503 `storage_unavailable`, with a message that names
// where the data lives, the cause and what to do. A query that waited too long for a free
// connection of this server's own pool is one too ("busy"), but says nothing of the
// database: it is not recorded as a fault and puts no outage in motion. `StorageHealth` remembers the last fault
// so /readyz can say why the server is not ready until a probe succeeds again.
import { UnavailableError, errorCode } from "../core/errors.ts";

export type StorageFaultKind = "full" | "read_only" | "io_error" | "cannot_open" | "permission_denied" | "unreachable" | "timed_out" | "busy";

const CAUSES: Record<StorageFaultKind, { cause: string; remedy: string }> = {
  full: { cause: "the disk is full", remedy: "Free space there; writes resume by themselves, no restart needed." },
  read_only: {
    cause: "it is read-only (a read-only file system or mount, or a read-only database)",
    remedy: "Make it writable for the user running llmgw; writes resume by themselves, no restart needed.",
  },
  io_error: { cause: "an I/O error", remedy: "Check the disk and the kernel log (dmesg); writes resume once the device answers again." },
  cannot_open: { cause: "the database file cannot be opened", remedy: "Check that it exists and that the user running llmgw may read and write it." },
  permission_denied: { cause: "permission denied", remedy: "Give the user running llmgw read and write access to it." },
  unreachable: { cause: "the database server cannot be reached", remedy: "Check that PostgreSQL runs and accepts connections; llmgw reconnects by itself." },
  timed_out: {
    cause: "the database did not finish the query in time",
    remedy: "Check the database's load and the locks other sessions hold; retrying later may work.",
  },
  busy: {
    cause: "every connection of this server's pool stayed busy (slow queries or lock waits) until the wait for one ran out",
    remedy: "Check for slow queries and the locks other sessions hold; retrying later may work.",
  },
};

/**
 * The pg driver's own connection failures, which carry no `code` (unlike the server's
 * SQLSTATEs and Node's socket errnos): message text is the only thing that tells them
 * apart, so it is read here and nowhere else. Each gets a code of its own for messages,
 * logs and /readyz. Exact texts of pg 8 and pg-pool 3; the silent ones (a deadline that
 * ran out with no answer at all) are what tells an outage from a dropped connection.
 */
const PG_DRIVER_FAULTS: readonly { message: RegExp; code: string; silent: boolean }[] = [
  // The client-side query deadline (query_timeout) ran out: no answer at all.
  { message: /^Query read timeout$/, code: "PG_QUERY_TIMEOUT", silent: true },
  // pg-pool's wait for a free client of a full pool ran out (connectionTimeoutMillis): every
  // connection is in use, which says the pool is busy, not that the database is silent
  // (a connect that runs out of time fails with one of the next two).
  { message: /^timeout exceeded when trying to connect$/, code: "PG_POOL_BUSY", silent: false },
  // Opening a connection took longer than connectionTimeoutMillis.
  { message: /^Connection terminated due to connection timeout$/, code: "PG_CONNECT_TIMEOUT", silent: true },
  { message: /^timeout expired$/, code: "PG_CONNECT_TIMEOUT", silent: true },
  // The socket closed under a connection in use, or a query was sent on one already broken.
  { message: /^Connection terminated unexpectedly$/, code: "PG_CONNECTION_LOST", silent: false },
  { message: /^Connection terminated$/, code: "PG_CONNECTION_LOST", silent: false },
  { message: /^Client has encountered a connection error and is not queryable$/, code: "PG_CONNECTION_LOST", silent: false },
];

/** Codes that mean the database stayed silent past a deadline (as against refusing or dropping a connection at once). */
const SILENT_CODES = new Set(["ETIMEDOUT", ...PG_DRIVER_FAULTS.filter((fault) => fault.silent).map((fault) => fault.code)]);

/** Whether a fault means the database gave no answer at all within a deadline: a partition, a machine gone. */
export function isSilentFault(fault: StorageUnavailableError): boolean {
  return SILENT_CODES.has(fault.faultCode);
}

/** The code of one of the pg driver's own connection errors (PG_DRIVER_FAULTS), anywhere in the cause chain. */
function pgDriverFaultCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current instanceof Error; depth += 1) {
    const message = current.message;
    const known = PG_DRIVER_FAULTS.find((fault) => fault.message.test(message));
    if (known !== undefined) return known.code;
    current = current.cause;
  }
  return undefined;
}

/**
 * The kind of storage fault an error code means, or undefined for every other failure
 * (a constraint violation, a bug in a query, SQLITE_BUSY). Extended SQLite codes
 * count with their family: SQLITE_IOERR_WRITE is an I/O error, SQLITE_READONLY_DBMOVED
 * a read-only database.
 */
export function storageFaultKind(code: string | undefined): StorageFaultKind | undefined {
  if (code === undefined) return undefined;
  if (code === "SQLITE_FULL" || code === "ENOSPC" || code === "EDQUOT" || code === "53100") return "full";
  if (code === "SQLITE_READONLY" || code.startsWith("SQLITE_READONLY_") || code === "EROFS" || code === "25006") return "read_only";
  if (code === "SQLITE_IOERR" || code.startsWith("SQLITE_IOERR_") || code === "EIO" || code === "58030") return "io_error";
  if (code === "SQLITE_CANTOPEN" || code.startsWith("SQLITE_CANTOPEN_")) return "cannot_open";
  if (code === "SQLITE_PERM" || code === "SQLITE_AUTH" || code === "EACCES" || code === "EPERM") return "permission_denied";
  // PostgreSQL: connection exceptions (class 08), the server shutting down or starting
  // (57P01-57P03), too many connections (53300), and the socket errors of connecting.
  if (code.startsWith("08") && code.length === 5) return "unreachable";
  if (code === "57P01" || code === "57P02" || code === "57P03" || code === "53300") return "unreachable";
  if (code === "ECONNREFUSED" || code === "ECONNRESET" || code === "ETIMEDOUT" || code === "EHOSTUNREACH" || code === "ENOTFOUND") return "unreachable";
  if (code === "EPIPE" || code === "ENETUNREACH" || code === "ECONNABORTED") return "unreachable";
  // The pg driver's own connection errors (named in PG_DRIVER_FAULTS).
  if (code === "PG_POOL_BUSY") return "busy";
  if (code.startsWith("PG_")) return "unreachable";
  // query_canceled: the server-side deadline (statement_timeout) or lock_timeout ended a query.
  if (code === "57014" || code === "55P03") return "timed_out";
  return undefined;
}

/**
 * What went wrong without where: "the disk is full (SQLITE_FULL)". For those who may not
 * see the server's paths (an unauthenticated /readyz).
 */
export function faultSummary(kind: StorageFaultKind, code: string): string {
  return `${CAUSES[kind].cause} (${code})`;
}

/** 503 `storage_unavailable`: the store cannot write (or be reached) now; retrying later may work. */
export class StorageUnavailableError extends UnavailableError {
  readonly kind: StorageFaultKind;
  /** The code the fault was recognised by (SQLITE_FULL, ENOSPC, 53100...). */
  readonly faultCode: string;
  /** Where the data lives, in words ("PostgreSQL at postgres://db:5432/llmgw"). */
  readonly where: string;

  constructor(options: { where: string; kind: StorageFaultKind; faultCode: string; cause: unknown }) {
    const { remedy } = CAUSES[options.kind];
    super(`Storage unavailable: cannot use ${options.where}: ${faultSummary(options.kind, options.faultCode)}. ${remedy}`, {
      code: "storage_unavailable",
      // A database that comes back is used again within a second or two; a full disk takes a person.
      retryAfterSeconds: options.kind === "unreachable" || options.kind === "timed_out" || options.kind === "busy" ? 5 : 30,
      cause: options.cause,
    });
    this.kind = options.kind;
    this.faultCode = options.faultCode;
    this.where = options.where;
  }
}

/**
 * The StorageUnavailableError an error stands for, or undefined when it is no storage
 * fault. `where` names the place in words ("the data dir /srv/llmgw (database
 * /srv/llmgw/llmgw.db)"); an error already classified keeps its own.
 */
export function asStorageFault(error: unknown, where: string): StorageUnavailableError | undefined {
  if (error instanceof StorageUnavailableError) return error;
  const code = errorCode(error) ?? pgDriverFaultCode(error);
  const kind = storageFaultKind(code);
  return kind === undefined ? undefined : new StorageUnavailableError({ where, kind, faultCode: code!, cause: error });
}

export interface StorageFaultState {
  kind: StorageFaultKind;
  code: string;
  message: string;
  /** When the fault was first seen (ISO-8601); later faults of the same run keep it. */
  since: string;
}

/**
 * The store's view of its own health: the last storage fault, kept until a probe write
 * succeeds. Any failed write sets it (admin writes, usage rows, replica states); only the
 * probe clears it, because small writes can still succeed on a full disk (SQLite reuses
 * its WAL file) while the next bigger one fails.
 */
export class StorageHealth {
  private state: StorageFaultState | null = null;

  constructor(private readonly clock: () => number = Date.now) {}

  noteFault(fault: StorageUnavailableError): void {
    // One query that ran out of time, or that found every pooled connection busy, says the
    // query was slow or the pool full, not that the store is down; whether the database
    // answers at all is the probe's to say.
    if (fault.kind === "timed_out" || fault.kind === "busy") return;
    this.state = { kind: fault.kind, code: fault.faultCode, message: fault.message, since: this.state?.since ?? new Date(this.clock()).toISOString() };
  }

  clear(): void {
    this.state = null;
  }

  fault(): StorageFaultState | null {
    return this.state;
  }
}
