// Latency histograms that survive the raw usage rows: a request's duration (or time to
// first token) in milliseconds falls into one of fixed log-spaced buckets, and a
// histogram is the count per bucket. Histograms of any minutes, keys and models add up
// bucket by bucket, so p50 and p95 over a day or a month are read from the merged
// counts once retention has deleted the rows themselves.
//
// Buckets: 0 holds 0 ms; bucket i ≥ 1 holds [2^((i-1)/8), 2^(i/8)) ms, eight buckets per
// doubling. A percentile answers the bucket's geometric middle, 2^((i-0.5)/8), rounded to
// a whole millisecond, so it is within 2^(1/16) - 1 ≈ 4.4% of the true value (plus the
// rounding, at most 0.5 ms); below ~12 ms a bucket holds one whole millisecond at most, so
// short latencies come back exact. Eight per doubling keeps a whole day of one model to a
// few dozen non-zero buckets, which is why the histogram is stored sparse.

/** Buckets per doubling of the latency. */
const BUCKETS_PER_DOUBLING = 8;

/** Sparse: bucket index (as text, the JSON object key) → count. */
export type Histogram = Record<string, number>;

/** The bucket a latency in milliseconds falls into. */
export function bucketOf(ms: number): number {
  if (!(ms >= 1)) return 0;
  return Math.floor(Math.log2(ms) * BUCKETS_PER_DOUBLING) + 1;
}

/** What a percentile that falls in `bucket` answers: its geometric middle, in whole ms. */
export function bucketValue(bucket: number): number {
  if (bucket <= 0) return 0;
  return Math.round(2 ** ((bucket - 0.5) / BUCKETS_PER_DOUBLING));
}

/** Adds one latency to a histogram (in place). */
export function observe(histogram: Histogram, ms: number): void {
  const key = String(bucketOf(ms));
  histogram[key] = (histogram[key] ?? 0) + 1;
}

/** Adds `from`'s counts into `into` (in place). */
export function mergeInto(into: Histogram, from: Histogram): void {
  for (const [bucket, count] of Object.entries(from)) into[bucket] = (into[bucket] ?? 0) + count;
}

/** Parses a stored histogram; text that is not one (never written by llmgw) counts as empty. */
export function parseHistogram(text: string | null): Histogram {
  if (text === null || text === "") return {};
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return {};
    const histogram: Histogram = {};
    for (const [bucket, count] of Object.entries(parsed)) {
      // PostgreSQL's sum() over bigint is numeric, which json_object_agg may write as text.
      const value = Number(count);
      if (Number.isFinite(value) && value > 0) histogram[bucket] = value;
    }
    return histogram;
  } catch {
    return {};
  }
}

/**
 * The nearest-rank percentile (`fraction` 0.5 for p50) of the merged counts: the value of
 * the first bucket whose running count reaches ceil(fraction × total); null when empty.
 */
export function percentile(histogram: Histogram, fraction: number): number | null {
  const buckets = Object.entries(histogram)
    .map(([bucket, count]) => [Number(bucket), count] as const)
    .filter(([, count]) => count > 0)
    .sort(([a], [b]) => a - b);
  const total = buckets.reduce((sum, [, count]) => sum + count, 0);
  if (total === 0) return null;
  const rank = Math.max(1, Math.ceil(fraction * total));
  let seen = 0;
  for (const [bucket, count] of buckets) {
    seen += count;
    if (seen >= rank) return bucketValue(bucket);
  }
  return bucketValue(buckets[buckets.length - 1]![0]);
}
