// Rotary position embedding on the host (RoFormer's rotation, in the rotate_half layout of
// HF's Llama): each pair (x[i], x[i + D/2]) of a head's D features at position t turns by
// the angle whose cosine and sine are cos[t, i] and sin[t, i]. A rotation's gradient is the
// rotation back, so backward is this kernel with `inverse` (sin negated). bfloat16 and
// float16 load as float and round once (compute_t), as the elementwise ops.
#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

template <typename T>
void rotary_typed(const Tensor& out, const Tensor& in, const Tensor& cos, const Tensor& sin, bool inverse) {
  using C = compute_t<T>;
  const int64_t B = in.size(0), S = in.size(1), H = in.size(2), D = in.size(3), half = D / 2;
  const T* x = static_cast<const T*>(in.data_ptr());
  T* y = static_cast<T*>(out.data_ptr());
  const T* c = static_cast<const T*>(cos.data_ptr());
  const T* s = static_cast<const T*>(sin.data_ptr());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * S + t) * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const C ci = C(c[t * half + i]), si = inverse ? -C(s[t * half + i]) : C(s[t * half + i]);
          const C x1 = C(x[base + i]), x2 = C(x[base + i + half]);
          y[base + i] = T(x1 * ci - x2 * si);
          y[base + i + half] = T(x2 * ci + x1 * si);
        }
      }
}

}  // namespace

void CpuBackend::rotary_embedding(const Tensor& out, const Tensor& in, const Tensor& cos, const Tensor& sin,
                                  bool inverse) {
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(in.dtype(), "rotary_embedding", [&] {
    rotary_typed<scalar_t>(out, in, cos, sin, inverse);
  });
}

}  // namespace mg
