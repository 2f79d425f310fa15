// Which devices DataParallel spreads over: the visible GPUs, or a list given on the
// command line ("0,1", "cuda:0,cuda:1", "cpu,cpu", "0,0").
//
// CUDA_VISIBLE_DEVICES and device ids act at different levels. CUDA_VISIBLE_DEVICES is
// read by the CUDA runtime when the process starts and decides which physical GPUs the
// process can see and how they are numbered: with CUDA_VISIBLE_DEVICES=2,3, cuda:0 is
// physical GPU 2 and cuda:1 is GPU 3. device ids then pick, among those visible
// devices, where the replicas run.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <minigrad/core/device.h>

namespace mg::parallel {

// cuda:0 ... cuda:N-1 for the N GPUs this process sees (none without CUDA or GPUs).
std::vector<Device> visible_gpus();

// Parses a comma-separated list: a bare number is a GPU ("1" = cuda:1), otherwise any
// device spec ("cpu", "cuda:1"). Repeats are kept ("0,0" = two replicas on cuda:0).
// mg::Error naming the bad entry on anything else, or on an empty list.
std::vector<Device> parse_device_list(std::string_view spec);

// Checks that `devices` can hold DataParallel replicas: not empty, one device type, and
// every GPU visible. `what` names the caller in errors ("DataParallel").
void check_device_list(const std::vector<Device>& devices, const char* what);

// "[cuda:0, cuda:1]", for messages.
std::string device_list_str(const std::vector<Device>& devices);

}  // namespace mg::parallel
