// What a node reports about itself, detected through real child processes: stand-in
// executables for nvidia-smi, llama-server and vllm (none of them runs here) written into a
// temporary folder that is the whole PATH of the probes, each saying which real behaviour
// it stands for. Also inventory files in both forms and `--labels`.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { BadRequestError } from "../core/errors.ts";
import { eventually } from "../../test/support/eventually.ts";
import { BUNDLED_ENGINE, detectInventory, parseLabels, parseNvidiaSmiGpus, readInventoryFile } from "./inventory.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

let root: string;
let folders = 0;

before(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), "llmgw-inventory-"));
});

after(async () => {
  await rm(root, { recursive: true, force: true });
});

/** A fresh folder holding the given shell scripts; the probes' PATH is this folder alone. */
async function binFolder(scripts: Record<string, string>): Promise<{ dir: string; env: NodeJS.ProcessEnv }> {
  folders += 1;
  const dir = path.join(root, `bin-${folders}`);
  await mkdir(dir);
  for (const [name, body] of Object.entries(scripts)) {
    const file = path.join(dir, name);
    await writeFile(file, `#!/bin/sh\n${body.trim()}\n`);
    await chmod(file, 0o755);
  }
  return { dir, env: { PATH: dir } };
}

// Stands in for nvidia-smi on a node with two H100 SXM GPUs: the real one answers the
// inventory query with one "index, name, memory.total" line per GPU, memory in MiB. It
// records its arguments so the test sees the exact query.
const twoH100s = `
echo "$@" > "\${0%/*}/nvidia-smi.args"
echo "0, NVIDIA H100 80GB HBM3, 81559 MiB"
echo "1, NVIDIA H100 80GB HBM3, 81559 MiB"
`;

// Stands in for nvidia-smi on a machine whose NVIDIA driver is not loaded: the real one
// prints this and exits with code 9.
const driverNotLoaded = `
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
`;

// Stands in for an nvidia-smi that answers exit 0 but not in the queried format (a wrapper
// script, or a GPU whose memory the driver cannot read and reports as "[N/A]").
const garbage = `
echo "0, NVIDIA H100 80GB HBM3, 81559 MiB"
echo "1, NVIDIA H100 80GB HBM3, [N/A]"
`;

// Stands in for llama-server's --version: it prints its build number and commit, then the
// compiler, on stderr, and exits 0 (ggml-org/llama.cpp common/common.cpp print_build_info).
const llamaServer = `
echo "version: 4567 (abc1234)" >&2
echo "built with cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0 for x86_64-linux-gnu" >&2
`;

// Stands in for vllm --version: a log line from platform detection, then the version on stdout.
const vllm = `
echo "INFO 10-05 12:00:00 __init__.py:183] Automatically detected platform cuda."
echo "0.6.3.post1"
`;

// Stands in for a vllm whose --version hangs (importing torch can block on a broken CUDA
// install), after forking a helper; both record their pids so the test can see them killed.
const hangingVllm = `
/bin/sleep 300 &
echo $! > "\${0%/*}/helper.pid"
echo $$ > "\${0%/*}/vllm.pid"
wait
`;

/** True while the process runs (a zombie, which nobody may reap in a container, counts as gone). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

async function expectGone(pidFile: string): Promise<void> {
  const pid = Number(await readFile(pidFile, "utf8"));
  assert.ok(pid > 0, `no pid in ${pidFile}`);
  // SIGKILL is immediate, but the kernel's teardown of the process is not.
  await eventually(`process ${pid} (${path.basename(pidFile)}) to end`, () => !running(pid));
}

/** Whether the stand-in wrote every one of these pid files whole. */
async function pidsWritten(pidFiles: readonly string[]): Promise<boolean> {
  const texts = await Promise.all(pidFiles.map((file) => readFile(file, "utf8").catch(() => "")));
  return texts.every((text) => text.endsWith("\n"));
}

/**
 * Runs `attempt` with a probe timeout of 1 s, then 2 s, 4 s... until the hanging stand-in had
 * forked its helper and written both pids before the timeout killed it, and returns that
 * timeout. On a loaded machine the shell may not even have started within the first one;
 * the kill is then right, but there is no helper whose end the test could check.
 */
