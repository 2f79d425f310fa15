// Replays the IDX fuzz target's seeds and past crashes (tests/fuzz/) in the regular
// suite: each must end in a result or an mg::Error, with no sanitizer report.
#include "catch_compat.h"

#include "fuzz/fuzz_targets.h"
#include "fuzz/replay.h"

TEST_CASE("fuzz replay: IDX reader on the seed corpus and every past crash") {
  const std::vector<std::string> inputs = mg::fuzz::replay_inputs("idx");
  REQUIRE(inputs.size() >= 5);  // the committed seeds at least
  for (const std::string& path : inputs) {
    INFO(path);
    const std::vector<uint8_t> bytes = mg::fuzz::read_bytes(path);
    CHECK_NOTHROW(mg::fuzz::idx_one_input(bytes.data(), bytes.size()));
  }
}

TEST_CASE("fuzz replay: the gzipped label seed reads as the raw one") {
  // Guards the seeds themselves: the fuzzer should start from files that parse.
  const std::string dir = std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/corpus/idx/";
  const mg::data::IdxArray raw = mg::data::read_idx_ubyte(dir + "labels-idx1-ubyte", 1);
  const mg::data::IdxArray gz = mg::data::read_idx_ubyte(dir + "labels-idx1-ubyte.gz", 1);
  CHECK(raw.dims == std::vector<int64_t>{6});
  CHECK(raw.values == std::vector<uint8_t>{0, 9, 3, 1, 7, 2});
  CHECK(gz.dims == raw.dims);
  CHECK(gz.values == raw.values);
}

TEST_CASE("fuzz replay: the gzip bomb and the lying header seeds are refused as they should be") {
  // Guards the seeds of the checks that stop a reader at what the header declares.
  const std::string dir = std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/corpus/idx/";
  REQUIRE_THROWS_WITH(mg::data::read_idx_ubyte(dir + "bomb-labels-idx1-ubyte.gz", 1),
                      MG_CONTAINS("the gzip data inflates past the 11 bytes that its header "
                                  "declares"));
  REQUIRE_THROWS_WITH(mg::data::read_idx_ubyte(dir + "liar-idx3-ubyte.gz", 3),
                      MG_CONTAINS("truncated: the header describes 4294967295 x 65535 x 65535"));
  REQUIRE_THROWS_WITH(mg::data::read_maybe_gzipped(dir + "bomb-labels-idx1-ubyte.gz", 4096),
                      MG_CONTAINS("the data is longer than the limit of 4096 bytes "
                                  "(decompressed); stopped reading there"));
  CHECK(mg::data::read_maybe_gzipped(dir + "labels-idx1-ubyte.gz", 14).size() == 14);
}
