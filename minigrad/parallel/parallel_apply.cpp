#include <minigrad/parallel/parallel_apply.h>

#include <minigrad/autograd/replica_scope.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/devices/run_per_device.h>

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
  // Each replica runs on the stream the caller has current on its device: the device's
  // compute stream, unless the caller chose another (as PyTorch's parallel_apply does).
  // The inputs were made on that stream and the outputs will be consumed and freed on
  // it, so no events are needed and the stream-ordered allocator's rule (freed on the
  // stream it was allocated on) holds for everything the replicas allocate.
  std::vector<Stream> streams;
  streams.reserve(n);
  for (const Device& d : devices) streams.push_back(current_stream(d));

  run_per_device(devices, streams, "parallel_apply: replica", [&](size_t i) {
    ReplicaScope replica(static_cast<int>(i));  // its nodes: "replica i backward" in a trace
    profiler::Span span(devices[i], "replica {} forward", i);
    span.category("forward").arg("replica", i);
    outputs[i] = (*replicas[i])(inputs[i]);
  });

  return outputs;
}

}  // namespace mg::parallel
