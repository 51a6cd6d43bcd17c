// `llmgw server` and `llmgw up`: start the server (and for `up`, the local agent that runs
// this machine's engines), print where it listens, on the first start the admin key, and a
// `ready:` line each time a model gets its first ready replica; stop everything cleanly
// on SIGINT or SIGTERM so no engine process outlives `up`.
import { existsSync, mkdirSync } from "node:fs";
import path from "node:path";
import { createLogger, parseLogFormat } from "../core/log.ts";
import { BadRequestError } from "../core/errors.ts";
import { ADMIN_KEY_FILE } from "../core/data-dir.ts";
import { startLocalNode } from "../agent/local-node.ts";
import { stopOnSignals } from "./shutdown.ts";
import { startServer, type RunningServer, type ServerParts } from "../server/server.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { resolveRegistryEndpoint, resolveRegistryToken } from "../registry/hub-client.ts";
import { parseByteSize } from "../core/byte-size.ts";
import { parseMetricsHosts } from "../metrics/metrics-hosts.ts";
import { DEFAULT_IMAGE_SETTINGS, type ImageSettings } from "../gateway/image-parts.ts";
import { DEFAULT_MAX_BODY_BYTES } from "../gateway/gateway.ts";
import { MAX_RESPONSES_RETENTION_DAYS } from "../gateway/responses/response-store.ts";
import { formatBytes } from "../core/format.ts";
import { LIMITS_CLOCK_ENV, limitsClockFromEnv } from "../policy/limits-clock.ts";
import { parseDuration, parsePositiveInt, parseListen, resolveDataDir, resolveDatabase, DEFAULT_LISTEN } from "./config.ts";

export interface ServerCommandOptions {
  listen?: string;
  dataDir?: string;
  database?: string;
  maxBody?: string;
  bodyTimeout?: string;
  headerTimeout?: string;
  guardTimeout?: string;
  registry?: string;
  logFormat?: string;
  nodeTimeout?: string;
  heartbeatInterval?: string;
  updateCheck?: string;
  usageRetention?: string;
  responsesRetention?: string;
  keyGrace?: string;
  metricsKey?: string;
  metricsHost?: string[];
  publicUrl?: string;
  budgetAlert?: string;
  consoleSession?: string;
  serverName?: string;
  advertiseUrl?: string;
  clusterSecretFile?: string;
  mirrorOn?: string;
  allowPrivateWebhooks?: boolean;
  imageUrls?: string;
  maxImageBytes?: string;
  maxImages?: string;
  imageFetchTimeout?: string;
  allowPrivateImageUrls?: boolean;
  demo?: boolean;
}

export const DEMO_MODEL_NAME = "demo";

