// A strict reader of Prometheus's text exposition format (version 0.0.4), for tests of
// GET /metrics. prom-client writes the format but has no parser, so this checks what
// Prometheus itself would refuse: every line is empty, a comment, or
// `name{label="value",...} value [timestamp]` with valid names, escapes and numbers; a
// family's TYPE comes before its samples and its samples are together; no series twice;
// and each histogram's buckets are cumulative, end at le="+Inf", and agree with _count.
// Any violation throws, naming the line.

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Family {
  name: string;
  type: string;
  help: string | null;
  samples: Sample[];
}

export interface Exposition {
  families: Map<string, Family>;
  /** The value of the one sample with this name and exactly these labels, or undefined. */
  value(name: string, labels?: Record<string, string>): number | undefined;
  /** Every sample with this name whose labels include these. */
  samples(name: string, labels?: Record<string, string>): Sample[];
}

type OpenFamily = Family & { typed: boolean };

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const TYPES = new Set(["counter", "gauge", "histogram", "summary", "untyped"]);
const SUFFIXES: Record<string, string[]> = { histogram: ["_bucket", "_sum", "_count"], summary: ["_sum", "_count", ""] };

export function parsePrometheusText(text: string): Exposition {
  if (text.length > 0 && !text.endsWith("\n")) throw new Error("the exposition must end with a line feed");
  const families = new Map<string, OpenFamily>();
  const seenSeries = new Set<string>();
  const closed = new Set<string>();
  let current: OpenFamily | undefined;
  const lines = text.split("\n");
  lines.pop();
  lines.forEach((line, index) => {
    const where = `line ${index + 1} (${JSON.stringify(line)})`;
    if (line === "") return;
    if (line.startsWith("#")) {
      const match = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
      if (match === null) return; // an ordinary comment
      const [, keyword, name, rest] = match as unknown as [string, "HELP" | "TYPE", string, string | undefined];
      if (!METRIC_NAME.test(name)) throw new Error(`${where}: invalid metric name`);
      const family = openFamily(name, where);
      if (keyword === "TYPE") {
        if (family.samples.length > 0) throw new Error(`${where}: TYPE after the family's samples`);
        if (rest === undefined || !TYPES.has(rest)) throw new Error(`${where}: unknown type`);
        if (family.typed) throw new Error(`${where}: a second TYPE`);
        family.type = rest;
        family.typed = true;
      } else {
        if (family.help !== null) throw new Error(`${where}: a second HELP`);
        family.help = unescapeHelp(rest ?? "", where);
      }
      return;
    }
    const sample = parseSample(line, where);
    const family = openFamily(familyOf(sample.name), where);
    const key = `${sample.name}${JSON.stringify(Object.entries(sample.labels).sort())}`;
    if (seenSeries.has(key)) throw new Error(`${where}: the same series twice`);
    seenSeries.add(key);
    family.samples.push(sample);
  });

  for (const family of families.values()) if (family.type === "histogram") checkHistogram(family);

  const matches = (sample: Sample, labels: Record<string, string>) => Object.entries(labels).every(([k, v]) => sample.labels[k] === v);
  return {
    families: new Map([...families].map(([name, family]) => [name, { name, type: family.type, help: family.help, samples: family.samples }])),
    value(name, labels = {}) {
      const found = [...families.values()]
        .flatMap((family) => family.samples)
        .filter((sample) => sample.name === name && Object.keys(sample.labels).length === Object.keys(labels).length && matches(sample, labels));
      return found[0]?.value;
    },
    samples(name, labels = {}) {
      return [...families.values()].flatMap((family) => family.samples).filter((sample) => sample.name === name && matches(sample, labels));
    },
  };

  /** The family a sample belongs to: its own name, or a histogram's/summary's base name. */
  function familyOf(sampleName: string): string {
    for (const [name, family] of families) {
      const suffixes = SUFFIXES[family.type] ?? [""];
      if (suffixes.some((suffix) => sampleName === name + suffix)) return name;
    }
    return sampleName;
  }

  function openFamily(name: string, where: string): OpenFamily {
    if (current?.name === name) return current;
    if (closed.has(name) || families.has(name)) throw new Error(`${where}: family ${name} appears in two places`);
    if (current !== undefined) closed.add(current.name);
    current = { name, type: "untyped", help: null, samples: [], typed: false };
    families.set(name, current);
    return current;
  }
}

