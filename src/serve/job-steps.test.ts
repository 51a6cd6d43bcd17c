// The serve job's adapter steps with a small registry and a recording mirror: which file of
// an adapter repository is taken (the one named, else the only .gguf, else a refusal that
// lists the .gguf files), each pinned to the commit read with the sha256 the registry
// published and named as its repository's own mirror version; and the mirror step fetching
// the adapters after the weights, with progress over all of them.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { LlmgwError } from "../core/errors.ts";
import type { FetchVersionOptions, FetchVersionSummary, Mirror, MirrorFetchFile } from "../mirror/mirror.ts";
import type { Registry, RepoFile, RepoInfo } from "../registry/types.ts";
import type { StepHandle } from "./jobs.ts";
import { describeAdapters, mirrorFiles, planAdapters, type PlannedFetch } from "./job-steps.ts";

const SHA = "c".repeat(40);

const repoFile = (path: string, size = 100): RepoFile => ({
  path,
  size,
  sha256: `${path.length.toString(16).padStart(2, "0")}${"d".repeat(62)}`,
  blobId: "b".repeat(40),
});

/** A registry of the repositories given, each at one commit; it records what was read and with which revision. */
function registry(repos: Record<string, RepoFile[]>): Registry & { reads: string[] } {
  const reads: string[] = [];
  return {
    reads,
    async repoInfo({ repo, revision }): Promise<RepoInfo> {
      reads.push(`${repo}@${revision ?? "main"}`);
      const files = repos[repo];
      if (files === undefined) throw new LlmgwError({ code: "repo_not_found", status: 404, message: `Repository '${repo}' was not found.` });
      return { repo, revision: revision ?? "main", sha: SHA, shortSha: SHA.slice(0, 12), gated: false, private: false, files };
    },
    downloadUrl: (repo, sha, path) => `https://hub.test/${repo}/resolve/${sha}/${path}`,
    requestHeaders: () => ({ authorization: "Bearer secret" }),
    readSmallFile: () => Promise.reject(new Error("not used")),
  };
}

const checked: Array<{ model: string; version: string }> = [];
const mirror = {
  checkFetch(options: { model: string; version: string; files: MirrorFetchFile[] }) {
    checked.push({ model: options.model, version: options.version });
    return options.files;
  },
} as unknown as Pick<Mirror, "checkFetch">;

async function refusal(promise: Promise<unknown>): Promise<LlmgwError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof LlmgwError, String(error));
    return error;
  }
  assert.fail("accepted");
}

describe("adapters in the registry step", () => {
  const signal = new AbortController().signal;
  const repos = {
    "o/style-lora-GGUF": [repoFile("README.md", 10), repoFile("style-F16.gguf", 1300)],
    "o/many-lora": [repoFile("a-F16.gguf"), repoFile("a-Q8_0.gguf"), repoFile("sub/b.gguf")],
    "o/peft-only": [repoFile("adapter_config.json"), repoFile("adapter_model.safetensors")],
  };

  test("the repository's only .gguf, or the file named, pinned to the commit read as the repository's own mirror version", async () => {
    const hub = registry(repos);
    const planned = await planAdapters({
      adapters: [
        { repo: "o/style-lora-GGUF", name: "style" },
        { repo: "o/many-lora", revision: "v2", file: "sub/b.gguf", name: "b", scale: 0.5 },
      ],
      registry: hub,
      mirror,
      signal,
    });
    assert.deepEqual(hub.reads, ["o/style-lora-GGUF@main", "o/many-lora@v2"]);
    assert.deepEqual(checked.slice(-2), [
      { model: "o--style-lora-GGUF", version: SHA.slice(0, 12) },
      { model: "o--many-lora", version: SHA.slice(0, 12) },
    ]);
    const [style, b] = planned;
    assert.equal(style?.name, "style");
    assert.equal(style?.scale, undefined, "no scale asked: the catalog's default");
    assert.equal(style?.file, "style-F16.gguf");
    assert.deepEqual(style?.planned.files, [
      {
        path: "style-F16.gguf",
        url: `https://hub.test/o/style-lora-GGUF/resolve/${SHA}/style-F16.gguf`,
        sha256: repos["o/style-lora-GGUF"][1]!.sha256,
        size: 1300,
        gitBlobId: null,
      },
    ]);
    assert.equal(JSON.stringify(planned).includes("secret"), false, "no registry token is kept in the job's context");
    assert.equal(b?.file, "sub/b.gguf");
    assert.equal(b?.scale, 0.5);
    assert.equal(describeAdapters(planned), `adapters style (o/style-lora-GGUF @ ${SHA.slice(0, 12)}, 1 KiB), b (o/many-lora @ ${SHA.slice(0, 12)}, 100 B)`);
  });

  test("no file named and several .gguf, none at all, or a named file that is not there: refused with the files to choose from", async () => {
    const hub = registry(repos);
    const several = await refusal(planAdapters({ adapters: [{ repo: "o/many-lora", name: "m" }], registry: hub, mirror, signal }));
    assert.equal(several.code, "adapter_file_ambiguous");
    assert.equal(several.status, 400);
    assert.equal(several.param, "adapters.0.file");
    assert.match(
      several.message,
      /o\/many-lora @ c{12} has 3 \.gguf files; say which is the adapter \(--adapter o\/many-lora:FILE\)\. its \.gguf files: a-F16\.gguf, a-Q8_0\.gguf, sub\/b\.gguf/,
    );
    const none = await refusal(
      planAdapters({
        adapters: [
          { repo: "o/style-lora-GGUF", name: "s" },
          { repo: "o/peft-only", name: "p" },
        ],
        registry: hub,
        mirror,
        signal,
      }),
    );
    assert.equal(none.param, "adapters.1.file");
    assert.match(none.message, /o\/peft-only @ c{12} has no \.gguf file: llama\.cpp loads LoRA adapters converted to GGUF/);
    const missing = await refusal(planAdapters({ adapters: [{ repo: "o/many-lora", file: "c.gguf", name: "c" }], registry: hub, mirror, signal }));
    assert.equal(missing.code, "adapter_file_not_found");
    assert.match(missing.message, /has no file 'c\.gguf'; its \.gguf files: a-F16\.gguf, a-Q8_0\.gguf, sub\/b\.gguf\. Name one of them/);
    const absent = await refusal(planAdapters({ adapters: [{ repo: "o/gone", name: "g" }], registry: hub, mirror, signal }));
    assert.equal(absent.code, "repo_not_found", "the registry's own answer (not found, gated, private) goes through as it is");
  });
});