export async function runServerCommand(options: ServerCommandOptions, mode: "server" | "up"): Promise<void> {
  const dataDir = resolveDataDir(options.dataDir);
  const { host, port } = parseListen(options.listen ?? process.env.LLMGW_LISTEN ?? DEFAULT_LISTEN);
  const logger = createLogger(options.logFormat === undefined ? {} : { format: parseLogFormat(options.logFormat) });
  const withAgent =
    mode === "up"
      ? async (parts: ServerParts) => {
          if (options.demo === true) await ensureDemoModel(parts, dataDir);
          return startLocalNode(parts, { logger });
        }
      : undefined;
  const server = await startServer(
    {
      dataDir,
      host,
      port,
      database: resolveDatabase(options.database, dataDir),
      maxBodyBytes: options.maxBody === undefined ? undefined : parseByteSize(options.maxBody, "--max-body"),
      bodyTimeoutMs: options.bodyTimeout === undefined ? undefined : parseDuration(options.bodyTimeout, "--body-timeout"),
      headerTimeoutMs: options.headerTimeout === undefined ? undefined : parseDuration(options.headerTimeout, "--header-timeout"),
      guardTimeoutMs: options.guardTimeout === undefined ? undefined : parseDuration(options.guardTimeout, "--guard-timeout"),
      registryEndpoint: resolveRegistryEndpoint({ flag: options.registry, env: process.env }),
      registryToken: resolveRegistryToken(),
      nodeTimeoutMs: options.nodeTimeout === undefined ? undefined : parseDuration(options.nodeTimeout, "--node-timeout"),
      heartbeatIntervalMs: options.heartbeatInterval === undefined ? undefined : parseDuration(options.heartbeatInterval, "--heartbeat-interval"),
      ...metricsKeyOption(options.metricsKey ?? process.env.LLMGW_METRICS_KEY),
      ...metricsHostsOption(options.metricsHost, process.env.LLMGW_METRICS_HOST),
      ...(options.updateCheck === undefined
        ? {}
        : { updateCheckIntervalMs: options.updateCheck === "off" ? 0 : parseDuration(options.updateCheck, "--update-check") }),
      ...(options.usageRetention === undefined
        ? {}
        : { usageRetentionDays: parsePositiveInt(options.usageRetention, "--usage-retention", { allowZero: true }) }),
      ...(options.responsesRetention === undefined ? {} : { responsesRetentionDays: parseResponsesRetention(options.responsesRetention) }),
      ...keyGraceOption(options.keyGrace ?? process.env.LLMGW_KEY_GRACE),
      ...publicUrlOption(options.publicUrl ?? process.env.LLMGW_PUBLIC_URL),
      ...(options.budgetAlert === undefined ? {} : { budgetAlertShare: parseBudgetAlert(options.budgetAlert) }),
      ...(options.consoleSession === undefined ? {} : { consoleSessionTtlMs: parseDuration(options.consoleSession, "--console-session") }),
      ...clusterOptions(options),
      ...allowPrivateWebhooksOption(options.allowPrivateWebhooks, process.env.LLMGW_ALLOW_PRIVATE_WEBHOOKS),
      images: imageOptions(options),
      ...limitsClockFromEnv(process.env),
      logger,
    },
    withAgent,
  );

  const frozenLimitsClock = process.env[LIMITS_CLOCK_ENV];
  if (frozenLimitsClock !== undefined && frozenLimitsClock !== "") {
    // A test knob left set on a real server would keep every budget and rate window from resetting.
    logger.warn({ at: frozenLimitsClock }, `${LIMITS_CLOCK_ENV} is set: budgets and rate windows stand still at that time (for tests only; unset it)`);
  }

  // Before anything says the server is up: whoever reads "listening" and then signals it
  // (a supervisor, a test) must get the orderly stop, not the default death by signal.
  stopOnSignals({ logger, stop: () => server.close() });

  const out = process.stdout;
  out.write(`llmgw ${mode} listening on ${server.url}  (OpenAI-compatible API: ${server.url}/v1)\n`);
  out.write(`console: ${server.url}/  (log in with the admin key)\n`);
  out.write(`data dir: ${dataDir}\n`);
  if (server.createdAdminKey !== null) {
    out.write(`\nAdmin key (shown once; also saved to ${path.join(dataDir, ADMIN_KEY_FILE)}, mode 0600):\n  ${server.createdAdminKey}\n\n`);
  }
  if (options.demo === true) {
    out.write(
      `Demo model '${DEMO_MODEL_NAME}' is starting. Try:\n` +
        `  curl ${server.url}/v1/chat/completions -H "Authorization: Bearer $(cat ${path.join(dataDir, ADMIN_KEY_FILE)})" \\\n` +
        `    -H 'content-type: application/json' -d '{"model":"${DEMO_MODEL_NAME}","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'\n` +
        `Or open ${server.url}/ in a browser, log in with the admin key and chat in the Playground.\n`,
    );
  }
  announceReadyModels(server, out);
}

/** Who this server is among those sharing one PostgreSQL, where they reach it, and the secret they share. */
/** --key-grace: a duration, or 0 (or off) for none: then every request needs the database. */
function keyGraceOption(value: string | undefined): { keyGraceMs?: number } {
  if (value === undefined) return {};
  if (value.trim() === "0" || value.trim().toLowerCase() === "off") return { keyGraceMs: 0 };
  return { keyGraceMs: parseDuration(value, "--key-grace") };
}

function clusterOptions(options: ServerCommandOptions): {
  serverName?: string;
  advertiseUrl?: string;
  clusterSecretFile?: string;
  clusterSecret?: string;
  mirrorOn?: string;
} {
  const name = options.serverName ?? process.env.LLMGW_SERVER_NAME;
  for (const [flag, value] of [
    ["--server-name", name],
    ["--mirror-on", options.mirrorOn],
  ] as const) {
    if (value !== undefined && !/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/.test(value)) {
      throw new BadRequestError(`Invalid ${flag} '${value}': a server name is up to 63 letters, digits, '.', '_' or '-', starting with a letter or digit.`, {
        code: "invalid_server_name",
      });
    }
  }
  const advertise = options.advertiseUrl ?? process.env.LLMGW_ADVERTISE_URL;
  if (advertise !== undefined) {
    let url: URL | undefined;
    try {
      url = new URL(advertise);
    } catch {
      url = undefined;
    }
    if (url === undefined || (url.protocol !== "http:" && url.protocol !== "https:")) {
      throw new BadRequestError(`Invalid --advertise-url '${advertise}': give the URL the other servers reach this one at, for example http://10.0.0.5:8700.`, {
        code: "invalid_advertise_url",
      });
    }
  }
  const secret = process.env.LLMGW_CLUSTER_SECRET;
  return {
    ...(name === undefined ? {} : { serverName: name }),
    ...(advertise === undefined ? {} : { advertiseUrl: advertise.replace(/\/+$/, "") }),
    ...(options.clusterSecretFile === undefined ? {} : { clusterSecretFile: path.resolve(options.clusterSecretFile) }),
    ...(secret === undefined || secret === "" ? {} : { clusterSecret: secret }),
    ...(options.mirrorOn === undefined ? {} : { mirrorOn: options.mirrorOn }),
  };
}

