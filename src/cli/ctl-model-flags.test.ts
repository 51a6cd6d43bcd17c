// `ctl model serve --adapter [NAME=]REPO[@REVISION][:FILE]` → the serve body's adapters:
// each part only when given (the server's defaults stay the server's), and a flag with an
// empty part refused before anything is sent, with the form to use.
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "../core/errors.ts";
import { serveAdapterFromFlag, serveBodyFromFlags } from "./ctl-model-flags.ts";

test("--adapter: repository alone, with a name, a revision and a file", () => {
  assert.deepEqual(serveAdapterFromFlag("owner/style-lora-GGUF"), { repo: "owner/style-lora-GGUF" });
  assert.deepEqual(serveAdapterFromFlag("owner/style-lora:f16/style.gguf"), { repo: "owner/style-lora", file: "f16/style.gguf" });
  assert.deepEqual(serveAdapterFromFlag("terse=owner/terse-lora@v2:terse.gguf"), {
    repo: "owner/terse-lora",
    revision: "v2",
    file: "terse.gguf",
    name: "terse",
  });
  const body = serveBodyFromFlags("owner/base-GGUF", { adapter: ["owner/a", "b=owner/b"] });
  assert.deepEqual(body.adapters, [{ repo: "owner/a" }, { repo: "owner/b", name: "b" }]);
  assert.equal("adapters" in serveBodyFromFlags("owner/base-GGUF", {}), false, "no --adapter: no adapters field");
});

test("--adapter with an empty part says the form to use", () => {
  for (const value of ["=owner/a", "style=", "owner/a:", "owner/a@:x.gguf", ":x.gguf"]) {
    assert.throws(
      () => serveAdapterFromFlag(value),
      (error: unknown) => error instanceof BadRequestError && /--adapter takes \[NAME=\]REPO\[@REVISION\]\[:FILE\]/.test(error.message),
      value,
    );
  }
});