function parseSample(line: string, where: string): Sample {
  const nameMatch = /^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line);
  if (nameMatch === null) throw new Error(`${where}: no metric name`);
  const name = nameMatch[0];
  let rest = line.slice(name.length);
  const labels: Record<string, string> = {};
  if (rest.startsWith("{")) {
    rest = rest.slice(1);
    for (;;) {
      if (rest.startsWith("}")) {
        rest = rest.slice(1);
        break;
      }
      const labelMatch = /^([^=]*)="/.exec(rest);
      if (labelMatch === null || !LABEL_NAME.test(labelMatch[1]!)) throw new Error(`${where}: bad label`);
      const labelName = labelMatch[1]!;
      if (labelName in labels) throw new Error(`${where}: label ${labelName} twice`);
      rest = rest.slice(labelMatch[0].length);
      let value = "";
      for (;;) {
        const char = rest[0];
        if (char === undefined) throw new Error(`${where}: unterminated label value`);
        rest = rest.slice(1);
        if (char === '"') break;
        if (char === "\n") throw new Error(`${where}: raw line feed in a label value`);
        if (char === "\\") {
          const escaped = rest[0];
          rest = rest.slice(1);
          if (escaped === "\\") value += "\\";
          else if (escaped === '"') value += '"';
          else if (escaped === "n") value += "\n";
          else throw new Error(`${where}: bad escape \\${escaped ?? ""} in a label value`);
        } else value += char;
      }
      labels[labelName] = value;
      if (rest.startsWith(",")) rest = rest.slice(1);
      else if (!rest.startsWith("}")) throw new Error(`${where}: expected , or } after a label`);
    }
  }
  const valueMatch = /^ (\S+)(?: (-?\d+))?$/.exec(rest);
  if (valueMatch === null) throw new Error(`${where}: expected ' value [timestamp]' after the name and labels`);
  return { name, labels, value: parseValue(valueMatch[1]!, where) };
}

/** Values as Prometheus reads them: Go's ParseFloat, which takes NaN and [+-]Inf(inity) in any case (prom-client writes "Nan"). */
function parseValue(text: string, where: string): number {
  const special = /^([-+]?)(inf|infinity|nan)$/i.exec(text);
  if (special !== null) return special[2]!.toLowerCase() === "nan" ? NaN : special[1] === "-" ? -Infinity : Infinity;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) throw new Error(`${where}: invalid value ${text}`);
  return Number(text);
}

function unescapeHelp(text: string, where: string): string {
  return text.replace(/\\(.?)/g, (_, escaped: string) => {
    if (escaped === "\\") return "\\";
    if (escaped === "n") return "\n";
    throw new Error(`${where}: bad escape in HELP`);
  });
}

function checkHistogram(family: Family): void {
  const groups = new Map<string, { buckets: Array<[number, number]>; count?: number; sum?: number }>();
  for (const sample of family.samples) {
    const { le, ...rest } = sample.labels;
    const key = JSON.stringify(Object.entries(rest).sort());
    const group = groups.get(key) ?? { buckets: [] };
    groups.set(key, group);
    if (sample.name === `${family.name}_bucket`) {
      if (le === undefined) throw new Error(`${family.name}: a bucket without le`);
      group.buckets.push([parseValue(le, family.name), sample.value]);
    } else if (sample.name === `${family.name}_count`) group.count = sample.value;
    else if (sample.name === `${family.name}_sum`) group.sum = sample.value;
  }
  for (const [key, group] of groups) {
    const what = `${family.name}${key}`;
    if (group.count === undefined || group.sum === undefined) throw new Error(`${what}: _count or _sum missing`);
    const last = group.buckets.at(-1);
    if (last === undefined || last[0] !== Infinity) throw new Error(`${what}: the last bucket is not le="+Inf"`);
    if (last[1] !== group.count) throw new Error(`${what}: the +Inf bucket (${last[1]}) differs from _count (${group.count})`);
    for (let i = 1; i < group.buckets.length; i += 1) {
      const [previousLe, previous] = group.buckets[i - 1]!;
      const [le, value] = group.buckets[i]!;
      if (!(le > previousLe)) throw new Error(`${what}: bucket bounds not increasing`);
      if (value < previous) throw new Error(`${what}: buckets not cumulative`);
    }
  }
}
