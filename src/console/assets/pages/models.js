// The Models page: every model in the catalog with what an operator asks first (can it
// answer, and if not why: its health line, parking, the placement explanation), where its
// replicas run, where its weights came from (provenance and whether nodes verified them)
// and whether a newer revision waits; and what `ctl model` does to one: scale, unpark,
// update, rollback, remove. The page keeps no state of its own beyond open forms: it polls
// the admin API and shows what the server says.
import { html, useRef, useState } from "../vendor/preact-htm.js";
import { api } from "../lib/api.js";
import { usePoll, useAction } from "../lib/live.js";
import { ConfirmDialog, ErrorNote, Loading, StateBadge, Time, formatBytes } from "../lib/ui.js";

const modelPath = (name, suffix = "") => `/api/v1/models/${encodeURIComponent(name)}${suffix}`;

/** A revision as people compare them: the first 12 characters of a commit, a tag as it is. */
function shortRevision(revision) {
  return typeof revision === "string" && /^[0-9a-f]{40}$/.test(revision) ? revision.slice(0, 12) : String(revision ?? "–");
}

/** An id attribute from a model name: names may hold '/', ':', '@', which are awkward in ids. */
function idFor(prefix, name, index) {
  return `${prefix}-${index}-${String(name).replace(/[^A-Za-z0-9_-]/g, "_")}`;
}

/**
 * Whether the one-line health leaves something out that the health endpoint explains: a
 * model that is not ready, or one with fewer ready replicas than it keeps (a scale-out that
 * found no room is "ready" yet has a placement explanation).
 */
function wantsDetail(model) {
  return model.health?.state !== "ready" || (model.health?.ready ?? 0) < (model.scaling?.min ?? 0) || autoscales(model);
}

/** Whether the model scales between min and max on its load (the health endpoint has its target, load and last decision). */
function autoscales(model) {
  const { min, max } = model.scaling ?? { min: 0, max: 0 };
  return max > Math.max(min, 1) && (model.profiles ?? []).some((profile) => profile.engine !== "external");
}

async function loadModels(signal) {
  const [models, nodes, updates] = await Promise.all([
    api("/api/v1/models", { signal }),
    api("/api/v1/nodes", { signal }),
    // Servers started without the serve routes have no update checker; the page still works.
    api("/api/v1/updates", { signal }).catch((error) => (error?.name === "AbortError" ? Promise.reject(error) : { data: [], unavailable: error })),
  ]);
  // The health endpoint names the parking reason and each placement refusal separately; it is
  // asked only for models whose one-line health leaves something to explain.
  const details = {};
  await Promise.all(
    models.data.filter(wantsDetail).map(async (model) => {
      try {
        details[model.name] = await api(modelPath(model.name, "/health"), { signal });
      } catch (error) {
        if (error?.name === "AbortError") throw error;
        // Removed between the two requests: the next poll no longer lists it.
      }
    }),
  );
  const nodeNames = new Map(nodes.data.map((node) => [node.id, node.name]));
  const updatesByModel = new Map(updates.data.map((update) => [update.model, update]));
  return { models: models.data, unreadable: models.unreadable ?? [], details, nodeNames, updatesByModel, updatesError: updates.unavailable ?? null };
}

