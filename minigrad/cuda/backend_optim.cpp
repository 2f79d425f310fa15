// CudaBackend: optimizer updates. SGD's step over all the tensors of a device is one
// multi-tensor kernel launch per kSgdTensorsPerLaunch tensors (kernels/optim.cu),
// where the composition of elementwise ops launches up to five kernels per tensor;
// Adam's one per kAdamTensorsPerLaunch tensors, where the composition launches a dozen.
#include <algorithm>
#include <vector>

#include <cuda_runtime_api.h>

#include <minigrad/cuda/backend.h>
#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda {

void CudaBackend::sgd_step(const SgdStep& step) {
  if (step.tensors.empty()) return;
  const Device device = step.tensors.front().param.device();
  MG_CHECK(device.type() == DeviceType::CUDA, "sgd_step on CUDA: parameter 0 is on {}", device);
  check_sgd_step(step, device);
  OpScope scope(device.index());
  const bool any_new_buffer = std::any_of(step.tensors.begin(), step.tensors.end(),
                                          [](const SgdTensor& t) { return t.new_buffer; });
  if (any_new_buffer) {
    // A buffer's first step is a different update (buf = d_p): a graph that captured it
    // would restart the momentum on every replay, from a buffer in the graph's memory.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MG_CUDA_CHECK(cudaStreamIsCapturing(scope.stream(), &capture));
    MG_CHECK(capture == cudaStreamCaptureStatusNone,
             "sgd_step on {}: the momentum buffers' first step cannot be captured in a CUDA "
             "graph (every replay would start the momentum again); run one step before the "
             "capture",
             device);
  }

  std::vector<kernels::SgdTensorPointers> tensors;
  tensors.reserve(step.tensors.size());
  const bool use_momentum = step.momentum != 0.0;
  for (const SgdTensor& t : step.tensors) {
    tensors.push_back(kernels::SgdTensorPointers{
        static_cast<float*>(t.param.data_ptr()), static_cast<const float*>(t.grad.data_ptr()),
        use_momentum ? static_cast<float*>(t.momentum_buffer.data_ptr()) : nullptr,
        t.param.numel(), t.new_buffer});
  }
  const kernels::SgdScalars scalars{static_cast<float>(step.weight_decay),
                                    static_cast<float>(step.momentum),
                                    static_cast<float>(1.0 - step.dampening),
                                    static_cast<float>(-step.lr),
                                    step.weight_decay != 0.0,
                                    use_momentum,
                                    step.nesterov};
  kernels::sgd_step(tensors.data(), tensors.size(), scalars, scope.stream());
}

void CudaBackend::adam_step(const AdamStep& step) {
  if (step.tensors.empty()) return;
  const Device device = step.tensors.front().param.device();
  MG_CHECK(device.type() == DeviceType::CUDA, "adam_step on CUDA: parameter 0 is on {}", device);
  check_adam_step(step, device);
  if (adam_step_dtype(step) != DType::Float32) return Backend::adam_step(step);  // float64
  OpScope scope(device.index());
  // The bias corrections are numbers in the launch, computed on the host from each
  // parameter's step count: a graph would replay this step's corrections every time.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MG_CUDA_CHECK(cudaStreamIsCapturing(scope.stream(), &capture));
  MG_CHECK(capture == cudaStreamCaptureStatusNone,
           "adam_step on {}: Adam's step cannot be captured in a CUDA graph (its bias "
           "corrections depend on the step count, which the optimizer keeps on the host, so "
           "every replay would repeat this step's corrections); run the optimizer step "
           "outside the capture",
           device);

  std::vector<kernels::AdamTensorPointers> tensors;
  tensors.reserve(step.tensors.size());
  for (const AdamTensor& t : step.tensors) {
    tensors.push_back(kernels::AdamTensorPointers{
        static_cast<float*>(t.param.data_ptr()), static_cast<const float*>(t.grad.data_ptr()),
        static_cast<float*>(t.exp_avg.data_ptr()), static_cast<float*>(t.exp_avg_sq.data_ptr()),
        step.amsgrad ? static_cast<float*>(t.max_exp_avg_sq.data_ptr()) : nullptr,
        t.param.numel(), static_cast<float>(-t.step_size),
        static_cast<float>(t.bias_correction2_sqrt)});
  }
  const kernels::AdamWeightDecay mode = step.weight_decay == 0.0 ? kernels::AdamWeightDecay::None
                                        : step.decoupled_weight_decay
                                            ? kernels::AdamWeightDecay::Decoupled
                                            : kernels::AdamWeightDecay::L2;
  const kernels::AdamScalars scalars{static_cast<float>(step.beta1),
                                     static_cast<float>(1.0 - step.beta1),
                                     static_cast<float>(step.beta2),
                                     static_cast<float>(1.0 - step.beta2),
                                     static_cast<float>(step.eps),
                                     static_cast<float>(step.weight_decay),
                                     static_cast<float>(1.0 - step.lr * step.weight_decay),
                                     mode,
                                     step.amsgrad,
                                     step.maximize};
  kernels::adam_step(tensors.data(), tensors.size(), scalars, scope.stream());
}

}  // namespace mg::cuda
