// The Jobs page: serve and update jobs as `llmgw ctl job` shows them (src/cli/ctl-job.ts),
// followed live. `#/jobs` is the "Serve a model" form (serve-form.js) and the list of jobs;
// `#/jobs/ID` is one job with its steps (state, detail line, time), the mirror step's
// progress (bytes as a bar, speed, time left, files), the smoke test's reply and tokens/s,
// the error when it failed, and Cancel while it is queued, running or waiting for room (a
// waiting job goes on by itself once a node has room, src/serve/jobs.ts). The page polls the
// job (and reloads at once on any event) rather than waiting for the job's end event,
// because steps change without events.
import { html, useEffect, useRef, useState } from "../vendor/preact-htm.js";
import { api } from "../lib/api.js";
import { useAction, usePoll } from "../lib/live.js";
import { Bar, ConfirmDialog, ErrorNote, Loading, StateBadge, Time, formatBytes, formatNumber } from "../lib/ui.js";
import { ServeForm } from "./serve-form.js";

/** A job being followed is polled this often: the mirror's bar and the steps move quickly. */
const JOB_POLL_MS = 1000;
const UNFINISHED = new Set(["queued", "running", "waiting"]);

export function JobsPage({ route }) {
  const jobId = route.rest[0];
  return html`<h1>Jobs</h1>
    ${
      jobId === undefined
        ? html`<${ServeForm} onStarted=${(job) => {
            location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
          }} />`
        : html`<p><a href="#/jobs">← All jobs and the Serve form</a></p>
          <${JobDetail} key=${jobId} id=${jobId} />`
    }
    <${JobList} selected=${jobId} />`;
}

/** The model a job is about: the one it made or changed, else the one it was asked for. */
function modelOf(job) {
  const asked = job.kind === "serve" ? job.request?.name : job.request?.model;
  return job.model ?? (typeof asked === "string" ? asked : null);
}

/** "serve llmgw-test/tiny-llama-GGUF as 'tiny'", "update of 'tiny' to the latest revision", "rollback of 'tiny'". */
function describeSubject(job) {
  const request = job.request ?? {};
  const text = (key) => (typeof request[key] === "string" ? request[key] : null);
  const model = modelOf(job);
  if (job.kind === "serve")
    return `serve ${text("repo") ?? "?"}${text("revision") === null ? "" : `@${text("revision")}`}${model === null ? "" : ` as '${model}'`}`;
  if (request.rollback === true) return `rollback of '${model ?? "?"}'`;
  return `update of '${model ?? "?"}'${text("revision") === null ? " to the latest revision" : ` to ${text("revision")}`}`;
}

/**
 * The step a job is at: the running one, else the one it failed or was cancelled at, else
 * the last one done (not a step skipped after a failure, which would hide where it stopped).
 */
function currentStep(job) {
  const inState = (state) => job.steps.find((step) => step.state === state);
  return (
    inState("running") ?? inState("waiting") ?? inState("failed") ?? inState("cancelled") ?? [...job.steps].reverse().find((step) => step.state === "done")
  );
}

/** "42 s", "3 min 05 s", "1 h 04 min". */
export function formatDuration(totalSeconds) {
  if (totalSeconds === null || totalSeconds === undefined || !Number.isFinite(totalSeconds)) return "–";
  const seconds = Math.max(0, Math.round(totalSeconds));
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, "0")} s`;
  return `${Math.floor(seconds / 3600)} h ${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")} min`;
}

function stepTime(step) {
  if (step.started_at === null) return null;
  const started = Date.parse(step.started_at);
  if (step.finished_at !== null) return `took ${formatDuration((Date.parse(step.finished_at) - started) / 1000)}`;
  return step.state === "running" ? `running for ${formatDuration((Date.now() - started) / 1000)}` : null;
}

