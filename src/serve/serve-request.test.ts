// The serve request's checks at the door: each mistake is refused with the field named and
// a message that says what to do instead, before anything runs.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import type { CatalogModel } from "../catalog/catalog.ts";
import { LlmgwError } from "../core/errors.ts";
import { checkServeRequest, defaultAdapterName, defaultModelName } from "./serve-request.ts";
import { chooseProfiles } from "./serve-definition.ts";
import type { PlanOption } from "../plan/plan.ts";

const taken = new Map<string, CatalogModel>([
  ["busy", { name: "busy" } as CatalogModel],
  ["busy-alias", { name: "busy" } as CatalogModel],
  ["base:style", { name: "busy" } as CatalogModel],
]);
const catalog = { resolve: (name: string) => taken.get(name) };

async function refusal(body: Record<string, unknown>): Promise<LlmgwError> {
  try {
    await checkServeRequest(body, { catalog });
  } catch (error) {
    assert.ok(error instanceof LlmgwError, `an llmgw error, got ${String(error)}`);
    return error;
  }
  assert.fail(`accepted ${JSON.stringify(body)}`);
}

describe("serve request at the door", () => {
  test("a good request gets its defaults and a name from the repository", async () => {
    const request = await checkServeRequest({ repo: "bartowski/Llama-3.2-1B-Instruct-GGUF", quant: "Q4_K_M" }, { catalog });
    assert.equal(request.name, "Llama-3.2-1B-Instruct");
    assert.equal(request.replicas, 1);
    assert.equal(request.fallbacks, false);
    assert.deepEqual(request.aliases, []);
  });

  test("each mistake is refused naming the field and what to do", async () => {
    const cases: Array<[Record<string, unknown>, number, string | undefined, RegExp]> = [
      [{ repo: "not a repo" }, 400, "repo", /owner\/name/],
      [{ repo: "/nowhere/at/all.gguf" }, 400, "repo", /no file or folder '\/nowhere\/at\/all\.gguf' on the server's machine/],
      [{ repo: "o/n", format: "onnx" }, 400, "format", /gguf|safetensors/],
      [{ repo: "o/n", quant: "Q4_K_M", file: "x.gguf" }, 400, "file", /quant or file, not both/],
      [{ repo: "o/n", format: "safetensors", projector: true }, 400, "projector", /projector goes with GGUF/],
      [{ repo: "o/n", format: "safetensors", hardware: { cpu: {} } }, 400, "hardware", /never on the CPU.*GPU class/],
      [{ repo: "o/n", guard_format: "llamaguard3", replicas: 0 }, 400, "replicas", /guard model.*at least one replica/],
      [{ repo: "o/n", replicas: -1 }, 400, "replicas", /must not be negative.*0 for a model started on demand/],
      [{ repo: "o/n", ctx_pool: 4096, context: 8192 }, 400, "context", /cannot exceed the context pool/],
      [{ repo: "o/n", name: "busy" }, 409, "name", /already used by model 'busy'.*another name/],
      [{ repo: "o/n", name: "fresh", aliases: ["busy-alias"] }, 409, "aliases", /already used by model 'busy'.*another alias/],
      [{ repo: "o/busy-GGUF" }, 409, "name", /already used.*--name/],
      [{ repo: "o/n", revision: "a/../b" }, 400, "revision", /./],
    ];
    for (const [body, status, param, message] of cases) {
      const error = await refusal(body);
      assert.equal(error.status, status, JSON.stringify(body));
      if (param !== undefined) assert.equal(error.param, param, `${JSON.stringify(body)}: ${error.message}`);
      assert.match(error.message, message, JSON.stringify(body));
    }
  });

  test("a local file that exists is accepted and named after the file; it has no revisions", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-serve-"));
    const file = path.join(dir, "My Model.Q8_0.gguf");
    writeFileSync(file, "GGUF");
    const request = await checkServeRequest({ repo: file }, { catalog });
    assert.equal(request.name, "My-Model.Q8_0");
    const error = await refusal({ repo: file, revision: "main" });
    assert.match(error.message, /no revisions/);
  });

  test("default names", () => {
    assert.equal(defaultModelName("llmgw-test/tiny-llama-GGUF"), "tiny-llama");
    assert.equal(defaultModelName("/models/qwen2.5-0.5b-instruct-q4_k_m.gguf"), "qwen2.5-0.5b-instruct-q4_k_m");
    assert.equal(defaultAdapterName("owner/Style-LoRA-GGUF"), "style-lora");
    assert.equal(defaultAdapterName("owner/My Adapter+v2"), "my-adapter-v2");
    assert.equal(defaultAdapterName("owner/__x"), "x");
    assert.equal(defaultAdapterName("owner/___"), "adapter");
    assert.equal(defaultAdapterName(`owner/${"a".repeat(90)}`).length, 64);
  });

  test("adapters get their names from their repositories, and what was given travels as given", async () => {
    const request = await checkServeRequest(
      {
        repo: "o/base-GGUF",
        adapters: [{ repo: "o/Style-LoRA-GGUF" }, { repo: "o/terse-lora", revision: "v2", file: "f16/terse.GGUF", name: "terse", scale: 0.5 }],
      },
      { catalog },
    );
    assert.deepEqual(request.adapters, [
      { repo: "o/Style-LoRA-GGUF", name: "style-lora" },
      { repo: "o/terse-lora", revision: "v2", file: "f16/terse.GGUF", name: "terse", scale: 0.5 },
    ]);
    assert.deepEqual((await checkServeRequest({ repo: "o/base-GGUF" }, { catalog })).adapters, []);
  });

  test("each adapter mistake is refused naming the adapter's field and what to do", async () => {
    const cases: Array<[Record<string, unknown>, number, string, RegExp]> = [
      [{ repo: "o/n", format: "safetensors", adapters: [{ repo: "o/a" }] }, 400, "adapters", /only for GGUF weights.*PEFT adapter folder on the nodes/],
      [{ repo: "o/n", file: "model.safetensors", adapters: [{ repo: "o/a" }] }, 400, "adapters", /not fetch adapters yet/],
      [
        { repo: "o/n", adapters: [{ repo: "o/a", file: "adapter.safetensors" }] },
        400,
        "adapters.0.file",
        /'adapter\.safetensors' of o\/a is not a \.gguf file.*convert_lora_to_gguf/,
      ],
      [{ repo: "o/n", adapters: [{ repo: "o/a" }, { repo: "p/a" }] }, 400, "adapters.1.name", /Adapters 1 and 2 are both named 'a'.*NAME=REPO/],
      [
        {
          repo: "o/n",
          adapters: [
            { repo: "o/x", name: "same" },
            { repo: "o/y", name: "same" },
          ],
        },
        400,
        "adapters.1.name",
        /both named 'same'/,
      ],
      [{ repo: "o/n", adapters: [{ repo: "not a repo" }] }, 400, "adapters.0.repo", /^Adapter 1: Invalid repository name 'not a repo'/],
      [{ repo: "o/n", adapters: [{ repo: "./style.gguf" }] }, 400, "adapters.0.repo", /local path.*owner\/name.*kind: "file"/],
      [{ repo: "o/n", adapters: [{ repo: "o/a", revision: "a/../b" }] }, 400, "adapters.0.revision", /^Adapter 1: Invalid revision/],
      [{ repo: "o/n", adapters: [{ repo: "o/a", name: "-bad" }] }, 400, "adapters.0.name", /1-64 letters/],
      [{ repo: "o/n", adapters: [{ repo: "o/a", scale: 0 }] }, 400, "adapters.0.scale", /more than 0/],
      [{ repo: "o/n", adapters: [{ repo: "o/a", extra: 1 }] }, 400, "adapters.0", /extra/],
      [
        { repo: "o/n", aliases: ["n:a"], adapters: [{ repo: "o/a" }] },
        400,
        "adapters.0.name",
        /'n:a' is both an alias of the model and the name of its adapter 1/,
      ],
      [{ repo: "o/n", name: "base", adapters: [{ repo: "o/style" }] }, 409, "adapters.0.name", /'base:style' is already used by model 'busy'.*another name/],
      [{ repo: "o/n", adapters: Array.from({ length: 17 }, (_, i) => ({ repo: `o/a${i}` })) }, 400, "adapters", /at most 16 adapters/],
    ];
    for (const [body, status, param, message] of cases) {
      const error = await refusal(body);
      assert.equal(error.status, status, JSON.stringify(body));
      assert.equal(error.param, param, `${JSON.stringify(body)}: ${error.message}`);
      assert.match(error.message, message, JSON.stringify(body));
    }
  });
});

