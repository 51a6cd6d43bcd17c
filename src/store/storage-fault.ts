// Storage faults: a full disk, a read-only file system or database, an I/O error, a
// database file that cannot be opened, a database server that cannot be reached. They
// are recognised here, once, by error code (SQLite's extended result codes, Node's errno
// codes, PostgreSQL's SQLSTATE), never by message text, and become one
// StorageUnavailableError: 503 `storage_unavailable`, with a message that names where the
// data lives, the cause and what to do. `StorageHealth` remembers the last fault so
// /readyz can say why the server is not ready until a probe write succeeds again.
import { UnavailableError, errorCode } from "../core/errors.ts";

export type StorageFaultKind = "full" | "read_only" | "io_error" | "cannot_open" | "permission_denied" | "unreachable";

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
};

/**
 * The kind of storage fault an error code means, or undefined for every other failure
 * (a constraint violation, a bug in a query, a busy database). Extended SQLite codes
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

  constructor(options: { where: string; kind: StorageFaultKind; faultCode: string; cause: unknown }) {
    const { remedy } = CAUSES[options.kind];
    super(`Storage unavailable: cannot use ${options.where}: ${faultSummary(options.kind, options.faultCode)}. ${remedy}`, {
      code: "storage_unavailable",
      retryAfterSeconds: 30,
      cause: options.cause,
    });
    this.kind = options.kind;
    this.faultCode = options.faultCode;
  }
}

/**
 * The StorageUnavailableError an error stands for, or undefined when it is no storage
 * fault. `where` names the place in words ("the data dir /srv/llmgw (database
 * /srv/llmgw/llmgw.db)"); an error already classified keeps its own.
 */
export function asStorageFault(error: unknown, where: string): StorageUnavailableError | undefined {
  if (error instanceof StorageUnavailableError) return error;
  const code = errorCode(error);
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
    this.state = { kind: fault.kind, code: fault.faultCode, message: fault.message, since: this.state?.since ?? new Date(this.clock()).toISOString() };
  }

  clear(): void {
    this.state = null;
  }

  fault(): StorageFaultState | null {
    return this.state;
  }
}
