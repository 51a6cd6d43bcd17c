// Validation of the names that come from users and from registries: repository ids,
// revisions and file paths inside a repository. Every path here later becomes part of a
// file name on disk (the mirror, the node's weight cache), so a path that could climb out
// of its folder, or that no file system could hold, is refused here, once, with a message
// that names the value. This is the one path rule: the mirror checks its file paths with
// `pathProblem` too (src/mirror/mirror-paths.ts), so a path the registry accepts is one
// the mirror can store.
import { BadRequestError } from "../core/errors.ts";
import { printable } from "../core/format.ts";

const REPO_PART = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
// The Hub's own limit on each part of a repository id.
const MAX_REPO_PART = 96;
// biome-ignore lint/suspicious/noControlCharactersInRegex: it matches control characters so that repository paths holding them are refused.
const CONTROL = /[\u0000-\u001f\u007f]/;
// Linux's NAME_MAX: the longest file name one directory entry can hold, in bytes.
const MAX_SEGMENT_BYTES = 255;
const MAX_PATH_LENGTH = 1024;

/**
 * Suffix of a mirror download in progress (`<final>.partial`). The mirror keeps a file
 * being fetched under this name next to where it will land, so no repository file may
 * end with it: it would collide with the download of its neighbour.
 */
export const PARTIAL_SUFFIX = ".partial";

/**
 * Checks a repository id of the form `owner/name` and returns it unchanged. Each part
 * starts with a letter or digit, then letters, digits, `.`, `_`, `-`; the Hub also forbids
 * `..` and `--` and a part that ends in `.` or `-`.
 */
export function validateRepoName(value: unknown): string {
  const text = typeof value === "string" ? value : String(value);
  const parts = text.split("/");
  const ok =
    typeof value === "string" &&
    parts.length === 2 &&
    parts.every(
      (part) =>
        part.length <= MAX_REPO_PART && REPO_PART.test(part) && !part.includes("..") && !part.includes("--") && !part.endsWith(".") && !part.endsWith("-"),
    );
  if (!ok) {
    throw new BadRequestError(
      `Invalid repository name '${printable(text)}': expected 'owner/name' where each part starts with a letter or digit ` +
        `and uses only letters, digits, '.', '_' and '-' (for example 'bartowski/Llama-3.2-1B-Instruct-GGUF').`,
      { code: "invalid_repo_name", param: "repo" },
    );
  }
  return text;
}

/** Checks a revision (branch, tag, `refs/pr/N` or commit sha) and returns it unchanged. */
export function validateRevision(value: unknown): string {
  const ok = typeof value === "string" && value.length > 0 && value.length <= 256 && !CONTROL.test(value) && !value.split("/").includes("..");
  if (!ok) {
    throw new BadRequestError(`Invalid revision '${printable(String(value))}': give a branch name, a tag or a commit sha (for example 'main').`, {
      code: "invalid_revision",
      param: "revision",
    });
  }
  return value;
}

/**
 * Checks a path inside a repository and returns it unchanged (the rule is `pathProblem`).
 * `param` names the request field the path came from, for the error.
 */
export function sanitizeRepoPath(value: unknown, param = "file"): string {
  const text = typeof value === "string" ? value : String(value);
  const reason = pathProblem(value);
  if (reason !== null) {
    throw new BadRequestError(
      `Invalid file path '${printable(text)}': ${reason}. Use a path relative to the repository root with '/' between folders (for example 'Q4_K_M/model-Q4_K_M.gguf').`,
      { code: "invalid_path", param },
    );
  }
  return text;
}

/**
 * Why `value` is not a safe repository path, or null when it is: relative, at most
 * 1024 characters, each `/`-separated segment a plain file name (`segmentProblem`), and
 * not ending in `.partial`.
 */
export function pathProblem(value: unknown): string | null {
  if (typeof value !== "string" || value.length === 0) return "it is empty";
  if (value.length > MAX_PATH_LENGTH) return `it is longer than ${MAX_PATH_LENGTH} characters`;
  if (value.startsWith("/")) return "it is absolute";
  const segments = value.split("/");
  for (const [index, segment] of segments.entries()) {
    const problem = segmentProblem(segment);
    if (problem !== null) return `segment ${index + 1} ('${printable(segment)}') is not allowed: ${problem}`;
  }
  if (value.endsWith(PARTIAL_SUFFIX)) return `it ends with '${PARTIAL_SUFFIX}', which the mirror reserves for downloads in progress`;
  return null;
}

/** Why `segment` cannot be one file or folder name on disk, or null when it can. */
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

/** Encodes each segment of a repository path for use in a URL, keeping the `/` separators. */
export function encodeRepoPath(path: string): string {
  return path.split("/").map(encodeURIComponent).join("/");
}
