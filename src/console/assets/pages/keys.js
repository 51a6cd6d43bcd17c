// The Keys page: every API key with its role, models, expiry, state, last use, budget
// spent of its limit and its rate limits (GET /api/v1/keys, plus GET /api/v1/keys/:id for
// what a key with limits has used), a form that creates a key (POST /api/v1/keys), and
// revocation behind a confirmation (DELETE /api/v1/keys/:id).
//
// A new key exists in clear text only in the server's answer to the create request. The
// page keeps it in this component's state and nowhere else (no storage, no address), shows
// it once with a copy button, and forgets it when dismissed or when the page is left.
import { html, useEffect, useRef, useState } from "../vendor/preact-htm.js";
import { api } from "../lib/api.js";
import { useAction, usePoll } from "../lib/live.js";
import { Bar, ConfirmDialog, CopyButton, ErrorNote, Loading, StateBadge, Time, formatNumber, formatUsd, relativeTime } from "../lib/ui.js";

const BUDGET_PERIODS = [
  { value: "total", label: "in total" },
  { value: "day", label: "per day (UTC)" },
  { value: "month", label: "per month (UTC)" },
];

const EMPTY_DRAFT = { name: "", role: "client", models: "", expires: "", budget: "", period: "month", rpm: "", tpm: "" };

function hasLimits(key) {
  return key.budget_usd !== null || key.rpm !== null || key.tpm !== null || (key.model_limits !== null && Object.keys(key.model_limits).length > 0);
}

function keyState(key, now = Date.now()) {
  if (key.revoked_at !== null) return "revoked";
  if (key.expires_at !== null && Date.parse(key.expires_at) <= now) return "expired";
  return "active";
}

/**
 * The keys, and for each live key with limits what it has used (the list leaves that out:
 * it costs a store read per key). A key whose usage cannot be read still shows its limits.
 */
async function loadKeys(signal) {
  const { data } = await api("/api/v1/keys", { signal });
  const usage = {};
  await Promise.all(
    data
      .filter((key) => keyState(key) === "active" && hasLimits(key))
      .map(async (key) => {
        try {
          usage[key.id] = (await api(`/api/v1/keys/${encodeURIComponent(key.id)}`, { signal })).usage;
        } catch (error) {
          if (error?.name === "AbortError") throw error;
        }
      }),
  );
  return { keys: data, usage };
}

/** The POST body from the form: only the fields given, in the API's names and types. */
function requestBody(draft) {
  const body = { name: draft.name.trim(), role: draft.role };
  const models = draft.models
    .split(",")
    .map((model) => model.trim())
    .filter(Boolean);
  if (models.length > 0) body.allowed_models = models;
  // datetime-local has no zone: it is the browser's local time, sent as UTC.
  if (draft.expires !== "") body.expires_at = new Date(draft.expires).toISOString();
  if (draft.budget !== "") {
    body.budget_usd = Number(draft.budget);
    body.budget_period = draft.period;
  }
  if (draft.rpm !== "") body.rpm = Number(draft.rpm);
  if (draft.tpm !== "") body.tpm = Number(draft.tpm);
  return body;
}

function BudgetCell({ keyInfo, usage }) {
  if (keyInfo.budget_usd === null) return html`<span class="muted">none</span>`;
  const period = BUDGET_PERIODS.find((candidate) => candidate.value === keyInfo.budget_period)?.label ?? keyInfo.budget_period;
  const budget = usage?.budget ?? null;
  if (budget === null) return html`<span>${formatUsd(keyInfo.budget_usd)} ${period}</span>`;
  return html`<div class="key-budget">
    <${Bar} used=${budget.spent_usd} total=${budget.limit_usd} label=${`Budget of key '${keyInfo.name}' spent`} format=${formatUsd} />
    <span class="muted">${period}${budget.reserved_usd > 0 ? `, ${formatUsd(budget.reserved_usd)} reserved` : ""}${budget.resets_at === null ? "" : `, resets ${relativeTime(budget.resets_at).replaceAll(" ", "\u00a0")}`}</span>
  </div>`;
}

