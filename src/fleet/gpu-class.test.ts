// The GPU class rule on names as nvidia-smi prints them (`--query-gpu=name`), and on
// classes written by hand in profiles.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { normalizeGpuClass } from "./gpu-class.ts";

describe("normalizeGpuClass", () => {
  test("real nvidia-smi names become the chip's class", () => {
    const cases: [string, string][] = [
      ["NVIDIA H100 80GB HBM3", "H100"],
      ["NVIDIA H100 PCIe", "H100"],
      ["NVIDIA H100 NVL", "H100"],
      ["NVIDIA H200", "H200"],
      ["NVIDIA A100-SXM4-80GB", "A100"],
      ["NVIDIA A100-PCIE-40GB", "A100"],
      ["NVIDIA A100 80GB PCIe", "A100"],
      ["Tesla V100-SXM2-16GB", "V100"],
      ["NVIDIA GeForce RTX 4090", "RTX4090"],
      ["NVIDIA GeForce RTX 4090 D", "RTX4090D"],
      ["NVIDIA GeForce RTX 3060 Laptop GPU", "RTX3060LAPTOP"],
      ["NVIDIA L4", "L4"],
      ["NVIDIA L40S", "L40S"],
      ["Tesla T4", "T4"],
      ["NVIDIA RTX A6000", "RTXA6000"],
      ["NVIDIA RTX 6000 Ada Generation", "RTX6000ADA"],
      ["Quadro RTX 8000", "RTX8000"],
      ["NVIDIA A10G", "A10G"],
      ["NVIDIA GH200 480GB", "GH200"],
      ["AMD Instinct MI300X", "MI300X"],
    ];
    for (const [name, expected] of cases) assert.equal(normalizeGpuClass(name), expected, name);
  });

  test("memory size and form factor do not split a chip into classes", () => {
    assert.equal(normalizeGpuClass("NVIDIA A100-SXM4-80GB"), normalizeGpuClass("NVIDIA A100-PCIE-40GB"));
    // ...but different chips of one family stay apart.
    assert.notEqual(normalizeGpuClass("NVIDIA L4"), normalizeGpuClass("NVIDIA L40S"));
    assert.notEqual(normalizeGpuClass("NVIDIA H100 80GB HBM3"), normalizeGpuClass("NVIDIA H200"));
  });

  test("a class written by hand in a profile matches the detected one, and a class normalises to itself", () => {
    assert.equal(normalizeGpuClass("h100"), "H100");
    assert.equal(normalizeGpuClass("rtx-4090"), "RTX4090");
    assert.equal(normalizeGpuClass("RTX_A6000"), "RTXA6000");
    for (const name of ["NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090", "NVIDIA RTX 6000 Ada Generation", "Tesla T4"]) {
      const once = normalizeGpuClass(name);
      assert.equal(normalizeGpuClass(once), once, name);
    }
  });

  test("a name made only of brand words keeps them instead of becoming empty", () => {
    assert.equal(normalizeGpuClass("NVIDIA"), "NVIDIA");
    assert.equal(normalizeGpuClass("NVIDIA GPU"), "NVIDIAGPU");
    assert.equal(normalizeGpuClass(""), "");
  });
});