export function ModelsPage() {
  const { data, error, loading, reload } = usePoll(loadModels, []);
  const check = useAction();
  const checkNow = () => check.run(() => api("/api/v1/updates/check", { method: "POST", body: {} })).then(reload);
  // Only models served from a repository have a newer revision to look for.
  const followed = data?.models.some((model) => model.origin) ?? false;
  return html`<h1>Models</h1>
    <div class="toolbar">
      <p class="muted models-intro">Add a model from a repository with the Serve form on the <a href="#/jobs">Jobs</a> page.${followed ? " The server checks followed repositories for new revisions on a schedule." : ""}</p>
      ${followed ? html`<button type="button" class="secondary" disabled=${check.busy} onClick=${checkNow}>${check.busy ? "Checking for updates…" : "Check for updates now"}</button>` : null}
    </div>
    <${ErrorNote} error=${check.error} prefix="Checking for updates failed" />
    <${ErrorNote} error=${error} prefix="Could not load the models" />
    ${data === null && loading ? html`<${Loading} what="models" />` : null}
    ${
      data !== null && data.unreadable.length > 0
        ? html`<p class="error" role="alert">The catalog holds ${data.unreadable.length} model(s) this server cannot read: ${data.unreadable.join(", ")}. Their rows were written by a newer llmgw or were damaged; they are not served.</p>`
        : null
    }
    ${
      data !== null && data.models.length === 0
        ? html`<p class="panel">No models yet. Serve one from a repository on the <a href="#/jobs">Jobs</a> page, or add one with <code>llmgw ctl model add</code>.</p>`
        : null
    }
    ${data?.models.map(
      (model, index) => html`<${ModelCard}
        key=${model.name}
        model=${model}
        index=${index}
        detail=${data.details[model.name] ?? null}
        nodeNames=${data.nodeNames}
        update=${data.updatesByModel.get(model.name) ?? null}
        reload=${reload}
      />`,
    )}`;
}

/** "1 of 2 ready", with the scaling bounds in words; an autoscaled model's against the replicas it wants now. */
function replicaCounts(model, detail) {
  const { min, max } = model.scaling ?? { min: 0, max: 0 };
  const ready = model.health?.ready ?? 0;
  const scaling = detail?.autoscaling;
  if (scaling) return `${ready} of ${scaling.desired} wanted ready (autoscaled between ${Math.max(min, 1)} and ${max}${min === 0 ? "; on demand" : ""})`;
  if (min === 0) return `${ready} ready; on demand, up to ${max} (a replica starts at the first request, stops after ${model.scaling.idle_seconds} s idle)`;
  return `${ready} of ${min} ready${max > min ? ` (scales out to ${max})` : ""}`;
}

/** Where an autoscaled model stands and what it last decided, in the words `ctl model show` uses. */
function describeAutoscaling(scaling) {
  const load = scaling.load === null ? "load not read yet" : `load now ${scaling.load}`;
  const now = `${scaling.desired} wanted (${scaling.min} to ${scaling.max}); target ${scaling.target} in flight and queued per replica, ${load}; up after ${scaling.up_after} s above target, down after ${scaling.down_after} s below half.`;
  const last = scaling.last;
  return last === null
    ? `${now} No decision yet.`
    : `${now} Last: ${last.direction} from ${last.from} to ${last.to} at ${new Date(last.at).toLocaleString()}: ${last.why}.`;
}

/** How the gateway picks one of the model's replicas, in the words `ctl model show` uses. */
function describeRouting(model) {
  if (model.routing !== "prefix") return "least-busy (the replica with the fewest requests in flight)";
  // The API shows a prefix-routed model's settings with their defaults filled in.
  const { chars, load_factor: loadFactor } = model.prefix ?? { chars: "the default number of", load_factor: "the default factor" };
  return `prefix (a conversation's first ${chars} characters pick its replica; one above ${loadFactor} × the mean requests in flight is passed over)`;
}

