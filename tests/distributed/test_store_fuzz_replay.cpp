// Replays the TCPStore message parser's fuzz seeds and past crashes (tests/fuzz/) in the
// regular suite: each must keep the parser's invariants, with no sanitizer report.
#include "catch_compat.h"

#include "fuzz/fuzz_targets.h"
#include "fuzz/replay.h"

TEST_CASE("fuzz replay: TCPStore message parser on the seed corpus and every past crash") {
  const std::vector<std::string> inputs = mg::fuzz::replay_inputs("store");
  REQUIRE(inputs.size() >= 9);  // the committed seeds at least
  for (const std::string& path : inputs) {
    INFO(path);
    const std::vector<uint8_t> bytes = mg::fuzz::read_bytes(path);
    CHECK_NOTHROW(mg::fuzz::store_one_input(bytes.data(), bytes.size()));
  }
}

TEST_CASE("fuzz replay: the session seed parses into the requests it was written from") {
  // Guards the seeds themselves: the fuzzer should start from streams that parse.
  namespace store = mg::parallel::store;
  const std::vector<uint8_t> bytes = mg::fuzz::read_bytes(
      std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/corpus/store/session");
  const char* p = reinterpret_cast<const char*>(bytes.data()) + 1;
  std::size_t left = bytes.size() - 1;
  std::vector<uint8_t> codes;
  while (left > 0) {
    store::Parsed parsed = store::parse_message(p, left, store::Limits{});
    REQUIRE(parsed.status == store::ParseStatus::Complete);
    REQUIRE(store::check_request(parsed.message).empty());
    codes.push_back(parsed.message.code);
    p += parsed.size;
    left -= parsed.size;
  }
  CHECK(codes == std::vector<uint8_t>{store::kHello, store::kSet, store::kGet, store::kAdd,
                                      store::kCheck, store::kWait, store::kWait});
}