function JobList({ selected }) {
  const jobs = usePoll((signal) => api("/api/v1/jobs?limit=100", { signal }), []);
  const list = jobs.data?.data;
  return html`<section aria-labelledby="jobs-list-heading">
    <h2 id="jobs-list-heading">All jobs</h2>
    <${ErrorNote} error=${jobs.error} prefix="Could not list the jobs" />
    ${
      list === undefined
        ? jobs.error
          ? null
          : html`<${Loading} what="jobs" />`
        : list.length === 0
          ? html`<p class="panel">No jobs yet. Serve a model with the form above, or run <code>llmgw ctl model serve OWNER/NAME</code>.</p>`
          : html`<div class="table-wrap" tabindex="0" role="region" aria-label="Jobs">
            <table class="jobs-table stack">
              <caption class="visually-hidden">Serve and update jobs, newest first</caption>
              <thead>
                <tr>
                  <th scope="col">Job</th>
                  <th scope="col">Kind</th>
                  <th scope="col">Model</th>
                  <th scope="col">State</th>
                  <th scope="col">Step</th>
                  <th scope="col">Started</th>
                  <th scope="col">Finished</th>
                </tr>
              </thead>
              <tbody>
                ${list.map((job) => {
                  const step = currentStep(job);
                  return html`<tr class=${job.id === selected ? "jobs-selected" : ""} data-job=${job.id}>
                    <td data-label="Job"><a class="mono" href=${`#/jobs/${encodeURIComponent(job.id)}`} aria-current=${job.id === selected ? "true" : undefined}>${job.id}</a></td>
                    <td data-label="Kind">${job.kind}</td>
                    <td data-label="Model">${modelOf(job) ?? html`<span class="muted">–</span>`}</td>
                    <td data-label="State"><${StateBadge} state=${job.state} /></td>
                    <td data-label="Step">${step === undefined ? html`<span class="muted">–</span>` : step.name}</td>
                    <td data-label="Started"><${Time} iso=${job.created_at} /></td>
                    <td data-label="Finished">${job.finished_at === null ? html`<span class="muted">not yet</span>` : html`<${Time} iso=${job.finished_at} />`}</td>
                  </tr>`;
                })}
              </tbody>
            </table>
          </div>`
    }
  </section>`;
}

function JobDetail({ id }) {
  const job = usePoll((signal) => api(`/api/v1/jobs/${encodeURIComponent(id)}`, { signal }), [id], { intervalMs: JOB_POLL_MS });
  const heading = useRef(null);
  // Arriving from the Serve button, the reader's place moves to the job being followed.
  useEffect(() => heading.current?.focus(), []);
  const data = job.data;
  return html`<section class="job" aria-labelledby="job-heading">
    <h2 id="job-heading" ref=${heading} tabindex="-1">Job <span class="mono">${id}</span></h2>
    <${ErrorNote} error=${job.error} prefix=${data ? "Could not refresh the job" : "Could not load the job"} />
    ${data === null ? (job.error ? null : html`<${Loading} what="the job" />`) : html`<${JobView} job=${data} reload=${job.reload} />`}
  </section>`;
}

function JobView({ job, reload }) {
  const running = UNFINISHED.has(job.state);
  const step = currentStep(job);
  const failedStep = job.steps.find((candidate) => candidate.state === "failed");
  const model = modelOf(job);
  return html`<div class="panel">
      <p class="job-subject">${describeSubject(job)}</p>
      <p role="status" class="job-state">
        <${StateBadge} state=${job.state} />
        ${" "}${job.state === "waiting" ? "in the catalog, waiting for room on a node; it goes on by itself once a node has room" : running ? (step ? `at step ${step.name}` : "waiting to start") : job.state === "done" ? "finished" : `ended ${job.state}`}
      </p>
      <dl class="facts">
        <dt>Kind</dt><dd>${job.kind}</dd>
        <dt>Model</dt><dd>${model ?? html`<span class="muted">not named yet</span>`}</dd>
        <dt>Started</dt><dd><${Time} iso=${job.created_at} /> by ${job.created_by}</dd>
        <dt>Finished</dt><dd>${job.finished_at === null ? html`<span class="muted">not yet</span>` : html`<${Time} iso=${job.finished_at} />`}</dd>
        ${job.resumed > 0 ? html`<dt>Resumed</dt><dd>${job.resumed} time(s) after a server restart</dd>` : null}
      </dl>
      ${running ? html`<${CancelJob} job=${job} onDone=${reload} />` : null}
    </div>
    ${job.state === "failed" ? html`<${ErrorNote} error=${{ message: job.error ?? "No error was recorded." }} prefix=${failedStep ? `Failed at step ${failedStep.name}` : "Failed"} />` : null}
    ${job.state !== "failed" && job.error !== null ? html`<p class="notice">${job.error}</p>` : null}
    <h3>Steps</h3>
    <ol class="job-steps">
      ${job.steps.map((item) => html`<${StepItem} step=${item} />`)}
    </ol>
    ${job.result !== null ? html`<${SmokeResult} result=${job.result} />` : null}
    ${
      job.state === "done" && model !== null
        ? html`<p>'${model}' is served: see it in <a href="#/models">Models</a>, or talk to it in the <a href="#/playground">Playground</a>.</p>`
        : null
    }
    <${RequestFacts} request=${job.request} />`;
}

function StepItem({ step }) {
  const time = stepTime(step);
  return html`<li class=${`job-step job-step-${step.state}`} data-step=${step.name}>
    <div class="job-step-head">
      <span class="job-step-name">${step.name}</span>
      <${StateBadge} state=${step.state} />
      ${time === null ? null : html`<span class="muted">${time}</span>`}
    </div>
    ${step.detail === null ? null : html`<p class="job-step-detail">${step.detail}</p>`}
    ${step.progress && (step.state === "running" || step.name === "mirror") ? html`<${MirrorProgress} progress=${step.progress} running=${step.state === "running"} />` : null}
  </li>`;
}

/** The mirror's bytes as a bar, with speed, time left and files (what ctl's progress line says). */
function MirrorProgress({ progress, running }) {
  const facts = [];
  // The server measures speed over its last few seconds of progress; a stalled download has none yet.
  if (running) facts.push(progress.bytes_per_second === null ? "speed not measured yet" : `${formatBytes(progress.bytes_per_second)}/s`);
  if (running && progress.eta_seconds !== null) facts.push(`${formatDuration(progress.eta_seconds)} left`);
  facts.push(`${progress.files_done} of ${progress.files_total} file${progress.files_total === 1 ? "" : "s"}`);
  return html`<div class="job-progress">
    <${Bar} used=${progress.bytes_done} total=${progress.bytes_total} label="Bytes mirrored" format=${formatBytes} warnAt=${2} />
    <p class="muted job-progress-facts">${facts.join(" · ")}</p>
  </div>`;
}

function SmokeResult({ result }) {
  return html`<h3>Smoke test</h3>
    <dl class="facts smoke-result">
      <dt>Reply</dt><dd><q class="smoke-reply">${result.reply}</q></dd>
      <dt>Tokens per second</dt><dd class="smoke-speed">${result.tokens_per_second.toFixed(1)}</dd>
      <dt>Tokens</dt><dd>${formatNumber(result.completion_tokens)}</dd>
      <dt>Replica</dt><dd><span class="mono">${result.replica}</span> on ${result.node}</dd>
    </dl>`;
}

/** What the job was asked, field by field (the request as the server stored it). */
function RequestFacts({ request }) {
  const entries = Object.entries(request ?? {}).filter(([, value]) => value !== undefined && value !== null && !(Array.isArray(value) && value.length === 0));
  if (entries.length === 0) return null;
  const show = (value) => (Array.isArray(value) ? value.join(", ") : typeof value === "object" ? JSON.stringify(value) : String(value));
  return html`<h3>Request</h3>
    <dl class="facts">${entries.map(([key, value]) => html`<dt>${key}</dt><dd class="mono">${show(value)}</dd>`)}</dl>`;
}

/** What cancelling undoes (the handlers' undo, serve/serve-job.ts and serve/update-job.ts), said before the user confirms. */
function cancelUndoes(job) {
  const model = modelOf(job);
  const kept = "Files already verified stay in the mirror.";
  if (job.kind === "serve" && job.state === "waiting")
    return `'${model ?? "?"}' is in the catalog, waiting for room: cancelling removes that model from the catalog. ${kept}`;
  if (job.kind === "serve") return `The model this job added to the catalog, if it got that far, is removed. ${kept}`;
  return `'${model ?? "?"}' returns to the revision it served, unless the new one already passed its smoke test. ${kept}`;
}

function CancelJob({ job, onDone }) {
  const [asking, setAsking] = useState(false);
  const cancel = useAction();
  const confirm = async () => {
    setAsking(false);
    await cancel.run(() => api(`/api/v1/jobs/${encodeURIComponent(job.id)}/cancel`, { method: "POST" }));
    onDone();
  };
  return html`<div class="actions">
      <button type="button" class="danger" disabled=${cancel.busy} onClick=${() => setAsking(true)}>${cancel.busy ? "Cancelling…" : "Cancel"}</button>
      <span class="muted">Stops the job and undoes what it started; files already verified stay in the mirror.</span>
    </div>
    <${ErrorNote} error=${cancel.error} prefix="Could not cancel" />
    <${ConfirmDialog}
      open=${asking}
      title="Cancel the job?"
      message=${`Cancel job ${job.id} (${describeSubject(job)})? ${cancelUndoes(job)}`}
      confirmLabel="Cancel job"
      onConfirm=${confirm}
      onCancel=${() => setAsking(false)}
    />`;
}