function ModelCard({ model, index, detail, nodeNames, update, reload }) {
  const action = useAction();
  const [scaling, setScaling] = useState(false);
  // Which confirmation is open: "remove", "rollback" or null.
  const [confirming, setConfirming] = useState(null);
  const removeButton = useRef(null);
  const rollbackButton = useRef(null);
  const scaleButton = useRef(null);
  const headingId = idFor("model", model.name, index);
  const health = model.health ?? { state: "unknown", reason: null };
  const parked = health.state === "parked" || detail?.parked;
  const origin = model.origin ?? null;

  const act = async (work) => {
    const result = await action.run(work);
    reload();
    return result;
  };
  const unpark = () => act(() => api(modelPath(model.name, "/unpark"), { method: "POST" }));
  const startJob = async (work) => {
    const job = await act(work);
    // The Jobs page follows the job's steps as they happen.
    if (job?.id) location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
  };
  const updateModel = () => startJob(() => api("/api/v1/jobs/update", { method: "POST", body: { model: model.name } }));
  const scaled = () => {
    setScaling(false);
    reload();
    // The form (and its focused button) goes away; focus returns to where it was opened.
    setTimeout(() => scaleButton.current?.focus(), 0);
  };
  const closeConfirm = (returnTo) => {
    setConfirming(null);
    // Once the dialog has left the page, focus goes back to the button that opened it.
    setTimeout(() => returnTo.current?.focus(), 0);
  };
  const confirmed = () => {
    const what = confirming;
    setConfirming(null);
    if (what === "remove") void act(() => api(modelPath(model.name), { method: "DELETE" }));
    if (what === "rollback") void startJob(() => api(modelPath(model.name, "/rollback"), { method: "POST" }));
  };

  return html`<section class="panel model" aria-labelledby=${headingId}>
    <div class="model-head">
      <h2 id=${headingId}>${model.name}</h2>
      <${StateBadge} state=${health.state} />
    </div>
    <div class="health-line">${healthLine(health, detail)}</div>
    <dl class="facts">
      ${model.description ? html`<dt>Description</dt><dd>${model.description}</dd>` : null}
      <dt>Aliases</dt>
      <dd>${model.aliases?.length ? model.aliases.join(", ") : html`<span class="muted">none</span>`}</dd>
      <dt>Replicas</dt>
      <dd>${replicaCounts(model, detail)}</dd>
      ${detail?.autoscaling ? html`<dt>Autoscaling</dt><dd><${LongText} text=${describeAutoscaling(detail.autoscaling)} /></dd>` : null}
      <dt>Routing</dt>
      <dd>${describeRouting(model)}</dd>
      <dt>Profiles</dt>
      <dd>${(model.profiles ?? []).map((profile) => `${profile.name} (${profile.engine})`).join(", ")}</dd>
      ${model.role === "guard" ? html`<dt>Role</dt><dd>guard model (${model.guard_format})</dd>` : null}
      <dt>Weights</dt>
      <dd>${describeWeights(model)}</dd>
      <dt>Update</dt>
      <dd>${describeUpdate(origin, update)}</dd>
    </dl>
    ${parked ? html`<${Parked} detail=${detail} health=${health} />` : null}
    ${detail?.placement?.length ? html`<${Placement} lines=${detail.placement} />` : null}
    ${detail?.weights_problem && detail.weights_problem !== health.reason ? html`<div class="error"><${LongText} text=${`Weights: ${detail.weights_problem}`} /></div>` : null}
    <${ReplicaTable} model=${model} nodeNames=${nodeNames} />
    ${origin ? html`<${Provenance} origin=${origin} replicas=${model.replicas ?? []} />` : null}
    <div class="actions model-actions">
      <button type="button" class="secondary" ref=${scaleButton} aria-expanded=${scaling ? "true" : "false"} onClick=${() => setScaling(!scaling)}>Scale</button>
      ${parked ? html`<button type="button" disabled=${action.busy} onClick=${unpark}>Unpark</button>` : null}
      ${origin ? html`<button type="button" class="secondary" disabled=${action.busy} onClick=${updateModel}>Update</button>` : null}
      ${origin?.previous ? html`<button type="button" class="secondary" ref=${rollbackButton} disabled=${action.busy} onClick=${() => setConfirming("rollback")}>Roll back</button>` : null}
      <button type="button" class="danger" ref=${removeButton} disabled=${action.busy} onClick=${() => setConfirming("remove")}>Remove</button>
    </div>
    <${ErrorNote} error=${action.error} />
    ${scaling ? html`<${ScaleForm} model=${model} idBase=${idFor("scale", model.name, index)} onDone=${scaled} />` : null}
    ${
      confirming === "remove"
        ? html`<${ConfirmDialog}
          open=${true}
          title=${`Remove model '${model.name}'?`}
          message=${`Its ${model.replicas?.length ?? 0} replica(s) stop and requests for '${model.name}'${model.aliases?.length ? ` (and its aliases ${model.aliases.join(", ")})` : ""} fail from now on.`}
          confirmLabel=${`Remove '${model.name}'`}
          onConfirm=${confirmed}
          onCancel=${() => closeConfirm(removeButton)}
        />`
        : null
    }
    ${
      confirming === "rollback"
        ? html`<${ConfirmDialog}
          open=${true}
          title=${`Roll back model '${model.name}'?`}
          message=${`A job replaces the replicas of '${model.name}' with revision ${shortRevision(origin?.previous?.revision)} of ${origin?.repo}, the one it served before its last update.`}
          confirmLabel="Roll back"
          danger=${false}
          onConfirm=${confirmed}
          onCancel=${() => closeConfirm(rollbackButton)}
        />`
        : null
    }
  </section>`;
}

