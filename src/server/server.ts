// Assembles a running llmgw server: opens the store, loads the catalog, prepares keys,
// the replica table and the gateway, and serves /v1 (gateway, raw node:http for speed),
// GET /metrics (Prometheus) and everything else (admin API, health) on one listener.
// `llmgw server` runs this alone; `llmgw up` adds a local agent through the `withAgent`
// hook. One server per data dir: the data dir lock is taken before anything else is opened.
// Several servers may share one PostgreSQL (src/cluster/): each serves the gateway and the
// admin API; one leads and runs the fleet, jobs and notifications, the others follow it and
// pass it what only it can answer.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import os from "node:os";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { getRequestListener } from "@hono/node-server";
import { ConflictError } from "../core/errors.ts";
import { Catalog } from "../catalog/catalog.ts";
import { assertGuardsExist } from "../catalog/guard-references.ts";
import { DiskWeightsChecker } from "../catalog/weights-check.ts";
import { KeyService } from "../keys/key-service.ts";
import { ReplicaTable } from "../fleet/replica-table.ts";
import { Fleet } from "../fleet/fleet.ts";
import { AGENT_API_PREFIX, createAgentApi } from "../fleet/agent-routes.ts";
import { SecretBox } from "../core/secret-box.ts";
import { syncExternalReplicas } from "../fleet/external-replicas.ts";
import { Gateway } from "../gateway/gateway.ts";
import { GuardModels } from "../policy/guards.ts";
import { UpstreamPools } from "../gateway/upstream.ts";
import { UsageRecorder } from "../gateway/usage-recorder.ts";
import { UsageRetention } from "../usage/usage-retention.ts";
import { ResponseStore } from "../gateway/responses/response-store.ts";
import { isOllamaPath } from "../gateway/ollama/ollama-routes.ts";
import { LimitsService } from "../policy/limits.ts";
import { openStore, type Store } from "../store/store.ts";
import { createAdminApi, type Readiness } from "./admin-api.ts";
import { acquireServerLocks } from "./data-dir-lock.ts";
import { auditTrail } from "../store/audit.ts";
import { DEFAULT_REGISTRY_ENDPOINT, HubClient } from "../registry/hub-client.ts";
import { planRepository } from "../plan/plan-repository.ts";
import { localPool } from "../plan/local-pool.ts";
import { fleetPool } from "../fleet/fleet-pool.ts";
import { Mirror } from "../mirror/mirror.ts";
import { createMirrorFileHandler, isMirrorFileRequest, type MirrorPlanner } from "../mirror/mirror-routes.ts";
import { catalogModelsUsing } from "../mirror/mirror-users.ts";
import { bearerToken } from "../core/bearer.ts";
import { JSON_API_BODY_LIMITS, type BodyLimits } from "../core/http.ts";
import { faultSummary } from "../store/storage-fault.ts";
import { LLMGW_VERSION } from "../core/version.ts";
import { SERVER_INFO_FILE, writeAdminKeyFile } from "../core/data-dir.ts";
import { JobRunner } from "../serve/jobs.ts";
import { serveJobHandler } from "../serve/serve-job.ts";
import { updateJobHandler } from "../serve/update-job.ts";
import { UpdateChecker } from "../serve/update-checker.ts";
import { smokeTestReplica } from "../serve/smoke-test.ts";
import { Metrics } from "../metrics/metrics.ts";
import { MetricsKey } from "../metrics/metrics-access.ts";
import { createMetricsHandler, isMetricsRequest } from "../metrics/metrics-route.ts";
import { EventLog } from "../events/event-log.ts";
import { EventFollower } from "../events/event-follower.ts";
import { jobEvent } from "../serve/job-events.ts";
import { BudgetAlerts } from "../policy/budget-alerts.ts";
import { ChannelStore } from "../notify/channels.ts";
import { Notifier } from "../notify/notifier.ts";
import { ConsoleSessions } from "../console/console-sessions.ts";
import { loadClusterSecret } from "../cluster/cluster-secret.ts";
import { ClusterMembers } from "../cluster/cluster-members.ts";
import { PostgresLeadership, SoleLeadership, NotLeaderError, type Leadership } from "../cluster/leadership.ts";
import { ChangeFeed } from "../cluster/change-feed.ts";
import { FleetFollower } from "../cluster/fleet-follower.ts";
import { FleetAccess } from "../cluster/fleet-access.ts";
import { ServerRole } from "../cluster/server-role.ts";
import { LeaderForwarder, answeredBy } from "../cluster/leader-forward.ts";
import { sharedJoinToken } from "../cluster/shared-join-token.ts";
import { sendError } from "../core/http.ts";
import { createPlaygroundHandler, isPlaygroundRequest } from "../console/playground-route.ts";
import type { Attachment, RunningServer, ServerConfig, ServerParts } from "./server-config.ts";
import { formatHostPort, listeningUrl, reachableUrl } from "./server-addresses.ts";
import { GatewayLoads, type LocalLoad } from "../cluster/gateway-loads.ts";

