// Validation of the names that come from users and from registries: repository ids,
// revisions and file paths inside a repository. Every path here later becomes part of a
// file name on disk (the mirror, the node's weight cache), so a path that could climb out
// of its folder is refused here, once, with a message that names the value.
import { BadRequestError } from "../core/errors.ts";

const REPO_PART = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
// The Hub's own limit on each part of a repository id.
const MAX_REPO_PART = 96;
const CONTROL = /[\u0000-\u001f\u007f]/;

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
        part.length <= MAX_REPO_PART &&
        REPO_PART.test(part) &&
        !part.includes("..") &&
        !part.includes("--") &&
        !part.endsWith(".") &&
        !part.endsWith("-"),
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
    throw new BadRequestError(
      `Invalid revision '${printable(String(value))}': give a branch name, a tag or a commit sha (for example 'main').`,
      { code: "invalid_revision", param: "revision" },
    );
  }
  return value;
}

/**
 * Checks a path inside a repository and returns it unchanged: relative, `/`-separated, no
 * empty, `.` or `..` segments, no backslashes, drive letters or control characters.
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

/** Why `value` is not a safe repository path, or null when it is. */
export function pathProblem(value: unknown): string | null {
  if (typeof value !== "string" || value.length === 0) return "it is empty";
  if (value.length > 1024) return "it is longer than 1024 characters";
  if (CONTROL.test(value)) return "it contains control characters";
  if (value.includes("\\")) return "it contains a backslash";
  if (value.startsWith("/")) return "it is absolute";
  if (/^[A-Za-z]:/.test(value)) return "it starts with a drive letter";
  const segments = value.split("/");
  if (segments.includes("..")) return "it contains '..'";
  if (segments.includes(".")) return "it contains a '.' segment";
  if (segments.includes("")) return "it contains an empty segment";
  return null;
}

/** Encodes each segment of a repository path for use in a URL, keeping the `/` separators. */
export function encodeRepoPath(path: string): string {
  return path.split("/").map(encodeURIComponent).join("/");
}

/** Control characters made visible, so an error message cannot be used to forge log lines. */
function printable(text: string): string {
  const shown = text.length > 200 ? `${text.slice(0, 200)}…` : text;
  return shown.replace(/[\u0000-\u001f\u007f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}