/** Notifications link to the console at this address; it must be a whole http(s) URL. */
function publicUrlOption(value: string | undefined): { publicUrl?: string } {
  if (value === undefined || value === "") return {};
  let url: URL | null = null;
  try {
    url = new URL(value);
  } catch {
    // Refused below with what to give instead.
  }
  if (url === null || (url.protocol !== "http:" && url.protocol !== "https:")) {
    throw new BadRequestError(`Invalid --public-url '${value}': give the address people open the console at, such as https://llmgw.example.com.`);
  }
  return { publicUrl: value.replace(/\/+$/, "") };
}

/** --budget-alert 80 (or 80%): the share of a budget announced as nearly spent. */
function parseBudgetAlert(value: string): number {
  const percent = Number(value.trim().replace(/%$/, ""));
  // Below 1 is most likely a fraction meant as a share (0.8 for 80%): refused rather than read as 0.8%.
  if (!Number.isFinite(percent) || percent < 1 || percent >= 100) {
    throw new BadRequestError(`Invalid --budget-alert '${value}': give a percentage between 1 and 99, such as 80 (not a fraction like 0.8).`);
  }
  return percent / 100;
}

/** --allow-private-webhooks, or LLMGW_ALLOW_PRIVATE_WEBHOOKS=1 (true, yes, on); empty, 0, false, no or off: refused as by default. */
function allowPrivateWebhooksOption(flag: boolean | undefined, env: string | undefined): { allowPrivateWebhooks?: boolean } {
  if (flag === true) return { allowPrivateWebhooks: true };
  const value = env?.trim().toLowerCase() ?? "";
  if (["", "0", "false", "no", "off"].includes(value)) return {};
  if (["1", "true", "yes", "on"].includes(value)) return { allowPrivateWebhooks: true };
  throw new BadRequestError(
    `Invalid LLMGW_ALLOW_PRIVATE_WEBHOOKS '${env}': give 1 to let notification channels send to private addresses, or 0 (the default) to refuse them.`,
    {
      code: "invalid_allow_private_webhooks",
    },
  );
}

/** A flag's value out of its bounds: the error names the flag, the value and the bounds. */
function outOfBounds(flag: string, value: string, bounds: string): BadRequestError {
  return new BadRequestError(`Invalid ${flag} '${value}': ${bounds}.`, { code: "invalid_image_option" });
}

/** The longest --image-fetch-timeout: a request waits that long for its images, and AbortSignal.timeout fires at once past 2^31 ms. */
const MAX_IMAGE_FETCH_TIMEOUT_MS = 5 * 60_000;
/** The most --max-images: llama-server decodes every image of a request before it answers. */
const MAX_IMAGES_LIMIT = 64;

/**
 * --image-urls, --max-image-bytes, --max-images, --image-fetch-timeout,
 * --allow-private-image-urls, checked against each other and --max-body at startup; what
 * is not given keeps image-parts.ts's default. An image's base64 is 4/3 of its size, so
 * the largest image must fit in ¾ of --max-body; the default 10 MiB shrinks to that
 * when --max-body is smaller than its 16 MiB.
 */
