// The process logger: pino on stderr. On a terminal, readable lines through pino-pretty
// (time, level, message, then the fields); elsewhere (a file, a pipe, a log collector)
// JSON lines, one object per line. `--log-format json|pretty` forces either. Secrets
// never reach it: the redaction list below covers every field name that may carry a key
// or token, as a second line of defence behind the rule that code never passes one to
// the logger; pino redacts before either format is written.
import { pino, type Logger } from "pino";
import pretty from "pino-pretty";
import { BadRequestError } from "./errors.ts";

export type { Logger };

/**
 * Every secret llmgw keeps (issue 25): API keys, external servers' keys, engine keys, the
 * join token and node credentials, webhook signing secrets, the cluster secret, console
 * session cookies. Each name at the top level and one level down.
 */
const SECRET_FIELDS = [
  "key",
  "apiKey",
  "api_key",
  "engineKey",
  "engine_key",
  "token",
  "joinToken",
  "join_token",
  "credential",
  "secret",
  "signingSecret",
  "signing_secret",
  "clusterSecret",
  "cluster_secret",
  "password",
  "authorization",
  "cookie",
];

const REDACTED_FIELDS = [
  ...SECRET_FIELDS,
  ...SECRET_FIELDS.map((field) => `*.${field}`),
  "headers.authorization",
  "*.headers.authorization",
  'headers["x-api-key"]',
  '*.headers["x-api-key"]',
  "*.headers.cookie",
];

/** auto: pretty on a terminal, JSON otherwise. */
export type LogFormat = "auto" | "json" | "pretty";

export interface LoggerOptions {
  level?: string;
  name?: string;
  /** Where lines go; defaults to stderr so stdout stays free for command output. */
  destination?: NodeJS.WritableStream & { isTTY?: boolean };
  /** Default: LLMGW_LOG_FORMAT, else auto. */
  format?: LogFormat;
}

export function createLogger(options: LoggerOptions = {}): Logger {
  const level = options.level ?? process.env.LLMGW_LOG_LEVEL ?? "info";
  const destination = options.destination ?? process.stderr;
  const format = options.format !== undefined ? parseLogFormat(options.format) : parseLogFormat(process.env.LLMGW_LOG_FORMAT ?? "auto", "LLMGW_LOG_FORMAT");
  const readable = format === "pretty" || (format === "auto" && destination.isTTY === true);
  const stream = readable
    ? pretty({
        destination,
        colorize: destination.isTTY === true,
        translateTime: "SYS:HH:MM:ss.l",
        // The message, then the fields as key=value on the same line; pid and name are the
        // same on every line of one process.
        ignore: "pid,hostname,name",
        hideObject: true,
        messageFormat: (log, messageKey) => [String(log[messageKey] ?? ""), ...fieldsOf(log, messageKey)].join(" "),
        sync: true,
      })
    : destination;
  return pino(
    { level, name: options.name ?? "llmgw", redact: { paths: REDACTED_FIELDS, censor: "[redacted]" }, base: { pid: process.pid } },
    stream as pino.DestinationStream,
  );
}

const NOT_FIELDS = new Set(["level", "time", "pid", "hostname", "name"]);

function fieldsOf(log: Record<string, unknown>, messageKey: string): string[] {
  return Object.entries(log)
    .filter(([field]) => field !== messageKey && !NOT_FIELDS.has(field))
    .map(([field, value]) => `${field}=${typeof value === "string" && /^[^\s"=]+$/.test(value) ? value : JSON.stringify(value)}`);
}

export function parseLogFormat(value: string, flag = "--log-format"): LogFormat {
  if (value === "auto" || value === "json" || value === "pretty") return value;
  throw new BadRequestError(
    `Invalid ${flag} '${value}': use json (one JSON object per line), pretty (readable lines) or auto (pretty on a terminal, else JSON).`,
  );
}

/** A logger that drops everything, for tests and library use. */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}
