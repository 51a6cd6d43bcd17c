// Small building blocks every page uses: usage bars, error notes, times, sizes, state
// badges, a copy button and a confirmation dialog. Everything renders through htm, which
// escapes text: nothing here (or in a page) sets HTML from a string.
import { html, useEffect, useRef, useState } from "../vendor/preact-htm.js";

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 100 || unit === 0 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}

export function formatNumber(value, digits = 0) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return value.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function formatUsd(value) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  return `$${value < 1 ? value.toFixed(4) : value.toFixed(2)}`;
}

/** "12 s ago", "3 min ago", "in 2 h": how people read a time on a status page. */
export function relativeTime(iso, now = Date.now()) {
  if (!iso) return "never";
  const at = Date.parse(iso);
  if (!Number.isFinite(at)) return String(iso);
  const seconds = Math.round((at - now) / 1000);
  const span = Math.abs(seconds);
  const text =
    span < 60 ? `${span} s` : span < 3600 ? `${Math.round(span / 60)} min` : span < 86400 ? `${Math.round(span / 3600)} h` : `${Math.round(span / 86400)} d`;
  return seconds <= 0 ? `${text} ago` : `in ${text}`;
}

/** A time shown relative, with the exact time on hover and for screen readers. */
export function Time({ iso }) {
  if (!iso) return html`<span>never</span>`;
  return html`<time datetime=${iso} title=${iso}>${relativeTime(iso)}</time>`;
}

/** A used/total bar with its numbers in words (the bar itself is decoration for sighted users). */
export function Bar({ used, total, label, format = formatNumber, warnAt = 0.8 }) {
  const known = Number.isFinite(used) && Number.isFinite(total) && total > 0;
  const share = known ? Math.min(1, Math.max(0, used / total)) : 0;
  const text = known ? `${format(used)} of ${format(total)}` : "unknown";
  const meter = useRef(null);
  useEffect(() => {
    // Width set through the DOM, not a style attribute: the page's CSP allows no inline styles.
    if (meter.current) meter.current.style.width = `${(share * 100).toFixed(1)}%`;
  }, [share]);
  return html`<div class="bar" role="meter" aria-label=${label} aria-valuemin="0" aria-valuemax=${known ? total : 0} aria-valuenow=${known ? used : 0} aria-valuetext=${text}>
    <div class="bar-track"><div ref=${meter} class=${`bar-fill${share >= warnAt ? " bar-warn" : ""}`}></div></div>
    <span class="bar-text">${text}</span>
  </div>`;
}

/** A state word with a colour that also reads without colour. */
export function StateBadge({ state }) {
  const value = String(state ?? "unknown");
  const tone = /^(ready|succeeded|delivered|ok|active|done|verified|present)$/.test(value)
    ? "good"
    : /^(failed|lost|parked|error|revoked|expired|unplaceable|cancelled|canceled)$/.test(value)
      ? "bad"
      : /^(running|starting|fetching|placed|pending|draining|stopping|queued|waiting)$/.test(value)
        ? "busy"
        : "neutral";
  return html`<span class=${`badge badge-${tone}`}>${value}</span>`;
}

/** An error from the API (or anything thrown), in words, announced to screen readers. */
export function ErrorNote({ error, prefix }) {
  // An unreachable server is announced once, by the connection banner, not by every part of the page.
  if (!error || error.code === "unreachable") return null;
  const message = error.message ?? String(error);
  return html`<p class="error" role="alert">${prefix ? `${prefix}: ` : ""}${message}</p>`;
}

/** Copies `text`; says so for a moment. */
export function CopyButton({ text, label = "Copy" }) {
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(text);
      setCopied(true);
      setTimeout(() => setCopied(false), 2000);
    } catch {
      setCopied(false);
    }
  };
  return html`<button type="button" class="secondary" onClick=${copy}>${copied ? "Copied" : label}</button><span class="visually-hidden" aria-live="polite">${copied ? "Copied to the clipboard" : ""}</span>`;
}

/**
 * A modal confirmation (native <dialog>: focus is trapped and Escape cancels). `message`
 * names what will happen to what, such as "Remove model 'demo'?".
 */
let dialogCount = 0;

export function ConfirmDialog({ open, title, message, confirmLabel, onConfirm, onCancel, danger = true }) {
  const dialog = useRef(null);
  // Each dialog names itself by its own heading, so several on one page stay apart.
  const titleId = useRef(null);
  if (titleId.current === null) {
    dialogCount += 1;
    titleId.current = `confirm-title-${dialogCount}`;
  }
  useEffect(() => {
    const element = dialog.current;
    if (!element) return;
    if (open && !element.open) element.showModal();
    if (!open && element.open) element.close();
  }, [open]);
  return html`<dialog ref=${dialog} class="confirm" aria-labelledby=${titleId.current} onCancel=${(event) => {
    event.preventDefault();
    onCancel();
  }}>
    <h2 id=${titleId.current}>${title}</h2>
    <p>${message}</p>
    <div class="actions">
      <button type="button" class=${danger ? "danger" : ""} onClick=${onConfirm}>${confirmLabel}</button>
      <button type="button" class="secondary" onClick=${onCancel} autofocus=${danger}>Cancel</button>
    </div>
  </dialog>`;
}

/** Shown while a page's first load is on its way. */
export function Loading({ what }) {
  return html`<p class="muted" role="status">Loading ${what}…</p>`;
}
