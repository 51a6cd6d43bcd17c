// The nearest-rank percentile the routing benchmarks report (p50, p95): the smallest value
// with at least `share` of the values at or below it; NaN for no values.
export function percentile(values: readonly number[], share: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(share * sorted.length) - 1))]!;
}
