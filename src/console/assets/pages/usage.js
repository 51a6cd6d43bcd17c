// The Usage page: requests, tokens (in and out), cost, error rate and p95 latency over
// time, one line per model or per key, for the last hour, day, week or month, and the
// numbers behind the charts as tables. Everything comes from GET /api/v1/usage, which adds
// up the stored per-minute and per-hour aggregates: once grouped by model or key and by
// minute, hour or day (the charts), once by model or key alone (the totals, whose percentiles are
// those of all the group's requests, which per-bucket rows cannot give).
//
// Charts are uPlot on canvas, sized from their container (phone width too) through uPlot's
// API; each has a heading and a sentence that says what it shows, for people who cannot see
// it and for tests.
import { html, useEffect, useMemo, useRef, useState } from "../vendor/preact-htm.js";
import uPlot from "../vendor/uplot.js";
import { api, query } from "../lib/api.js";
import { usePoll } from "../lib/live.js";
import { ErrorNote, Loading, formatNumber, formatUsd } from "../lib/ui.js";

const MINUTE_MS = 60_000;
const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

// Buckets small enough to show a shape, few enough to draw: 60 minutes, 24 or 168 hours, 30 days.
const RANGES = [
  { value: "1h", label: "Last hour", spanMs: HOUR_MS, bucket: "minute", phrase: "in the last hour" },
  { value: "24h", label: "Last 24 hours", spanMs: DAY_MS, bucket: "hour", phrase: "in the last 24 hours" },
  { value: "7d", label: "Last 7 days", spanMs: 7 * DAY_MS, bucket: "hour", phrase: "in the last 7 days" },
  { value: "30d", label: "Last 30 days", spanMs: 30 * DAY_MS, bucket: "day", phrase: "in the last 30 days" },
];
const BUCKET_MS = { minute: MINUTE_MS, hour: HOUR_MS, day: DAY_MS };

const GROUPINGS = [
  { value: "model", label: "Model" },
  { value: "key", label: "Key" },
];

/** Lines drawn per chart; the tables list every group. */
const MAX_SERIES = 6;
/** Line colours, each at 4.5:1 or more on white (style.css has the same ones for the legend). */
const COLOURS = ["#1f4e8c", "#b0470f", "#1d6b3a", "#8e2c8e", "#9b1c1c", "#4f5b6d"];

function groupName(row, by) {
  const name = row[by];
  return name === null ? (by === "key" ? "(no key)" : "(no model)") : name;
}

function percent(errors, requests) {
  return requests > 0 ? (100 * errors) / requests : null;
}

function formatPercent(value) {
  return value === null ? "–" : `${formatNumber(value, value < 10 ? 1 : 0)}%`;
}

function formatMs(value) {
  return value === null || value === undefined ? "–" : `${formatNumber(value)} ms`;
}

