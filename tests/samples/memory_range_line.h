// What the tests of a memory line priced as a range share (throughput_test's FSDP races,
// train_fashion_mnist_memory_test's ZeRO-3): "X to Y MiB (...; the high adds: <a racing
// buffer> (...) R MiB ...), measured within that range" (samples/support/trainer_moments.h,
// mlp_memory_report.h). The range must be exactly the named buffer, and the measured peak
// within 5 % of it: a range widened to fit fails.
#pragma once

#include <string>

#include "catch_compat.h"

namespace mg::testing {

// `line`: one rank's line from "memory: peak " on; `key`: the text before the low figure;
// `racing`: the racing term's name as printed (its figure follows the next ") ");
// `racing_bytes`: its bytes as the formula has them.
inline void check_range_line(const std::string& line, const std::string& key, const std::string& racing,
                             double racing_bytes) {
  INFO(line);
  const size_t peak = line.find("memory: peak ");
  REQUIRE(peak != std::string::npos);
  const double measured = std::stod(line.substr(peak + 13));
  const size_t at = line.find(key);
  REQUIRE(at != std::string::npos);
  const double low = std::stod(line.substr(at + key.size()));
  const double high = std::stod(line.substr(line.find(" to ", at) + 4));
  const size_t adds = line.find("the high adds: " + racing);
  REQUIRE(adds != std::string::npos);
  const double printed = std::stod(line.substr(line.find(") ", adds) + 2));
  CHECK(printed == Approx(racing_bytes / 1048576).margin(0.005));
  CHECK(high - low == Approx(printed).margin(0.011));  // each printed to 0.01 MiB
  CHECK(measured >= 0.95 * low);
  CHECK(measured <= 1.05 * high);
  CHECK_THAT(line, MG_CONTAINS("measured within that range"));
}

}  // namespace mg::testing
