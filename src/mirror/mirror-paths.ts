// Names in the mirror become file names on disk: DATA_DIR/mirror/{model}/{version}/{file}.
// Every name that reaches the mirror (from the admin API, a node asking for a file, or a
// registry's file list) is checked here, segment by segment, before any path is joined,
// so no name can climb out of the mirror's folder or land on a download in progress.
import { BadRequestError } from "../core/errors.ts";

/** Suffix of a download in progress (`<final>.partial`); repository files may not end with it. */
export const PARTIAL_SUFFIX = ".partial";

const CONTROL = /[\u0000-\u001f\u007f]/;
// Linux's NAME_MAX: the longest file name one directory entry can hold, in bytes.
const MAX_SEGMENT_BYTES = 255;
const MAX_PATH_LENGTH = 1024;

/** Why `segment` cannot be one file or folder name in the mirror, or null when it can. */
export function segmentProblem(segment: string): string | null {
  if (segment.length === 0) return "it is empty";
  if (Buffer.byteLength(segment) > MAX_SEGMENT_BYTES) return `it is longer than ${MAX_SEGMENT_BYTES} bytes`;
  if (CONTROL.test(segment)) return "it contains control characters";
  if (segment.includes("/")) return "it contains '/'";
  if (segment.includes("\\")) return "it contains a backslash";
  if (segment === "..") return "it is '..' (a parent folder)";
  if (segment === ".") return "it is '.'";
  if (/^[A-Za-z]:/.test(segment)) return "it starts with a drive letter";
  return null;
}

/**
 * Checks a model or version name (one path segment) and returns it unchanged. `param`
 * names the request field for the 400.
 */
export function validateMirrorKey(kind: "model" | "version", value: unknown, param: string = kind): string {
  const text = typeof value === "string" ? value : String(value);
  const problem = typeof value === "string" ? segmentProblem(value) : "it is not a string";
  if (problem !== null) {
    throw new BadRequestError(
      `Invalid mirror ${kind} '${printable(text)}': ${problem}. A ${kind} is one path segment: letters, digits and punctuation, ` +
        `without '/', '\\', '..' or control characters (for example ${kind === "model" ? "'bartowski--Llama-3.2-1B-Instruct-GGUF'" : "'0123456789ab'"}).`,
      { code: "invalid_path", param },
    );
  }
  return text;
}

/**
 * Checks a file path inside a mirrored version (a repository path such as
 * `Q2_K/x-00001-of-00002.gguf`) and returns it unchanged. Every segment must pass
 * `segmentProblem`; the path is relative and does not end in `.partial`.
 */
export function validateMirrorFile(value: unknown, param = "file"): string {
  const text = typeof value === "string" ? value : String(value);
  const fail = (why: string): never => {
    throw new BadRequestError(
      `Invalid mirror file path '${printable(text)}': ${why}. Use a path relative to the repository root with '/' between folders, ` +
        `each segment a plain name (for example 'Q4_K_M/model-Q4_K_M.gguf').`,
      { code: "invalid_path", param },
    );
  };
  if (typeof value !== "string" || value.length === 0) return fail("it is empty");
  if (value.length > MAX_PATH_LENGTH) return fail(`it is longer than ${MAX_PATH_LENGTH} characters`);
  if (value.startsWith("/")) return fail("it is absolute");
  const segments = value.split("/");
  segments.forEach((segment, index) => {
    const problem = segmentProblem(segment);
    if (problem !== null) fail(`segment ${index + 1} ('${printable(segment)}') is not allowed: ${problem}`);
  });
  if (value.endsWith(PARTIAL_SUFFIX)) return fail(`it ends with '${PARTIAL_SUFFIX}', which the mirror reserves for downloads in progress`);
  return value;
}

/** Control characters made visible, so an error message cannot forge log lines. */
export function printable(text: string): string {
  const shown = text.length > 200 ? `${text.slice(0, 200)}…` : text;
  return shown.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}
