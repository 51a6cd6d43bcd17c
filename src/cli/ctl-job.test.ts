// `llmgw ctl` jobs: followJob against a scripted client (step lines once each and in order,
// the mirror's progress bar, the smoke test's reply, failed/cancelled/waiting ends, a lost
// server), `model serve`'s flags → request body and refusals, an example in every leaf
// command's --help, and the serve command as a child process against a loopback stand-in
// for the serve-job routes of notes/serve-api.md (the real routes are another module's).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Command } from "commander";
import { BadRequestError, LlmgwError, NotFoundError, UpstreamError } from "../core/errors.ts";
import type { AdminClient } from "./admin-client.ts";
import { registerCtl } from "./ctl.ts";
import { currentStep, describeJobEnd, followJob, type JobStep, type JobStepProgress, type JobView } from "./ctl-job.ts";
import { serveBodyFromFlags } from "./ctl-model-flags.ts";

const JOB_ID = "job-0c9d2f3e";
const REGISTRY_DETAIL = "llmgw-test/tiny-llama-GGUF@1a2b3c4d: Q4_K_M, 1 file, 2.1 MB";

type StepSpec = [name: string, state: JobStep["state"], detail?: string | null, progress?: JobStepProgress];

function jobView(state: JobView["state"], steps: StepSpec[], extra: Partial<JobView> = {}): JobView {
  return {
    id: JOB_ID,
    kind: "serve",
    state,
    request: { repo: "llmgw-test/tiny-llama-GGUF", quant: "Q4_K_M" },
    model: "tiny-llama",
    steps: steps.map(([name, stepState, detail = null, progress]) => ({
      name,
      state: stepState,
      detail,
      started_at: null,
      finished_at: null,
      ...(progress === undefined ? {} : { progress }),
    })),
    error: null,
    result: null,
    resumed: 0,
    created_by: "admin:root",
    created_at: new Date().toISOString(),
    updated_at: new Date().toISOString(),
    finished_at: null,
    ...extra,
  };
}

/** A client whose GETs of the job answer the scripted views in turn (the last one again after the end). */
function scriptedClient(script: Array<JobView | Error>): Pick<AdminClient, "call"> & { calls: string[] } {
  const calls: string[] = [];
  let next = 0;
  return {
    calls,
    call: async <T>(method: string, pathname: string): Promise<T> => {
      calls.push(`${method} ${pathname}`);
      const answer = script[Math.min(next, script.length - 1)]!;
      next += 1;
      if (answer instanceof Error) throw answer;
      return structuredClone(answer) as T;
    },
  };
}

const progress = (done: number): JobStepProgress => ({
  bytes_done: done,
  bytes_total: 2 * 1024 * 1024,
  bytes_per_second: 512 * 1024,
  eta_seconds: 2,
  files_done: 0,
  files_total: 1,
});
const pending = (...names: string[]): StepSpec[] => names.map((name) => [name, "pending"]);

