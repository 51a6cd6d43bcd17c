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

test("every kind of secret llmgw keeps is redacted by its field name, at the top and one level down", () => {
  const out = capture(false);
  const logger = createLogger({ format: "json", destination: out.stream, level: "info" });
  const secrets = {
    joinToken: "jt-1",
    join_token: "jt-2",
    credential: "cred-3",
    secret: "whsec-4",
    signing_secret: "whsec-5",
    cluster_secret: "cs-6",
    password: "pw-7",
    cookie: "session-8",
  };
  logger.info({ ...secrets, channel: { secret: "whsec-9" }, req: { headers: { "x-api-key": "sk-10", cookie: "session-11" } }, model: "visible-model" }, "x");
  logger.flush();
  assert.doesNotMatch(out.text(), /jt-1|jt-2|cred-3|whsec-4|whsec-5|cs-6|pw-7|session-8|whsec-9|sk-10|session-11/);
  assert.match(out.text(), /visible-model/);
});

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
