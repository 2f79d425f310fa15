// The memory a pipeline step will need on each device, planned before the step runs.
//
// A stage holds its parameters, their gradients, and the activations of the
// micro-batches in flight: what each micro-batch's forward keeps for its backward (its
// input, the saved tensors, its output), for as many micro-batches as the schedule
// keeps alive at once (GPipe: all m; 1F1B: at most p - s; see schedule.h). The
// activations of one micro-batch are measured, not guessed: a dry run of the stage's
// forward on one micro-batch, counting what the device's allocator hands out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/backend.h>
#include <minigrad/core/device.h>
#include <minigrad/parallel/pipeline/schedule.h>
#include <minigrad/parallel/pipeline/stage_runner.h>

namespace mg::parallel {

struct StagePlan {
  int stage = 0;
  Device device;
  int64_t layers = 0;
  std::size_t parameter_bytes = 0;   // already on the device
  std::size_t gradient_bytes = 0;    // still to be allocated (gradients not there yet)
  std::size_t input_bytes = 0;       // one micro-batch's input
  std::size_t activation_bytes = 0;  // what one micro-batch's forward keeps, input included
  int64_t in_flight = 0;             // micro-batches alive at once
  Checkpoint checkpoint = Checkpoint::Never;
  // What the step will allocate on the device: the gradients and the micro-batches in
  // flight (checkpointed ones keep their input only, and one at a time is recomputed).
  // An upper bound: it does not count what backward frees as it goes.
  std::size_t planned_bytes() const;
};

// A table of the plan, one line per stage (printed by samples, quoted in errors).
std::string plan_str(const std::vector<StagePlan>& plan);

// Refuses (mg::Error with the numbers) a plan whose stages on one device need more than
// that device's free memory. Devices whose free memory is unknown are not checked.
void check_plan_fits(const std::vector<StagePlan>& plan);

// Device-neutral memory counters (the backend's): bytes held by live tensors on `device`
// now (the host allocator's count on the CPU, cuda::memory_allocated on a GPU), and its
// free memory.
std::size_t memory_allocated(Device device);
MemoryInfo memory_info(Device device);

}  // namespace mg::parallel