export type { Attachment, RunningServer, ServerConfig, ServerParts } from "./server-config.ts";

const DEFAULT_HEADER_TIMEOUT_MS = 60_000;
const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 65_000;

export async function startServer(config: ServerConfig, withAgent?: (parts: ServerParts) => Promise<Attachment>): Promise<RunningServer> {
  const { logger } = config;
  // Before anything is opened: a metrics key too short to keep a secret stops the start here.
  const metricsKey = config.metricsKey === undefined ? null : new MetricsKey(config.metricsKey);
  mkdirSync(config.dataDir, { recursive: true, mode: 0o700 });
  // Before the store or any engine: a second server on this data dir (or this SQLite file) stops here.
  const lock = acquireServerLocks({ dataDir: config.dataDir, address: `${config.host}:${config.port}`, database: config.database });
  let store: Store;
  try {
    store = await openStore({ database: config.database, ...(config.databaseSchema === undefined ? {} : { schema: config.databaseSchema }) });
  } catch (error) {
    lock.release();
    throw error;
  }
  let secretBox: SecretBox;
  let members: ClusterMembers;
  try {
    // Engine keys, channels and the join token are sealed with it: every server on the database needs the same one.
    // A SQLite database has one server: its own data dir's key, whatever the environment says
    // (a cluster secret set by mistake must not make its sealed values unreadable).
    const shared = store.dialect === "postgres";
    if (!shared && (config.clusterSecretFile !== undefined || config.clusterSecret !== undefined))
      logger.warn("a cluster secret is for servers sharing PostgreSQL; this SQLite server uses its data dir's own key");
    const secret = loadClusterSecret({
      ...(shared && config.clusterSecretFile !== undefined ? { file: config.clusterSecretFile } : {}),
      ...(shared && config.clusterSecret !== undefined ? { env: config.clusterSecret } : {}),
      dataDirBox: () => SecretBox.forDataDir(config.dataDir),
    });
    secretBox = secret.box;
    members = new ClusterMembers({
      store,
      dataDir: config.dataDir,
      self: {
        name: config.serverName ?? os.hostname(),
        url: config.advertiseUrl ?? `http://${formatHostPort(config.host, config.port)}`,
        version: LLMGW_VERSION,
        secretCheck: secretBox.checkValue(),
        secretSource: secret.source,
      },
      logger,
    });
    // Refuses a server given another secret, or a second server of this name.
    await members.join();
  } catch (error) {
    await store.close().catch(() => undefined);
    lock.release();
    throw error;
  }
  const box = secretBox;
  const mirror = new Mirror({
    store,
    root: path.join(config.dataDir, "mirror"),
    logger,
    // A file no running server holds is fetched from its origin with the registry's token
    // (made below; called only once the server serves).
    originHeaders: (url) => registry.requestHeaders(url),
    // Servers sharing the database: each mirror file has its holders, and a server without
    // the bytes sends nodes to one that has them (307 with a grant signed by the cluster secret).
    ...(store.dialect === "postgres"
      ? {
          cluster: {
            self: members.name,
            liveServers: async () => (await members.list()).filter((member) => member.live).map((member) => ({ name: member.name, url: member.url })),
            mac: (text: string) => box.mac(text),
          },
        }
      : {}),
  });
  // Keys name guard models and the catalog keeps the guards keys name: each asks the other through a closure.
  const catalog: Catalog = new Catalog({ store, box, weights: new DiskWeightsChecker({ mirror }), keyGuards: () => keys.guardReferences() });
  const keys: KeyService = new KeyService({
    store,
    guardChecker: (guards) => assertGuardsExist(guards, (name) => catalog.resolve(name), "key"),
    logger,
    ...(config.keyGraceMs === undefined ? {} : { keyGraceMs: config.keyGraceMs }),
  });
  const replicas = new ReplicaTable();
  const events = new EventLog({ store, logger });
  const feed = new ChangeFeed({ store, logger });
  const leadership: Leadership =
    store.dialect === "postgres"
      ? new PostgresLeadership({ store, name: members.name, logger, ...(config.leaderPollMs === undefined ? {} : { pollMs: config.leaderPollMs }) })
      : new SoleLeadership(store);
  let joinToken = "";
  // The gateway is made after the fleet has started; until then nothing is in flight anywhere.
  let localLoad: LocalLoad | null = null;
  // Every server's requests in flight and queued: the leader's autoscaling and drains count them all.
  const loads = new GatewayLoads({ store, server: members.name, local: () => localLoad, logger, clock: config.fleetClock });
  let recheck = (_modelId: string): void => {};
  const follower = store.dialect === "postgres" ? new FleetFollower({ store, box, catalog, replicas, feed, joinToken: () => joinToken, logger }) : null;
  // Made below, once the services it starts exist; the closures here run after that.
  let role: ServerRole | undefined;
  const fleetAccess = new FleetAccess({ leading: () => role?.fleet ?? null, follower: () => follower, tellDemand: (modelId) => feed.tell("demand", modelId) });
  const makeFleet = (takeover: boolean): Fleet => {
    const fleet = new Fleet({
      store,
      catalog,
      replicas,
      mirror,
      box,
      joinToken: () => joinToken,
      logger,
      events,
      fence: leadership,
      takeover,
      // A replica the gateways have requests at is drained before its engine is stopped.
      inFlight: (replicaId) => loads.replica(replicaId),
      load: loads,
      drainCounts: loads.drainCounts(),
      ...(config.nodeTimeoutMs === undefined ? {} : { nodeTimeoutMs: config.nodeTimeoutMs }),
      ...(config.heartbeatIntervalMs === undefined ? {} : { heartbeatIntervalMs: config.heartbeatIntervalMs }),
      ...(config.fleetClock === undefined ? {} : { clock: config.fleetClock }),
    });
    fleet.onStatusChange((modelId) => recheck(modelId));
    return fleet;
  };
  const registry = new HubClient({
    endpoint: config.registryEndpoint ?? DEFAULT_REGISTRY_ENDPOINT,
    ...(config.registryToken ? { token: config.registryToken } : {}),
    inServer: true,
  });
  // One planner for GET /api/v1/plan, mirror fetches without a quant and serve jobs, so all pick the same artifact.
  // Against the fleet's nodes once any has joined; before that, this machine.
  const planner: MirrorPlanner = (query, signal) => planRepository({ ...query, registry, pool: fleetPool(fleetAccess.nodes()) ?? localPool(), signal });
  const jobDependencies = {
    catalog,
    mirror,
    registry,
    // Jobs run on the leader only, with its Fleet of the term.
    get fleet(): Fleet {
      const fleet = role?.jobsFleet ?? null;
      if (fleet === null) throw new NotLeaderError("This server does not lead the cluster; jobs run on the leader.");
      return fleet;
    },
    planner,
    smokeTest: config.smokeTest ?? smokeTestReplica,
    logger,
    ...(config.replicaTimeoutMs === undefined ? {} : { replicaTimeoutMs: config.replicaTimeoutMs }),
  };
  const jobs = new JobRunner({
    store,
    logger,
    fence: leadership,
    handlers: { serve: serveJobHandler(jobDependencies), update: updateJobHandler(jobDependencies) },
    onFinished: (job) => {
      const event = jobEvent(job);
      if (event !== null) void events.record(event);
    },
  });
  const updates = new UpdateChecker({
    store,
    catalog,
    registry,
    logger,
    events,
    ...(config.updateCheckIntervalMs === undefined ? {} : { intervalMs: config.updateCheckIntervalMs }),
  });
  const pools = new UpstreamPools();
  const usage = new UsageRecorder({ store, logger, dataDir: config.dataDir });
  const usageRetention = new UsageRetention({
    store,
    logger,
    ...(config.usageRetentionDays === undefined ? {} : { retentionDays: config.usageRetentionDays }),
  });
  // Every server sweeps expired responses: a sweep deletes only rows past their time, so two find nothing twice.
  const responses = new ResponseStore({ store, logger, retentionDays: config.responsesRetentionDays });
  responses.start();
  const limits: LimitsService = new LimitsService({
    store,
    logger,
    // Announced by the leader; its periodic check finds a budget spent through another server too.
    onBudgetRefused: (refusal) => (role?.fleet === null ? undefined : budgetAlerts.refused(refusal)),
    ...(config.limitsClock === undefined ? {} : { clock: config.limitsClock }),
  });
  const budgetAlerts: BudgetAlerts = new BudgetAlerts({
    store,
    events,
    logger,
    spent: () => limits.spentByKey(),
    ...(config.budgetAlertShare === undefined ? {} : { share: config.budgetAlertShare }),
    ...(config.budgetCheckIntervalMs === undefined ? {} : { intervalMs: config.budgetCheckIntervalMs }),
    ...(config.limitsClock === undefined ? {} : { clock: config.limitsClock }),
  });
  const webhookAddresses = { allowPrivate: config.allowPrivateWebhooks === true };
  const channels = new ChannelStore({ store, box, addresses: webhookAddresses });
  let consoleUrl = config.publicUrl ?? "";
  const notifier = new Notifier({
    store,
    events,
    channels,
    logger,
    consoleUrl: () => consoleUrl,
    addresses: webhookAddresses,
    ...(config.notify === undefined ? {} : { settings: config.notify }),
  });
  role = new ServerRole({ makeFleet, services: { jobs, updates, budgetAlerts, notifier, usageRetention }, follower, name: members.name, logger });
  const serverRole = role;
  const audit = auditTrail(store);
  const sessions = new ConsoleSessions({
    store,
    keys,
    audit,
    ...(config.publicUrl === undefined ? {} : { publicUrl: config.publicUrl }),
    ...(config.consoleSessionTtlMs === undefined ? {} : { ttlMs: config.consoleSessionTtlMs }),
  });
  let stopExternalSync = () => {};
  const unsubscribers: Array<() => void> = [];
  const stopFollowing = async () => {
    for (const unsubscribe of unsubscribers) unsubscribe();
    await serverRole.closingDown();
    await feed.stop();
  };
  try {
    joinToken = await sharedJoinToken(store, box, config.dataDir, async () =>
      (await members.list()).some((member) => member.live && member.name !== members.name),
    );
    await catalog.refresh();
    stopExternalSync = syncExternalReplicas(catalog, replicas);
    // What other servers change reaches this one within a second (PostgreSQL; SQLite has no others).
    unsubscribers.push(
      feed.subscribe(["models", "model_aliases"], () => catalog.refresh()),
      // A notified change may be a revocation: until re-read, those keys get no grace; a resync keeps it.
      feed.subscribe(["api_keys"], (_tables, { notified }) => keys.forgetCached(notified ? "notified" : "resync")),
      feed.subscribe(["console_sessions"], () => sessions.forgetCached()),
      // A standby's clients used an on-demand model: the leader counts it as a request.
      feed.onTold("demand", (modelId) => {
        const fleet = serverRole.fleet;
        const model = catalog.list().find((m) => m.id === modelId);
        if (fleet === null || model === undefined) return;
        fleet.requested(model);
        fleet.finished(model);
      }),
    );
    await feed.start();
    // A standby routes from the leader's rows from the start; one that wins the lead stops following.
    await follower?.start();
    // SQLite: this server leads now. Before the fleet's first pass there, an update cut by
    // the last stop holds its old replicas again, and the first pass knows every model's
    // weights before an agent asks for its assignments.
    await leadership.start(serverRole);
    // Fetches cut off by the last stop are listed as incomplete, never as present.
    const recovered = await mirror.recover();
    if (recovered.interrupted + recovered.missing + recovered.unconfirmed > 0) logger.info(recovered, "mirror recovered files of an earlier run");
  } catch (error) {
    // Nothing of this start may outlive it: a caller that retries must find the data dir free.
    stopExternalSync();
    await stopFollowing().catch(() => undefined);
    await leadership.stop().catch(() => undefined);
    await members.leave();
    await mirror.close().catch(() => undefined);
    await registry.close().catch(() => undefined);
    await store.close().catch(() => undefined);
    lock.release();
    throw error;
  }

  const eventFollower = new EventFollower({ events, logger });
  // Open event streams end when the server closes, so closing does not wait on them.
  const closingStreams = new AbortController();
  const metrics: Metrics = new Metrics({
    logger,
    sources: {
      models: () => catalog.list(),
      replicasOf: (modelId) => replicas.forModel(modelId),
      // Read at scrape time only, after the gateway below exists.
      inFlightAt: (replicaId): number => gateway.inFlightOf(replicaId),
      waitingFor: (modelId): number => gateway.waitingFor(modelId),
      isParked: (modelId) => fleetAccess.status(modelId).parked !== null,
      desiredReplicas: (modelId) => fleetAccess.status(modelId).desired ?? null,
      nodes: () => fleetAccess.nodes(),
      budgetSpent: config.budgetSpent ?? (() => limits.spentByKey()),
      usageRows: () => ({ dropped: usage.droppedRows(), spooled: usage.spooledRows() }),
    },
  });
  // The guards ask their models through the gateway's own admission, so a guard waits in its model's queue like any request.
  const guards: GuardModels = new GuardModels({
    catalog,
    ask: (request): Promise<unknown> => gateway.callModel(request),
    // A key's own guards come with its Principal: no lookup on the hot path.
    keyGuards: (request) => request.principal.guards ?? null,
    logger,
    ...(config.guardTimeoutMs === undefined ? {} : { timeoutMs: config.guardTimeoutMs }),
  });
  const gateway: Gateway = new Gateway({
    catalog,
    keys,
    replicas,
    pools,
    usage,
    logger,
    maxBodyBytes: config.maxBodyBytes,
    bodyTimeoutMs: config.bodyTimeoutMs,
    stalledReaderMs: config.stalledReaderMs,
    images: config.images,
    fleetStatus: (modelId) => fleetAccess.status(modelId),
    onDemand: fleetAccess,
    responses,
    limits,
    metrics,
    guards,
  });
  recheck = (modelId) => gateway.recheck(modelId);
  localLoad = gateway;
  loads.start();
  const parts: ServerParts = {
    store,
    members,
    leadership,
    mirror,
    catalog,
    keys,
    replicas,
    get fleet(): Fleet {
      return fleetAccess.leader();
    },
    joinToken: () => joinToken,
    logger,
    config,
  };
  let attachment: Attachment | undefined;
  let ready = false;
  const readiness = async (): Promise<Readiness> => {
    const usageRowsDropped = usage.droppedRows();
    if (!ready) return { status: "starting", reason: "The server is starting.", usage_rows_dropped: usageRowsDropped };
    const fault = await store.checkWrites();
    if (fault !== null) {
      // /readyz needs no key: it says what is wrong, not where the data lives (the log and the admin API's 503s do).
      return {
        status: "not_ready",
        reason: `Storage unavailable: ${faultSummary(fault.kind, fault.code)}; the server log names the place.`,
        storage: { kind: fault.kind, code: fault.code, since: fault.since },
        usage_rows_dropped: usageRowsDropped,
      };
    }
    return { status: "ready", usage_rows_dropped: usageRowsDropped };
  };
  const bodyLimits: BodyLimits = { ...JSON_API_BODY_LIMITS, timeoutMs: config.bodyTimeoutMs ?? JSON_API_BODY_LIMITS.timeoutMs };
  const adminApi = createAdminApi({
    sessions,
    catalog,
    keys,
    limits,
    replicas,
    logger,
    version: LLMGW_VERSION,
    readiness,
    audit,
    mirror: { mirror, registry, logger, planner, modelsUsing: catalogModelsUsing(catalog), bodyLimits },
    serve: { jobs, updates },
    usage: { store },
    events: { events, follower: eventFollower, closing: closingStreams.signal, accessChanges: [keys.changes, sessions.changes] },
    notify: { channels, notifier },
    cluster: { store, members, leadership },
    planner,
    bodyLimits,
    fleet: fleetAccess,
    joinToken: () => joinToken,
  });
  const adminListener = getRequestListener(adminApi.fetch);
  const mirrorFiles = createMirrorFileHandler({
    mirror,
    // Weights go to nodes, each with its own credential; admin and client keys are not node credentials.
    authorize: async (req) => {
      fleetAccess.authenticateNode(bearerToken(req.headers.authorization));
    },
    logger,
  });
  const playground = createPlaygroundHandler({ sessions, keys, gateway });
  const metricsListener = createMetricsHandler({ metrics, keys, metricsKey, logger, hosts: { ...config, bound: () => server.address() as AddressInfo } });
  const agentListener = getRequestListener(
    createAgentApi({
      fleet: {
        join: (r) => fleetAccess.leader().join(r),
        heartbeat: (c, r) => fleetAccess.leader().heartbeat(c, r),
        assignments: (c, o) => fleetAccess.leader().assignments(c, o),
      },
      logger,
      bodyLimits,
    }).fetch,
  );
  const forwarder = store.dialect === "postgres" ? new LeaderForwarder({ store, members, logger }) : null;

  const headerTimeoutMs = config.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS;
  const listenerOptions: http.ServerOptions = {
    keepAliveTimeout: config.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
    // Node answers 408 and closes a connection whose headers are late; it checks every
    // connectionsCheckingInterval, so that interval bounds how late the check can be.
    headersTimeout: headerTimeoutMs,
    connectionsCheckingInterval: Math.min(30_000, Math.max(50, Math.floor(headerTimeoutMs / 4))),
    // No whole-request deadline: bodies have their own (bodyTimeoutMs), and answers (long
    // generations) are bounded by the upstream timeouts, not by this listener.
    requestTimeout: 0,
  };
  const server = http.createServer(listenerOptions, (req, res) => {
    const url = req.url ?? "/";
    if (url === "/v1" || url.startsWith("/v1/") || isOllamaPath(url)) {
      gateway.handle(req, res);
      return;
    }
    // HTTP/1.0 has no Host (load balancers' plain health checks send none); the admin routing needs one.
    req.headers.host ??= `${config.host}:${config.port}`;
    const answerer = forwarder === null ? "here" : answeredBy(req, { mirrorOn: config.mirrorOn, self: members.name });
    if (typeof answerer === "object") void forwarder!.forward(req, res, answerer.server);
    else if (answerer === "leader" && serverRole.fleet === null) {
      // Only the leader can answer: a standby passes it on; one that is taking the lead asks for a retry.
      if (serverRole.takingLead) {
        req.resume();
        sendError(req, res, new NotLeaderError("This server is taking the lead of the cluster; retry in a moment."));
      } else void forwarder!.forward(req, res);
    } else if (isPlaygroundRequest(url)) void playground(req, res);
    else if (isMirrorFileRequest(url)) void mirrorFiles(req, res);
    else if (isMetricsRequest(url)) metricsListener(req, res);
    else if (url.startsWith(`${AGENT_API_PREFIX}/`)) void agentListener(req, res);
    else void adminListener(req, res);
  });
  const listening = new Promise<void>((resolve, reject) => {
    server.once("error", (error: NodeJS.ErrnoException) => {
      reject(
        error.code === "EADDRINUSE"
          ? new ConflictError(
              `Cannot listen on ${config.host}:${config.port}: the address is in use. Stop the other process or pass --listen with another port.`,
              { code: "address_in_use" },
            )
          : error,
      );
    });
    server.listen(config.port, config.host, resolve);
  });
  /** Stops what runs in every role and closes the store; the leader's services are stopped by the leadership's stand-by. */
  const shutDown = async (graceful: boolean) => {
    ready = false;
    stopExternalSync();
    closingStreams.abort();
    eventFollower.close();
    fleetAccess.close();
    await stopFollowing();
    // Before the local agent, the mirror and the fleet: a running job stops where it is (resumed by the next leader or start).
    await serverRole.stopServices();
    if (graceful) await attachment?.stop();
    else await attachment?.stop().catch(() => undefined);
    // A leader gives up the lead here (its fleet stops; a standby takes over within its poll).
    await leadership.stop();
    await new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeIdleConnections();
      if (!graceful) server.closeAllConnections();
      setTimeout(() => server.closeAllConnections(), 2000).unref();
    });
    forwarder?.close();
    gateway.close();
    await pools.closeAll();
    await mirror.close();
    await registry.close();
    await usageRetention.stop();
    await responses.stop();
    await usage.close();
    await limits.close();
    await loads.stop();
    await members.leave();
    await store.close();
  };
  let createdAdminKey: string | null;
  try {
    await listening;
    // Only once the address is ours: a start that fails must not mint a key nobody saw.
    createdAdminKey = await ensureAdminKey(keys, config.dataDir);
    if (config.advertiseUrl === undefined) await members.setUrl(reachableUrl(server.address() as AddressInfo));
    attachment = withAgent === undefined ? undefined : await withAgent(parts);
    consoleUrl ||= server.address() === null ? "" : reachableUrl(server.address() as AddressInfo);
    // A leader's jobs cut by the last stop continue once this server's own node (if any) is back; its services start.
    await serverRole.serve();
  } catch (error) {
    await shutDown(false).catch(() => undefined);
    lock.release();
    throw error;
  }
  const url = listeningUrl(server.address() as AddressInfo);
  lock.setAddress(url);
  const instance = lock.holder.instance;
  writeFileSync(path.join(config.dataDir, SERVER_INFO_FILE), `${JSON.stringify({ url, pid: process.pid, instance })}\n`);
  ready = true;
  logger.info({ url, database: store.location, server: members.name, leading: leadership.leading }, "llmgw server listening");

  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= (async () => {
      await shutDown(true);
      removeServerInfoIfOurs(config.dataDir, instance);
      lock.release();
    })();
    return closing;
  };
  // Not a spread of `parts`: that would read its `fleet` getter once, now; its descriptors keep the getter.
  const running = { url, gateway, limits, metrics, events, notifier, budgetAlerts, createdAdminKey, close };
  return Object.defineProperties(running, Object.getOwnPropertyDescriptors(parts)) as RunningServer;
}

/**
 * The first start creates an admin key, writes it to DATA_DIR/admin.key (mode 0600, for
 * `llmgw ctl` on this machine) and returns it so the caller prints it once.
 */
async function ensureAdminKey(keys: KeyService, dataDir: string): Promise<string | null> {
  if (await keys.hasActiveAdminKey()) return null;
  const { key } = await keys.create({ name: "admin", role: "admin" }, "system:first-start");
  writeAdminKeyFile(dataDir, key);
  return key;
}

/** server.json tells `ctl` where this server listens; only the server that wrote it removes it. */
function removeServerInfoIfOurs(dataDir: string, instance: string): void {
  const file = path.join(dataDir, SERVER_INFO_FILE);
  try {
    if ((JSON.parse(readFileSync(file, "utf8")) as { instance?: unknown }).instance === instance) rmSync(file, { force: true });
  } catch {
    // Gone, or not ours to judge: leave it.
  }
}