function bucketLabel(ms, bucket) {
  const at = new Date(ms);
  // Days are UTC days (as the server adds them up), so their date is read in UTC too.
  return bucket === "day"
    ? `${at.toLocaleDateString([], { timeZone: "UTC" })} (UTC)`
    : at.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

async function loadUsage({ range, by }, signal) {
  const from = new Date(Date.now() - range.spanMs).toISOString();
  const [overTime, totals] = await Promise.all([
    api(`/api/v1/usage${query({ from, group_by: `${by},${range.bucket}` })}`, { signal }),
    api(`/api/v1/usage${query({ from, group_by: by })}`, { signal }),
  ]);
  return { range: range.value, by, from, overTime: overTime.data, groups: totals.data, total: totals.total };
}

/**
 * The charts' data: one x per bucket from the range's start to now (empty buckets count 0
 * requests, and have no error rate or latency), the groups drawn (the busiest), and each
 * bucket's sums over every group for the summaries.
 */
function chartData(data, range, by) {
  const bucketMs = BUCKET_MS[range.bucket];
  const first = Math.floor(Date.parse(data.from) / bucketMs) * bucketMs;
  const last = Math.floor(Date.now() / bucketMs) * bucketMs;
  const starts = [];
  for (let at = first; at <= last; at += bucketMs) starts.push(at);
  const index = new Map(starts.map((at, position) => [at, position]));
  const drawn = [...data.groups]
    .sort((a, b) => b.requests - a.requests)
    .slice(0, MAX_SERIES)
    .map((row) => groupName(row, by));
  const empty = (fill) => starts.map(() => fill);
  const perGroup = new Map(
    drawn.map((name) => [name, { requests: empty(0), errors: empty(0), tokensIn: empty(0), tokensOut: empty(0), cost: empty(0), p95: empty(null) }]),
  );
  const all = { requests: empty(0), errors: empty(0), tokensIn: empty(0), tokensOut: empty(0), cost: empty(0) };
  for (const row of data.overTime) {
    const position = index.get(Date.parse(row.period));
    if (position === undefined) continue;
    all.requests[position] += row.requests;
    all.errors[position] += row.errors;
    all.tokensIn[position] += row.prompt_tokens;
    all.tokensOut[position] += row.completion_tokens;
    all.cost[position] += row.cost_usd;
    const series = perGroup.get(groupName(row, by));
    if (series === undefined) continue;
    series.requests[position] += row.requests;
    series.errors[position] += row.errors;
    series.tokensIn[position] += row.prompt_tokens;
    series.tokensOut[position] += row.completion_tokens;
    series.cost[position] += row.cost_usd;
    series.p95[position] = row.p95_ms;
  }
  return { xs: starts.map((at) => at / 1000), starts, drawn, perGroup, all };
}

/** The bucket with the most of `values` (the first when tied), or null when all are 0 or empty. */
function peak(values) {
  let best = null;
  values.forEach((value, position) => {
    if (value !== null && value > 0 && (best === null || value > values[best])) best = position;
  });
  return best;
}

/** What each chart draws, and the sentence that says it in words. */
function chartsOf(series, data, range, by) {
  const { xs, starts, drawn, perGroup, all } = series;
  const sum = (values) => values.reduce((total, value) => total + value, 0);
  const when = (position) => bucketLabel(starts[position], range.bucket);
  const lines = (pick, format) => drawn.map((name, position) => ({ label: name, colour: position, values: pick(perGroup.get(name)), format }));
  const perGroupText = (total) =>
    data.groups.length === 0
      ? ""
      : `; by ${by}: ${[...data.groups]
          .sort((a, b) => b.requests - a.requests)
          .map((row) => `${groupName(row, by)} ${total(row)}`)
          .join(", ")}`;

  const requests = sum(all.requests);
  const busiest = peak(all.requests);
  const errors = sum(all.errors);
  const rates = all.requests.map((count, position) => percent(all.errors[position], count));
  const worstRate = peak(rates);
  const p95s = drawn.flatMap((name) => perGroup.get(name).p95.map((value, position) => ({ name, value, position }))).filter((point) => point.value !== null);
  const slowest = p95s.reduce((best, point) => (best === null || point.value > best.value ? point : best), null);
  return [
    {
      id: "requests",
      title: "Requests",
      lines: lines((group) => group.requests, formatNumber),
      summary:
        `Requests: ${formatNumber(requests)} ${range.phrase}` +
        (busiest === null
          ? "."
          : `, at most ${formatNumber(all.requests[busiest])} in one ${range.bucket} (${when(busiest)})${perGroupText((row) => formatNumber(row.requests))}.`),
      format: formatNumber,
    },
    {
      id: "tokens",
      title: "Tokens in and out",
      lines: drawn.flatMap((name, position) => [
        { label: `${name} in`, colour: position, values: perGroup.get(name).tokensIn },
        { label: `${name} out`, colour: position, dash: true, values: perGroup.get(name).tokensOut },
      ]),
      summary: `Tokens: ${formatNumber(sum(all.tokensIn))} in (prompt) and ${formatNumber(sum(all.tokensOut))} out (completion) ${range.phrase}.`,
      format: formatNumber,
    },
    {
      id: "cost",
      title: "Cost",
      lines: lines((group) => group.cost),
      summary: `Cost: ${formatUsd(data.total.cost_usd)} ${range.phrase}${perGroupText((row) => formatUsd(row.cost_usd))}.`,
      format: formatUsd,
    },
    {
      id: "errors",
      title: "Error rate",
      lines: lines((group) => group.requests.map((count, position) => percent(group.errors[position], count))),
      summary:
        `Error rate: ${formatPercent(percent(errors, requests))} ${range.phrase} (${formatNumber(errors)} errors of ${formatNumber(requests)} requests)` +
        (worstRate === null ? "." : `, highest ${formatPercent(rates[worstRate])} in one ${range.bucket} (${when(worstRate)}).`),
      format: (value) => formatPercent(value),
    },
    {
      id: "latency",
      title: "p95 latency",
      lines: lines((group) => group.p95),
      summary:
        `p95 latency: ${formatMs(data.total.p95_ms)} over all requests ${range.phrase}` +
        (slowest === null ? "." : `, highest ${formatMs(slowest.value)} for ${slowest.name} in one ${range.bucket} (${when(slowest.position)}).`),
      format: formatMs,
    },
  ].map((chart) => ({ ...chart, xs }));
}

/**
 * The values of a bucket hold from its start to the next one's (a step, not a slope between
 * two hours), so the last bucket gets an end point too: the start of the bucket after it.
 */
function steppedData(xs, lines, bucket) {
  const end = xs.length === 0 ? [] : [xs[xs.length - 1] + BUCKET_MS[bucket] / 1000];
  return [[...xs, ...end], ...lines.map((line) => [...line.values, ...(xs.length === 0 ? [] : [line.values[line.values.length - 1]])])];
}

/** A bucket with a value between two without (an error rate, a latency) draws no step: it gets a dot. */
function isolatedPoints(u, seriesIndex) {
  const values = u.data[seriesIndex];
  const found = [];
  for (let position = 0; position < values.length - 1; position += 1) {
    if (values[position] !== null && values[position + 1] === null && (position === 0 || values[position - 1] === null)) found.push(position);
  }
  return found.length === 0 ? null : found;
}

/** One uPlot chart, made again when its lines change and otherwise only given new data. */
function Plot({ xs, lines, format, bucket }) {
  const box = useRef(null);
  const plot = useRef(null);
  const shape = JSON.stringify(lines.map((line) => [line.label, line.colour, line.dash === true]));
  useEffect(() => {
    const element = box.current;
    if (!element) return undefined;
    const height = () => (element.clientWidth < 500 ? 180 : 220);
    const step = uPlot.paths.stepped({ align: 1 });
    plot.current = new uPlot(
      {
        width: Math.max(200, element.clientWidth),
        height: height(),
        legend: { show: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true }, y: { range: (_u, min, max) => [0, Math.max(max ?? 0, min ?? 0) > 0 ? max * 1.1 : 1] } },
        axes: [
          { stroke: "#1c2330", grid: { stroke: "#e3e7ec" }, ticks: { stroke: "#d5dae1" } },
          { stroke: "#1c2330", size: 70, grid: { stroke: "#e3e7ec" }, ticks: { stroke: "#d5dae1" }, values: (_u, ticks) => ticks.map((tick) => format(tick)) },
        ],
        series: [
          { value: (_u, seconds) => (seconds === null ? "–" : bucketLabel(seconds * 1000, bucket)) },
          ...lines.map((line) => ({
            label: line.label,
            stroke: COLOURS[line.colour % COLOURS.length],
            width: 2,
            dash: line.dash ? [6, 4] : undefined,
            paths: step,
            points: { show: false, size: 7, filter: isolatedPoints },
            value: (_u, value) => format(value),
          })),
        ],
      },
      steppedData(xs, lines, bucket),
      element,
    );
    // The canvas follows its box: a turned phone or a resized window redraws at the new width.
    const resize = new ResizeObserver(() => plot.current?.setSize({ width: Math.max(200, element.clientWidth), height: height() }));
    resize.observe(element);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
  }, [shape, bucket]);
  useEffect(() => {
    plot.current?.setData(steppedData(xs, lines, bucket));
  }, [xs, lines]);
  return html`<div class="plot" ref=${box} aria-hidden="true"></div>`;
}

