// train_fashion_mnist's memory line: this rank's allocator peak over the training steps
// beside the MLP's formulas (plan/mlp_formulas.h) for the same split, as train_gpt's
// memory_report.h does for the GPT:
//
//   memory: peak 4.43 MiB on rank 0; the planner: 4.43 MiB (params 0.90 MiB, grads 0.90 MiB,
//   optimizer 0.90 MiB, buffers 0.90 MiB, activations 0.03 MiB, data 0.81 MiB), measured /
//   planned 1.000
//
// "data" is what the trainer holds beside the step: the training and test sets and the
// rank's batch. ZeRO-3 over Gloo is a range (plan::mlp_zero3_memory: a race with the
// communication thread): "the planner: 4.03 to 4.80 MiB (the low: ...; the high adds: the
// reduce-scatter's scratch ...), measured within that range (measured / low 1.000, measured
// / high 0.840)". The pipeline in one process (--pipeline P) and TensorParallel in one
// process are ranges too, their threads racing on one allocator (plan::mlp_pipe_memory:
// the states the stages' threads can be in together; plan::mlp_tp_in_process_memory: the
// ranks' moments between the all-reduces): "the planner: 7.31 to 7.37 MiB (the low: ... the
// ranks' threads together in forward, ...; the high adds: the others at their largest moment
// too (each a row layer's bias-added output) 0.06 MiB ...)". In 16 bits (one device, DDP,
// ZeRO-1, ZeRO-2, ZeRO-3, tp over ranks) the masters of bf16-true are named beside the
// parameters; ZeRO-3's low there may come before its launch, and the line says by how much. Splits, precisions and devices
// the formulas do not price yet are said in the line (a GPU: its allocator holds the batch
// but not the data sets; not measured yet).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <minigrad/plan/mlp_formulas.h>
#include <minigrad/plan/planner.h>

namespace mg::samples {

struct MLPRun {
  plan::MLPConfig config;
  plan::Split split;        // dp: the data-parallel ranks of --distributed; tp, pp, zero
  int devices_in_one_process = 1;  // DataParallel's or TensorParallel's (--devices cpu,cpu)
  plan::MLPPrecision precision = plan::MLPPrecision::True32;  // --precision
  bool cpu = true;          // the CPU allocator's peak (the data sets live there too)
  int64_t rank_rows = 0;    // a step's rows on this rank
  int64_t train_images = 0, test_images = 0;
  plan::MLPOptimizer optimizer = plan::MLPOptimizer::SGDMomentum;
  bool pipe_1f1b = false;   // --schedule 1f1b (else gpipe), with --pipeline
  bool gloo = false;        // the process group is Gloo's (ZeRO-3's range: its thread's scratch)
};

std::string mlp_memory_report(std::size_t peak_bytes, int rank, const MLPRun& run);

}  // namespace mg::samples