describe("profiles a serve job adds", () => {
  const request = { repo: "o/n", fallbacks: false, aliases: [] as string[], replicas: 1 };
  const option = (placement: PlanOption["placement"], fits: boolean, format: "gguf" | "safetensors" = "gguf"): PlanOption =>
    ({
      artifact: { id: "A", label: "A", format, bytes: 1, qualityRank: 1 },
      placement,
      engine: format === "gguf" ? "llamacpp" : "vllm",
      neededBytes: 1,
      availableBytes: 2,
      per: "node",
      hostsNow: 1,
      fits,
    }) as PlanOption;

  test("GGUF without hardware and without a plan runs on the CPU with the pool split into requests", () => {
    const [profile, ...rest] = chooseProfiles({ request: { ...request, ctx_pool: 8192, context: 2048 }, format: "gguf", planOptions: [], artifactId: null });
    assert.deepEqual(rest, []);
    assert.equal(profile?.engine, "llamacpp");
    assert.deepEqual(profile?.hardware, { cpu: {} });
    assert.equal(profile?.ctx_size, 8192);
    assert.equal(profile?.parallel, 4);
  });

  test("the plan's GPU pick comes first, and fallbacks add the CPU at a lower priority", () => {
    const gpu = { kind: "gpu", gpuClass: "H200", gpusPerNode: 1, nodes: 1 } as const;
    const profiles = chooseProfiles({ request: { ...request, fallbacks: true }, format: "gguf", planOptions: [option(gpu, true)], artifactId: "A" });
    assert.deepEqual(
      profiles.map((p) => [p.name, p.priority]),
      [
        ["gpu-h200-1x1", 0],
        ["cpu", -1],
      ],
    );
    assert.deepEqual(profiles[0]?.hardware, { gpu: { class: "H200", gpus_per_node: 1, nodes: 1 } });
  });

  test("original weights without a GPU are refused with what to give instead", () => {
    assert.throws(
      () => chooseProfiles({ request, format: "safetensors", planOptions: [option({ kind: "cpu" }, true, "safetensors")], artifactId: "A" }),
      /never on the CPU.*--gpu-class/,
    );
    const profiles = chooseProfiles({
      request: { ...request, hardware: { gpu: { class: "A100", gpus_per_node: 2, nodes: 1 } } },
      format: "safetensors",
      planOptions: [],
      artifactId: null,
    });
    assert.deepEqual(
      profiles.map((p) => [p.engine, p.hardware.gpu?.gpus_per_node]),
      [["vllm", 2]],
    );
  });
});