function Chart({ chart, bucket }) {
  const titleId = `chart-${chart.id}-title`;
  return html`<figure class="chart" aria-labelledby=${titleId} data-chart=${chart.id}>
    <h3 id=${titleId}>${chart.title}</h3>
    <figcaption class="chart-summary">${chart.summary}</figcaption>
    ${
      chart.lines.length === 0
        ? html`<p class="muted">Nothing to draw yet.</p>`
        : html`<${Plot} xs=${chart.xs} lines=${chart.lines} format=${chart.format} bucket=${bucket} />
          <ul class="chart-legend">
            ${chart.lines.map((line) => html`<li><span class=${`swatch swatch-${line.colour % COLOURS.length}${line.dash ? " swatch-dashed" : ""}`}></span>${line.label}</li>`)}
          </ul>`
    }
  </figure>`;
}

function TotalsTable({ data, by }) {
  const heading = GROUPINGS.find((grouping) => grouping.value === by).label;
  const rows = [...data.groups].sort((a, b) => b.requests - a.requests);
  const cells = (row) => html`<td class="num">${formatNumber(row.requests)}</td>
    <td class="num">${formatNumber(row.errors)}</td>
    <td class="num">${formatPercent(percent(row.errors, row.requests))}</td>
    <td class="num">${formatNumber(row.prompt_tokens)}</td>
    <td class="num">${formatNumber(row.completion_tokens)}</td>
    <td class="num">${formatUsd(row.cost_usd)}</td>
    <td class="num">${formatMs(row.p50_ms)}</td>
    <td class="num">${formatMs(row.p95_ms)}</td>
    <td class="num">${formatMs(row.ttft_p50_ms)}</td>`;
  // Focusable: on a phone the table scrolls sideways, and a keyboard must be able to scroll it.
  return html`<div class="table-wrap" tabindex="0" role="region" aria-label=${`Usage by ${by}`}>
    <table class="usage-totals">
      <caption class="visually-hidden">Usage by ${by}</caption>
      <thead>
        <tr>
          <th scope="col">${heading}</th>
          <th scope="col" class="num">Requests</th>
          <th scope="col" class="num">Errors</th>
          <th scope="col" class="num">Error rate</th>
          <th scope="col" class="num">Tokens in</th>
          <th scope="col" class="num">Tokens out</th>
          <th scope="col" class="num">Cost</th>
          <th scope="col" class="num">p50</th>
          <th scope="col" class="num">p95</th>
          <th scope="col" class="num">TTFT p50</th>
        </tr>
      </thead>
      <tbody>
        ${
          rows.length === 0
            ? html`<tr><td colspan="10" class="muted">No requests in this time range.</td></tr>`
            : rows.map(
                (row) => html`<tr key=${groupName(row, by)} data-group=${groupName(row, by)}><th scope="row">${groupName(row, by)}</th>${cells(row)}</tr>`,
              )
        }
      </tbody>
      ${rows.length === 0 ? null : html`<tfoot><tr><th scope="row">All</th>${cells(data.total)}</tr></tfoot>`}
    </table>
  </div>`;
}

