#include <minigrad/parallel/pipeline/plan.h>

#include <map>

#include <fmt/format.h>

#include <minigrad/core/allocator.h>

namespace mg::parallel {

std::size_t StagePlan::planned_bytes() const {
  std::size_t activations = 0;
  const auto n = static_cast<std::size_t>(in_flight);
  switch (checkpoint) {
    case Checkpoint::Never:
      activations = n * activation_bytes;
      break;
    case Checkpoint::Always:  // n inputs, and one micro-batch recomputed at a time
      activations = n * input_bytes + activation_bytes;
      break;
    case Checkpoint::ExceptLast:  // the last micro-batch whole, beside a recomputed one
      activations = n <= 1 ? activation_bytes : (n - 1) * input_bytes + 2 * activation_bytes;
      break;
  }
  return gradient_bytes + activations;
}

std::string plan_str(const std::vector<StagePlan>& plan) {
  std::string s;
  for (const StagePlan& p : plan)
    s += fmt::format(
        "stage {} on {}: {} layer{}, parameters {}, gradients {}, activations {} x {} "
        "micro-batch{} in flight (checkpoint {}): plans {} more\n",
        p.stage, p.device, p.layers, p.layers == 1 ? "" : "s", format_bytes(p.parameter_bytes),
        format_bytes(p.gradient_bytes), format_bytes(p.activation_bytes), p.in_flight,
        p.in_flight == 1 ? "" : "es", checkpoint_name(p.checkpoint),
        format_bytes(p.planned_bytes()));
  return s;
}

void check_plan_fits(const std::vector<StagePlan>& plan) {
  // Stages that share a device share its free memory.
  std::map<Device, std::vector<const StagePlan*>> by_device;
  for (const StagePlan& p : plan) by_device[p.device].push_back(&p);
  for (const auto& [device, stages] : by_device) {
    const MemoryInfo info = memory_info(device);
    if (!info.known) continue;
    std::size_t needed = 0;
    std::string names;
    for (const StagePlan* p : stages) {
      needed += p->planned_bytes();
      names += fmt::format("{}{}", names.empty() ? "" : ", ", p->stage);
    }
    MG_CHECK(needed <= info.free_bytes,
             "Pipe: the plan does not fit on {}: stage{} {} need{} {} more, but {} has {} free "
             "(of {}).\n{}Balance the layers by size (balance_by_size), or keep fewer "
             "activations alive: the 1f1b schedule, or checkpoint=always",
             device, stages.size() == 1 ? "" : "s", names, stages.size() == 1 ? "s" : "",
             format_bytes(needed), device, format_bytes(info.free_bytes),
             format_bytes(info.total_bytes), plan_str(plan));
  }
}

std::size_t memory_allocated(Device device) {
  return backend(device).memory_allocated(device.index());
}

MemoryInfo memory_info(Device device) { return backend(device).memory_info(device.index()); }

}  // namespace mg::parallel
