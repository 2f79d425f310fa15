#include <minigrad/parallel/parallel_apply.h>

#include <exception>
#include <functional>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/replica_scope.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/worker_pool.h>

namespace mg::parallel {

std::vector<Tensor> parallel_apply(const std::vector<nn::ModulePtr>& replicas,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Device>& devices) {
  MG_CHECK(replicas.size() == inputs.size() && replicas.size() == devices.size(),
           "parallel_apply: got {} replicas, {} inputs and {} devices; expected one of each "
           "per replica",
           replicas.size(), inputs.size(), devices.size());
  const size_t n = replicas.size();
  std::vector<Tensor> outputs(n);
  if (n == 0) return outputs;
  const bool grad_enabled = GradMode::is_enabled();

  // Each replica runs on the stream the caller has current on its device: the device's
  // compute stream, unless the caller chose another (as PyTorch's parallel_apply does).
  // The inputs were made on that stream and the outputs will be consumed and freed on
  // it, so no events are needed and the stream-ordered allocator's rule (freed on the
  // stream it was allocated on) holds for everything the replicas allocate.
  std::vector<Stream> streams;
  streams.reserve(n);
  for (const Device& d : devices) streams.push_back(current_stream(d));

  std::vector<std::exception_ptr> errors(n);
  auto forward_replica = [&](size_t i) {
    try {
      DeviceGuard device_guard(devices[i]);
      StreamGuard stream_guard(streams[i]);
      AutoGradMode grad_mode(grad_enabled);
      ReplicaScope replica(static_cast<int>(i));  // its nodes: "replica i backward" in a trace
      profiler::Span span(devices[i], "replica {} forward", i);
      span.category("forward").arg("replica", i);
      outputs[i] = replicas[i]->forward(inputs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  if (n == 1) {
    forward_replica(0);
  } else {  // one worker thread per replica (worker_pool.h)
    std::vector<std::function<void()>> tasks;
    tasks.reserve(n);
    for (size_t i = 0; i < n; ++i) tasks.emplace_back([&forward_replica, i] { forward_replica(i); });
    WorkerPool::instance().run_all(tasks);
  }

  for (size_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      MG_FAIL("parallel_apply: replica {} on {} failed: {}", i, devices[i], e.what());
    } catch (...) {
      MG_FAIL("parallel_apply: replica {} on {} failed with an unknown exception", i, devices[i]);
    }
  }

  return outputs;
}

}  // namespace mg::parallel
