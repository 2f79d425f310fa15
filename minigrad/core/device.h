// Device: where a tensor's memory lives. "cpu", "cuda", "cuda:1".
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace mg {

enum class DeviceType { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

class Device {
 public:
  Device(DeviceType type = DeviceType::CPU, int index = 0);
  // Parses "cpu", "cuda" (= cuda:0) and "cuda:N"; anything else is an mg::Error.
  Device(std::string_view spec);  // NOLINT: implicit, as torch::Device("cuda:1")
  Device(const char* spec) : Device(std::string_view(spec)) {}  // NOLINT

  static Device cpu() { return Device(DeviceType::CPU, 0); }
  static Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  bool is_cuda() const { return type_ == DeviceType::CUDA; }
  std::string str() const;

  bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  bool operator<(const Device& o) const {
    return type_ != o.type_ ? type_ < o.type_ : index_ < o.index_;
  }

 private:
  DeviceType type_;
  int index_;
};

}  // namespace mg

template <>
struct fmt::formatter<mg::Device> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(const mg::Device& d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