/**
 * A message that may carry an engine's log (many lines): its first line, and the rest
 * folded away so that one failing model does not push the others off the screen.
 */
function LongText({ text }) {
  const [first, ...rest] = String(text).split("\n");
  if (rest.length === 0) return html`<span>${first}</span>`;
  return html`<span>${first}</span>
    <details class="long-text">
      <summary>Full message (${rest.length + 1} lines)</summary>
      <pre tabindex="0">${text}</pre>
    </details>`;
}

function healthLine(health, detail) {
  if (health.state === "ready") return "Answers requests.";
  // The list below names each node's reason; the line would repeat it in one long sentence.
  if (health.state === "unplaceable" && detail?.placement?.length) return "No node can take a replica; why is below.";
  if (health.state === "parked") return "Parked: not started again until it is unparked.";
  return html`<${LongText} text=${health.reason ?? ""} />`;
}

function describeWeights(model) {
  const source = model.source;
  const where =
    source?.kind === "mirror"
      ? `mirror ${source.model}/${source.version}/${source.file}`
      : source?.kind === "file"
        ? `file ${source.path}`
        : (model.profiles ?? []).every((profile) => profile.engine === "external")
          ? "none here (an external server)"
          : "–";
  return model.origin ? `${model.origin.repo} @ ${shortRevision(model.origin.revision)} (${where})` : `${where}; no origin repository recorded`;
}

function describeUpdate(origin, update) {
  if (!origin) return html`<span class="muted">not followed (no origin repository)</span>`;
  if (!update || (!update.checked_at && !update.error)) return html`<span class="muted">not checked yet</span>`;
  if (update.error) return html`<span class="update-failed">check failed: ${update.error}</span>`;
  if (update.update_available) {
    return html`<strong>available</strong>: ${update.ref ?? "main"} is at ${shortRevision(update.latest_revision)} (serving ${shortRevision(update.revision)})${update.checked_at ? html`, checked <${Time} iso=${update.checked_at} />` : null}`;
  }
  return html`up to date with ${update.ref ?? "main"}${update.checked_at ? html`, checked <${Time} iso=${update.checked_at} />` : null}`;
}

function Parked({ detail, health }) {
  const reason = detail?.parked?.reason ?? health.reason?.replace(/^parked:\s*/, "") ?? "no reason recorded";
  return html`<div class="error parked" role="note">
    <strong>Parked</strong> (the fleet stopped starting it): <${LongText} text=${reason} />
    <div>Fix the cause, then Unpark to try again.</div>
  </div>`;
}

function Placement({ lines }) {
  return html`<div class="placement">
    <h3>Why no node can take a replica</h3>
    <ul>
      ${lines.map((line, index) => html`<li key=${index}>${line}</li>`)}
    </ul>
  </div>`;
}

function ReplicaTable({ model, nodeNames }) {
  const replicas = model.replicas ?? [];
  if (replicas.length === 0) return html`<p class="muted">No replicas.</p>`;
  // Focusable: on a phone the table scrolls sideways, and a keyboard must reach that too.
  return html`<h3>Replicas</h3>
    <div class="table-wrap" tabindex="0" role="region" aria-label=${`Replicas of ${model.name}, table`}>
      <table>
        <caption class="visually-hidden">Replicas of ${model.name}</caption>
        <thead>
          <tr>
            <th scope="col">Replica</th>
            <th scope="col">State</th>
            <th scope="col">Node</th>
            <th scope="col">Profile</th>
            <th scope="col">Ready since</th>
            <th scope="col">Attempts</th>
            <th scope="col">Weights</th>
          </tr>
        </thead>
        <tbody>
          ${replicas.map(
            (replica) => html`<tr key=${replica.id}>
              <td class="mono replica-id">${replica.id}</td>
              <td><${StateBadge} state=${replica.state} />${replica.lastError ? html`<div class="muted"><${LongText} text=${replica.lastError} /></div>` : null}</td>
              <td>${(replica.nodeIds ?? []).map((id) => nodeNames.get(id) ?? id).join(", ") || "–"}</td>
              <td>${replica.profile} (${replica.engine})</td>
              <td>${replica.readyAt ? html`<${Time} iso=${replica.readyAt} />` : "–"}</td>
              <td class="num">${replica.attempt}${replica.failures ? ` (${replica.failures} failed)` : ""}</td>
              <td>${replica.weights_verified ? "verified (sha256)" : "not verified"}</td>
            </tr>`,
          )}
        </tbody>
      </table>
    </div>`;
}

