#include <minigrad/core/device.h>

#include <charconv>

#include <minigrad/core/error.h>

namespace mg {

Device::Device(DeviceType type, int index) : type_(type), index_(index) {
  MG_CHECK(index >= 0, "Device: index must be >= 0, got {}", index);
  MG_CHECK(type != DeviceType::CPU || index == 0, "Device: cpu has only index 0, got cpu:{}",
           index);
}

Device::Device(std::string_view spec) : type_(DeviceType::CPU), index_(0) {
  auto fail = [&] {
    MG_FAIL("Device: cannot parse '{}': expected 'cpu', 'cuda' or 'cuda:N'", spec);
  };
  if (spec == "cpu") return;
  if (spec.substr(0, 4) != "cuda") fail();
  type_ = DeviceType::CUDA;
  if (spec.size() == 4) return;
  if (spec[4] != ':' || spec.size() == 5) fail();
  const char* begin = spec.data() + 5;
  const char* end = spec.data() + spec.size();
  auto [ptr, ec] = std::from_chars(begin, end, index_);
  if (ec != std::errc() || ptr != end || index_ < 0) fail();
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index_);
}

}  // namespace mg
