// The devices the planner prices a step on: dense peak FLOP/s per precision, memory and
// its bandwidth, and the bandwidth of the link between devices of one node. Figures are
// the vendors' datasheets' dense ones (never the "with sparsity" ones, which are twice
// the dense), each row's source named in devices.cpp. "cpu" is this machine: its float32
// GEMM rate measured when asked for, its memory from the OS.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mg::plan {

// Lightning's names: 32-true (float32 everywhere), bf16-mixed (float32 parameters and
// AdamW, GEMMs in bfloat16 under autocast: nanoGPT's), bf16-true (bfloat16 parameters,
// gradients and activations, float32 master weights and AdamW state: llm.c's,
// optim::MasterWeights), 16-mixed (bf16-mixed's bytes with float16 GEMMs and a loss scale;
// every device here runs float16 at its bfloat16 dense rate).
enum class Precision { True32, BF16Mixed, BF16True, F16Mixed };
// "32-true" | "bf16-mixed" | "bf16-true" | "16-mixed"; mg::Error naming the others.
Precision precision_from_string(const std::string& name);
std::string to_string(Precision precision);

struct DeviceSpec {
  std::string name;         // "h100-80gb", the name minigrad-plan takes
  std::string description;  // "NVIDIA H100 SXM5 80 GB"
  double fp32_flops = 0;    // dense FP32 (CUDA cores; no TF32), FLOP/s
  double bf16_flops = 0;    // dense BF16 tensor cores with FP32 accumulate, FLOP/s
  double memory_bytes = 0;  // the datasheet's GB (10^9 bytes)
  double memory_bandwidth = 0;  // bytes/s
  double link_bandwidth = 0;    // one direction between two devices of a node, bytes/s
  std::string link;             // "NVLink 4", "PCIe 4.0 x16"
  std::string source;           // where the figures come from
  bool measured = false;        // the cpu row: measured here, not a datasheet's
  // The dense peak for a precision: fp32_flops for 32-true, bf16_flops for the others
  // (their GEMMs run in bfloat16).
  double peak_flops(Precision precision) const;
};

// The table: h100-80gb (SXM), h100-pcie, h200, a100-40gb, a100-80gb, l4, rtx-4090.
const std::vector<DeviceSpec>& device_table();
// A row by name, or "cpu" (measured: measure_cpu()); mg::Error naming the known ones.
DeviceSpec device_by_name(const std::string& name);
// The row of a GPU by the name its CUDA runtime reports (cuda::get_device_name,
// nvidia-smi's): "NVIDIA H100 80GB HBM3" is h100-80gb. Exact names only, so that a
// sibling with other figures (the H100 NVL, an A100 PCIe 40 GB) is not priced as its
// cousin: nullopt for a name not in the table.
std::optional<DeviceSpec> device_by_runtime_name(const std::string& runtime_name);
// This machine: a float32 GEMM's FLOP/s over the backend (256 x 256, the best of a few),
// bf16 at the same rate (the CPU backend computes 16-bit through float), memory from the
// OS, a memcpy's bandwidth as memory and link (Gloo ranks on one host meet through it).
DeviceSpec measure_cpu();

}  // namespace mg::plan
