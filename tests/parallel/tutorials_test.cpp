// The two tutorials run on CPU replicas and print what PyTorch's tutorials print.
// They are run as programs (build/bin/...), as a reader would run them.
#include "catch_compat.h"

#include <array>
#include <cstdio>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fmt/format.h>

namespace {

struct Run {
  int status = -1;
  std::string output;  // stdout and stderr together
};

std::string program(const char* name) { return fmt::format("{}/bin/{}", MINIGRAD_BINARY_DIR, name); }

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

Run run(const std::string& command) {
  Run result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

size_t count(const std::string& text, const std::string& line) {
  size_t n = 0;
  for (size_t at = text.find(line); at != std::string::npos; at = text.find(line, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("data_parallel_tutorial splits each batch of 30 over four CPU replicas") {
  const std::string tutorial = program("data_parallel_tutorial");
  if (!exists(tutorial)) {
    WARN("not built (MINIGRAD_BUILD_SAMPLES=OFF): " << tutorial);
    return;
  }
  const Run r = run(tutorial + " --replicas 4");
  INFO(r.output);
  REQUIRE(r.status == 0);
  REQUIRE(count(r.output, "--replicas 4: running 4 replicas on the CPU\n") == 1);
  // 100 examples in batches of 30: 30 30 30 10; 30 rows on 4 replicas are 8 8 8 6, and
  // the last 10 are 3 3 3 1.
  REQUIRE(count(r.output, "Outside: input size [30, 5] output_size [30, 2]\n") == 3);
  REQUIRE(count(r.output, "Outside: input size [10, 5] output_size [10, 2]\n") == 1);
  REQUIRE(count(r.output, "\tIn Model: input size [8, 5] output size [8, 2]\n") == 9);
  REQUIRE(count(r.output, "\tIn Model: input size [6, 5] output size [6, 2]\n") == 3);
  REQUIRE(count(r.output, "\tIn Model: input size [3, 5] output size [3, 2]\n") == 3);
  REQUIRE(count(r.output, "\tIn Model: input size [1, 5] output size [1, 2]\n") == 1);
}

TEST_CASE("data_parallel_tutorial takes --device-ids and explains a bad one") {
  const std::string tutorial = program("data_parallel_tutorial");
  if (!exists(tutorial)) return;
  const Run two = run(tutorial + " --device-ids cpu,cpu");
  INFO(two.output);
  REQUIRE(two.status == 0);
  REQUIRE(count(two.output, "--device-ids cpu,cpu: using [cpu, cpu]\n") == 1);
  REQUIRE(count(two.output, "\tIn Model: input size [15, 5] output size [15, 2]\n") == 6);
  REQUIRE(count(two.output, "\tIn Model: input size [5, 5] output size [5, 2]\n") == 2);

  const Run bad = run(tutorial + " --device-ids cpu,,cpu");
  REQUIRE(bad.status == 2);  // a bad flag
  REQUIRE(count(bad.output, "data_parallel_tutorial: error: device list 'cpu,,cpu': empty entry") == 1);
}

TEST_CASE("model_parallel trains its two layers for 10 epochs") {
  const std::string binary = program("model_parallel");
  if (!exists(binary)) return;
  const Run r = run(binary + " --devices cpu,cpu");
  INFO(r.output);
  REQUIRE(r.status == 0);
  REQUIRE(count(r.output, "layer1 = Linear(10, 5) on cpu, layer2 = Linear(5, 2) on cpu\n") == 1);
  float first = 0, last = 0;
  for (int epoch = 1; epoch <= 10; ++epoch) {
    const std::string prefix = fmt::format("Epoch {}, Loss: ", epoch);
    const size_t at = r.output.find(prefix);
    REQUIRE(at != std::string::npos);
    const float loss = std::stof(r.output.substr(at + prefix.size()));
    if (epoch == 1) first = loss;
    last = loss;
  }
  REQUIRE(last < first);  // SGD on a fixed batch: the loss goes down
}

TEST_CASE("model_parallel --wrap-data-parallel says what DataParallel does with it") {
  const std::string binary = program("model_parallel");
  if (!exists(binary)) return;
  const Run r = run(binary + " --devices cpu,cpu --wrap-data-parallel");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // Both layers on the CPU: nothing is split, so DataParallel accepts it (the refusal
  // needs two devices; tests/cuda checks that message).
  REQUIRE(count(r.output, "DataParallel accepted it: both layers are on cpu") == 1);
}

TEST_CASE("model_parallel --pipeline --chunks 8 trains as the naive split does and prints how busy each stage was") {
  const std::string binary = program("model_parallel");
  if (!exists(binary)) return;
  const Run naive = run(binary + " --devices cpu,cpu");
  const Run piped = run(binary + " --devices cpu,cpu --pipeline --chunks 8");
  INFO(naive.output);
  INFO(piped.output);
  REQUIRE(naive.status == 0);
  REQUIRE(piped.status == 0);
  REQUIRE(count(piped.output, "Pipe over [cpu, cpu]: 8 micro-batches of a batch of 64, schedule gpipe\n") == 1);
  // The same weights, batch and losses, epoch by epoch (printed to four decimals).
  for (int epoch = 1; epoch <= 10; ++epoch) {
    const std::string prefix = fmt::format("Epoch {}, Loss: ", epoch);
    const size_t a = naive.output.find(prefix), b = piped.output.find(prefix);
    REQUIRE(a != std::string::npos);
    REQUIRE(b != std::string::npos);
    REQUIRE(naive.output.substr(a, prefix.size() + 6) == piped.output.substr(b, prefix.size() + 6));
  }
  REQUIRE(count(piped.output, "naive split (1 micro-batch): step ") == 1);
  REQUIRE(count(piped.output, "pipeline (8 micro-batches): step ") == 1);
  REQUIRE(count(piped.output, ", stage 0 (cpu) busy ") == 2);
  REQUIRE(count(piped.output, ", stage 1 (cpu) busy ") == 2);
  REQUIRE(count(piped.output, "(ideal for equal stages: (p-1)/(m+p-1) = 11%)") == 1);
  const Run ofob = run(binary + " --devices cpu,cpu --pipeline --chunks 4 --schedule 1f1b");
  INFO(ofob.output);
  REQUIRE(ofob.status == 0);
  REQUIRE(count(ofob.output, "Epoch 10, Loss: ") == 1);
}

// Flags that would do nothing outside their mode, and numbers that are not numbers, are
// refused by the tutorials and the benchmarks alike (samples/support/command_line.h).
TEST_CASE("model_parallel, pipeline_parallel and the benchmarks refuse pointless flags and bad numbers") {
  const struct {
    const char* program;
    const char* flags;
    const char* message;
  } cases[] = {
      {"model_parallel", "--chunks 4", "model_parallel: error: --chunks requires --pipeline"},
      {"model_parallel", "--timeline t.svg", "model_parallel: error: --timeline requires --pipeline"},
      {"model_parallel", "--epochs 2 --trace t.json --trace-warmup 5",
       "model_parallel: error: --trace-warmup 5: the run has 2 epochs left"},
      {"pipeline_parallel", "--timeout nan",
       "pipeline_parallel: error: --timeout: expects a number in [0, 3.1536e+07], got 'nan'"},
      {"pipeline_parallel", "--layers 2000000000",
       "pipeline_parallel: error: --layers: expects an integer in [1, 65536], got '2000000000'"},
      {"minigrad-bench", "--mode eager --chunks 4",
       "minigrad-bench: error: --chunks applies to --mode pipeline only, not --mode eager"},
      {"minigrad-bench", "--steps 5x", "minigrad-bench: error: --steps: expects an integer in "
                                       "[1, 1048576], got '5x'"},
      {"minigrad-bench", "--mode dataparallel --device-ids 0,99999999999",
       "minigrad-bench: error: --device-ids expects an integer in [0, 1023], got '99999999999'"},
      {"ddp-bench", "--timeout -1", "ddp-bench: error: --timeout: expects a number in [0, "
                                    "3.1536e+07], got '-1'"},
      {"tp-bench", "--widths 8,16x,4", "tp-bench: error: --widths expects an integer in [1, "
                                       "1048576], got '16x'"},
  };
  for (const auto& c : cases) {
    const std::string binary = program(c.program);
    if (!exists(binary)) continue;
    const Run r = run(binary + " " + c.flags);
    INFO(c.program << " " << c.flags << "\n" << r.output);
    CHECK(r.status == 2);
    CHECK(count(r.output, c.message) == 1);
  }
}
