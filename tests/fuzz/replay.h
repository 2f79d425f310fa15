// The inputs the regular suite replays through a fuzz target (fuzz_targets.h): the seed
// corpus (tests/fuzz/corpus/<target>/) and every input that once crashed it
// (tests/fuzz/regressions/<target>/), in name order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace mg::fuzz {

inline std::vector<std::string> replay_inputs(const std::string& target) {
  std::vector<std::string> paths;
  for (const char* kind : {"corpus", "regressions"}) {
    const std::filesystem::path dir =
        std::filesystem::path(MINIGRAD_SOURCE_DIR) / "tests" / "fuzz" / kind / target;
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.is_regular_file() && entry.path().filename().string()[0] != '.')
        paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace mg::fuzz
