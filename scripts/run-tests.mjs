// Runs the test suite with node:test through tsx. The files are listed here on purpose:
// a test file that is not in this list does not run, so adding one is a visible change.
import { spawn, spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const unit = [
  "src/core/errors.test.ts",
  "src/core/backoff.test.ts",
  "src/core/log.test.ts",
  "src/core/byte-size.test.ts",
  "src/agent/engine-supervisor.test.ts",
  "src/engines/llama-server/llama-server-launch.test.ts",
  "src/engines/llama-server/llama-server-version.test.ts",
  "src/engines/vllm/vllm-launch.test.ts",
  "src/engines/engine-launch.test.ts",
  "src/engines/engine-args-check.test.ts",
  "src/agent/weights-identity.test.ts",
  "src/agent/weight-cache.test.ts",
  "src/agent/weights-wait.test.ts",
  "src/agent/http-assignments.test.ts",
  "src/store/store.test.ts",
  "src/store/store-faults.test.ts",
  "src/catalog/catalog.test.ts",
  "src/catalog/sealed-keys.test.ts",
  "src/catalog/weights-check.test.ts",
  "src/catalog/adapters.test.ts",
  "src/catalog/peft-folder.test.ts",
  "src/fleet/weights-knowledge.test.ts",
  "src/cli/local-paths.test.ts",
  "src/cli/ctl-job.test.ts",
  "src/cli/admin-client.test.ts",
  "src/cli/ctl-node.test.ts",
  "src/keys/key-service.test.ts",
  "src/gguf/header.test.ts",
  "src/gguf/llama-support.test.ts",
  "src/gguf/memory-estimate.test.ts",
  "src/plan/plan.test.ts",
  "src/gguf/tiny-model.test.ts",
  "src/gguf/tiny-lora.test.ts",
  "src/gguf/lora-adapter.test.ts",
  "src/gguf/gguf-writer.test.ts",
  "src/gguf/tiny-projector.test.ts",
  "test/support/tiny-png.test.ts",
  "src/engines/llamacpp/openai-wire.test.ts",
  "src/engines/llamacpp/json-schema-grammar.test.ts",
  "src/engines/llamacpp/structured-outputs.test.ts",
  "src/engines/llamacpp/stop-sequences.test.ts",
  "src/engines/llamacpp/decode-lockstep.test.ts",
  "src/engines/llamacpp/llama-runner.test.ts",
  "src/engines/llamacpp/prompt-cache.test.ts",
  "src/engines/llamacpp/native-binding.test.ts",
  "src/engines/llamacpp/engine-server.test.ts",
  "src/engines/llamacpp/sampling.test.ts",
  "src/engines/llamacpp/engine-command.test.ts",
  "src/engines/llamacpp/embeddings.test.ts",
  "src/engines/llamacpp/adapters.test.ts",
  "src/serve/job-steps.test.ts",
  "src/cli/ctl-model-flags.test.ts",
  "src/registry/hub-client.test.ts",
  "src/registry/file-sets.test.ts",
  "src/registry/local-source.test.ts",
  "test/support/stand-in-hub.test.ts",
  "test/support/tools.test.ts",
  "src/mirror/mirror.test.ts",
  "src/mirror/mirror-routes.test.ts",
  "src/mirror/verification.test.ts",
  "src/mirror/mirror-cluster.test.ts",
  "src/mirror/origin-copies.test.ts",
  "src/gateway/usage-tap.test.ts",
  "src/gateway/stream-usage.test.ts",
  "src/gateway/usage-recorder.test.ts",
  "src/usage/usage-aggregates.test.ts",
  "src/gateway/gateway.test.ts",
  "src/gateway/embeddings-usage.test.ts",
  "src/gateway/output-cap.test.ts",
  "src/gateway/gateway-faults.test.ts",
  "src/gateway/try-replicas.test.ts",
  "src/gateway/request-outcome.test.ts",
  "src/gateway/output-bound.test.ts",
  "src/gateway/stream-assembly.test.ts",
  "src/gateway/relay-assembled.test.ts",
  "src/gateway/image-parts.test.ts",
  "src/gateway/image-fetch.test.ts",
  "src/gateway/image-options.test.ts",
  "src/engines/llama-server/engine-build.test.ts",
  "src/engines/llama-server/build-lock.test.ts",
  "src/engines/llama-server/llama-cpp-source.test.ts",
  "src/core/json-body.test.ts",
  "src/events/events-routes.test.ts",
  "src/gateway/admission.test.ts",
  "src/gateway/prefix-affinity.test.ts",
  "src/gateway/prefix-routing.test.ts",
  "src/gateway/admission-affinity.test.ts",
  "src/fleet/autoscaler.test.ts",
  "src/gateway/request-cancel.test.ts",
  "src/gateway/anthropic/messages-request.test.ts",
  "src/gateway/anthropic/messages-answer.test.ts",
  "src/gateway/anthropic/messages-stream.test.ts",
  "src/gateway/anthropic/anthropic-gateway.test.ts",
  "src/gateway/anthropic/anthropic-policy.test.ts",
  "src/gateway/ollama/ollama-answer.test.ts",
  "src/gateway/ollama/ollama-errors.test.ts",
  "src/gateway/ollama/ollama-lines.test.ts",
  "src/gateway/ollama/ollama-messages.test.ts",
  "src/gateway/ollama/ollama-models.test.ts",
  "src/gateway/ollama/ollama-options.test.ts",
  "src/gateway/ollama/ollama-request.test.ts",
  "src/gateway/ollama/ollama-routes.test.ts",
  "src/gateway/ollama/ollama-stream.test.ts",
  "src/gateway/ollama/ollama-wire.test.ts",
  "src/gateway/ollama/ollama-gateway.test.ts",
  "src/gateway/responses/response-store.test.ts",
  "src/gateway/responses/responses-translation.test.ts",
  "src/gateway/responses/responses-gateway.test.ts",
  "src/server/admin-api.test.ts",
  "src/server/data-dir-lock.test.ts",
  "src/server/server.test.ts",
  "src/metrics/metrics.test.ts",
  "src/metrics/metrics-access.test.ts",
  "src/metrics/metrics-route.test.ts",
  "test/monitoring-files.test.ts",
  "test/deploy-checks.test.ts",
  "src/agent/local-node.test.ts",
  "src/fleet/on-demand.test.ts",
  "src/fleet/reconciler.test.ts",
  "src/fleet/node-registry.test.ts",
  "src/fleet/node-address.test.ts",
  "src/fleet/fleet.test.ts",
  "src/fleet/rebalance.test.ts",
  "src/fleet/gpu-class.test.ts",
  "src/fleet/replica-needs.test.ts",
  "src/fleet/placement.test.ts",
  "src/fleet/inventory-schema.test.ts",
  "src/agent/inventory.test.ts",
  "src/serve/jobs.test.ts",
  "src/serve/serve-job.test.ts",
  "src/serve/serve-request.test.ts",
  "src/serve/update-job.test.ts",
  "src/serve/mirrored-here.test.ts",
  "src/policy/limit-store.test.ts",
  "src/policy/token-bound.test.ts",
  "src/policy/limits.test.ts",
  "src/policy/limits-settle.test.ts",
  "src/policy/limits-outage.test.ts",
  "src/policy/limits-clock.test.ts",
  "src/policy/limit-ledger.test.ts",
  "src/cli/ctl-key.test.ts",
  "src/policy/guards-formats.test.ts",
  "src/policy/guards.test.ts",
  "src/policy/guards-attacks.test.ts",
  "src/policy/key-guards.test.ts",
  "src/notify/notify.test.ts",
  "src/notify/webhook-address.test.ts",
  "src/cli/ctl-notify.test.ts",
  "src/console/console-sessions.test.ts",
  "src/cluster/cluster.test.ts",
  "src/cluster/gateway-loads.test.ts",
  "src/fleet/autoscaling.test.ts",
  "src/fleet/autoscaling-cluster.test.ts",
  "src/fleet/drain.test.ts",
];

// The longest files first: two run at once, and a long file started last would run alone
// at the end (chaos takes minutes). The unit files, short, fill in behind them. The two
// files that run two servers each (chaos, cluster) are kept apart, so they do not meet.
const endToEnd = [
  "test/chaos.e2e.test.ts",
  "test/fleet.e2e.test.ts",
  "test/serve.e2e.test.ts",
  "test/console.e2e.test.ts",
  "test/console-fleet.e2e.test.ts",
  "test/console-jobs.e2e.test.ts",
  "test/console-keys.e2e.test.ts",
  "test/cluster.e2e.test.ts",
  "test/lora-engines.e2e.test.ts",
  "test/serve-adapters.e2e.test.ts",
  "test/llama-server.e2e.test.ts",
  "test/up-demo.e2e.test.ts",
  "test/engine-features.e2e.test.ts",
  "test/server-process.e2e.test.ts",
  "test/plan-cli.e2e.test.ts",
  "test/supply-chain.e2e.test.ts",
  "test/stream-failure.e2e.test.ts",
  "test/usage.e2e.test.ts",
  "test/node-address.e2e.test.ts",
  "test/secrets-at-rest.e2e.test.ts",
  "test/serve-restart.e2e.test.ts",
  "test/small-machine.e2e.test.ts",
  "test/anthropic.e2e.test.ts",
  "test/apis.e2e.test.ts",
  "test/guards-engine.e2e.test.ts",
  "test/notify.e2e.test.ts",
  "test/mirror-holder-down.e2e.test.ts",
  "test/agent-killed-fetching.e2e.test.ts",
  "test/db-faults.e2e.test.ts",
  "test/db-outage-gateway.e2e.test.ts",
  "test/ctl-state.e2e.test.ts",
  "test/autoscaling.e2e.test.ts",
];

const files = [...endToEnd, ...unit];
const only = process.argv.slice(2);
const selected = only.length > 0 ? only : files;

// A test file on disk that the lists leave out would never run, silently: refuse to start.
const root = fileURLToPath(new URL("..", import.meta.url));
const onDisk = ["src", "test"].flatMap((dir) =>
  readdirSync(path.join(root, dir), { recursive: true, encoding: "utf8" })
    .filter((file) => file.endsWith(".test.ts"))
    .map((file) => `${dir}/${file.split(path.sep).join("/")}`),
);
const unlisted = onDisk.filter((file) => !files.includes(file));
if (unlisted.length > 0) {
  console.error(
    `run-tests: these test files are in no list of scripts/run-tests.mjs, so they would never run: ${unlisted.join(", ")}. Add each to \`unit\` or \`endToEnd\`.`,
  );
  process.exit(1);
}

// Provision first (scripts/provision.sh): the Debian tools some tests drive and a check that
// PostgreSQL answers. It installs only what is missing, so a machine that has everything
// pays a second; where it cannot install, it says what is missing and the tests that need it
// fail with that sentence. LLMGW_SKIP_PROVISION=1 skips it (for a quick run of one file).
if (process.env.LLMGW_SKIP_PROVISION !== "1") {
  const provision = spawnSync("bash", [fileURLToPath(new URL("./provision.sh", import.meta.url))], { stdio: "inherit" });
  if (provision.status !== 0) process.exit(provision.status ?? 1);
}

// The tests start `llmgw` as a child (bin/llmgw.js), which runs the compiled dist/: bring it
// up to date with the sources first, so the run tests what ships and never a stale build.
const build = spawnSync(process.execPath, [fileURLToPath(new URL("./build.mjs", import.meta.url)), "--if-stale"], { stdio: "inherit" });
if (build.status !== 0) process.exit(build.status ?? 1);

// --test-force-exit: a file's process exits once its tests (and their `after` hooks) are
// done. Without it, Node's own teardown can spin for ever on a request libuv no longer
// tracks (seen once: src/store/store-faults.test.ts, all its tests passed, then 13 minutes
// in Environment::CleanupHandles at 80% CPU), and the run never ends.
const child = spawn(process.execPath, ["--import", "tsx", "--test", "--test-force-exit", "--test-reporter=spec", "--test-concurrency=2", ...selected], {
  stdio: "inherit",
  env: { ...process.env, LLMGW_LOG_LEVEL: process.env.LLMGW_LOG_LEVEL ?? "silent" },
});
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
