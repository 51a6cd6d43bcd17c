// The Nodes page: the machines replicas run on, each with its state, last heartbeat, what it
// has and what its replicas take (cores, memory and each GPU as used/total bars), its
// engines and its replicas; drain and remove, as `ctl node` does; and the command that adds
// a node, with this server's join token, ready to copy.
import { html, useEffect, useRef, useState } from "../vendor/preact-htm.js";
import { api } from "../lib/api.js";
import { usePoll, useAction } from "../lib/live.js";
import { Bar, ConfirmDialog, CopyButton, ErrorNote, Loading, StateBadge, Time, formatBytes, formatNumber } from "../lib/ui.js";

// A replica of a small model reserves a quarter or half a core (plan/cpu-share.ts): show "0.75 of 2", not "1 of 2".
const formatCores = (value) => formatNumber(value, 2);

const nodePath = (name, suffix = "") => `/api/v1/nodes/${encodeURIComponent(name)}${suffix}`;

function idFor(prefix, name, index) {
  return `${prefix}-${index}-${String(name).replace(/[^A-Za-z0-9_-]/g, "_")}`;
}

export function NodesPage() {
  const { data, error, loading, reload } = usePoll((signal) => api("/api/v1/nodes", { signal }), []);
  const nodes = data?.data ?? null;
  return html`<h1>Nodes</h1>
    <${ErrorNote} error=${error} prefix="Could not load the nodes" />
    ${nodes === null && loading ? html`<${Loading} what="nodes" />` : null}
    ${nodes !== null && nodes.length === 0 ? html`<p class="panel">No node has joined. Add one with the command below.</p>` : null}
    <div class="node-list">
      ${nodes?.map((node, index) => html`<${NodeCard} key=${node.id} node=${node} index=${index} reload=${reload} />`)}
    </div>
    <${AddNode} />`;
}

function NodeCard({ node, index, reload }) {
  const action = useAction();
  const [confirming, setConfirming] = useState(false);
  const removeButton = useRef(null);
  const headingId = idFor("node", node.name, index);
  const act = async (work) => {
    await action.run(work);
    reload();
  };
  const drain = () => act(() => api(nodePath(node.name, "/drain"), { method: "POST" }));
  const remove = () => {
    setConfirming(false);
    void act(() => api(nodePath(node.name), { method: "DELETE" }));
  };
  const cancel = () => {
    setConfirming(false);
    // Once the dialog has left the page, focus goes back to the button that opened it.
    setTimeout(() => removeButton.current?.focus(), 0);
  };
  const labels = Object.entries(node.labels ?? {});
  const replicas = node.replicas ?? [];
  return html`<section class="panel node" aria-labelledby=${headingId}>
    <div class="node-head">
      <h2 id=${headingId}>${node.name}</h2>
      <${StateBadge} state=${node.state} />
    </div>
    <dl class="facts">
      <dt>Last heartbeat</dt>
      <dd><${Time} iso=${node.last_heartbeat} /></dd>
      <dt>Address</dt>
      <dd class="mono">${node.address}</dd>
      <dt>Joined</dt>
      <dd><${Time} iso=${node.joined_at} /></dd>
      ${labels.length > 0 ? html`<dt>Labels</dt><dd>${labels.map(([name, value]) => `${name}=${value}`).join(", ")}</dd>` : null}
      <dt>Engines</dt>
      <dd>${node.engines?.length ? node.engines.map((engine) => `${engine.engine} ${engine.version}`).join(", ") : html`<span class="muted">none found</span>`}</dd>
    </dl>
    <div class="node-bars">
      <div class="field">
        <span class="bar-name">Cores</span>
        <${Bar} used=${node.cores?.used} total=${node.cores?.total} label=${`Cores of ${node.name}`} format=${formatCores} />
      </div>
      <div class="field">
        <span class="bar-name">Memory</span>
        <${Bar} used=${node.memory_bytes?.used} total=${node.memory_bytes?.total} label=${`Memory of ${node.name}`} format=${formatBytes} />
      </div>
      ${(node.gpus ?? []).map((gpu) => html`<${GpuBar} key=${gpu.index} gpu=${gpu} node=${node} />`)}
    </div>
    ${node.gpus?.length ? null : html`<p class="muted">No GPU.</p>`}
    <p class="muted">Bars show what the replicas placed here reserve, against what the node reported.</p>
    <h3>Replicas</h3>
    ${
      replicas.length === 0
        ? html`<p class="muted">No replica runs here.</p>`
        : html`<div class="table-wrap" tabindex="0" role="region" aria-label=${`Replicas on ${node.name}, table`}>
          <table>
            <caption class="visually-hidden">Replicas on ${node.name}</caption>
            <thead>
              <tr><th scope="col">Replica</th><th scope="col">Model</th><th scope="col">State</th><th scope="col">Profile</th></tr>
            </thead>
            <tbody>
              ${replicas.map(
                (replica) => html`<tr key=${replica.id}>
                  <td class="mono replica-id">${replica.id}</td>
                  <td>${replica.model}</td>
                  <td><${StateBadge} state=${replica.state} /></td>
                  <td>${replica.profile}</td>
                </tr>`,
              )}
            </tbody>
          </table>
        </div>`
    }
    <div class="actions">
      ${node.state === "ready" ? html`<button type="button" class="secondary" disabled=${action.busy} onClick=${drain}>Drain</button>` : null}
      <button type="button" class="danger" ref=${removeButton} disabled=${action.busy} onClick=${() => setConfirming(true)}>Remove</button>
    </div>
    ${node.state === "draining" ? html`<p class="muted">Draining: no new replica is placed here; its replicas move elsewhere.</p>` : null}
    <${ErrorNote} error=${action.error} />
    ${
      confirming
        ? html`<${ConfirmDialog}
          open=${true}
          title=${`Remove node '${node.name}'?`}
          message=${`The server forgets '${node.name}'${replicas.length ? ` and places its ${replicas.length} replica(s) elsewhere` : ""}. To bring it back, join it again with the join command.`}
          confirmLabel=${`Remove '${node.name}'`}
          onConfirm=${remove}
          onCancel=${cancel}
        />`
        : null
    }
  </section>`;
}

