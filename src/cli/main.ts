// Command-line entry of llmgw: parses arguments with commander and hands each command to
// its domain. Commands load their modules lazily so that `llmgw engine` (started once per
// replica) does not pay for the server stack, and the server does not load llama.cpp
// until an engine needs it.
import { Command } from "commander";
import { reportCliError } from "./output.ts";
import { registerCtl } from "./ctl.ts";
import { LLMGW_VERSION } from "../core/version.ts";

const program = new Command();
program
  .name("llmgw")
  .description("Self-hosted LLM gateway and control plane")
  .version(LLMGW_VERSION, "-V, --version", "print the llmgw version")
  .showHelpAfterError();

const serverOptions = (command: Command) =>
  command
    .option("--listen <host:port>", "address to listen on (or LLMGW_LISTEN)", undefined)
    .option("--data-dir <dir>", "data dir (or LLMGW_DATA_DIR; default ~/.llmgw)")
    .option("--database <url>", "postgres://... for PostgreSQL (or LLMGW_DATABASE); default: SQLite in the data dir")
    .option("--max-body <size>", "largest /v1 request body, e.g. 16m")
    .option("--body-timeout <duration>", "a request body must arrive whole within this, else 408 (default 30s)")
    .option("--header-timeout <duration>", "request headers must arrive within this, else 408 (default 60s)")
    .option(
      "--metrics-key <key>",
      "secret that lets scrapers on other machines read GET /metrics (prefer LLMGW_METRICS_KEY: flags show in ps); loopback needs none",
    )
    .option(
      "--metrics-host <name>",
      "a Host name (name or name:port) a scraper on this machine may read GET /metrics by without a key, besides the listen address and --public-url (repeatable or a comma list; or LLMGW_METRICS_HOST)",
      (value: string, previous: string[] = []) => [...previous, value],
    )
    .option("--guard-timeout <duration>", "how long a guard model may take on one check, its queue included, before the request gets 503 (default 10s)")
    .option("--registry <url>", "Hugging Face Hub endpoint (or HF_ENDPOINT; default https://huggingface.co); token from HF_TOKEN")
    .option("--log-format <format>", "json, pretty or auto (or LLMGW_LOG_FORMAT; auto: readable lines on a terminal, JSON lines otherwise)")
    .option("--node-timeout <duration>", "a node without a heartbeat for this long is lost and its replicas placed elsewhere (default 15s)")
    .option("--heartbeat-interval <duration>", "how often agents send a heartbeat (default 5s)")
    .option("--update-check <duration>", "how often to check served repositories for newer revisions (default 6h; off: only 'ctl model check-updates')")
    .option(
      "--key-grace <duration>",
      "keys read from the database within this keep working while it cannot be reached (or LLMGW_KEY_GRACE; default 10m; 0: off)",
    )
    .option("--usage-retention <days>", "days raw usage rows are kept (default 30; 0: forever); per-minute aggregates stay 400 days")
    .option("--responses-retention <days>", "days the Responses API keeps stored responses (default 30; 0: until deleted)")
    .option("--public-url <url>", "the address people reach this server at, behind a proxy (or LLMGW_PUBLIC_URL); notifications link to its console")
    .option("--budget-alert <percent>", "share of a key's budget announced as budget_threshold (default 80)")
    .option("--console-session <duration>", "how long a console login lasts before the admin key is asked for again (default 12h)")
    .option("--server-name <name>", "this server's name among servers sharing one PostgreSQL (or LLMGW_SERVER_NAME; default: the host name)")
    .option("--advertise-url <url>", "where the other servers reach this one (or LLMGW_ADVERTISE_URL; default: the listening address)")
    .option("--mirror-on <name>", "with several servers: mirror fetches run on this server (give every server the same; default: the leader)")
    .option(
      "--allow-private-webhooks",
      "let notification channels send to private, loopback and link-local addresses (or LLMGW_ALLOW_PRIVATE_WEBHOOKS=1); refused by default",
    )
    .option(
      "--image-urls <mode>",
      "fetch: the gateway fetches http(s) image URLs in chat requests and sends them on as data URLs; refuse: such URLs get 400 (default fetch)",
    )
    .option(
      "--max-image-bytes <size>",
      "largest image in a chat request, data URL or fetched, e.g. 10m: 1k to ¾ of --max-body (default 10m, or ¾ of --max-body when less)",
    )
    .option("--max-images <n>", "most images in one chat request, 1 to 64 (default 8)")
    .option("--image-fetch-timeout <duration>", "all image URLs of a request must have been fetched within this, else 400; 100ms to 5m (default 10s)")
    .option("--allow-private-image-urls", "let image URLs reach private, loopback and link-local addresses and ports other than 80 and 443; refused by default")
    .option(
      "--cluster-secret-file <file>",
      "the secret every server sharing one PostgreSQL is given (or LLMGW_CLUSTER_SECRET); engine keys are sealed with it",
    );