function BucketTable({ series, range }) {
  const rows = series.starts.map((at, position) => ({ at, position })).filter(({ position }) => series.all.requests[position] > 0);
  if (rows.length === 0) return null;
  return html`<details class="panel">
    <summary>Numbers per ${range.bucket} (${formatNumber(rows.length)} with requests)</summary>
    <div class="table-wrap" tabindex="0" role="region" aria-label=${`Usage per ${range.bucket}`}>
      <table>
        <thead>
          <tr>
            <th scope="col">${range.bucket === "day" ? "Day" : range.bucket === "minute" ? "Minute" : "Hour"} from</th>
            <th scope="col" class="num">Requests</th>
            <th scope="col" class="num">Errors</th>
            <th scope="col" class="num">Tokens in</th>
            <th scope="col" class="num">Tokens out</th>
            <th scope="col" class="num">Cost</th>
          </tr>
        </thead>
        <tbody>
          ${rows.reverse().map(
            ({ at, position }) => html`<tr key=${at}>
            <td>${bucketLabel(at, range.bucket)}</td>
            <td class="num">${formatNumber(series.all.requests[position])}</td>
            <td class="num">${formatNumber(series.all.errors[position])}</td>
            <td class="num">${formatNumber(series.all.tokensIn[position])}</td>
            <td class="num">${formatNumber(series.all.tokensOut[position])}</td>
            <td class="num">${formatUsd(series.all.cost[position])}</td>
          </tr>`,
          )}
        </tbody>
      </table>
    </div>
  </details>`;
}

export function UsagePage() {
  const [rangeValue, setRangeValue] = useState("1h");
  const [by, setBy] = useState("model");
  const range = RANGES.find((candidate) => candidate.value === rangeValue);
  const { data, error, loading } = usePoll((signal) => loadUsage({ range, by }, signal), [rangeValue, by]);
  // What the last poll read may be of the range or grouping chosen before; it is not drawn as this one.
  const current = data !== null && data.range === rangeValue && data.by === by ? data : null;
  const series = useMemo(() => (current === null ? null : chartData(current, range, by)), [current]);
  const charts = useMemo(() => (series === null ? [] : chartsOf(series, current, range, by)), [series]);
  const byLabel = GROUPINGS.find((grouping) => grouping.value === by).label.toLowerCase();

  return html`<h1>Usage</h1>
    <p class="muted">Requests through the OpenAI-compatible API, by ${byLabel}, read from the usage records every 2 s.</p>
    <div class="toolbar">
      <div class="field">
        <label for="usage-range">Time range</label>
        <select id="usage-range" value=${rangeValue} onChange=${(event) => setRangeValue(event.currentTarget.value)}>
          ${RANGES.map((candidate) => html`<option value=${candidate.value}>${candidate.label}</option>`)}
        </select>
      </div>
      <div class="field">
        <label for="usage-by">By</label>
        <select id="usage-by" value=${by} onChange=${(event) => setBy(event.currentTarget.value)}>
          ${GROUPINGS.map((grouping) => html`<option value=${grouping.value}>${grouping.label}</option>`)}
        </select>
      </div>
    </div>
    <${ErrorNote} error=${error} />
    ${
      current === null
        ? loading || data !== null
          ? html`<${Loading} what="usage" />`
          : null
        : html`<h2>Over time, per ${range.bucket}</h2>
          <div class="usage-charts">
            ${charts.map((chart) => html`<${Chart} key=${chart.id} chart=${chart} bucket=${range.bucket} />`)}
          </div>
          <h2>Totals by ${byLabel}</h2>
          <${TotalsTable} data=${current} by=${by} />
          <${BucketTable} series=${series} range=${range} />`
    }`;
}
