// The GPU class: the short name placement matches a profile's `hardware.gpu.class`
// against. Drivers report long names that mix the vendor, the chip, the memory and the
// form factor ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"), and one chip appears
// under several spellings; a profile that says "H100" or "A100" must match all of them.
//
// The rule, applied to the words of the name (split at anything that is not a letter or
// a digit):
// 1. Brand words are dropped: NVIDIA, GeForce, Tesla, Quadro, AMD, Radeon, Instinct, and
//    the filler words GPU and Generation.
// 2. The class ends at the first word that describes memory or packaging rather than the
//    chip: a size ("80GB", "40G", "94GiB"), a memory type (HBM, HBM2e, HBM3), or a form
//    factor (SXM, SXM4, PCIe, NVL). Memory is reported per GPU in bytes and checked on its
//    own, so "A100-PCIE-40GB" and "A100-SXM4-80GB" are both class A100 and a profile that
//    needs 80 GB of it still only fits the second.
// 3. The remaining words are joined and upper-cased: "NVIDIA GeForce RTX 4090" → RTX4090,
//    "NVIDIA RTX A6000" → RTXA6000, "NVIDIA RTX 6000 Ada Generation" → RTX6000ADA. Words that
//    tell different chips apart are kept ("RTX 4090 D", "L40S", "Laptop").
//
// The result is stable under itself (a class normalises to itself), so a profile's class
// written by hand ("rtx-4090", "h100") can be passed through the same function. A name made
// only of dropped words (just "NVIDIA") keeps all its words rather than becoming empty.

const BRAND_WORDS = new Set(["NVIDIA", "GEFORCE", "TESLA", "QUADRO", "AMD", "RADEON", "INSTINCT", "GPU", "GENERATION"]);

/** Words from which on a name describes memory or packaging, not the chip. */
const DETAIL_WORD = /^(\d+(\.\d+)?([KMGT]I?B?|[KMGT]?B)|HBM\w*|SXM\d*|PCIE\d*|NVL\d*)$/;

/** The class placement matches against, for example "NVIDIA H100 80GB HBM3" → "H100". */
export function normalizeGpuClass(name: string): string {
  const words = name
    .toUpperCase()
    .split(/[^A-Z0-9]+/)
    .filter((word) => word !== "");
  const kept: string[] = [];
  for (const word of words) {
    if (DETAIL_WORD.test(word) && kept.length > 0) break;
    if (!BRAND_WORDS.has(word)) kept.push(word);
  }
  return (kept.length > 0 ? kept : words).join("");
}
