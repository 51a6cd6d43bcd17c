// Runs the test suite with node:test through tsx. The files are listed here on purpose:
// a test file that is not in this list does not run, so adding one is a visible change.
import { spawn } from "node:child_process";

const unit = [
  "src/core/errors.test.ts",
  "src/core/log.test.ts",
  "src/agent/engine-supervisor.test.ts",
  "src/engines/llama-server/llama-server-launch.test.ts",
  "src/engines/vllm/vllm-launch.test.ts",
  "src/engines/engine-launch.test.ts",
  "src/agent/weights-identity.test.ts",
  "src/agent/weight-cache.test.ts",
  "src/store/store.test.ts",
  "src/catalog/catalog.test.ts",
  "src/catalog/weights-check.test.ts",
  "src/cli/local-paths.test.ts",
  "src/cli/ctl-job.test.ts",
  "src/keys/key-service.test.ts",
  "src/gguf/header.test.ts",
  "src/gguf/llama-support.test.ts",
  "src/gguf/memory-estimate.test.ts",
  "src/plan/plan.test.ts",
  "src/gguf/tiny-model.test.ts",
  "src/engines/llamacpp/openai-wire.test.ts",
  "src/engines/llamacpp/stop-sequences.test.ts",
  "src/engines/llamacpp/decode-lockstep.test.ts",
  "src/engines/llamacpp/llama-runner.test.ts",
  "src/engines/llamacpp/engine-server.test.ts",
  "src/engines/llamacpp/engine-command.test.ts",
  "src/registry/hub-client.test.ts",
  "src/registry/file-sets.test.ts",
  "src/registry/local-source.test.ts",
  "test/support/stand-in-hub.test.ts",
  "src/mirror/mirror.test.ts",
  "src/mirror/mirror-routes.test.ts",
  "src/mirror/verification.test.ts",
  "src/gateway/usage-tap.test.ts",
  "src/gateway/stream-usage.test.ts",
  "src/gateway/usage-recorder.test.ts",
  "src/gateway/gateway.test.ts",
  "src/gateway/gateway-faults.test.ts",
  "src/gateway/admission.test.ts",
  "src/server/admin-api.test.ts",
  "src/server/data-dir-lock.test.ts",
  "src/server/server.test.ts",
  "src/agent/local-node.test.ts",
  "src/fleet/on-demand.test.ts",
  "src/fleet/reconciler.test.ts",
  "src/fleet/node-registry.test.ts",
  "src/fleet/fleet.test.ts",
  "src/fleet/gpu-class.test.ts",
  "src/fleet/replica-needs.test.ts",
  "src/fleet/placement.test.ts",
  "src/fleet/inventory-schema.test.ts",
  "src/agent/inventory.test.ts",
  "src/serve/jobs.test.ts",
  "src/serve/serve-request.test.ts",
  "src/serve/update-job.test.ts",
  "src/policy/guards-formats.test.ts",
  "src/policy/guards.test.ts",
];

const endToEnd = [
  "test/up-demo.e2e.test.ts",
  "test/server-process.e2e.test.ts",
  "test/plan-cli.e2e.test.ts",
  "test/supply-chain.e2e.test.ts",
  "test/stream-failure.e2e.test.ts",
  "test/fleet.e2e.test.ts",
  "test/serve.e2e.test.ts",
  "test/serve-restart.e2e.test.ts",
  "test/guards-engine.e2e.test.ts",
];

const files = [...unit, ...endToEnd];
const only = process.argv.slice(2);
const selected = only.length > 0 ? only : files;

const child = spawn(
  process.execPath,
  ["--import", "tsx", "--test", "--test-reporter=spec", "--test-concurrency=2", ...selected],
  { stdio: "inherit", env: { ...process.env, LLMGW_LOG_LEVEL: process.env.LLMGW_LOG_LEVEL ?? "silent" } },
);
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