/**
 * A GPU is given whole to one replica (placement does not share one), so its bar is all or
 * nothing: the API names the replica holding it, not a byte count in use.
 */
function GpuBar({ gpu, node }) {
  const total = gpu.memory_bytes;
  return html`<div class="field">
    <span class="bar-name">GPU ${gpu.index}: ${gpu.name}${gpu.class && gpu.class !== gpu.name ? ` (${gpu.class})` : ""}${gpu.replica ? ` · ${gpu.replica}` : " · free"}</span>
    <${Bar} used=${gpu.replica ? total : 0} total=${total} label=${`GPU ${gpu.index} of ${node.name}`} format=${formatBytes} />
  </div>`;
}

/**
 * The command that joins a new machine. The join token is read once when the page opens,
 * not polled: the server audits every read of it.
 */
function AddNode() {
  const [token, setToken] = useState(null);
  const [error, setError] = useState(null);
  const [address, setAddress] = useState("");
  useEffect(() => {
    const controller = new AbortController();
    api("/api/v1/nodes/join-token", { signal: controller.signal })
      .then((answer) => setToken(answer.token))
      .catch((failure) => {
        if (failure?.name !== "AbortError") setError(failure);
      });
    return () => controller.abort();
  }, []);
  // An address has no spaces; dropping them keeps the command one that a shell reads as meant.
  const advertise = address.replace(/\s+/g, "");
  const command = token === null ? null : `llmgw agent --server ${location.origin} --join-token ${token}${advertise ? ` --advertise ${advertise}` : ""}`;
  return html`<section class="panel add-node" aria-labelledby="add-node-title">
    <h2 id="add-node-title">Add a node</h2>
    <p>On the new machine, install llmgw and run the command below. It joins this server and reports what the machine has; replicas are placed on it from then on.</p>
    <${ErrorNote} error=${error} prefix="Could not read the join token" />
    ${command === null && error === null ? html`<${Loading} what="the join token" />` : null}
    <div class="field join-advertise">
      <label for="join-advertise">Address of the new node, as this server reaches it (needed on another machine: adds --advertise)</label>
      <input id="join-advertise" type="text" autocomplete="off" spellcheck=${false} placeholder="10.0.0.12" value=${address} onInput=${(event) => setAddress(event.currentTarget.value)} />
    </div>
    ${
      command !== null
        ? html`<pre class="join-command"><code>${command}</code></pre>
          <div class="actions"><${CopyButton} text=${command} label="Copy the join command" /></div>`
        : null
    }
    <p class="muted">The token lets any machine that has it join: share it like a password.</p>
  </section>`;
}
