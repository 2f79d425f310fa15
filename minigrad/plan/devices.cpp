// The device table (devices.h). Dense figures, from the vendors' datasheets:
//   H100 SXM5 80 GB, H100 PCIe 80 GB: NVIDIA H100 Tensor Core GPU datasheet (2023):
//     FP32 67 / 51 TFLOPS, BF16 1,979 / 1,513 TFLOPS "with sparsity" (dense half: 989.5 /
//     756.5), HBM3 3.35 TB/s / HBM2e 2 TB/s, NVLink 900 GB/s / PCIe Gen5 128 GB/s (both
//     directions: 450 / 64 GB/s one way).
//   H200 SXM 141 GB: NVIDIA H200 Tensor Core GPU datasheet (2024): FP32 67 TFLOPS, BF16
//     1,979 TFLOPS with sparsity (989.5 dense), HBM3e 4.8 TB/s, NVLink 900 GB/s.
//   A100 SXM 40 GB / 80 GB: NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS,
//     BF16 312 TFLOPS dense (624 sparse), HBM2 1,555 GB/s / HBM2e 2,039 GB/s, NVLink 600
//     GB/s (300 one way).
//   L4 24 GB: NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3 TFLOPS, BF16 242
//     TFLOPS with sparsity (121 dense), GDDR6 300 GB/s, PCIe Gen4 x16 64 GB/s (32 one way).
//   GeForce RTX 4090 24 GB: NVIDIA Ada GPU architecture whitepaper (v2.1, appendix table 2):
//     FP32 82.6 TFLOPS, BF16 tensor with FP32 accumulate 165.2 TFLOPS dense (330.3
//     sparse), GDDR6X 1,008 GB/s, PCIe Gen4 x16 (no NVLink; 32 GB/s one way).
#include <minigrad/plan/devices.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include <minigrad/core/error.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

namespace mg::plan {

namespace {
constexpr double T = 1e12, G = 1e9;
}  // namespace

Precision precision_from_string(const std::string& name) {
  if (name == "32-true") return Precision::True32;
  if (name == "bf16-mixed") return Precision::BF16Mixed;
  if (name == "bf16-true") return Precision::BF16True;
  if (name == "16-mixed") return Precision::F16Mixed;
  MG_FAIL("precision: unknown precision '{}' (32-true, bf16-mixed, bf16-true or 16-mixed)", name);
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::True32: return "32-true";
    case Precision::BF16Mixed: return "bf16-mixed";
    case Precision::BF16True: return "bf16-true";
    case Precision::F16Mixed: return "16-mixed";
  }
  return "?";
}

double DeviceSpec::peak_flops(Precision precision) const {
  return precision == Precision::True32 ? fp32_flops : bf16_flops;
}

const std::vector<DeviceSpec>& device_table() {
  static const std::vector<DeviceSpec> table{
      {"h100-80gb", "NVIDIA H100 SXM5 80 GB", 67 * T, 989.5 * T, 80 * G, 3350 * G, 450 * G, "NVLink 4",
       "H100 datasheet 2023, dense = sparse / 2"},
      {"h100-pcie", "NVIDIA H100 PCIe 80 GB", 51 * T, 756.5 * T, 80 * G, 2000 * G, 64 * G, "PCIe 5.0 x16",
       "H100 datasheet 2023, dense = sparse / 2"},
      {"h200", "NVIDIA H200 SXM 141 GB", 67 * T, 989.5 * T, 141 * G, 4800 * G, 450 * G, "NVLink 4",
       "H200 datasheet 2024, dense = sparse / 2"},
      {"a100-40gb", "NVIDIA A100 SXM4 40 GB", 19.5 * T, 312 * T, 40 * G, 1555 * G, 300 * G, "NVLink 3",
       "A100 datasheet 2021, dense"},
      {"a100-80gb", "NVIDIA A100 SXM4 80 GB", 19.5 * T, 312 * T, 80 * G, 2039 * G, 300 * G, "NVLink 3",
       "A100 datasheet 2021, dense"},
      {"l4", "NVIDIA L4 24 GB", 30.3 * T, 121 * T, 24 * G, 300 * G, 32 * G, "PCIe 4.0 x16",
       "L4 datasheet 2023, dense = sparse / 2"},
      {"rtx-4090", "NVIDIA GeForce RTX 4090 24 GB", 82.6 * T, 165.2 * T, 24 * G, 1008 * G, 32 * G,
       "PCIe 4.0 x16", "Ada architecture whitepaper, FP32 accumulate, dense"},
  };
  return table;
}

DeviceSpec device_by_name(const std::string& name) {
  if (name == "cpu") return measure_cpu();
  for (const DeviceSpec& d : device_table())
    if (d.name == name) return d;
  std::string known = "cpu";
  for (const DeviceSpec& d : device_table()) known += ", " + d.name;
  MG_FAIL("device: unknown device '{}' (known: {})", name, known);
}

std::optional<DeviceSpec> device_by_runtime_name(const std::string& runtime_name) {
  // cudaDeviceProp::name of each row's GPU, as the runtime and nvidia-smi print it.
  static const std::pair<const char*, const char*> names[] = {
      {"NVIDIA H100 80GB HBM3", "h100-80gb"}, {"NVIDIA H100 PCIe", "h100-pcie"},
      {"NVIDIA H200", "h200"},                {"NVIDIA A100-SXM4-40GB", "a100-40gb"},
      {"NVIDIA A100-SXM4-80GB", "a100-80gb"}, {"NVIDIA L4", "l4"},
      {"NVIDIA GeForce RTX 4090", "rtx-4090"},
  };
  for (const auto& [runtime, row] : names)
    if (runtime_name == runtime) return device_by_name(row);
  return std::nullopt;
}

DeviceSpec measure_cpu() {
  using Clock = std::chrono::steady_clock;
  DeviceSpec d;
  d.name = "cpu";
  d.description = "this machine's CPU (measured)";
  d.measured = true;
  d.link = "shared memory";
  d.source = "measured here: a 256 x 256 float32 matmul, a 64 MiB memcpy";
  const int64_t n = 256;
  // Ones, not randn: measuring draws nothing from the default generator, so a trainer
  // that measures at start keeps its run's random stream.
  const Tensor a = ones(Shape{n, n}), b = ones(Shape{n, n});
  double best = 1e30;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = Clock::now();
    const Tensor c = ops::matmul(a, b);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  d.fp32_flops = d.bf16_flops = 2.0 * static_cast<double>(n * n * n) / best;
  std::vector<char> from(64 << 20, 1), to(64 << 20);
  double copy = 1e30;
  for (int k = 0; k < 3; ++k) {
    const auto t0 = Clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    copy = std::min(copy, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  d.memory_bandwidth = d.link_bandwidth = static_cast<double>(from.size()) / copy;
  d.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  return d;
}

}  // namespace mg::plan