function Provenance({ origin, replicas }) {
  const verified = replicas.filter((replica) => replica.weights_verified).length;
  return html`<h3>Provenance</h3>
    <p>
      From <span class="mono">${origin.repo}</span> at revision <span class="mono">${origin.revision}</span>${origin.ref ? ` (following ${origin.ref})` : ""}.
      ${replicas.length > 0 ? ` Weights verified against these hashes on ${verified} of ${replicas.length} replica(s).` : ""}
    </p>
    <div class="table-wrap" tabindex="0" role="region" aria-label=${`Files of ${origin.repo}, table`}>
      <table>
        <caption class="visually-hidden">Files of ${origin.repo} at ${origin.revision}</caption>
        <thead>
          <tr><th scope="col">File</th><th scope="col">SHA-256</th><th scope="col" class="num">Size</th></tr>
        </thead>
        <tbody>
          ${(origin.files ?? []).map(
            (file) => html`<tr key=${file.path}>
              <td class="mono">${file.path}</td>
              <td class="mono sha">${file.sha256}</td>
              <td class="num">${formatBytes(file.bytes)}</td>
            </tr>`,
          )}
        </tbody>
      </table>
    </div>
    ${origin.previous ? html`<p class="muted">Before the last update it served revision <span class="mono">${origin.previous.revision}</span>; Roll back returns to it.</p>` : null}`;
}

/** Scaling as the catalog takes it (scaling.min, .max, .idle_seconds); the server checks the bounds and names the field it refuses. */
function ScaleForm({ model, idBase, onDone }) {
  const [min, setMin] = useState(String(model.scaling?.min ?? 1));
  const [max, setMax] = useState(String(model.scaling?.max ?? 1));
  const [idle, setIdle] = useState(String(model.scaling?.idle_seconds ?? 900));
  const save = useAction();
  const submit = async (event) => {
    event.preventDefault();
    const result = await save.run(() =>
      api(modelPath(model.name), { method: "PATCH", body: { scaling: { min: Number(min), max: Number(max), idle_seconds: Number(idle) } } }),
    );
    if (result !== undefined) onDone();
  };
  return html`<form class="scale-form" onSubmit=${submit} aria-label=${`Scale ${model.name}`}>
    <div class="form-grid">
      <div class="field">
        <label for=${`${idBase}-min`}>Min replicas</label>
        <input id=${`${idBase}-min`} type="number" min="0" max="64" step="1" required value=${min} onInput=${(event) => setMin(event.currentTarget.value)} />
      </div>
      <div class="field">
        <label for=${`${idBase}-max`}>Max replicas</label>
        <input id=${`${idBase}-max`} type="number" min="0" max="64" step="1" required value=${max} onInput=${(event) => setMax(event.currentTarget.value)} />
      </div>
      <div class="field">
        <label for=${`${idBase}-idle`}>Idle seconds (min 0 only)</label>
        <input id=${`${idBase}-idle`} type="number" min="0" step="1" required value=${idle} onInput=${(event) => setIdle(event.currentTarget.value)} />
      </div>
      <div class="actions">
        <button type="submit" disabled=${save.busy}>${save.busy ? "Saving…" : "Save scaling"}</button>
      </div>
    </div>
    <p class="muted">Min replicas keep running; 0 runs on demand (a replica starts at the first request and stops after the idle seconds). Max is how far it scales out.</p>
    <${ErrorNote} error=${save.error} />
  </form>`;
}
