// The Jobs page's "Serve a model" form: the fields of POST /api/v1/jobs/serve (see
// src/serve/serve-request.ts), first the plan for them (GET /api/v1/plan: each artifact of
// the repository × each way to place it, what it needs, what the pool offers, whether it
// fits and why not, and which one the server recommends), then the job. The plan is shown
// before anything starts because serving a repository fetches its weights: the operator
// should see which file the job will take, and where it will run, before a byte moves.
import { html, useState } from "../vendor/preact-htm.js";
import { api, query } from "../lib/api.js";
import { useAction } from "../lib/live.js";
import { ErrorNote, StateBadge, formatBytes, formatNumber } from "../lib/ui.js";

/** The context a replica's requests share when the form leaves it empty (DEFAULT_CONTEXT_POOL on the server). */
const DEFAULT_CONTEXT = 16384;

const EMPTY_FORM = { repo: "", quant: "", replicas: "1", onDemand: false, name: "", aliases: "", context: "" };

/**
 * The name the server gives a repository's model when the form leaves Name empty (its
 * defaultModelName): shown as the field's placeholder, so nobody is surprised by it.
 */
function defaultName(repo) {
  const base = repo.trim().split("/")[1] ?? "";
  return base
    .replace(/-GGUF$/i, "")
    .replace(/[^A-Za-z0-9._:@+-]+/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "");
}

function splitAliases(text) {
  return text
    .split(",")
    .map((alias) => alias.trim())
    .filter((alias) => alias !== "");
}

/** The serve request the form describes, as serve-request.ts reads it. */
export function serveRequestOf(form) {
  const request = { repo: form.repo.trim() };
  if (form.quant.trim() !== "") request.quant = form.quant.trim();
  if (form.name.trim() !== "") request.name = form.name.trim();
  const aliases = splitAliases(form.aliases);
  if (aliases.length > 0) request.aliases = aliases;
  // On demand is replicas 0: no replica until the first request, and it stops when idle.
  if (form.onDemand) request.replicas = 0;
  else if (form.replicas.trim() !== "") request.replicas = Number(form.replicas);
  // The form's context is the pool a replica shares among its requests: the size the job
  // plans for (serve-job.ts plans with ctx_pool), so the plan shown here is the job's plan.
  if (form.context.trim() !== "") request.ctx_pool = Number(form.context);
  return request;
}

/** What a plan was asked for: a plan is current while the form still asks the same. */
function planKey(form) {
  return `${form.repo.trim()}\n${form.context.trim()}`;
}

