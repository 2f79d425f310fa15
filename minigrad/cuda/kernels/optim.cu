// Optimizer updates: SGD and Adam, each as one multi-tensor kernel. Each launch carries up to
// kSgdTensorsPerLaunch tensors' pointers and sizes by value in its parameters (no
// pointer table in device memory: nothing to allocate or copy per step, and a graph
// capture records the launch whole). Each block updates one chunk of one tensor; a
// block finds its tensor by a binary search over the tensors' first chunks, which all
// its threads read from the same constant-bank words.
//
// Rounding: every product and sum is __fmul_rn / __fadd_rn (Adam's quotients and roots
// __fdiv_rn / __fsqrt_rn), so nvcc cannot contract them into FMAs or approximate them,
// and the bits are those of the elementwise kernels (add_scaled, ScalarFunctor's mul)
// the unfused update runs, and of the CPU backend.
#include <algorithm>
#include <cstdint>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda::kernels {
namespace {

constexpr int kSgdThreads = 256;
constexpr int64_t kSgdChunk = 16 * kSgdThreads;  // elements per block
constexpr int kSgdBatch = 4;  // elements per thread loaded together (see sgd_kernel)
constexpr int kMaxTensors = kSgdTensorsPerLaunch;

struct SgdLaunchTensors {
  float* param[kMaxTensors];
  const float* grad[kMaxTensors];
  float* momentum_buffer[kMaxTensors];
  int64_t numel[kMaxTensors];
  // Tensor t is worked on by blocks [first_chunk[t], first_chunk[t + 1]).
  uint32_t first_chunk[kMaxTensors + 1];
  uint8_t new_buffer[kMaxTensors];
  int32_t count;
};
// Kernel parameters of up to 4 KB are accepted on every GPU and CUDA version we build for.
static_assert(sizeof(SgdLaunchTensors) + sizeof(SgdScalars) <= 4096,
              "SGD's kernel parameters must stay within 4 KB");

template <bool kWeightDecay, bool kMomentum, bool kNesterov>
__global__ void __launch_bounds__(kSgdThreads)
    sgd_kernel(const __grid_constant__ SgdLaunchTensors tensors, const SgdScalars s) {
  const uint32_t block = blockIdx.x;
  int lo = 0, hi = tensors.count - 1;  // the last tensor whose first chunk is <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tensors.first_chunk[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int t = lo;
  float* p = tensors.param[t];
  const float* g = tensors.grad[t];
  float* buf = tensors.momentum_buffer[t];
  const bool new_buffer = tensors.new_buffer[t] != 0;
  const int64_t begin = static_cast<int64_t>(block - tensors.first_chunk[t]) * kSgdChunk;
  const int64_t end = min(begin + kSgdChunk, tensors.numel[t]);
  // kSgdBatch elements per thread are loaded before any is computed or stored, so that
  // each thread has that many loads per operand in flight: with one at a time a
  // memory-bound kernel stays far below the HBM bandwidth. Each element is still read
  // before it is written, by the one thread that owns it.
  for (int64_t base = begin + threadIdx.x; base < end; base += kSgdBatch * kSgdThreads) {
    float p_v[kSgdBatch], g_v[kSgdBatch], buf_v[kSgdBatch];
#pragma unroll
    for (int u = 0; u < kSgdBatch; ++u) {
      const int64_t i = base + u * kSgdThreads;
      if (i < end) {
        p_v[u] = p[i];
        g_v[u] = g[i];
        if constexpr (kMomentum) buf_v[u] = new_buffer ? 0.0f : buf[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kSgdBatch; ++u) {
      const int64_t i = base + u * kSgdThreads;
      if (i >= end) continue;
      float d_p = g_v[u];
      if constexpr (kWeightDecay) d_p = __fadd_rn(d_p, __fmul_rn(s.weight_decay, p_v[u]));
      if constexpr (kMomentum) {
        // buf.mul_(momentum).add_(d_p, 1 - dampening), or d_p itself the first time.
        const float b = new_buffer ? d_p
                                   : __fadd_rn(__fmul_rn(buf_v[u], s.momentum),
                                               __fmul_rn(s.keep, d_p));
        buf[i] = b;
        if constexpr (kNesterov) {
          d_p = __fadd_rn(d_p, __fmul_rn(s.momentum, b));
        } else {
          d_p = b;
        }
      }
      p[i] = __fadd_rn(p_v[u], __fmul_rn(s.neg_lr, d_p));
    }
  }
}

template <bool kWeightDecay, bool kMomentum, bool kNesterov>
void launch_sgd(const SgdLaunchTensors& tensors, uint32_t blocks, const SgdScalars& s,
                cudaStream_t stream) {
  sgd_kernel<kWeightDecay, kMomentum, kNesterov><<<blocks, kSgdThreads, 0, stream>>>(tensors, s);
  MG_CUDA_CHECK_LAUNCH();
}

template <bool kWeightDecay>
void launch_sgd(const SgdLaunchTensors& tensors, uint32_t blocks, const SgdScalars& s,
                cudaStream_t stream) {
  if (!s.use_momentum) {
    launch_sgd<kWeightDecay, false, false>(tensors, blocks, s, stream);
  } else if (s.nesterov) {
    launch_sgd<kWeightDecay, true, true>(tensors, blocks, s, stream);
  } else {
    launch_sgd<kWeightDecay, true, false>(tensors, blocks, s, stream);
  }
}

void launch_sgd(const SgdLaunchTensors& tensors, uint32_t blocks, const SgdScalars& s,
                cudaStream_t stream) {
  if (s.use_weight_decay) {
    launch_sgd<true>(tensors, blocks, s, stream);
  } else {
    launch_sgd<false>(tensors, blocks, s, stream);
  }
}

// ---- Adam ----

constexpr int kAdamThreads = 256;
constexpr int64_t kAdamChunk = 16 * kAdamThreads;  // elements per block
constexpr int kAdamBatch = 4;
constexpr int kMaxAdamTensors = kAdamTensorsPerLaunch;

struct AdamLaunchTensors {
  float* param[kMaxAdamTensors];
  const float* grad[kMaxAdamTensors];
  float* exp_avg[kMaxAdamTensors];
  float* exp_avg_sq[kMaxAdamTensors];
  float* max_exp_avg_sq[kMaxAdamTensors];
  int64_t numel[kMaxAdamTensors];
  float neg_step_size[kMaxAdamTensors];
  float bias_correction2_sqrt[kMaxAdamTensors];
  uint32_t first_chunk[kMaxAdamTensors + 1];
  int32_t count;
};
static_assert(sizeof(AdamLaunchTensors) + sizeof(AdamScalars) <= 4096,
              "Adam's kernel parameters must stay within 4 KB");

// torch.maximum: NaN wins, as on the CPU.
__device__ __forceinline__ float nan_maximum(float a, float b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return a > b ? a : b;
}

template <AdamWeightDecay kDecay, bool kAmsgrad, bool kMaximize>
__global__ void __launch_bounds__(kAdamThreads)
    adam_kernel(const __grid_constant__ AdamLaunchTensors tensors, const AdamScalars s) {
  const uint32_t block = blockIdx.x;
  int lo = 0, hi = tensors.count - 1;  // the last tensor whose first chunk is <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tensors.first_chunk[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int t = lo;
  float* p = tensors.param[t];
  const float* grad = tensors.grad[t];
  float* m = tensors.exp_avg[t];
  float* v = tensors.exp_avg_sq[t];
  float* vmax = tensors.max_exp_avg_sq[t];
  const float neg_step_size = tensors.neg_step_size[t];
  const float bias_correction2_sqrt = tensors.bias_correction2_sqrt[t];
  const int64_t begin = static_cast<int64_t>(block - tensors.first_chunk[t]) * kAdamChunk;
  const int64_t end = min(begin + kAdamChunk, tensors.numel[t]);
  // As SGD's kernel: kAdamBatch elements of every operand loaded before any is computed.
  for (int64_t base = begin + threadIdx.x; base < end; base += kAdamBatch * kAdamThreads) {
    float p_v[kAdamBatch], g_v[kAdamBatch], m_v[kAdamBatch], v_v[kAdamBatch],
        vmax_v[kAdamBatch];
#pragma unroll
    for (int u = 0; u < kAdamBatch; ++u) {
      const int64_t i = base + u * kAdamThreads;
      if (i < end) {
        p_v[u] = p[i];
        g_v[u] = grad[i];
        m_v[u] = m[i];
        v_v[u] = v[i];
        if constexpr (kAmsgrad) vmax_v[u] = vmax[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kAdamBatch; ++u) {
      const int64_t i = base + u * kAdamThreads;
      if (i >= end) continue;
      float g = g_v[u];
      if constexpr (kMaximize) g = -g;
      float param = p_v[u];
      if constexpr (kDecay == AdamWeightDecay::Decoupled) param = __fmul_rn(param, s.decay);
      if constexpr (kDecay == AdamWeightDecay::L2)
        g = __fadd_rn(g, __fmul_rn(s.weight_decay, param));
      const float m_new = __fadd_rn(__fmul_rn(m_v[u], s.beta1), __fmul_rn(s.keep1, g));
      m[i] = m_new;
      // addcmul_: (value * g) * g, then the add.
      const float v_new = __fadd_rn(__fmul_rn(v_v[u], s.beta2), __fmul_rn(__fmul_rn(s.keep2, g), g));
      v[i] = v_new;
      float second = v_new;
      if constexpr (kAmsgrad) {
        second = nan_maximum(vmax_v[u], v_new);
        vmax[i] = second;
      }
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(second), bias_correction2_sqrt), s.eps);
      // addcdiv_: (value * m) / denom, then the add.
      p[i] = __fadd_rn(param, __fdiv_rn(__fmul_rn(neg_step_size, m_new), denom));
    }
  }
}

template <AdamWeightDecay kDecay, bool kAmsgrad>
void launch_adam(const AdamLaunchTensors& tensors, uint32_t blocks, const AdamScalars& s,
                 cudaStream_t stream) {
  if (s.maximize) {
    adam_kernel<kDecay, kAmsgrad, true><<<blocks, kAdamThreads, 0, stream>>>(tensors, s);
  } else {
    adam_kernel<kDecay, kAmsgrad, false><<<blocks, kAdamThreads, 0, stream>>>(tensors, s);
  }
  MG_CUDA_CHECK_LAUNCH();
}

template <AdamWeightDecay kDecay>
void launch_adam(const AdamLaunchTensors& tensors, uint32_t blocks, const AdamScalars& s,
                 cudaStream_t stream) {
  if (s.amsgrad) {
    launch_adam<kDecay, true>(tensors, blocks, s, stream);
  } else {
    launch_adam<kDecay, false>(tensors, blocks, s, stream);
  }
}

void launch_adam(const AdamLaunchTensors& tensors, uint32_t blocks, const AdamScalars& s,
                 cudaStream_t stream) {
  switch (s.weight_decay_mode) {
    case AdamWeightDecay::None:
      launch_adam<AdamWeightDecay::None>(tensors, blocks, s, stream);
      break;
    case AdamWeightDecay::L2: launch_adam<AdamWeightDecay::L2>(tensors, blocks, s, stream); break;
    case AdamWeightDecay::Decoupled:
      launch_adam<AdamWeightDecay::Decoupled>(tensors, blocks, s, stream);
      break;
  }
}

}  // namespace

void sgd_step(const SgdTensorPointers* tensors, std::size_t count, const SgdScalars& scalars,
              cudaStream_t stream) {
  // gridDim.x may reach 2^31 - 1; a launch stops short of it (a tensor of 2^31 chunks,
  // 8 * 10^12 elements, cannot exist).
  constexpr int64_t kMaxBlocks = INT32_MAX;
  SgdLaunchTensors launch{};
  int64_t blocks = 0;
  const auto flush = [&] {
    if (launch.count == 0) return;
    launch.first_chunk[launch.count] = static_cast<uint32_t>(blocks);
    launch_sgd(launch, static_cast<uint32_t>(blocks), scalars, stream);
    launch = SgdLaunchTensors{};
    blocks = 0;
  };
  for (std::size_t i = 0; i < count; ++i) {
    const SgdTensorPointers& t = tensors[i];
    if (t.numel <= 0) continue;
    const int64_t chunks = (t.numel + kSgdChunk - 1) / kSgdChunk;
    if (launch.count == kMaxTensors || blocks + chunks > kMaxBlocks) flush();
    const int n = launch.count++;
    launch.param[n] = t.param;
    launch.grad[n] = t.grad;
    launch.momentum_buffer[n] = t.momentum_buffer;
    launch.numel[n] = t.numel;
    launch.first_chunk[n] = static_cast<uint32_t>(blocks);
    launch.new_buffer[n] = t.new_buffer ? 1 : 0;
    blocks += chunks;
  }
  flush();
}

void adam_step(const AdamTensorPointers* tensors, std::size_t count, const AdamScalars& scalars,
               cudaStream_t stream) {
  constexpr int64_t kMaxBlocks = INT32_MAX;
  AdamLaunchTensors launch{};
  int64_t blocks = 0;
  const auto flush = [&] {
    if (launch.count == 0) return;
    launch.first_chunk[launch.count] = static_cast<uint32_t>(blocks);
    launch_adam(launch, static_cast<uint32_t>(blocks), scalars, stream);
    launch = AdamLaunchTensors{};
    blocks = 0;
  };
  for (std::size_t i = 0; i < count; ++i) {
    const AdamTensorPointers& t = tensors[i];
    if (t.numel <= 0) continue;
    const int64_t chunks = (t.numel + kAdamChunk - 1) / kAdamChunk;
    if (launch.count == kMaxAdamTensors || blocks + chunks > kMaxBlocks) flush();
    const int n = launch.count++;
    launch.param[n] = t.param;
    launch.grad[n] = t.grad;
    launch.exp_avg[n] = t.exp_avg;
    launch.exp_avg_sq[n] = t.exp_avg_sq;
    launch.max_exp_avg_sq[n] = t.max_exp_avg_sq;
    launch.numel[n] = t.numel;
    launch.neg_step_size[n] = t.neg_step_size;
    launch.bias_correction2_sqrt[n] = t.bias_correction2_sqrt;
    launch.first_chunk[n] = static_cast<uint32_t>(blocks);
    blocks += chunks;
  }
  flush();
}

}  // namespace mg::cuda::kernels
