// What the tests of train_gpt's splits share (train_gpt_split_test, train_gpt_pipeline_test,
// train_gpt_checkpoint_test, train_gpt_llama_test): a tiny corpus, the losses of a --metrics
// CSV, the sample a run printed, and two checkpoints' dicts compared (checkpoint_compare.h).
#pragma once

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_compare.h"
#include "temp_dir.h"

namespace mg::testing {

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A few "fortunes" under `dir`/fortunes (a vocabulary of 34, even for tp 2); returns the folder.
inline std::string make_fortunes(const TempDir& dir) {
  const std::string root = dir / "fortunes";
  std::filesystem::create_directories(root);
  std::string text;
  for (int i = 0; i < 60; ++i)
    text += "A fortune a day keeps the doctor away, said number " + std::to_string(i) + ".\n%\n";
  std::ofstream(root + "/wisdom", std::ios::binary) << text;
  return root;
}

// train_loss, val_loss of every row of a --metrics CSV.
inline std::vector<double> metrics_losses(const std::string& path) {
  std::vector<double> values;
  std::istringstream csv(read_text(path));
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line)) {
    double train = 0, val = 0;
    if (std::sscanf(line.c_str(), "%*d,%lf,%lf", &train, &val) == 2) values.insert(values.end(), {train, val});
  }
  return values;
}

// The sample's text, as printed after the "---- a sample" line. Under minigrad-run, rank
// 0's lines alone, their prefix removed: another rank's whole line may come between them.
inline std::string sample_of(const std::string& output) {
  const size_t at = output.find("---- a sample");
  if (at == std::string::npos) return "";
  const std::string text = output.substr(output.find('\n', at) + 1);
  const bool launched = output.compare(at < 9 ? 0 : at - 9, 9, "[rank 0] ") == 0;
  if (!launched) return text;
  std::string rank_0;
  for (size_t line = 0, end; line < text.size(); line = end + 1) {
    end = std::min(text.find('\n', line), text.size());
    if (text.compare(line, 9, "[rank 0] ") == 0) rank_0 += text.substr(line + 9, end + 1 - line - 9);
  }
  return rank_0;
}

}  // namespace mg::testing
