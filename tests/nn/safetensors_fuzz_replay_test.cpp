// Replays the safetensors fuzz target's seeds and past crashes (tests/fuzz/) in the
// regular suite: each must end in a result or an mg::Error, with no sanitizer report.
#include "catch_compat.h"

#include "fuzz/fuzz_targets.h"
#include "fuzz/replay.h"

TEST_CASE("fuzz replay: safetensors loader on the seed corpus and every past crash") {
  const std::vector<std::string> inputs = mg::fuzz::replay_inputs("safetensors");
  REQUIRE(inputs.size() >= 4);  // the committed seeds at least
  for (const std::string& path : inputs) {
    INFO(path);
    const std::vector<uint8_t> bytes = mg::fuzz::read_bytes(path);
    CHECK_NOTHROW(mg::fuzz::safetensors_one_input(bytes.data(), bytes.size()));
  }
}

TEST_CASE("fuzz replay: the seed checkpoint of a Linear(2, 3) loads into one") {
  // Guards the seed itself: if it stopped matching nn::load, the fuzzer would no longer
  // reach the state-dict checks from it.
  mg::nn::Linear model(2, 3);
  mg::nn::load(model, std::string(MINIGRAD_SOURCE_DIR) +
                          "/tests/fuzz/corpus/safetensors/linear-2x3.safetensors");
  CHECK(model.weight().to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(model.bias().to_vector<float>() == std::vector<float>{0.1f, -0.2f, 0.3f});
}
