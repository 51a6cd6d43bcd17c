// The process logger: pino JSON lines on stderr. Secrets never reach it: the redaction
// list below covers every field name that may carry a key or token, as a second line of
// defence behind the rule that code never passes one to the logger.
import { pino, type Logger } from "pino";

export type { Logger };

const REDACTED_FIELDS = [
  "key",
  "apiKey",
  "api_key",
  "engineKey",
  "engine_key",
  "token",
  "authorization",
  "*.key",
  "*.apiKey",
  "*.api_key",
  "*.engineKey",
  "*.engine_key",
  "*.token",
  "*.authorization",
  "headers.authorization",
  "*.headers.authorization",
];

export interface LoggerOptions {
  level?: string;
  name?: string;
  /** Where lines go; defaults to stderr so stdout stays free for command output. */
  destination?: NodeJS.WritableStream;
}

export function createLogger(options: LoggerOptions = {}): Logger {
  const level = options.level ?? process.env.LLMGW_LOG_LEVEL ?? "info";
  return pino(
    { level, name: options.name ?? "llmgw", redact: { paths: REDACTED_FIELDS, censor: "[redacted]" }, base: { pid: process.pid } },
    (options.destination ?? process.stderr) as pino.DestinationStream,
  );
}

/** A logger that drops everything, for tests and library use. */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}