export function imageOptions(options: ServerCommandOptions): Partial<ImageSettings> {
  const maxBody = options.maxBody === undefined ? DEFAULT_MAX_BODY_BYTES : parseByteSize(options.maxBody, "--max-body");
  const largestImage = Math.floor((maxBody * 3) / 4);
  const images: Partial<ImageSettings> = { maxBodyBytes: maxBody };
  if (options.imageUrls !== undefined) {
    if (options.imageUrls !== "fetch" && options.imageUrls !== "refuse") {
      throw new BadRequestError(
        `Invalid --image-urls '${options.imageUrls}': give fetch (the gateway fetches http(s) image URLs) or refuse (clients must send data URLs).`,
      );
    }
    images.urls = options.imageUrls;
  }
  if (options.maxImageBytes !== undefined) {
    const bytes = parseByteSize(options.maxImageBytes, "--max-image-bytes");
    if (bytes < 1024) throw outOfBounds("--max-image-bytes", options.maxImageBytes, "give at least 1k; no image is smaller");
    if (bytes > largestImage) {
      throw outOfBounds(
        "--max-image-bytes",
        options.maxImageBytes,
        `give at most ${formatBytes(largestImage)}, ¾ of --max-body (${formatBytes(maxBody)}): an image goes upstream in base64, 4/3 of its size, inside the request body. Lower it, or raise --max-body`,
      );
    }
    images.maxBytes = bytes;
  } else if (DEFAULT_IMAGE_SETTINGS.maxBytes > largestImage) {
    images.maxBytes = largestImage;
  }
  if (options.maxImages !== undefined) {
    const count = parsePositiveInt(options.maxImages, "--max-images");
    if (count > MAX_IMAGES_LIMIT) throw outOfBounds("--max-images", options.maxImages, `give 1 to ${MAX_IMAGES_LIMIT}`);
    images.maxImages = count;
  }
  if (options.imageFetchTimeout !== undefined) {
    const ms = parseDuration(options.imageFetchTimeout, "--image-fetch-timeout");
    if (ms < 100 || ms > MAX_IMAGE_FETCH_TIMEOUT_MS) {
      throw outOfBounds("--image-fetch-timeout", options.imageFetchTimeout, "give 100ms to 5m; the request waits this long for its images");
    }
    images.fetchTimeoutMs = ms;
  }
  if (options.allowPrivateImageUrls === true) images.allowPrivate = true;
  return images;
}

/** An empty LLMGW_METRICS_KEY (a template's placeholder) means no key, not a too-short one. */
function metricsKeyOption(key: string | undefined): { metricsKey?: string } {
  return key === undefined || key === "" ? {} : { metricsKey: key };
}

/** --metrics-host (repeatable, or names separated by commas), else LLMGW_METRICS_HOST. */
function metricsHostsOption(flags: string[] | undefined, env: string | undefined): { metricsHosts?: string[] } {
  const names = parseMetricsHosts(flags ?? (env === undefined ? [] : [env]));
  return names.length === 0 ? {} : { metricsHosts: names };
}

/**
 * Prints `ready: model 'NAME' answers at URL/v1` when a model goes from no ready replica
 * to one: the moment a person waiting at the terminal can send the first request.
 */
function announceReadyModels(server: RunningServer, out: NodeJS.WritableStream): void {
  const answering = new Set<string>();
  const check = (modelId: string) => {
    const ready = server.replicas.forModel(modelId).some((replica) => replica.state === "ready");
    if (!ready) {
      answering.delete(modelId);
      return;
    }
    if (answering.has(modelId)) return;
    const model = server.catalog.list().find((candidate) => candidate.id === modelId);
    if (model === undefined) return;
    answering.add(modelId);
    out.write(`ready: model '${model.name}' answers at ${server.url}/v1\n`);
  };
  server.replicas.onChange((replica) => check(replica.modelId));
  // Replicas that became ready while the server started (external ones are at once).
  for (const replica of server.replicas.all()) check(replica.modelId);
}

/**
 * `--demo`: a tiny random-weight llama model, generated into the data dir (never
 * downloaded), added to the catalog as `demo` with one replica. Runs once; later starts
 * find both in place.
 */
async function ensureDemoModel(parts: ServerParts, dataDir: string): Promise<void> {
  const file = path.join(dataDir, "models", "demo.gguf");
  if (!existsSync(file)) {
    mkdirSync(path.dirname(file), { recursive: true });
    await writeTinyLlamaGguf({ path: file, seed: 42, name: "llmgw demo (random weights)" });
  }
  if (parts.catalog.resolve(DEMO_MODEL_NAME) === undefined) {
    await parts.catalog.create(
      {
        name: DEMO_MODEL_NAME,
        description: "Tiny random-weight llama model generated by `llmgw up --demo`: answers fast, says nothing meaningful.",
        source: { kind: "file", path: file },
        scaling: { min: 1, max: 1 },
        profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 4096, parallel: 2 }],
      },
      "system:demo",
    );
  }
  parts.logger.info({ file }, "demo model ready to start");
}

/** --responses-retention: whole days, 0 (until deleted) to a hundred years. */
function parseResponsesRetention(value: string): number {
  const days = parsePositiveInt(value, "--responses-retention", { allowZero: true });
  if (days > MAX_RESPONSES_RETENTION_DAYS) {
    throw new BadRequestError(`Invalid --responses-retention '${value}': at most ${MAX_RESPONSES_RETENTION_DAYS} days; 0 keeps responses until deleted.`);
  }
  return days;
}