/** The form, its plan, and the button that starts the job; `onStarted(job)` follows the new job. */
export function ServeForm({ onStarted }) {
  const [form, setForm] = useState(EMPTY_FORM);
  const [planned, setPlanned] = useState(null);
  const plan = useAction();
  const serve = useAction();
  const set = (field) => (event) => {
    const target = event.currentTarget;
    setForm((previous) => ({ ...previous, [field]: target.type === "checkbox" ? target.checked : target.value }));
  };

  const showPlan = async (event) => {
    event.preventDefault();
    serve.clear();
    const key = planKey(form);
    const context = form.context.trim();
    const result = await plan.run(async () => {
      // The nodes alongside: the plan names placements (CPU, 2× H100), the pool says which machines those are.
      const [repository, nodes] = await Promise.all([api(`/api/v1/plan${query({ repo: form.repo.trim(), context })}`), api("/api/v1/nodes")]);
      return { repository, nodes: nodes.data };
    });
    setPlanned(result === undefined ? null : { key, ...result });
  };

  const startServe = async (event) => {
    const element = event.currentTarget.form;
    if (element && !element.reportValidity()) return;
    const job = await serve.run(() => api("/api/v1/jobs/serve", { method: "POST", body: serveRequestOf(form) }));
    if (job) onStarted(job);
  };

  const current = planned !== null && planned.key === planKey(form);
  const fieldHint = (id, text) => html`<span class="muted serve-hint" id=${id}>${text}</span>`;
  return html`<section class="panel serve-form" aria-labelledby="serve-heading">
    <h2 id="serve-heading">Serve a model</h2>
    <p class="muted">Step 1: show the plan (what fits where). Step 2: serve; the job fetches the weights into the mirror, checks them, adds the model, starts a replica and smoke-tests it.</p>
    <form onSubmit=${showPlan}>
      <div class="form-grid">
        <div class="field">
          <label for="serve-repo">Repository</label>
          <input id="serve-repo" name="repo" required placeholder="owner/name" autocomplete="off" spellcheck=${false} aria-describedby="serve-repo-hint" value=${form.repo} onInput=${set("repo")} />
          ${fieldHint("serve-repo-hint", "owner/name on the Hugging Face Hub")}
        </div>
        <div class="field">
          <label for="serve-quant">Quant</label>
          <input id="serve-quant" name="quant" placeholder="e.g. Q4_K_M" autocomplete="off" spellcheck=${false} aria-describedby="serve-quant-hint" value=${form.quant} onInput=${set("quant")} />
          ${fieldHint("serve-quant-hint", "optional; empty: what the plan recommends")}
        </div>
        <div class="field">
          <label for="serve-replicas">Replicas</label>
          <input id="serve-replicas" name="replicas" type="number" min="0" step="1" inputmode="numeric" disabled=${form.onDemand} value=${form.onDemand ? "0" : form.replicas} onInput=${set("replicas")} />
          <span class="serve-check">
            <input id="serve-on-demand" name="on-demand" type="checkbox" checked=${form.onDemand} aria-describedby="serve-on-demand-hint" onChange=${set("onDemand")} />
            <label for="serve-on-demand">On demand</label>
          </span>
          ${fieldHint("serve-on-demand-hint", "no replica until the first request (scales from zero, stops when idle)")}
        </div>
        <div class="field">
          <label for="serve-name">Name</label>
          <input id="serve-name" name="name" autocomplete="off" spellcheck=${false} placeholder=${defaultName(form.repo) || "from the repository"} aria-describedby="serve-name-hint" value=${form.name} onInput=${set("name")} />
          ${fieldHint("serve-name-hint", "what clients ask for; empty: from the repository")}
        </div>
        <div class="field">
          <label for="serve-aliases">Aliases</label>
          <input id="serve-aliases" name="aliases" autocomplete="off" spellcheck=${false} placeholder="small, fast" aria-describedby="serve-aliases-hint" value=${form.aliases} onInput=${set("aliases")} />
          ${fieldHint("serve-aliases-hint", "comma-separated other names")}
        </div>
        <div class="field">
          <label for="serve-context">Context (tokens)</label>
          <input id="serve-context" name="context" type="number" min="256" step="1" inputmode="numeric" placeholder=${String(DEFAULT_CONTEXT)} aria-describedby="serve-context-hint" value=${form.context} onInput=${set("context")} />
          ${fieldHint("serve-context-hint", `shared by a replica's requests; the plan is made for it (default ${formatNumber(DEFAULT_CONTEXT)})`)}
        </div>
      </div>
      <div class="actions">
        <button type="submit" disabled=${plan.busy}>${plan.busy ? "Planning…" : "Show plan"}</button>
        <button type="button" disabled=${!current || serve.busy} aria-describedby="serve-button-hint" onClick=${startServe}>${serve.busy ? "Starting…" : "Serve"}</button>
        <span class="muted" id="serve-button-hint">${current ? "Starts the job with the fields above." : "Show the plan for this repository and context first."}</span>
      </div>
    </form>
    <${ErrorNote} error=${plan.error} prefix="Could not plan" />
    <${ErrorNote} error=${serve.error} prefix="Could not start the job" />
    ${current ? html`<${PlanView} repository=${planned.repository} nodes=${planned.nodes} quant=${form.quant.trim()} />` : null}
  </section>`;
}

const sameArtifact = (a, b) => a.id === b.id && a.format === b.format && a.bytes === b.bytes;

/**
 * Which artifact the job will take: the quant asked for, else the recommendation (what
 * src/serve/artifact-choice.ts does); null when nothing fits and no quant was given.
 */
function chosenArtifact(plan, quant) {
  if (quant !== "") return plan.artifacts.find((artifact) => artifact.id.toUpperCase() === quant.toUpperCase()) ?? null;
  if (plan.recommendation === null) return null;
  return plan.artifacts.find((artifact) => sameArtifact(artifact, plan.recommendation.artifact)) ?? null;
}

/** The plan: a row per option (artifact × placement), the pool's nodes, and the server's recommendation. */
function PlanView({ repository, nodes, quant }) {
  const plan = repository.plan;
  const chosen = chosenArtifact(plan, quant);
  const filesOf = (ref) => plan.artifacts.find((artifact) => sameArtifact(artifact, ref))?.files ?? [];
  const unplanned = repository.artifacts.filter((artifact) => !artifact.planned);
  const warnings = [...new Set(plan.artifacts.flatMap((artifact) => artifact.memory?.warnings ?? []))];
  return html`<section class="plan" aria-labelledby="plan-heading">
    <h3 id="plan-heading">Plan for a ${formatNumber(plan.contextSize)}-token context</h3>
    <p class="muted"><span class="mono">${repository.repo}</span> at ${repository.revision} (<span class="mono">${repository.sha.slice(0, 12)}</span>)</p>
    <p class="plan-explanation">${plan.explanation}</p>
    <p>
      ${
        quant !== "" && chosen === null
          ? html`<span class="error">The repository has no ${quant} artifact; Serve would fail. Its artifacts: ${plan.artifacts.map((artifact) => artifact.label).join(", ")}.</span>`
          : chosen === null
            ? "Nothing fits: Serve would take the registry's default choice and the model would wait for room."
            : html`Serve takes <strong>${chosen.label}</strong>${quant !== "" ? " (asked for)" : " (recommended)"}: <span class="mono">${(chosen.files ?? []).join(", ")}</span>.`
      }
    </p>
    <div class="table-wrap" tabindex="0" role="region" aria-label="Plan table">
      <table class="plan-table">
        <caption class="visually-hidden">What fits where: each artifact and placement, the memory it needs and the most the pool offers</caption>
        <thead>
          <tr>
            <th scope="col">Artifact</th>
            <th scope="col">Files</th>
            <th scope="col">Engine</th>
            <th scope="col">Where</th>
            <th scope="col" class="num">Needs</th>
            <th scope="col" class="num">Available</th>
            <th scope="col" class="num">Hosts now</th>
            <th scope="col">Fits</th>
          </tr>
        </thead>
        <tbody>
          ${plan.options.map((option) => {
            const recommended =
              plan.recommendation !== null &&
              sameArtifact(option.artifact, plan.recommendation.artifact) &&
              option.where === plan.recommendation.where &&
              option.engine === plan.recommendation.engine;
            const unit = option.per === "gpu" ? "/GPU" : "/node";
            return html`<tr class=${recommended ? "plan-recommended" : ""}>
              <td>${option.artifact.label} <span class="muted">(${option.artifact.format}, ${formatBytes(option.artifact.bytes)})</span>${recommended ? html` <span class="badge badge-good">Recommended</span>` : null}</td>
              <td class="mono plan-files">${filesOf(option.artifact).join(", ")}</td>
              <td>${option.engine === "vllm" ? "vLLM" : "llama.cpp"}</td>
              <td>${option.where}</td>
              <td class="num">${formatBytes(option.neededBytes)}${unit}</td>
              <td class="num">${option.placement.kind === "gpu" && option.placement.gpuClass === "none" ? "none" : `${formatBytes(option.availableBytes)}${unit}`}</td>
              <td class="num">${option.hostsNow}</td>
              <td>${option.fits ? html`<span class="badge badge-good">yes</span>` : html`<span class="badge badge-bad">no</span> <span class="plan-why">${option.why ?? ""}</span>`}</td>
            </tr>`;
          })}
        </tbody>
      </table>
    </div>
    ${warnings.length > 0 ? html`<ul class="plan-warnings">${warnings.map((warning) => html`<li><strong>Warning:</strong> ${warning}</li>`)}</ul>` : null}
    ${
      unplanned.length > 0
        ? html`<p class="muted">Not planned: ${unplanned.map((artifact, index) => html`${index > 0 ? "; " : ""}${artifact.description} (${artifact.note ?? "not planned"})`)}.</p>`
        : null
    }
    <${PoolNodes} nodes=${nodes} />
    <details class="plan-memory">
      <summary>What each artifact's memory is made of</summary>
      <ul>${plan.artifacts.map((artifact) => html`<li><strong>${artifact.label}</strong>: ${artifact.memory?.basis ?? `${formatBytes(artifact.memory?.totalBytes)}`}</li>`)}</ul>
    </details>
  </section>`;
}

/** The machines the plan was made on: the server plans against its ready nodes. */
function PoolNodes({ nodes }) {
  if (nodes.length === 0) return html`<p class="muted">No node has joined yet: the plan was made for the server's own machine.</p>`;
  return html`<h3 id="plan-nodes-heading">Nodes in the pool</h3>
    <p class="muted">The plan counts ready nodes; "hosts now" are those with the room free at this moment.</p>
    <div class="table-wrap" tabindex="0" role="region" aria-labelledby="plan-nodes-heading">
      <table class="plan-nodes" aria-labelledby="plan-nodes-heading">
        <thead>
          <tr>
            <th scope="col">Node</th>
            <th scope="col">State</th>
            <th scope="col" class="num">Cores</th>
            <th scope="col" class="num">Memory used</th>
            <th scope="col">GPUs</th>
            <th scope="col">Engines</th>
          </tr>
        </thead>
        <tbody>
          ${nodes.map(
            (node) => html`<tr>
              <td>${node.name}</td>
              <td><${StateBadge} state=${node.state} /></td>
              <td class="num">${node.cores ? `${node.cores.used} of ${node.cores.total}` : "–"}</td>
              <td class="num">${node.memory_bytes ? `${formatBytes(node.memory_bytes.used)} of ${formatBytes(node.memory_bytes.total)}` : "–"}</td>
              <td>${node.gpus?.length ? node.gpus.map((gpu) => `${gpu.class} ${formatBytes(gpu.memory_bytes)}`).join(", ") : "none"}</td>
              <td>${node.engines?.length ? node.engines.map((engine) => `${engine.engine} ${engine.version}`).join(", ") : "none"}</td>
            </tr>`,
          )}
        </tbody>
      </table>
    </div>`;
}
