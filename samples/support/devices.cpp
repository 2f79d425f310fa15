#include "devices.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>
#include <minigrad/cuda/cuda.h>

#include "command_line.h"

namespace mg::samples {

namespace {

std::string trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "available: cpu, 0, 1" — what the user may write instead.
std::string available(int cuda_device_count) {
  std::vector<std::string> names{"cpu"};
  for (int i = 0; i < cuda_device_count; ++i) names.push_back(std::to_string(i));
  if (cuda_device_count > 0) names.push_back("all");
  return fmt::format("available: {}", fmt::join(names, ", "));
}

}  // namespace

std::vector<Device> parse_devices(const std::string& spec, int cuda_device_count,
                                  bool cuda_built) {
  if (!cuda_built) cuda_device_count = 0;
  const std::string whole = trim(spec);
  // Messages show at most 60 characters of it, and the entries are counted before any
  // is made.
  const std::string shown =
      spec.size() <= 60 ? spec : fmt::format("{}... ({} characters)", spec.substr(0, 60), spec.size());
  constexpr std::size_t kMaxDevices = 4096;
  const auto entries = static_cast<std::size_t>(std::count(whole.begin(), whole.end(), ',')) + 1;
  MG_CHECK(entries <= kMaxDevices, "--devices {}: {} entries, more than the {} devices a run can use",
           shown, entries, kMaxDevices);
  // Without the CUDA backend there is no GPU to name, whatever the machine has.
  const auto count_str =
      cuda_built ? fmt::format("this machine has {} CUDA device{} ({})", cuda_device_count,
                               cuda_device_count == 1 ? "" : "s", available(cuda_device_count))
                 : fmt::format("minigrad was built without CUDA ({}); rebuild it with the CUDA "
                               "toolkit installed to train on GPUs",
                               available(0));
  if (whole == "all") {
    std::vector<Device> gpus;
    for (int i = 0; i < cuda_device_count; ++i) gpus.push_back(Device::cuda(i));
    if (gpus.empty()) gpus.push_back(Device::cpu());
    return gpus;
  }
  std::vector<Device> devices;
  size_t start = 0;
  while (start <= whole.size()) {
    size_t comma = whole.find(',', start);
    if (comma == std::string::npos) comma = whole.size();
    const std::string entry = trim(whole.substr(start, comma - start));
    start = comma + 1;
    MG_CHECK(!entry.empty(), "--devices {}: empty entry; expected cpu, all, or GPU ids such as 0,1",
             shown);
    Device device;
    if (all_digits(entry)) {
      device = Device::cuda(static_cast<int>(parse_integer("--devices", entry, 0, 1 << 20)));
    } else {
      try {
        device = Device(entry);
      } catch (const Error&) {
        MG_FAIL("--devices {}: '{}' is not a device; expected cpu, all, or GPU ids such as 0,1 "
                "({})",
                shown, entry, available(cuda_device_count));
      }
    }
    MG_CHECK(!device.is_cuda() || device.index() < cuda_device_count,
             "--devices {}: no CUDA device {}; {}", shown, device.index(), count_str);
    devices.push_back(device);
  }
  for (const Device& d : devices)
    MG_CHECK(d.type() == devices[0].type(),
             "--devices {}: mixes the CPU and GPUs; train on the CPU or on GPUs ({})", shown,
             available(cuda_device_count));
  return devices;
}

std::vector<Device> parse_devices(const std::string& spec) {
  return parse_devices(spec, cuda::device_count(), cuda::is_built());
}

std::string devices_str(const std::vector<Device>& devices) {
  std::vector<std::string> names;
  for (const Device& d : devices) names.push_back(d.str());
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace mg::samples
