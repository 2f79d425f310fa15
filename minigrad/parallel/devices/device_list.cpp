#include <minigrad/parallel/devices/device_list.h>

#include <fmt/ranges.h>

#include <cctype>
#include <cstdlib>
#include <string>

#include <minigrad/core/backend.h>
#include <minigrad/parallel/devices/communicator.h>

namespace mg::parallel {

std::vector<Device> visible_gpus() {
  std::vector<Device> gpus;
  const int count = backend(DeviceType::CUDA).device_count();
  for (int i = 0; i < count; ++i) gpus.push_back(Device::cuda(i));
  return gpus;
}

std::vector<Device> parse_device_list(std::string_view spec) {
  std::vector<Device> devices;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view entry = spec.substr(start, end - start);
    while (!entry.empty() && std::isspace(static_cast<unsigned char>(entry.front()))) entry.remove_prefix(1);
    while (!entry.empty() && std::isspace(static_cast<unsigned char>(entry.back()))) entry.remove_suffix(1);
    MG_CHECK(!entry.empty(),
             "device list '{}': empty entry; expected comma-separated devices such as '0,1', "
             "'cuda:0,cuda:1' or 'cpu,cpu'",
             spec);
    bool digits = true;
    for (char c : entry) digits = digits && std::isdigit(static_cast<unsigned char>(c));
    if (digits) {
      MG_CHECK(entry.size() < 6, "device list '{}': GPU index '{}' is too large", spec, entry);
      devices.push_back(Device::cuda(std::atoi(std::string(entry).c_str())));
    } else {
      try {
        devices.emplace_back(entry);
      } catch (const Error& e) {
        MG_FAIL("device list '{}': {}", spec, e.what());
      }
    }
    start = end + 1;
  }
  return devices;
}

namespace {
#ifdef MINIGRAD_WITH_CUDA
constexpr const char* kNoGpu = "no CUDA device is visible";
#else
constexpr const char* kNoGpu = "no CUDA device is visible (minigrad was built without CUDA)";
#endif
}  // namespace

void check_device_list(const std::vector<Device>& devices, const char* what) {
  MG_CHECK(!devices.empty(),
           "{}: device_ids is empty; give at least one device (e.g. {{cuda:0, cuda:1}} or "
           "{{cpu, cpu}}), or leave device_ids out to use every visible GPU",
           what);
  for (size_t i = 1; i < devices.size(); ++i)
    MG_CHECK(devices[i].type() == devices[0].type(),
             "{}: device_ids {} mixes device types; the replicas must all be on CPU or all on "
             "CUDA devices",
             what, device_list_str(devices));
  if (devices[0].is_cuda()) {
    const int count = backend(DeviceType::CUDA).device_count();
    for (size_t i = 0; i < devices.size(); ++i)
      MG_CHECK(devices[i].index() < count,
               "{}: device_ids[{}] is {}, but {} (CUDA_VISIBLE_DEVICES decides which GPUs "
               "a process sees)",
               what, i, devices[i],
               count == 0 ? std::string(kNoGpu)
                          : fmt::format("only {} CUDA device{} visible (cuda:0 to cuda:{})", count,
                                        count == 1 ? " is" : "s are", count - 1));
  }
}

std::string device_list_str(const std::vector<Device>& devices) {
  std::vector<std::string> names;
  names.reserve(devices.size());
  for (const Device& d : devices) names.push_back(d.str());
  return fmt::format("[{}]", fmt::join(names, ", "));
}

}  // namespace mg::parallel
