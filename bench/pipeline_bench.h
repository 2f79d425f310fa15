// minigrad-bench's pipeline modes (bench/pipeline_bench.cpp):
//   --mode model_parallel   the naive split: stage s's layers on devices[s], the
//                           activations moved with Tensor::to, one thread: the stages
//                           take turns (PyTorch's model-parallel tutorial)
//   --mode pipeline         the same split under parallel::Pipe: --chunks micro-batches,
//                           --schedule gpipe|1f1b, --checkpoint never|except_last|always
// Both print the JSON fields of the other modes; pipeline adds each stage's busy
// fraction and the measured bubble (from Pipe::last_timeline) beside the formula's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace minigrad_bench {

struct PipelineRun {
  std::string mode;                // model_parallel | pipeline
  std::string devices = "cpu,cpu";  // one per stage
  int64_t chunks = 8;
  std::string schedule = "gpipe";
  std::string checkpoint = "never";
  std::vector<int64_t> widths;     // input, hidden..., classes
  int64_t batch = 0;
  int steps = 20, warmup = 3;
  double lr = 0.01;
  uint64_t seed = 0;
  std::string timeline;            // pipeline: the last timed step's timeline as an SVG
};

// Fills `record` (which has the common fields) with the timings and memory of `run`.
void run_pipeline_bench(const PipelineRun& run, nlohmann::json& record);

}  // namespace minigrad_bench
