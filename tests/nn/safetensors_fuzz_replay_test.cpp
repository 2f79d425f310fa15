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

TEST_CASE("fuzz regressions: the safetensors faults the fuzzer found are named errors now") {
  const std::string dir = std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/regressions/safetensors/";
  // Was a stack overflow: error messages dump() JSON values, recursively.
  REQUIRE_THROWS_WITH(
      mg::nn::load_tensors(dir + "json-nested-100000-deep-overflowed-the-stack-in-dump.safetensors"),
      MG_CONTAINS("is not a valid safetensors file: its JSON header nests deeper than 16 levels"));
  // Was a signed overflow (UBSan) computing the strides of an empty tensor.
  REQUIRE_THROWS_WITH(
      mg::nn::load_tensors(dir + "shape-0-then-2e62x2e62-overflowed-int64-strides.safetensors"),
      MG_CONTAINS("tensor 't' has an impossibly large shape [0,4611686018427387904,4611686018427387904]"));
}

TEST_CASE("fuzz replay: the non-finite and the header-length seeds are refused as they should be") {
  const std::string dir = std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/corpus/safetensors/";
  REQUIRE_THROWS_WITH(mg::nn::load_tensors(dir + "non-finite.safetensors"),
                      MG_CONTAINS("holds non-finite values (NaN or infinity) in 2 tensors"));
  mg::nn::LoadOptions options;
  options.allow_non_finite = true;
  CHECK(mg::nn::load_tensors(dir + "non-finite.safetensors", options).tensors.size() == 2);
  REQUIRE_THROWS_WITH(mg::nn::load_tensors(dir + "header-length-past-end.safetensors"),
                      MG_CONTAINS("the header length 1099511627776 is larger than the 7 bytes "
                                  "that follow it"));
}

// nlohmann's parser keeps the last of two equal keys; the loader refuses them instead.
TEST_CASE("fuzz replay: a header that names a key twice is refused, naming it") {
  const std::string dir = std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/corpus/safetensors/";
  REQUIRE_THROWS_WITH(mg::nn::load_tensors(dir + "duplicate-tensor.safetensors"),
                      MG_CONTAINS("is not a valid safetensors file: its header names 'w' twice"));
  REQUIRE_THROWS_WITH(mg::nn::load_tensors(dir + "duplicate-metadata.safetensors"),
                      MG_CONTAINS("its header names '__metadata__' twice"));
  REQUIRE_THROWS_WITH(mg::nn::load_tensors(dir + "duplicate-metadata-key.safetensors"),
                      MG_CONTAINS("the entry '__metadata__' of its header has the key 'epoch' "
                                  "twice"));
  REQUIRE_THROWS_WITH(mg::nn::load_tensors(dir + "duplicate-shape.safetensors"),
                      MG_CONTAINS("the entry 'w' of its header has the key 'shape' twice"));
  // Out-of-range numbers in the metadata are text to the loader; --resume refuses them.
  const mg::nn::Checkpoint ck =
      mg::nn::load_tensors(dir + "checkpoint-metadata-out-of-range.safetensors");
  CHECK(ck.metadata.at("epoch") == "99999999999999999999999");
}
