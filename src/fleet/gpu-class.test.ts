import { test } from "node:test";
import assert from "node:assert/strict";
import { normalizeGpuClass } from "./gpu-class.ts";

// Names as nvidia-smi (and rocm-smi for the AMD card) print them.
const CASES: Array<[string, string]> = [
  ["NVIDIA GeForce RTX 4090", "RTX4090"],
  ["NVIDIA H200", "H200"],
  ["NVIDIA H100 80GB HBM3", "H100"],
  ["NVIDIA H100 PCIe", "H100"],
  ["NVIDIA H100 NVL", "H100"],
  ["NVIDIA A100-SXM4-80GB", "A100"],
  ["NVIDIA A100-PCIE-40GB", "A100"],
  ["Tesla V100-SXM2-32GB", "V100"],
  ["Tesla T4", "T4"],
  ["NVIDIA A10G", "A10G"],
  ["NVIDIA L40S", "L40S"],
  ["NVIDIA RTX A6000", "RTXA6000"],
  ["NVIDIA RTX 6000 Ada Generation", "RTX6000ADA"],
  ["NVIDIA GeForce RTX 3090 Ti", "RTX3090TI"],
  ["NVIDIA GH200 480GB", "GH200"],
  ["AMD Instinct MI300X", "MI300X"],
  // How profiles write the class.
  ["H100", "H100"],
  ["rtx-4090", "RTX4090"],
  ["RTX 4090", "RTX4090"],
];

test("driver names and profile spellings normalise to one class", () => {
  for (const [name, expected] of CASES) assert.equal(normalizeGpuClass(name), expected, name);
});

test("a class is a fixed point, so normalising the inventory's class again changes nothing", () => {
  for (const [name] of CASES) {
    const once = normalizeGpuClass(name);
    assert.equal(normalizeGpuClass(once), once, name);
  }
  assert.equal(normalizeGpuClass(normalizeGpuClass("NVIDIA 80GB")), normalizeGpuClass("NVIDIA 80GB"));
});

test("a name made only of dropped words keeps them rather than becoming empty", () => {
  assert.equal(normalizeGpuClass("NVIDIA Tesla"), "NVIDIATESLA");
});
