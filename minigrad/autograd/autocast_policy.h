// Autocast's policy: what dtype each op runs in inside an AutocastGuard (autograd/
// autocast.h), one row per op that has a rule, one column per device type. It is
// torch.autocast's, from torch 1.13's lists (aten/src/ATen/autocast_mode.cpp):
//
//   Lower    the floating inputs are cast to the region's 16-bit dtype (bfloat16 or
//            float16) and the op runs there: the GEMMs, whose float32 accumulation
//            (cuBLAS's CUBLAS_COMPUTE_32F, the CPU's sgemm) keeps them accurate and whose
//            16-bit inputs halve their memory traffic and use the tensor cores.
//   Float32  the floating inputs are cast to float32: ops whose result is sensitive to
//            rounding or range (exponentials, sums over many terms, normalisations, losses).
//   Promote  the inputs are cast to the widest floating dtype among them (cat joins a
//            bfloat16 and a float32 tensor as float32).
//   -        no rule: the op runs in its inputs' dtypes (elementwise ops on mixed inputs
//            promote to the widest, as outside a region; a softmax of bfloat16 is bfloat16).
//
// float64 inputs are never cast (torch: "is_eligible" excludes double), nor int64 ones.
// Ops that are not in the table (relu, gelu, tanh, add, mul, dropout, embedding,
// masked_fill, views, to) have no rule.
//
// The CPU column is torch 1.13's CPU list (tests/autograd/autocast_test.cpp checks the dtype
// of every op against torch.autocast("cpu", torch.bfloat16), from
// tests/autograd/reference/make_autocast_reference.py). The CUDA column is torch 1.13's CUDA
// list, which puts more ops in float32 than the CPU's: softmax, log_softmax, layer_norm,
// exp, log and sum (sum as "fp32_set_opt_dtype": a float32 result). Neither list has mean
// (it accumulates in float32 inside and returns its input's dtype) nor
// scaled_dot_product_attention (torch 2.0 added it to both as Lower; torch 1.13's
// composition of matmul, softmax and matmul gives the 16-bit dtype on the CPU too).
#pragma once

#include <minigrad/core/device.h>

namespace mg::autocast {

enum class CastPolicy { None, Lower, Float32, Promote };

enum class AutocastOp {
  Matmul,       // matmul, bmm (mm, bmm, matmul, baddbmm, addbmm in torch)
  Linear,       // linear, linear_relu (linear, addmm)
  Attention,    // scaled_dot_product_attention, fused or composed
  CrossEntropy, // cross_entropy (cross_entropy_loss, nll_loss)
  Softmax,
  LogSoftmax,
  LayerNorm,
  Exp,
  Log,
  Sum,
  Mean,
  Cat,
};

struct AutocastRule {
  AutocastOp op;
  const char* name;
  CastPolicy cpu;
  CastPolicy cuda;
};

// clang-format off
inline constexpr AutocastRule kAutocastPolicy[] = {
    // op                         name                            CPU                    CUDA
    {AutocastOp::Matmul,       "matmul",                       CastPolicy::Lower,     CastPolicy::Lower},
    {AutocastOp::Linear,       "linear",                       CastPolicy::Lower,     CastPolicy::Lower},
    {AutocastOp::Attention,    "scaled_dot_product_attention", CastPolicy::Lower,     CastPolicy::Lower},
    {AutocastOp::CrossEntropy, "cross_entropy",                CastPolicy::Float32,   CastPolicy::Float32},
    {AutocastOp::Softmax,      "softmax",                      CastPolicy::None,      CastPolicy::Float32},
    {AutocastOp::LogSoftmax,   "log_softmax",                  CastPolicy::None,      CastPolicy::Float32},
    {AutocastOp::LayerNorm,    "layer_norm",                   CastPolicy::None,      CastPolicy::Float32},
    {AutocastOp::Exp,          "exp",                          CastPolicy::None,      CastPolicy::Float32},
    {AutocastOp::Log,          "log",                          CastPolicy::None,      CastPolicy::Float32},
    {AutocastOp::Sum,          "sum",                          CastPolicy::None,      CastPolicy::Float32},
    {AutocastOp::Mean,         "mean",                         CastPolicy::None,      CastPolicy::None},
    {AutocastOp::Cat,          "cat",                          CastPolicy::Promote,   CastPolicy::Promote},
};
// clang-format on

constexpr CastPolicy policy(AutocastOp op, DeviceType device_type) {
  for (const AutocastRule& rule : kAutocastPolicy)
    if (rule.op == op) return device_type == DeviceType::CPU ? rule.cpu : rule.cuda;
  return CastPolicy::None;
}

}  // namespace mg::autocast
