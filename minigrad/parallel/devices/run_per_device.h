// run_per_device: one task per device, all at once, each on its own long-lived thread
// with its device, stream and the caller's grad mode and autocast regions — what parallel_apply does for
// replicas, TensorParallel for ranks and Pipe for stages.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/stream.h>

namespace mg::parallel {

// Runs task(i) for every i < devices.size(): task i on worker thread i of the pool
// (worker_pool.h; on the caller's thread when there is one task), with devices[i] the
// current device, streams[i] the current stream there and the caller's grad mode and
// autocast state (autograd/autocast.h).
// Returns when every task has ended.
//
// A task that throws is named with its device: the failure is re-thrown as an mg::Error
// "<who> <i> on <device> failed: <its message>" (who: "parallel_apply: replica"). Tasks
// that do not depend on each other report the lowest index that failed, so the message
// does not depend on timing. Tasks that wait for each other (the ranks of a group) pass
// on_failure: it runs on the failing task's thread as soon as it fails (to abort the
// group, so that the others leave the collectives they wait in), and the failure
// reported is then the first in time, the cause of the others.
void run_per_device(const std::vector<Device>& devices, const std::vector<Stream>& streams,
                    const std::string& who, const std::function<void(size_t)>& task,
                    const std::function<void(size_t, const std::string&)>& on_failure = {});

}  // namespace mg::parallel