function RateCell({ keyInfo, usage }) {
  const rate = usage?.rate ?? null;
  const lines = [];
  if (keyInfo.rpm !== null || keyInfo.tpm !== null) {
    const limits = [keyInfo.rpm === null ? null : `${formatNumber(keyInfo.rpm)} rpm`, keyInfo.tpm === null ? null : `${formatNumber(keyInfo.tpm)} tpm`]
      .filter(Boolean)
      .join(" · ");
    lines.push(html`<div>${limits}</div>`);
    if (rate !== null) lines.push(html`<div class="muted">this minute: ${formatNumber(rate.requests)} requests, ${formatNumber(rate.tokens)} tokens</div>`);
  }
  for (const [model, limits] of Object.entries(keyInfo.model_limits ?? {})) {
    const parts = [limits.rpm == null ? null : `${formatNumber(limits.rpm)} rpm`, limits.tpm == null ? null : `${formatNumber(limits.tpm)} tpm`]
      .filter(Boolean)
      .join(" · ");
    lines.push(html`<div>${model}: ${parts}</div>`);
  }
  return lines.length === 0 ? html`<span class="muted">none</span>` : lines;
}

function KeyTable({ keys, usage, onRevoke }) {
  if (keys.length === 0) return html`<p class="muted">No keys yet.</p>`;
  return html`<div class="table-wrap" tabindex="0" role="region" aria-label="API keys">
    <table class="keys-table stack">
      <caption class="visually-hidden">API keys, oldest first</caption>
      <thead>
        <tr>
          <th scope="col">Name</th>
          <th scope="col">Prefix</th>
          <th scope="col">State</th>
          <th scope="col">Role</th>
          <th scope="col">Models</th>
          <th scope="col">Budget spent</th>
          <th scope="col">Rate limits</th>
          <th scope="col">Expires</th>
          <th scope="col">Last used</th>
          <th scope="col"><span class="visually-hidden">Actions</span></th>
        </tr>
      </thead>
      <tbody>
        ${keys.map((key) => {
          const state = keyState(key);
          return html`<tr key=${key.id} data-key-id=${key.id}>
            <td data-label="Name" class="key-name">${key.name}</td>
            <td data-label="Prefix"><code>${key.prefix}…</code></td>
            <td data-label="State"><${StateBadge} state=${state} />${key.revoked_at === null ? null : html` <${Time} iso=${key.revoked_at} />`}</td>
            <td data-label="Role">${key.role}</td>
            <td data-label="Models">${key.allowed_models === null ? html`<span class="muted">all</span>` : key.allowed_models.join(", ")}</td>
            <td data-label="Budget spent"><${BudgetCell} keyInfo=${key} usage=${usage[key.id]} /></td>
            <td data-label="Rate limits"><${RateCell} keyInfo=${key} usage=${usage[key.id]} /></td>
            <td data-label="Expires">${key.expires_at === null ? html`<span class="muted">never</span>` : html`<${Time} iso=${key.expires_at} />`}</td>
            <td data-label="Last used"><${Time} iso=${key.last_used_at} /></td>
            <td data-label="Actions">${state === "revoked" ? null : html`<button type="button" class="danger" onClick=${() => onRevoke(key)}>Revoke<span class="visually-hidden"> key '${key.name}'</span></button>`}</td>
          </tr>`;
        })}
      </tbody>
    </table>
  </div>`;
}

/** The key just created, shown this once. */
function NewKeyPanel({ created, onDismiss }) {
  const heading = useRef(null);
  useEffect(() => {
    heading.current?.focus();
    heading.current?.scrollIntoView({ block: "nearest" });
  }, [created]);
  return html`<section class="panel new-key" aria-labelledby="new-key-title">
    <h3 id="new-key-title" ref=${heading} tabindex="-1">New key '${created.name}'</h3>
    <p><strong>This is the only time the key is shown: copy it now.</strong> llmgw keeps only a hash of it, so it will not be shown again, here or anywhere else.</p>
    <p class="new-key-line"><code class="new-key-text" aria-label=${`Key '${created.name}'`}>${created.key}</code></p>
    <div class="actions">
      <${CopyButton} text=${created.key} label="Copy key" />
      <button type="button" onClick=${onDismiss}>Done, I have stored it</button>
    </div>
  </section>`;
}