describe("followJob", () => {
  test("prints each step once as it starts and once as it ends, in step order, then the smoke test's reply and tokens/s", async () => {
    const client = scriptedClient([
      jobView("queued", pending("registry", "mirror", "check", "catalog", "placement", "smoke_test")),
      jobView("running", [["registry", "running"], ...pending("mirror", "check", "catalog", "placement", "smoke_test")]),
      jobView("running", [
        ["registry", "done", REGISTRY_DETAIL],
        ["mirror", "running", "fetching 1 file", progress(1024 * 1024)],
        ...pending("check", "catalog", "placement", "smoke_test"),
      ]),
      jobView("running", [
        ["registry", "done", REGISTRY_DETAIL],
        ["mirror", "running", "fetching 1 file", progress(1536 * 1024)],
        ...pending("check", "catalog", "placement", "smoke_test"),
      ]),
      // Several steps move between two polls: their lines still come in step order.
      jobView("running", [
        ["registry", "done", REGISTRY_DETAIL],
        ["mirror", "done", "1 file verified, 2.0 MiB"],
        ["check", "done", "llama, 1.1B, fits 1 CPU node"],
        ["catalog", "done", "added 'tiny-llama'"],
        ["placement", "running", "starting 1 replica"],
        ["smoke_test", "pending"],
      ]),
      jobView(
        "done",
        [
          ["registry", "done", REGISTRY_DETAIL],
          ["mirror", "done", "1 file verified, 2.0 MiB"],
          ["check", "done", "llama, 1.1B, fits 1 CPU node"],
          ["catalog", "done", "added 'tiny-llama'"],
          ["placement", "done", "1 replica ready on node-a"],
          ["smoke_test", "done", "replied in 0.4 s"],
        ],
        { result: { reply: "Hello\nthere", tokens_per_second: 42.46, completion_tokens: 8, replica: "tiny-llama-1", node: "node-a" } },
      ),
    ]);
    const lines: string[] = [];
    const job = await followJob(client, JOB_ID, { draw: false, out: (line) => lines.push(line), pollMs: 0 });

    assert.equal(job.state, "done");
    assert.equal(client.calls.length, 6, "stops polling once the job is done");
    assert.ok(client.calls.every((call) => call === `GET /api/v1/jobs/${JOB_ID}`));
    assert.deepEqual(lines, [
      "… registry   running",
      `✓ registry   ${REGISTRY_DETAIL}`,
      "… mirror     fetching 1 file",
      "✓ mirror     1 file verified, 2.0 MiB",
      "✓ check      llama, 1.1B, fits 1 CPU node",
      "✓ catalog    added 'tiny-llama'",
      "… placement  starting 1 replica",
      "✓ placement  1 replica ready on node-a",
      "✓ smoke_test replied in 0.4 s",
      'Smoke test: tiny-llama-1 on node-a replied "Hello there" (42.5 tokens/s, 8 tokens)',
    ]);
    assert.deepEqual(describeJobEnd(job), { summary: `Done: 'tiny-llama' is served (job ${JOB_ID}).`, problem: null });
  });

  test("draws the mirror step's bytes, speed and time left; a terminal redraws one line and clears it before the next step line", async () => {
    const mirroring = (done: number) =>
      jobView("running", [["registry", "done", REGISTRY_DETAIL], ["mirror", "running", "fetching 1 file", progress(done)], ...pending("check")]);
    const script = [
      mirroring(1024 * 1024),
      mirroring(1536 * 1024),
      jobView(
        "failed",
        [
          ["registry", "done", REGISTRY_DETAIL],
          ["mirror", "done", "verified"],
          ["check", "failed", "the weights do not match"],
        ],
        { error: "the weights do not match" },
      ),
    ];

    const log: string[] = [];
    const terminal = { isTTY: true, write: (text: string) => log.push(`err:${text}`) };
    await followJob(scriptedClient(script), JOB_ID, { draw: true, out: (line) => log.push(`out:${line}`), progressTo: terminal, pollMs: 0 });
    const bars = log.filter((entry) => entry.startsWith("err:\r["));
    assert.equal(bars.length, 2, "one redraw per poll while the mirror step runs");
    assert.match(bars[0]!, /\[#{15}-{15}\] {2}50\.0% 1 MiB \/ 2 MiB {2}512 KiB\/s {2}2s left {2}0\/1 file/);
    assert.match(bars[1]!, / {2}75\.0% 2 MiB \/ 2 MiB/);
    const mirrorDone = log.indexOf("out:✓ mirror     verified");
    assert.equal(log[mirrorDone - 1], "err:\r\u001b[K", "the bar is cleared before the step line");

    // Not a terminal: a plain line, at most one every 5 s (both polls here come within it).
    const plain: string[] = [];
    await followJob(scriptedClient(script), JOB_ID, {
      draw: true,
      out: () => {},
      progressTo: { isTTY: false, write: (text: string) => plain.push(text) },
      pollMs: 0,
    });
    assert.equal(plain.length, 1);
    assert.match(plain[0]!, /^\[#+-+\] {2}50\.0% 1 MiB \/ 2 MiB .*\n$/);
  });

  test("a failed job ends the follow with the failed step marked and the error flagged; steps passed over show as such", async () => {
    const lines: string[] = [];
    const job = await followJob(
      scriptedClient([
        jobView("running", [["registry", "running", "resolving main"], ...pending("mirror", "check")]),
        jobView(
          "failed",
          [
            ["registry", "done", REGISTRY_DETAIL],
            ["mirror", "skipped", "already mirrored"],
            ["check", "failed", "no node has 9 GiB free"],
          ],
          {
            error: "No node can run tiny-llama:\nit needs 9 GiB. Add a node or pick a smaller --quant.",
          },
        ),
      ]),
      JOB_ID,
      { draw: false, out: (line) => lines.push(line), pollMs: 0 },
    );
    assert.equal(job.state, "failed");
    assert.deepEqual(lines, [
      "… registry   resolving main",
      `✓ registry   ${REGISTRY_DETAIL}`,
      "- mirror     already mirrored",
      "✗ check      no node has 9 GiB free",
    ]);
    assert.deepEqual(describeJobEnd(job), {
      summary: null,
      problem: `Job ${JOB_ID} failed at check: No node can run tiny-llama: it needs 9 GiB. Add a node or pick a smaller --quant.`,
    });
  });

  test("a job that waits for room ends the follow with its waiting step's line", async () => {
    const lines: string[] = [];
    const job = await followJob(
      scriptedClient([
        jobView("running", [["catalog", "done", "added 'tiny-llama'"], ["placement", "running", "placing a replica"], ...pending("smoke_test")]),
        jobView("waiting", [
          ["catalog", "done", "added 'tiny-llama'"],
          ["placement", "waiting", "waiting for room: node-a: 0.25 of 2 cores free, needs 0.5"],
          ...pending("smoke_test"),
        ]),
      ]),
      JOB_ID,
      { draw: false, out: (line) => lines.push(line), pollMs: 0 },
    );
    assert.equal(job.state, "waiting");
    assert.deepEqual(lines.slice(-2), ["… placement  placing a replica", "~ placement  waiting for room: node-a: 0.25 of 2 cores free, needs 0.5"]);
  });

  test("cancelled jobs are a problem, jobs waiting for room are not", () => {
    const cancelled = describeJobEnd(
      jobView("cancelled", [
        ["registry", "done", REGISTRY_DETAIL],
        ["mirror", "cancelled"],
      ]),
    );
    assert.equal(cancelled.problem, `Job ${JOB_ID} was cancelled.`);
    const waiting = describeJobEnd(jobView("waiting", [["placement", "done", "no room yet"]], { error: "every h100 is taken" }));
    assert.equal(waiting.problem, null);
    assert.match(waiting.summary!, /'tiny-llama' is in the catalog and waits for room: every h100 is taken\..*'llmgw ctl model show tiny-llama'/);
    assert.match(waiting.summary!, new RegExp(`job ${JOB_ID} then goes on by itself to its smoke test`));
  });

  test("rides out a server that is briefly unreachable, gives up in one line naming the job after the limit, and does not retry HTTP errors", async () => {
    const refused = () => new UpstreamError("Cannot reach llmgw", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
    const done = jobView("done", [["registry", "done", REGISTRY_DETAIL]]);
    const recovered = scriptedClient([refused(), new LlmgwError({ message: "Bad gateway", code: "http_error", status: 502 }), done]);
    assert.equal((await followJob(recovered, JOB_ID, { draw: false, out: () => {}, pollMs: 0, lostAfterMs: 60_000 })).state, "done");
    assert.equal(recovered.calls.length, 3);

    await assert.rejects(followJob(scriptedClient([refused()]), JOB_ID, { draw: false, out: () => {}, pollMs: 0, lostAfterMs: 0 }), (error: LlmgwError) => {
      assert.equal(error.code, "job_follow_lost");
      assert.doesNotMatch(error.message, /\n/);
      assert.match(error.message, new RegExp(`ECONNREFUSED.*job ${JOB_ID}.*'llmgw ctl job watch ${JOB_ID}'`));
      return true;
    });

    const missing = scriptedClient([new NotFoundError("No job 'x'.", { code: "job_not_found" }), done]);
    await assert.rejects(followJob(missing, JOB_ID, { draw: false, out: () => {}, pollMs: 0 }), /No job 'x'/);
    assert.equal(missing.calls.length, 1);
  });

  test("leaves no SIGINT listener behind", async () => {
    const before = process.listenerCount("SIGINT");
    await followJob(scriptedClient([jobView("done", [])]), JOB_ID, { draw: false, out: () => {}, pollMs: 0 });
    await assert.rejects(followJob(scriptedClient([new Error("boom")]), JOB_ID, { draw: false, out: () => {}, pollMs: 0 }));
    assert.equal(process.listenerCount("SIGINT"), before);
  });
});

test("the STEP of 'job list' is where the job is: running, the step it failed or was cancelled at, else the last that ran", () => {
  const update = (state: JobView["state"], steps: StepSpec[]) => jobView(state, steps, { kind: "update", request: { model: "tiny-llama" } });
  const done: StepSpec[] = [
    ["registry", "done"],
    ["mirror", "done"],
    ["check", "done"],
    ["catalog", "done"],
  ];
  // A failed rollout: the steps after it are skipped, and the failure is at rollout.
  assert.equal(currentStep(update("failed", [...done, ["rollout", "failed", "no room"], ["smoke_test", "skipped"], ["retire", "skipped"]]))?.name, "rollout");
  assert.equal(currentStep(update("cancelled", [...done, ["rollout", "cancelled"], ["smoke_test", "cancelled"], ["retire", "cancelled"]]))?.name, "rollout");
  assert.equal(currentStep(update("running", [...done, ["rollout", "running"], ["smoke_test", "pending"], ["retire", "pending"]]))?.name, "rollout");
  // Nothing to update: the steps after the registry's answer are skipped.
  assert.equal(
    currentStep(
      update("done", [
        ["registry", "done"],
        ["mirror", "skipped"],
        ["retire", "skipped"],
      ]),
    )?.name,
    "registry",
  );
  assert.equal(currentStep(update("done", [...done, ["rollout", "done"], ["smoke_test", "done"], ["retire", "done"]]))?.name, "retire");
});

describe("serveBodyFromFlags", () => {
  test("maps the flags to the serve job's snake_case body, sending only what was given", () => {
    assert.deepEqual(serveBodyFromFlags("llmgw-test/tiny-llama-GGUF", {}), { repo: "llmgw-test/tiny-llama-GGUF" });
    assert.deepEqual(
      serveBodyFromFlags("llmgw-test/tiny-llama-GGUF", {
        revision: "v2",
        quant: "Q4_K_M",
        format: "gguf",
        projector: true,
        gpuClass: "h100",
        gpusPerNode: "2",
        fallbacks: true,
        name: "tiny",
        alias: ["small", "t"],
        onDemand: true,
        guardFormat: "llamaguard3",
        ctxPool: "8192",
        context: "4096",
      }),
      {
        repo: "llmgw-test/tiny-llama-GGUF",
        revision: "v2",
        quant: "Q4_K_M",
        format: "gguf",
        projector: true,
        hardware: { gpu: { class: "h100", gpus_per_node: 2, nodes: 1 } },
        fallbacks: true,
        name: "tiny",
        aliases: ["small", "t"],
        replicas: 0,
        guard_format: "llamaguard3",
        ctx_pool: 8192,
        context: 4096,
      },
    );
    assert.deepEqual(serveBodyFromFlags("o/n", { file: "x.gguf", projector: "mmproj.gguf", cpu: true, replicas: "3" }), {
      repo: "o/n",
      file: "x.gguf",
      projector: "mmproj.gguf",
      hardware: { cpu: {} },
      replicas: 3,
    });
    assert.deepEqual(serveBodyFromFlags("o/n", { gpuClass: "a100", nodes: "2" }).hardware, { gpu: { class: "a100", gpus_per_node: 1, nodes: 2 } });
  });

  test("sends a local repository path absolute", () => {
    assert.equal(serveBodyFromFlags("./models/tiny.gguf", {}).repo, path.resolve("models/tiny.gguf"));
  });

  test("refuses contradicting flags in one line that says what to do", () => {
    const refusals: Array<[Record<string, unknown>, RegExp]> = [
      [{ quant: "Q4_K_M", file: "x.gguf" }, /Give --quant or --file, not both/],
      [{ replicas: "2", onDemand: true }, /Give --replicas N or --on-demand, not both/],
      [{ cpu: true, gpuClass: "h100" }, /Give --cpu or --gpu-class C, not both/],
      [{ gpusPerNode: "2" }, /--gpus-per-node and --nodes .*add --gpu-class C/],
      [{ nodes: "2", cpu: true }, /--gpus-per-node and --nodes .*add --gpu-class C/],
      [{ format: "onnx" }, /Invalid --format 'onnx': use gguf or safetensors/],
      [{ guardFormat: "llama-guard-3" }, /Invalid --guard-format 'llama-guard-3': use llamaguard3, shieldgemma or json/],
      [{ replicas: "-1" }, /Invalid --replicas '-1'/],
      [{ gpuClass: "h100", gpusPerNode: "0" }, /Invalid --gpus-per-node '0'/],
    ];
    for (const [options, message] of refusals) {
      assert.throws(
        () => serveBodyFromFlags("o/n", options),
        (error: Error) => error instanceof BadRequestError && message.test(error.message) && !error.message.includes("\n"),
        JSON.stringify(options),
      );
    }
  });
});

/** Every command under `ctl` that has no subcommands, as "model serve", "replicas", ... */
function leafCommands(command: Command, prefix: string[] = []): Array<{ name: string; command: Command }> {
  if (command.commands.length === 0) return [{ name: prefix.join(" "), command }];
  return command.commands.flatMap((child) => leafCommands(child, [...prefix, child.name()]));
}

test("every leaf ctl command shows an example under --help", () => {
  const program = new Command("llmgw");
  registerCtl(program);
  const ctl = program.commands.find((command) => command.name() === "ctl")!;
  const leaves = leafCommands(ctl);
  assert.deepEqual(
    leaves.map((leaf) => leaf.name).sort(),
    [
      "model list",
      "model show",
      "model add",
      "model edit",
      "model serve",
      "model update",
      "model rollback",
      "model check-updates",
      "model scale",
      "model remove",
      "model unpark",
      "model plan",
      "job list",
      "job show",
      "job watch",
      "job cancel",
      "mirror fetch",
      "mirror list",
      "mirror verify",
      "mirror rm",
      "mirror replicate",
      "node list",
      "node show",
      "node drain",
      "node undrain",
      "node update",
      "node remove",
      "node join-token",
      "key create",
      "key list",
      "key show",
      "key update",
      "key revoke",
      "notify add",
      "notify list",
      "notify update",
      "notify enable",
      "notify rm",
      "notify test",
      "notify log",
      "replicas",
      "usage",
      "events",
      "cluster status",
    ].sort(),
  );
  for (const { name, command } of leaves) {
    // addHelpText's text is written by outputHelp (what --help runs), not by helpInformation().
    let help = "";
    command.configureOutput({ writeOut: (text) => (help += text) });
    command.outputHelp();
    assert.match(help, /\nExamples?:\n {2}llmgw ctl \S/, `'ctl ${name} --help' has no example`);
    assert.match(help, new RegExp(`llmgw ctl ${name}\\b`), `the example of 'ctl ${name}' runs that command`);
    assert.ok(
      command.options.some((option) => option.long === "--json"),
      `'ctl ${name}' has --json`,
    );
  }
  const model = ctl.commands.find((command) => command.name() === "model")!;
  assert.deepEqual(model.commands.find((command) => command.name() === "remove")?.aliases(), ["rm"]);
});

describe("ctl model serve as a child process", () => {
  const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));
  const run = promisify(execFile);
  let server: Server;
  let url: string;
  const received: Array<{ method: string; url: string; body: unknown }> = [];
  let finalJob: JobView;

  before(async () => {
    // Stands in for the serve-job routes: POST answers 202 with the queued job, GET with `finalJob`.
    server = createServer((request, response) => {
      let text = "";
      request.on("data", (chunk) => (text += chunk));
      request.on("end", () => {
        received.push({ method: request.method!, url: request.url!, body: text === "" ? null : JSON.parse(text) });
        const send = (status: number, body: unknown) => response.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
        if (request.method === "POST" && request.url === "/api/v1/jobs/serve") return send(202, jobView("queued", pending("registry", "mirror")));
        if (request.method === "GET" && request.url === `/api/v1/jobs/${JOB_ID}`) return send(200, finalJob);
        send(404, { error: { message: `No route ${request.method} ${request.url}`, type: "not_found", code: "not_found", param: null } });
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  after(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const ctl = (args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", url, "--key", "sk-admin", ...args], { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });

  test("--detach posts the body and prints the job id alone on stdout, how to follow it on stderr", async () => {
    received.length = 0;
    const { stdout, stderr } = await ctl([
      "model",
      "serve",
      "llmgw-test/tiny-llama-GGUF",
      "--quant",
      "Q4_K_M",
      "--gpu-class",
      "h100",
      "--gpus-per-node",
      "2",
      "--on-demand",
      "--alias",
      "a",
      "b",
      "--detach",
    ]);
    assert.deepEqual(received, [
      {
        method: "POST",
        url: "/api/v1/jobs/serve",
        body: {
          repo: "llmgw-test/tiny-llama-GGUF",
          quant: "Q4_K_M",
          hardware: { gpu: { class: "h100", gpus_per_node: 2, nodes: 1 } },
          aliases: ["a", "b"],
          replicas: 0,
        },
      },
    ]);
    // What README promises: `--detach` returns the job id, usable as `job=$(llmgw ctl model serve ... --detach)`.
    assert.equal(stdout, `${JOB_ID}\n`);
    assert.match(
      stderr,
      new RegExp(`Started job ${JOB_ID}: serve llmgw-test/tiny-llama-GGUF as 'tiny-llama'\\. Follow it with 'llmgw ctl job watch ${JOB_ID}'`),
    );
  });

  test("a followed job that fails exits 1 with its error in one line on stderr; --json prints the final job", async () => {
    finalJob = jobView(
      "failed",
      [
        ["registry", "done", REGISTRY_DETAIL],
        ["mirror", "failed", "disk full"],
      ],
      { error: "The mirror's disk is full: free 3 GiB and run it again." },
    );
    await assert.rejects(ctl(["model", "serve", "llmgw-test/tiny-llama-GGUF"]), (error: { code: number; stdout: string; stderr: string }) => {
      assert.equal(error.code, 1);
      assert.match(error.stdout, /✓ registry {3}llmgw-test\/tiny-llama-GGUF@1a2b3c4d[^\n]*\n✗ mirror {5}disk full\n/);
      assert.equal(error.stderr, `error: Job ${JOB_ID} failed at mirror: The mirror's disk is full: free 3 GiB and run it again.\n`);
      return true;
    });
    await assert.rejects(ctl(["model", "serve", "llmgw-test/tiny-llama-GGUF", "--json"]), (error: { code: number; stdout: string }) => {
      assert.equal(error.code, 1);
      assert.equal(JSON.parse(error.stdout).state, "failed");
      return true;
    });

    finalJob = jobView("done", [["registry", "done", REGISTRY_DETAIL]], {
      result: { reply: "Hi", tokens_per_second: 12, completion_tokens: 2, replica: "r1", node: "n1" },
    });
    const { stdout } = await ctl(["model", "serve", "llmgw-test/tiny-llama-GGUF"]);
    assert.match(stdout, /Smoke test: r1 on n1 replied "Hi" \(12\.0 tokens\/s, 2 tokens\)\nDone: 'tiny-llama' is served/);
  });

  test("contradicting flags are refused before anything is sent", async () => {
    received.length = 0;
    await assert.rejects(ctl(["model", "serve", "o/n", "--quant", "Q4_K_M", "--file", "x.gguf"]), (error: { code: number; stderr: string }) => {
      assert.equal(error.code, 1);
      assert.match(error.stderr, /^error: Give --quant or --file, not both/);
      return true;
    });
    assert.equal(received.length, 0);
  });
});
