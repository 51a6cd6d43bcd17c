// Log lines: readable on a terminal, JSON elsewhere or when asked, secrets redacted in both.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { BadRequestError } from "./errors.ts";
import { createLogger, type LogFormat } from "./log.ts";

function capture(isTTY: boolean): { stream: Writable & { isTTY: boolean }; text: () => string } {
  let text = "";
  const stream = Object.assign(
    new Writable({
      write(chunk: Buffer | string, _encoding, done) {
        text += chunk.toString();
        done();
      },
    }),
    { isTTY },
  );
  return { stream, text: () => text };
}

function logOnce(format: LogFormat, isTTY: boolean): string {
  const out = capture(isTTY);
  const logger = createLogger({ format, destination: out.stream, level: "info" });
  logger.info({ url: "http://127.0.0.1:8700", key: "llmgw-secret", upstream: { api_key: "sk-upstream" } }, "llmgw server listening");
  logger.flush();
  return out.text();
}

test("on a terminal, a line with time, level, message and fields; secrets redacted", () => {
  // No colours: the capture is no terminal; `pretty` forces the format alone.
  const line = logOnce("pretty", false);
  assert.match(
    line,
    /^\[\d\d:\d\d:\d\d\.\d{3}\] INFO: llmgw server listening url=http:\/\/127\.0\.0\.1:8700 key=\[redacted\] upstream=\{"api_key":"\[redacted\]"\}\n$/,
  );
  assert.doesNotMatch(line, /llmgw-secret|sk-upstream/);
});

test("elsewhere, JSON lines; secrets redacted", () => {
  const line = logOnce("json", true);
  const parsed = JSON.parse(line) as Record<string, unknown>;
  assert.equal(parsed.msg, "llmgw server listening");
  assert.equal(parsed.level, 30);
  assert.equal(parsed.key, "[redacted]");
  assert.doesNotMatch(line, /llmgw-secret|sk-upstream/);
});

test("auto picks readable lines for a terminal and JSON for anything else", () => {
  assert.match(logOnce("auto", true), /INFO.*llmgw server listening/);
  assert.doesNotThrow(() => JSON.parse(logOnce("auto", false)));
});

test("an unknown format is refused with the choices", () => {
  assert.throws(() => createLogger({ format: "xml" as LogFormat }), BadRequestError);
  const previous = process.env.LLMGW_LOG_FORMAT;
  process.env.LLMGW_LOG_FORMAT = "xml";
  try {
    assert.throws(() => createLogger(), /Invalid LLMGW_LOG_FORMAT 'xml': use json .*, pretty .* or auto/);
  } finally {
    if (previous === undefined) delete process.env.LLMGW_LOG_FORMAT;
    else process.env.LLMGW_LOG_FORMAT = previous;
  }
});
