// Small formatting helpers shared by messages and tables: byte sizes, host:port, and
// user-supplied text made safe to print.

const KiB = 1024;
const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

/** Binary units, one decimal for GiB and above: "4.6 GiB", "512 MiB", "17 KiB". */
export function formatBytes(bytes: number): string {
  if (bytes >= 0.1 * GiB) return `${(bytes / GiB).toFixed(1)} GiB`;
  if (bytes >= MiB) return `${Math.round(bytes / MiB)} MiB`;
  if (bytes >= KiB) return `${Math.round(bytes / KiB)} KiB`;
  return `${Math.round(bytes)} B`;
}

/** A host as it appears before ":port" (IPv6 in brackets). */
export function formatHost(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

/** User text for an error message: at most 200 characters, control characters escaped. */
export function printable(text: string): string {
  const shown = text.length > 200 ? `${text.slice(0, 200)}…` : text;
  // biome-ignore lint/suspicious/noControlCharactersInRegex: it matches control characters so that user text is escaped before it goes into a message.
  return shown.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}

/**
 * Text that a message goes on after, without its final full stop: an error's message is
 * a sentence, and "failed: ${message}. Try again" would otherwise end it twice ("..").
 */
export function clause(text: string): string {
  return text.trimEnd().replace(/(?<!\.)\.$/, "");
}

/** "1 file", "2 files": a count with its noun; `plural` for nouns that do not just add "s". */
export function countOf(count: number, singular: string, plural = `${singular}s`): string {
  return `${count} ${count === 1 ? singular : plural}`;
}