async function withStartedStandIn(pidFiles: readonly string[], attempt: (timeoutMs: number) => Promise<void>): Promise<number> {
  for (let timeoutMs = 1_000; ; timeoutMs *= 2) {
    for (const file of pidFiles) await rm(file, { force: true });
    await attempt(timeoutMs);
    if (await pidsWritten(pidFiles)) return timeoutMs;
    assert.ok(timeoutMs < 64_000, `the stand-in wrote no pids within ${timeoutMs / 1000} s of starting`);
  }
}

function probeFailure(...mentions: RegExp[]) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof BadRequestError, `expected a BadRequestError, got ${String(error)}`);
    assert.equal(error.code, "inventory_probe_failed", error.message);
    for (const mention of mentions) assert.match(error.message, mention);
    return true;
  };
}

describe("detectInventory", () => {
  test("reports this machine's cores and memory, the GPUs nvidia-smi lists, and the bundled engine", async () => {
    const { dir, env } = await binFolder({ "nvidia-smi": twoH100s });
    const { inventory, warnings } = await detectInventory({ env });
    assert.equal(inventory.cores, os.availableParallelism());
    assert.equal(inventory.memoryBytes, os.totalmem());
    assert.deepEqual(inventory.gpus, [
      { index: 0, name: "NVIDIA H100 80GB HBM3", class: "H100", memoryBytes: 81559 * MiB },
      { index: 1, name: "NVIDIA H100 80GB HBM3", class: "H100", memoryBytes: 81559 * MiB },
    ]);
    assert.deepEqual(inventory.engines, [{ engine: "llamacpp", version: "3.21.1" }]);
    assert.deepEqual(warnings, []);
    assert.equal((await readFile(path.join(dir, "nvidia-smi.args"), "utf8")).trim(), "--query-gpu=index,name,memory.total --format=csv,noheader");
  });

  test("no nvidia-smi on PATH: no GPUs, and nothing to warn about", async () => {
    const { env } = await binFolder({});
    const { inventory, warnings } = await detectInventory({ env });
    assert.deepEqual(inventory.gpus, []);
    assert.deepEqual(inventory.engines, [BUNDLED_ENGINE]);
    assert.deepEqual(warnings, []);
  });

  test("an nvidia-smi that fails (no driver) or prints garbage: no GPUs and a warning that says why", async () => {
    const failing = await binFolder({ "nvidia-smi": driverNotLoaded });
    const failed = await detectInventory({ env: failing.env });
    assert.deepEqual(failed.inventory.gpus, []);
    assert.equal(failed.warnings.length, 1);
    assert.match(failed.warnings[0]!, /nvidia-smi exited with code 9: 'NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver/);
    assert.match(failed.warnings[0]!, /this node reports no GPUs/);

    const unreadable = await binFolder({ "nvidia-smi": garbage });
    const partly = await detectInventory({ env: unreadable.env });
    // One unreadable line makes the whole answer unreadable: half a node's GPUs would mislead placement.
    assert.deepEqual(partly.inventory.gpus, []);
    assert.match(partly.warnings[0] ?? "", /'1, NVIDIA H100 80GB HBM3, \[N\/A\]'/);
  });

  test("a configured nvidia-smi path that does not exist is an error naming it", async () => {
    const { dir, env } = await binFolder({});
    const missing = path.join(dir, "no-such-nvidia-smi");
    await assert.rejects(detectInventory({ env, nvidiaSmiPath: missing }), probeFailure(new RegExp(`not found at ${missing}`)));
  });

  test("llama-server --version: the build number and commit from its stderr", async () => {
    const { dir, env } = await binFolder({ "llama-server": llamaServer });
    const { inventory } = await detectInventory({ env, llamaServerPath: path.join(dir, "llama-server") });
    assert.deepEqual(inventory.engines, [BUNDLED_ENGINE, { engine: "llama-server", version: "4567 (abc1234)" }]);
  });

  test("llama-server built from source or by a distribution: its version line as printed; an unknown build joins with a warning", async () => {
    // Stand in for the two other shapes llama.cpp builds print (common/common.cpp
    // print_build_info): a build from the source node-llama-cpp ships ("0.4.0-dev", build
    // 1, its commit), and a distribution package built outside git ("0 (unknown)").
    const { dir, env } = await binFolder({
      "from-source": `echo "version: 0.4.0-dev (build 1, commit 80fb11a)" >&2; echo "built with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu" >&2`,
      distribution: `echo "version: 0 (unknown)" >&2; echo "built with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu" >&2`,
      release: llamaServer,
    });
    const fromSource = await detectInventory({ env, llamaServerPath: path.join(dir, "from-source") });
    assert.deepEqual(fromSource.inventory.engines[1], { engine: "llama-server", version: "0.4.0-dev (build 1, commit 80fb11a)" });
    assert.deepEqual(fromSource.warnings, [], "the bundled engine's own source is a known build");

    const distribution = await detectInventory({ env, llamaServerPath: path.join(dir, "distribution") });
    assert.deepEqual(distribution.inventory.engines[1], { engine: "llama-server", version: "0 (unknown)" });
    assert.equal(distribution.warnings.length, 1);
    assert.match(
      distribution.warnings[0]!,
      new RegExp(`llama-server at ${dir}/distribution reports version '0 \\(unknown\\)', a build llmgw has no architecture list for`),
    );
    assert.match(distribution.warnings[0]!, /newest build llmgw knows/);

    const release = await detectInventory({ env, llamaServerPath: path.join(dir, "release") });
    assert.deepEqual(release.inventory.engines[1], { engine: "llama-server", version: "4567 (abc1234)" });
    assert.match(release.warnings[0] ?? "", /reports version '4567 \(abc1234\)'/, "a release llmgw has no list for is accepted with a warning too");
  });

  test("a CUDA build of llama-server lists its devices before the version line", async () => {
    // Stands in for a CUDA llama-server, whose --version first initialises ggml-cuda and prints the devices on stderr.
    const { dir, env } = await binFolder({
      "llama-server": `
echo "ggml_cuda_init: found 1 CUDA devices:" >&2
echo "  Device 0: NVIDIA H100 80GB HBM3, compute capability 9.0, VMM: yes" >&2
${llamaServer}`,
    });
    const { inventory } = await detectInventory({ env, llamaServerPath: path.join(dir, "llama-server") });
    assert.deepEqual(inventory.engines[1], { engine: "llama-server", version: "4567 (abc1234)" });
  });

  test("a configured llama-server that is missing, fails or prints no version is an error naming the path", async () => {
    // Stands in for a llama-server binary built against a shared library that is not installed: the loader fails, exit 127.
    const { dir, env } = await binFolder({
      "llama-server": `echo "llama-server: error while loading shared libraries: libcudart.so.12: cannot open shared object file" >&2; exit 127`,
      "not-llama": `echo "usage: something else"`,
    });
    const failing = path.join(dir, "llama-server");
    await assert.rejects(
      detectInventory({ env, llamaServerPath: failing }),
      probeFailure(new RegExp(`llama-server at ${failing} exited with code 127`), /libcudart\.so\.12/),
    );
    const missing = path.join(dir, "nowhere", "llama-server");
    await assert.rejects(detectInventory({ env, llamaServerPath: missing }), probeFailure(new RegExp(`llama-server at ${missing} does not exist`)));
    await assert.rejects(
      detectInventory({ env, llamaServerPath: path.join(dir, "not-llama") }),
      probeFailure(/printed no "version: \.\.\." line/, /usage: something else/),
    );
  });

  test("vllm on PATH is reported with the version it prints after its log lines", async () => {
    const { env } = await binFolder({ vllm });
    const { inventory, warnings } = await detectInventory({ env });
    assert.deepEqual(inventory.engines, [BUNDLED_ENGINE, { engine: "vllm", version: "0.6.3.post1" }]);
    assert.deepEqual(warnings, []);
  });

  test("a configured vllm path is probed instead of PATH", async () => {
    const { env } = await binFolder({});
    const elsewhere = await binFolder({ "vllm-0.6": vllm });
    const { inventory } = await detectInventory({ env, vllmPath: path.join(elsewhere.dir, "vllm-0.6") });
    assert.deepEqual(inventory.engines, [BUNDLED_ENGINE, { engine: "vllm", version: "0.6.3.post1" }]);
  });

  test("a failing vllm on PATH is left out with a warning; a failing configured one is an error", async () => {
    // Stands in for a vllm whose Python environment is broken: the import fails with a traceback and exit 1.
    const broken = `echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1`;
    const { dir, env } = await binFolder({ vllm: broken });
    const { inventory, warnings } = await detectInventory({ env });
    assert.deepEqual(inventory.engines, [BUNDLED_ENGINE]);
    assert.match(
      warnings[0] ?? "",
      /vllm on PATH exited with code 1 on --version: 'ModuleNotFoundError: No module named 'torch''; this node reports no vLLM engine/,
    );
    await assert.rejects(detectInventory({ env, vllmPath: path.join(dir, "vllm") }), probeFailure(new RegExp(`vllm at ${dir}/vllm exited with code 1`)));
  });

  test("a probe that hangs is killed with what it forked when the timeout passes", async () => {
    const { dir, env } = await binFolder({
      "vllm-hangs": hangingVllm,
      vllm: hangingVllm.replace(/helper\.pid/, "path-helper.pid").replace(/vllm\.pid/, "path-vllm.pid"),
    });
    const configured = [path.join(dir, "vllm.pid"), path.join(dir, "helper.pid")];
    await withStartedStandIn(configured, async (timeoutMs) => {
      await assert.rejects(
        detectInventory({ env, vllmPath: path.join(dir, "vllm-hangs"), timeoutMs }),
        probeFailure(new RegExp(`vllm-hangs did not answer --version within ${timeoutMs / 1000} s and was stopped`)),
      );
    });
    for (const file of configured) await expectGone(file);

    // The same vllm found on PATH: a warning, and the node still joins.
    const onPath = [path.join(dir, "path-vllm.pid"), path.join(dir, "path-helper.pid")];
    await withStartedStandIn(onPath, async (timeoutMs) => {
      const { inventory, warnings } = await detectInventory({ env, timeoutMs });
      assert.deepEqual(inventory.engines, [BUNDLED_ENGINE]);
      assert.match(warnings[0] ?? "", new RegExp(`vllm on PATH did not answer --version within ${timeoutMs / 1000} s`));
    });
    for (const file of onPath) await expectGone(file);
  });

  test("an abort stops the probes and rejects with the reason", async () => {
    const { dir, env } = await binFolder({ vllm: hangingVllm });
    const controller = new AbortController();
    // A timeout no test waits for: only the abort ends this probe.
    const detecting = detectInventory({ env, signal: controller.signal, timeoutMs: 3_600_000 });
    // Abort once the stand-in is running with its helper (it has written both pids).
    await eventually("the stand-in to start", () => pidsWritten([path.join(dir, "helper.pid"), path.join(dir, "vllm.pid")]));
    controller.abort(new Error("agent shutting down"));
    await assert.rejects(detecting, /agent shutting down/);
    await expectGone(path.join(dir, "vllm.pid"));
    await expectGone(path.join(dir, "helper.pid"));
  });
});

describe("parseNvidiaSmiGpus", () => {
  test("reads the units nvidia-smi may print and refuses a line without memory", () => {
    const parsed = parseNvidiaSmiGpus("0, NVIDIA L4, 23034 MiB\n1, Tesla T4, 15 GiB\n\n");
    assert.deepEqual(parsed, {
      kind: "ok",
      gpus: [
        { index: 0, name: "NVIDIA L4", class: "L4", memoryBytes: 23034 * MiB },
        { index: 1, name: "Tesla T4", class: "T4", memoryBytes: 15 * GiB },
      ],
    });
    assert.deepEqual(parseNvidiaSmiGpus("No devices were found"), { kind: "unreadable", line: "No devices were found" });
    assert.deepEqual(parseNvidiaSmiGpus("0, NVIDIA L4, 0 MiB"), { kind: "unreadable", line: "0, NVIDIA L4, 0 MiB" });
    assert.deepEqual(parseNvidiaSmiGpus(""), { kind: "ok", gpus: [] });
  });
});

describe("readInventoryFile", () => {
  async function inventoryFile(name: string, content: unknown): Promise<string> {
    const file = path.join(root, name);
    await writeFile(file, typeof content === "string" ? content : JSON.stringify(content));
    return file;
  }

  function fileRefusal(file: string, param: string | null, ...mentions: RegExp[]) {
    return (error: unknown): boolean => {
      assert.ok(error instanceof BadRequestError, `expected a BadRequestError, got ${String(error)}`);
      assert.equal(error.code, "invalid_inventory", error.message);
      assert.equal(error.param, param, error.message);
      assert.ok(error.message.includes(file), `the message names the file: ${error.message}`);
      for (const mention of mentions) assert.match(error.message, mention);
      return true;
    };
  }

  test("the wire form is read as it is", async () => {
    const wire = {
      cores: 16,
      memoryBytes: 128 * GiB,
      gpus: [{ index: 3, name: "NVIDIA GeForce RTX 4090", class: "RTX4090", memoryBytes: 24564 * MiB }],
      engines: [
        { engine: "llamacpp", version: "3.21.1" },
        { engine: "llama-server", version: "4567 (abc1234)" },
      ],
    };
    assert.deepEqual(await readInventoryFile(await inventoryFile("wire.json", wire)), wire);
  });

  test("the friendly form: sizes as strings, indexes by position, classes from names, the bundled engine by default", async () => {
    const file = await inventoryFile("friendly.json", {
      cores: 8,
      memory: "32GiB",
      gpus: [
        { name: "NVIDIA H100 80GB HBM3", memory: "80GiB" },
        { name: "NVIDIA H100 80GB HBM3", memory: 85899345920 },
      ],
    });
    assert.deepEqual(await readInventoryFile(file), {
      cores: 8,
      memoryBytes: 32 * GiB,
      gpus: [
        { index: 0, name: "NVIDIA H100 80GB HBM3", class: "H100", memoryBytes: 80 * GiB },
        { index: 1, name: "NVIDIA H100 80GB HBM3", class: "H100", memoryBytes: 80 * GiB },
      ],
      engines: [BUNDLED_ENGINE],
    });
    const cpuOnly = await inventoryFile("cpu-only.json", { cores: 4, memory: "16g" });
    assert.deepEqual(await readInventoryFile(cpuOnly), { cores: 4, memoryBytes: 16 * GiB, gpus: [], engines: [BUNDLED_ENGINE] });
  });

  test("a class written by hand goes through the class rule; given indexes and engines are kept", async () => {
    const file = await inventoryFile("classes.json", {
      cores: 8,
      memoryBytes: 32 * GiB,
      gpus: [{ index: 2, name: "test GPU", class: "rtx-4090", memory: "24GiB" }],
      engines: [{ engine: "vllm", version: "0.6.3.post1" }],
    });
    const inventory = await readInventoryFile(file);
    assert.deepEqual(inventory.gpus, [{ index: 2, name: "test GPU", class: "RTX4090", memoryBytes: 24 * GiB }]);
    assert.deepEqual(inventory.engines, [{ engine: "vllm", version: "0.6.3.post1" }]);
  });

  test("a missing file or bad JSON is refused naming the file", async () => {
    const missing = path.join(root, "no-such-inventory.json");
    await assert.rejects(readInventoryFile(missing), fileRefusal(missing, null, /does not exist/, /--inventory path/));
    const bad = await inventoryFile("bad.json", "{ cores: 8 }");
    await assert.rejects(readInventoryFile(bad), fileRefusal(bad, null, /not valid JSON/));
  });

  test("a misspelt field, a size that is not one, or an impossible value is refused naming the field", async () => {
    const misspelt = await inventoryFile("misspelt.json", { cores: 8, memory: "32GiB", gpu: [{ name: "NVIDIA L4", memory: "24GiB" }] });
    await assert.rejects(readInventoryFile(misspelt), fileRefusal(misspelt, "gpu", /unknown field 'gpu'/, /Known fields: cores/));
    const gpuTypo = await inventoryFile("gpu-typo.json", { cores: 8, memory: "32GiB", gpus: [{ name: "NVIDIA L4", mem: "24GiB" }] });
    await assert.rejects(readInventoryFile(gpuTypo), fileRefusal(gpuTypo, "gpus.0.mem", /unknown field 'gpus\.0\.mem'/));
    const notASize = await inventoryFile("not-a-size.json", { cores: 8, memory: "lots" });
    await assert.rejects(readInventoryFile(notASize), fileRefusal(notASize, "memory", /'lots' is not a size/));
    const gpuSize = await inventoryFile("gpu-size.json", { cores: 8, memory: "32GiB", gpus: [{ name: "NVIDIA L4", memory: "24 gigs" }] });
    await assert.rejects(readInventoryFile(gpuSize), fileRefusal(gpuSize, "gpus.0.memory"));
    const both = await inventoryFile("both.json", { cores: 8, memory: "32GiB", memoryBytes: 1 });
    await assert.rejects(readInventoryFile(both), fileRefusal(both, "memory", /both memory and memoryBytes/));
    const zeroCores = await inventoryFile("zero-cores.json", { cores: 0, memory: "32GiB" });
    await assert.rejects(readInventoryFile(zeroCores), fileRefusal(zeroCores, "cores", /from 1 to 4096, got 0/));
    const sameIndex = await inventoryFile("same-index.json", {
      cores: 8,
      memory: "32GiB",
      gpus: [
        { name: "NVIDIA L4", memory: "24GiB" },
        { index: 0, name: "NVIDIA L4", memory: "24GiB" },
      ],
    });
    await assert.rejects(readInventoryFile(sameIndex), fileRefusal(sameIndex, "gpus.1.index", /listed twice/));
    const noMemory = await inventoryFile("no-gpu-memory.json", { cores: 8, memory: "32GiB", gpus: [{ name: "NVIDIA L4", memory: 0 }] });
    await assert.rejects(readInventoryFile(noMemory), fileRefusal(noMemory, "gpus.0.memoryBytes"));
  });
});

describe("parseLabels", () => {
  test("key=value pairs separated by commas, spaces and a trailing comma forgiven", () => {
    assert.deepEqual(parseLabels("zone=eu-1, rack=r12,example.com/tier=gold,"), { zone: "eu-1", rack: "r12", "example.com/tier": "gold" });
    assert.deepEqual(parseLabels(""), {});
  });

  test("a pair without '=', a bad key, a bad or empty value and a repeated key are refused naming the pair", () => {
    const refused = (pair: string, why: RegExp) => (error: unknown) => {
      assert.ok(error instanceof BadRequestError);
      assert.equal(error.code, "invalid_labels");
      assert.ok(error.message.includes(`'${pair}'`), error.message);
      assert.match(error.message, why);
      return true;
    };
    assert.throws(() => parseLabels("zone=eu-1,gpu"), refused("gpu", /no '='/));
    assert.throws(() => parseLabels("bad key=x"), refused("bad key=x", /the key must be/));
    assert.throws(() => parseLabels(`zone=${"x".repeat(64)}`), refused(`zone=${"x".repeat(64)}`, /the value must be 1-63/));
    assert.throws(() => parseLabels("zone="), refused("zone=", /the value must be/));
    assert.throws(() => parseLabels("zone=a b"), refused("zone=a b", /the value must be/));
    // Keys begin and end with a letter or digit, like Kubernetes label keys; that also keeps out "__proto__".
    assert.throws(() => parseLabels("-zone=x"), refused("-zone=x", /the key must be/));
    assert.throws(() => parseLabels("__proto__=x"), refused("__proto__=x", /the key must be/));
    assert.throws(() => parseLabels("zone=eu-"), refused("zone=eu-", /the value must be/));
    assert.throws(() => parseLabels("zone=eu-1,zone=eu-2"), refused("zone=eu-2", /'zone' is given twice/));
  });
});
