// The --devices flag of the training programs: where to train.
//
//   cpu          the CPU
//   all          every visible GPU (the CPU when there is none)
//   0,1  cuda:1  GPU ids or device names, comma-separated; a repeated id ("0,0") or
//   cpu,cpu      "cpu,cpu" asks for several replicas on one device (DataParallel)
#pragma once

#include <string>
#include <vector>

#include <minigrad/core/device.h>

namespace mg::samples {

// The devices `spec` names on a machine with `cuda_device_count` visible GPUs, in a
// minigrad built with CUDA or not (`cuda_built`). mg::Error, beginning "--devices
// <spec>: ", on an unknown word, a GPU that does not exist (saying which devices do, or
// that minigrad was built without CUDA), or a list mixing the CPU and GPUs.
std::vector<Device> parse_devices(const std::string& spec, int cuda_device_count,
                                  bool cuda_built = true);

// parse_devices for this process: the GPUs it sees, and this build.
std::vector<Device> parse_devices(const std::string& spec);

// "cpu", "cuda:0", "cuda:0, cuda:1".
std::string devices_str(const std::vector<Device>& devices);

}  // namespace mg::samples
