// Usage rows the store refused, kept until it takes them again (usage-recorder.ts): first
// in memory, up to a bound (50,000 rows by default), then appended to files in the data
// dir (DATA_DIR/usage-spool/*.jsonl, one JSON row a line, fsync'd once per batch), up to
// a bound of their own (100 MB by default). Rows past both bounds are dropped, and the
// recorder counts them; so is a batch the files cannot take (a full disk: the data dir
// is where SQLite lives too).
//
// Draining writes memory first, then the files oldest first. A file is written in one
// transaction and removed after it commits, and a new file is started whenever one is
// being drained, so a file is never appended to and written at once. A crash between a
// file's commit and its removal writes that file's rows (at most SEGMENT_BYTES of them)
// a second time at the next start; a crash while rows are only in memory loses those.
// A file whose rows committed but that cannot be removed (a data dir turned read-only) is
// never written again by this process: it is let go, and the drain says which it was
// (the recorder logs it), since the next start would write its rows a second time.
// A graceful stop moves the rows still in memory to a file, and the next start replays
// whatever files are left.
import { mkdirSync, readdirSync, readFileSync, statSync } from "node:fs";
import { open, readFile, rm } from "node:fs/promises";
import path from "node:path";
import type { UsageRow } from "./usage-recorder.ts";

export const DEFAULT_SPOOL_MEMORY_ROWS = 50_000;
export const DEFAULT_SPOOL_FILE_BYTES = 100 * 1024 * 1024;
/** A new file is started past this size: what a crash at the wrong moment can write twice. */
const SEGMENT_BYTES = 4 * 1024 * 1024;
/** Rows of memory written in one transaction while draining. */
const DRAIN_BATCH = 2000;
const SPOOL_DIR = "usage-spool";

export interface UsageSpoolOptions {
  /** The data dir; its usage-spool folder holds the files. Absent: memory only. */
  dataDir?: string;
  memoryRows?: number;
  fileBytes?: number;
  /** Removes a written file (tests make it fail); default: fs rm. */
  remove?: (file: string) => Promise<void>;
}

/**
 * What a drain did: rows written to the store, rows of damaged lines that could not be
 * read back, and files written but not removed (with why): their rows are in the store.
 */
export interface Drained {
  written: number;
  unreadable: number;
  notRemoved: Array<{ file: string; error: unknown }>;
}

export class UsageSpool {
  private memory: UsageRow[] = [];
  private readonly dir: string | undefined;
  private readonly memoryRows: number;
  private readonly fileBytes: number;
  /** The files waiting, oldest first, with their sizes and row counts. */
  private readonly files: Array<{ file: string; bytes: number; rows: number }> = [];
  /** The file being appended to; undefined: the next append starts a new one. */
  private current: { file: string; bytes: number; rows: number } | undefined;
  private nextNumber = 1;
  private readonly remove: (file: string) => Promise<void>;

  constructor(options: UsageSpoolOptions) {
    this.dir = options.dataDir === undefined ? undefined : path.join(options.dataDir, SPOOL_DIR);
    this.memoryRows = options.memoryRows ?? DEFAULT_SPOOL_MEMORY_ROWS;
    this.fileBytes = options.fileBytes ?? DEFAULT_SPOOL_FILE_BYTES;
    this.remove = options.remove ?? ((file) => rm(file, { force: true }));
    this.findLeftovers();
  }

  /** Rows held, in memory and in files. */
  rows(): number {
    return this.memory.length + this.files.reduce((sum, file) => sum + file.rows, 0);
  }

  isEmpty(): boolean {
    return this.memory.length === 0 && this.files.length === 0;
  }

  /** Where the files live, for messages (undefined: memory only). */
  where(): string | undefined {
    return this.dir;
  }

  get bounds(): { memoryRows: number; fileBytes: number } {
    return { memoryRows: this.memoryRows, fileBytes: this.dir === undefined ? 0 : this.fileBytes };
  }

  /**
   * Keeps rows: in memory while there is room, the rest in a file. Returns how many were
   * dropped (past both bounds) and the error of a file write that failed, if one did.
   */
  async add(rows: readonly UsageRow[]): Promise<{ dropped: number; error?: unknown }> {
    const room = Math.max(0, this.memoryRows - this.memory.length);
    for (const row of rows.slice(0, room)) this.memory.push(row);
    const rest = rows.slice(room);
    if (rest.length === 0) return { dropped: 0 };
    return this.append(rest);
  }