serverOptions(program.command("up").description("Run the server and a local agent on this machine (SQLite, bundled llama.cpp)"))
  .option("--demo", "generate a tiny GGUF model and serve it as 'demo'")
  .action(async (options: Record<string, unknown>) => {
    const { runServerCommand } = await import("./run-server.ts");
    await runServerCommand(options, "up");
  });

serverOptions(program.command("server").description("Run the control plane and gateway (agents run the engines)")).action(
  async (options: Record<string, unknown>) => {
    const { runServerCommand } = await import("./run-server.ts");
    await runServerCommand(options, "server");
  },
);

program
  .command("agent")
  .description("Run a node of the fleet: join a server, run the engines it assigns, report their states")
  .option(
    "--server <urls>",
    "the llmgw server (or LLMGW_SERVER), e.g. http://10.0.0.5:8700; for a cluster, its servers separated by commas (http://a:8700,http://b:8700): the agent fails over between them",
  )
  .option("--join-token <token>", "the server's join token, needed on the first start only (or LLMGW_JOIN_TOKEN)")
  .option("--name <name>", "this node's name (default: the host name)")
  .option("--data-dir <dir>", "where the node keeps its credential, weights cache and engine runs (or LLMGW_AGENT_DATA_DIR; default ~/.llmgw-agent)")
  .option("--advertise <address>", "the address the gateway reaches this node's engines at; engines bind to it (default 127.0.0.1)")
  .option("--inventory <file>", "JSON file that replaces the detected hardware (cores, memory, GPUs, engines)")
  .option("--labels <k=v,...>", "labels of this node")
  .option(
    "--llama-server <path>",
    "the node's own llama-server, used for every llama.cpp profile (GPU profiles need it); auto: the one `llmgw engine build` made",
  )
  .option("--vllm <path>", "the node's vllm executable")
  .option("--ray <path>", "the node's ray executable, for vLLM replicas over several nodes (default: ray on PATH)")
  .option("--log-format <format>", "json, pretty or auto")
  .action(async (options: Record<string, string | undefined>) => {
    const { runAgentCommand } = await import("./run-agent.ts");
    await runAgentCommand(options);
  });

const engine = program
  .command("engine")
  .description("Run the bundled llama.cpp engine as an OpenAI-compatible server (started by the agent, not by hand)")
  // Checked by the engine itself (engine-command.ts), not by commander: commander would ask
  // `llmgw engine build` for them too.
  .option("--model <file>", "GGUF model file to serve (required)")
  .option("--port <port>", "port to listen on (required)")
  .option("--host <address>", "address to bind", "127.0.0.1")
  .option("--key <key>", "engine key required on /v1 (or LLMGW_ENGINE_KEY)")
  .option("--ctx-size <n>", "context size shared by all parallel sequences", "4096")
  .option("--parallel <n>", "requests served at once (parallel sequences)", "2")
  .option("--threads <n>", "CPU threads (0 = one per available core)", "0")
  .option("--model-name <name>", "model id reported by /v1/models")
  .option("--embeddings", "serve only /v1/embeddings (a dedicated embedding model; no generation context)")
  .option(
    "--lora <file>",
    "LoRA adapter GGUF to load, applied to requests that name it (repeatable; id = order given)",
    (file: string, files: string[] = []) => [...files, file],
  )
  .option("--lora-contexts <n>", "most contexts kept for adapter combinations at once (each as large as the base's)", "2")
  .action(async (options: Record<string, string | boolean | undefined>) => {
    const { runEngineCommand } = await import("../engines/llamacpp/engine-command.ts");
    await runEngineCommand(options);
  });

engine
  .command("build")
  .description(
    "Build llama-server (with llama-bench and llama-batched-bench) from the llama.cpp source node-llama-cpp ships, into ~/.cache/llmgw/llama.cpp/<commit>/, and the bundled engine's llama.cpp for this CPU; prints the path for `llmgw agent --llama-server` (or use --llama-server auto)",
  )
  .option("--out <dir>", "build into this folder (new, empty, or an earlier build) instead of the cache")
  .option("--jobs <n>", "compile jobs (default: one per core)")
  .option("--no-bundled", "leave the bundled engine on node-llama-cpp's prebuilt binary (prompt processing about half as fast on a CPU)")
  .option("--quiet", "print only the path")
  .action(async (options: { out?: string; jobs?: string; quiet?: boolean; bundled?: boolean }) => {
    const { runEngineBuildCommand } = await import("./engine-build-command.ts");
    await runEngineBuildCommand(options);
  });

program
  .command("admin-key")
  .description("The admin key, on the server's machine")
  .command("reset")
  .description("Mint a new admin key offline (lost admin.key): needs the data dir, not a running server or a key")
  .option("--data-dir <dir>", "the server's data dir (or LLMGW_DATA_DIR; default ~/.llmgw)")
  .option("--database <url>", "postgres://... when the server uses PostgreSQL (or LLMGW_DATABASE)")
  .action(async (options: { dataDir?: string; database?: string }) => {
    const { runAdminKeyReset } = await import("./admin-key-command.ts");
    await runAdminKeyReset(options);
  });

registerCtl(program);

try {
  await program.parseAsync(process.argv);
} catch (error) {
  reportCliError(error);
}
