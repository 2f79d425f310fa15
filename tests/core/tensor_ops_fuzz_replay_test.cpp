// Replays the tensor-ops fuzz target's seeds and past crashes (tests/fuzz/) in the
// regular suite: each program must end with results or mg::Errors only, with no
// sanitizer report (the suite also runs under ASan and UBSan).
#include "catch_compat.h"

#include "fuzz/replay.h"
#include "fuzz/tensor_ops_target.h"

TEST_CASE("fuzz replay: tensor ops on the seed corpus and every past crash") {
  const std::vector<std::string> inputs = mg::fuzz::replay_inputs("tensor_ops");
  REQUIRE(inputs.size() >= 11);  // the committed seeds at least
  for (const std::string& path : inputs) {
    INFO(path);
    const std::vector<uint8_t> bytes = mg::fuzz::read_bytes(path);
    CHECK_NOTHROW(mg::fuzz::tensor_ops_one_input(bytes.data(), bytes.size()));
  }
}

TEST_CASE("fuzz replay: the tensor-ops encoding reads the numbers the seeds are written in") {
  // Guards the seeds: make_tensor_ops_corpus.py and Reader must agree.
  const uint8_t bytes[] = {0x02, 0x0f, 0x80, 0x81, 0x84, 0xc0, 0xfd, 0xff, 0xff,
                           0xff, 0xff, 0xff, 0xff, 0xff, 0x0a, 0x64, 0x80};
  mg::fuzz::tensor_ops::Reader in(bytes, sizeof bytes);
  CHECK(in.number() == 0);
  CHECK(in.number() == 13);
  CHECK(in.number() == std::numeric_limits<int64_t>::max());
  CHECK(in.number() == std::numeric_limits<int64_t>::min());
  CHECK(in.number() == std::numeric_limits<int64_t>::max() - 254);
  CHECK(in.number() == -3);
  CHECK(in.scalar() == 0.0);
  CHECK(in.scalar() == 0.5);
  CHECK(std::isnan(in.scalar()));
  CHECK(in.done());
  CHECK(in.byte() == 0);  // past the end: zeros
}