describe("the mirror step with adapters", () => {
  const version = (model: string, files: Array<[string, number]>): PlannedFetch => ({
    model,
    version: "v1",
    repo: model.replace("--", "/"),
    revision: SHA,
    files: files.map(([path, size]) => ({ path, url: `https://hub.test/${path}`, sha256: "e".repeat(64), size })),
    totalBytes: files.reduce((sum, [, size]) => sum + size, 0),
  });

  test("the adapters' versions are fetched after the weights, with the registry's headers again and progress over all", async () => {
    const calls: FetchVersionOptions[] = [];
    const fake = {
      async fetchVersion(options: FetchVersionOptions): Promise<FetchVersionSummary> {
        calls.push(options);
        // An adapter already in the mirror is skipped; the weights are fetched.
        const skipped = options.model !== "o--base";
        for (const file of options.files) {
          options.onProgress?.({
            model: options.model,
            version: options.version,
            file: file.path,
            state: "complete",
            bytesDone: file.size ?? 0,
            bytesTotal: file.size,
          });
        }
        const files = options.files.map((file) => ({
          file: file.path,
          state: "complete" as const,
          skipped,
          resumedFrom: 0,
          bytesFetched: skipped ? 0 : (file.size ?? 0),
          bytesTotal: file.size,
          sha256: file.sha256,
          error: null,
        }));
        return {
          model: options.model,
          version: options.version,
          repo: options.repo,
          revision: options.revision,
          complete: true,
          files,
          fetched: skipped ? 0 : files.length,
          skipped: skipped ? files.length : 0,
          failed: 0,
          bytesFetched: 0,
        };
      },
    } as unknown as Mirror;
    const progress: Array<Parameters<StepHandle["progress"]>[0]> = [];
    const step: StepHandle = { detail: () => undefined, progress: (p) => progress.push(p) };
    const detail = await mirrorFiles({
      planned: version("o--base", [["base.gguf", 1000]]),
      alongside: [version("o--style", [["style.gguf", 24]])],
      mirror: fake,
      registry: registry({}),
      step,
      signal: new AbortController().signal,
    });
    assert.deepEqual(
      calls.map((c) => `${c.model}/${c.version}: ${c.files.map((f) => `${f.path} ${f.headers?.authorization ?? "no headers"}`).join(", ")}`),
      ["o--base/v1: base.gguf Bearer secret", "o--style/v1: style.gguf Bearer secret"],
    );
    assert.equal(detail, "2 files verified (1 KiB): 1 fetched, 1 already in the mirror");
    const last = progress.at(-1)!;
    assert.equal(last.bytes_total, 1024);
    assert.equal(last.bytes_done, 1024);
    assert.deepEqual([last.files_done, last.files_total], [2, 2]);
    assert.ok(
      progress.every((p) => p.bytes_total === 1024 && p.files_total === 2),
      "one total over the weights and the adapters",
    );
  });
});
