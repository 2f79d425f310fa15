// mg::cuda::get_device_name: the name the CUDA runtime gives a device ("NVIDIA H100 80GB
// HBM3"), as torch.cuda.get_device_name. Plain C++, in every build: the planner's device
// table (plan/devices.h) is looked up by it. Its own header, so that asking a name does not
// recompile everything that includes cuda.h.
#pragma once

#include <string>

namespace mg::cuda {

// `device` -1: the current device. mg::Error when minigrad was built without CUDA or the
// device is not visible.
std::string get_device_name(int device = -1);

}  // namespace mg::cuda