function CreateKeyForm({ onCreated }) {
  const [draft, setDraft] = useState(EMPTY_DRAFT);
  const create = useAction();
  const set = (field) => (event) => setDraft({ ...draft, [field]: event.currentTarget.value });
  const submit = async (event) => {
    event.preventDefault();
    const created = await create.run(() => api("/api/v1/keys", { method: "POST", body: requestBody(draft) }));
    if (created !== undefined) {
      setDraft(EMPTY_DRAFT);
      onCreated(created);
    }
  };
  return html`<form class="panel key-form" onSubmit=${submit} aria-labelledby="create-key-title">
    <div class="form-grid">
      <div class="field">
        <label for="key-name">Name</label>
        <input id="key-name" required maxlength="100" autocomplete="off" value=${draft.name} onInput=${set("name")} />
      </div>
      <div class="field">
        <label for="key-role">Role</label>
        <select id="key-role" value=${draft.role} onChange=${set("role")}>
          <option value="client">client: the /v1 API</option>
          <option value="admin">admin: the admin API and every model</option>
        </select>
      </div>
      <div class="field">
        <label for="key-models">Allowed models</label>
        <input id="key-models" autocomplete="off" placeholder="demo, other-model" aria-describedby="key-models-hint" value=${draft.models} onInput=${set("models")} />
        <span id="key-models-hint" class="muted">Comma-separated; empty: all models.</span>
      </div>
      <div class="field">
        <label for="key-expires">Expires</label>
        <input id="key-expires" type="datetime-local" aria-describedby="key-expires-hint" value=${draft.expires} onInput=${set("expires")} />
        <span id="key-expires-hint" class="muted">Your local time; empty: never.</span>
      </div>
      <div class="field">
        <label for="key-budget">Budget USD</label>
        <input id="key-budget" type="number" min="0" step="0.01" inputmode="decimal" aria-describedby="key-budget-hint" value=${draft.budget} onInput=${set("budget")} />
        <span id="key-budget-hint" class="muted">Empty: no budget.</span>
      </div>
      <div class="field">
        <label for="key-period">Budget period</label>
        <select id="key-period" value=${draft.period} onChange=${set("period")}>
          ${BUDGET_PERIODS.map((period) => html`<option value=${period.value}>${period.label}</option>`)}
        </select>
      </div>
      <div class="field">
        <label for="key-rpm">RPM</label>
        <input id="key-rpm" type="number" min="1" step="1" inputmode="numeric" aria-describedby="key-rpm-hint" value=${draft.rpm} onInput=${set("rpm")} />
        <span id="key-rpm-hint" class="muted">Requests per minute; empty: no limit.</span>
      </div>
      <div class="field">
        <label for="key-tpm">TPM</label>
        <input id="key-tpm" type="number" min="1" step="1" inputmode="numeric" aria-describedby="key-tpm-hint" value=${draft.tpm} onInput=${set("tpm")} />
        <span id="key-tpm-hint" class="muted">Tokens per minute, prompt and output; empty: no limit.</span>
      </div>
    </div>
    <div class="actions">
      <button type="submit" disabled=${create.busy}>${create.busy ? "Creating…" : "Create key"}</button>
    </div>
    <${ErrorNote} error=${create.error} prefix="The key was not created" />
  </form>`;
}

export function KeysPage() {
  const { data, error, loading, reload } = usePoll(loadKeys, []);
  // The key in clear text lives here only: gone on dismiss and when the page unmounts.
  const [created, setCreated] = useState(null);
  const [revoking, setRevoking] = useState(null);
  const revoke = useAction();

  const confirmRevoke = async () => {
    const target = revoking;
    setRevoking(null);
    await revoke.run(() => api(`/api/v1/keys/${encodeURIComponent(target.id)}`, { method: "DELETE" }));
    reload();
  };
  const dismiss = () => {
    setCreated(null);
    document.getElementById("key-name")?.focus();
  };

  return html`<h1>Keys</h1>
    <p class="muted">Keys for the OpenAI-compatible API (client) and the admin API (admin). A key is shown once, when it is created.</p>
    <h2>API keys</h2>
    <${ErrorNote} error=${error} />
    <${ErrorNote} error=${revoke.error} prefix="The key was not revoked" />
    ${
      data === null
        ? loading
          ? html`<${Loading} what="keys" />`
          : null
        : html`<${KeyTable} keys=${data.keys} usage=${data.usage} onRevoke=${(key) => {
            revoke.clear();
            setRevoking(key);
          }} />`
    }
    <h2 id="create-key-title">Create a key</h2>
    ${created === null ? null : html`<${NewKeyPanel} created=${created} onDismiss=${dismiss} />`}
    <${CreateKeyForm} onCreated=${(next) => {
      setCreated(next);
      reload();
    }} />
    <${ConfirmDialog}
      open=${revoking !== null}
      title=${revoking === null ? "Revoke key" : `Revoke key '${revoking.name}'?`}
      message=${revoking === null ? "" : `Key '${revoking.name}' (${revoking.prefix}…) will be refused from its next request on. This cannot be undone: a revoked key cannot be restored, only replaced by a new one.`}
      confirmLabel="Revoke key"
      onConfirm=${confirmRevoke}
      onCancel=${() => setRevoking(null)}
    />`;
}