  /** Moves the rows in memory to a file (a graceful stop), so the next start writes them. */
  async persistMemory(): Promise<{ dropped: number; error?: unknown }> {
    const rows = this.memory;
    this.memory = [];
    return rows.length === 0 ? { dropped: 0 } : this.append(rows);
  }

  /**
   * Writes what is held with `write`: memory in batches, then each file in one call,
   * removed once written. Stops at the first failure of `write`, which it throws; what was
   * not written stays for the next drain. A file written is let go even when it cannot be
   * removed: its rows are in the store, and writing them again would count them twice.
   */
  async drain(write: (rows: UsageRow[]) => Promise<void>): Promise<Drained> {
    const drained: Drained = { written: 0, unreadable: 0, notRemoved: [] };
    while (this.memory.length > 0) {
      const batch = this.memory.slice(0, DRAIN_BATCH);
      await write(batch);
      this.memory.splice(0, batch.length);
      drained.written += batch.length;
    }
    // The file being appended to is drained too: later rows start a new one.
    this.current = undefined;
    while (this.files.length > 0) {
      const file = this.files[0]!;
      const { rows, unreadable } = parseLines(await readIfThere(file.file));
      if (rows.length > 0) await write(rows);
      this.files.shift();
      await this.remove(file.file).catch((error: unknown) => drained.notRemoved.push({ file: file.file, error }));
      drained.written += rows.length;
      drained.unreadable += unreadable;
    }
    return drained;
  }

  private async append(rows: readonly UsageRow[]): Promise<{ dropped: number; error?: unknown }> {
    if (this.dir === undefined) return { dropped: rows.length };
    let bytesHeld = this.files.reduce((sum, file) => sum + file.bytes, 0);
    const lines: string[] = [];
    let bytes = 0;
    for (const row of rows) {
      const line = `${JSON.stringify(row)}\n`;
      const size = Buffer.byteLength(line);
      if (bytesHeld + size > this.fileBytes) break;
      bytesHeld += size;
      bytes += size;
      lines.push(line);
    }
    const beyondBound = rows.length - lines.length;
    if (lines.length === 0) return { dropped: beyondBound };
    try {
      const target = this.target();
      const handle = await open(target.file, "a", 0o600);
      try {
        await handle.write(lines.join(""));
        await handle.datasync();
      } finally {
        await handle.close();
      }
      target.bytes += bytes;
      target.rows += lines.length;
      if (target.bytes >= SEGMENT_BYTES) this.current = undefined;
      return { dropped: beyondBound };
    } catch (error) {
      // A full or read-only disk: these rows are lost, the count says how many. A partly
      // written line is skipped (and counted) when the file is read back.
      this.current = undefined;
      return { dropped: rows.length, error };
    }
  }

  /** The file to append to: the current one, or a new one. */
  private target(): { file: string; bytes: number; rows: number } {
    if (this.current !== undefined) return this.current;
    mkdirSync(this.dir!, { recursive: true, mode: 0o700 });
    const file = path.join(this.dir!, `${String(this.nextNumber).padStart(8, "0")}.jsonl`);
    this.nextNumber += 1;
    this.current = { file, bytes: 0, rows: 0 };
    this.files.push(this.current);
    return this.current;
  }

  /** Files a previous run left (an outage it stopped in): replayed first, in order. */
  private findLeftovers(): void {
    if (this.dir === undefined) return;
    let names: string[];
    try {
      names = readdirSync(this.dir).filter((name) => /^\d{8}\.jsonl$/.test(name));
    } catch {
      return; // No spool folder: nothing was left.
    }
    for (const name of names.sort()) {
      const file = path.join(this.dir, name);
      const bytes = statSync(file).size;
      const rows = readFileSync(file, "utf8")
        .split("\n")
        .filter((line) => line !== "").length;
      this.files.push({ file, bytes, rows });
      this.nextNumber = Math.max(this.nextNumber, Number(name.slice(0, 8)) + 1);
    }
  }
}

/** A file's text; empty when it is gone (its first write failed before creating it). */
async function readIfThere(file: string): Promise<string> {
  try {
    return await readFile(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return "";
    throw error;
  }
}

function parseLines(text: string): { rows: UsageRow[]; unreadable: number } {
  const rows: UsageRow[] = [];
  let unreadable = 0;
  for (const line of text.split("\n")) {
    if (line === "") continue;
    try {
      rows.push(JSON.parse(line) as UsageRow);
    } catch {
      unreadable += 1;
    }
  }
  return { rows, unreadable };
}
