// GPU classes: the one name a GPU model goes by, so a profile's `hardware.gpu.class` ("H100",
// "RTX4090") matches what a node's driver reports ("NVIDIA H100 80GB HBM3", "NVIDIA GeForce
// RTX 4090"). The agent stores the class in its inventory and placement normalises both
// sides again, so a profile written "rtx-4090" or "NVIDIA A100" matches as well.
//
// The rule: split the name into words at anything that is not a letter or digit, upper-case
// them, drop
// - vendor and brand words (NVIDIA, GeForce, Tesla, Quadro, AMD, Radeon, Instinct, Intel):
//   they do not tell one model from another, and drivers add or leave them out by release;
// - form factors (SXM, SXM2..5, PCIe, NVL, HBM2/2e/3/3e) and memory sizes ("80GB"): they
//   are variants of one GPU, and placement checks each GPU's memory separately, so a
//   profile asking for "A100" takes the 40 GB and the 80 GB card alike when its need fits;
// - "Generation" ("RTX 6000 Ada Generation" is "RTX6000ADA");
// and join what is left: "NVIDIA A100-SXM4-80GB" → "A100", "NVIDIA RTX A6000" → "RTXA6000",
// "NVIDIA GeForce RTX 3090 Ti" → "RTX3090TI", "AMD Instinct MI300X" → "MI300X". The result
// is a fixed point (normalising it again changes nothing). A name that is nothing but such
// words keeps its words, so no GPU's class is empty.

const DROPPED_WORDS = new Set(["NVIDIA", "GEFORCE", "TESLA", "QUADRO", "AMD", "RADEON", "INSTINCT", "INTEL", "GENERATION", "PCIE", "NVL"]);
const FORM_FACTOR = /^(SXM\d?|HBM\d?E?)$/;
const MEMORY_SIZE = /^\d+(GB|G|GIB)$/;

/** The class placement compares, for example "NVIDIA GeForce RTX 4090" → "RTX4090". */
export function normalizeGpuClass(name: string): string {
  const words = name
    .toUpperCase()
    .split(/[^A-Z0-9]+/)
    .filter((word) => word !== "");
  const kept = words.filter((word) => !DROPPED_WORDS.has(word) && !FORM_FACTOR.test(word) && !MEMORY_SIZE.test(word));
  return (kept.length > 0 ? kept : words).join("");
}
