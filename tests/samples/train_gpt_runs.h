// What the tests of train_gpt's splits share (train_gpt_split_test, train_gpt_pipeline_test,
// train_gpt_checkpoint_test): a tiny corpus, the losses of a --metrics CSV, and the sample a
// run printed.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// The sample's text, as printed after the "---- a sample" line (rank 0's, prefix removed).
inline std::string sample_of(const std::string& output) {
  const size_t at = output.find("---- a sample");
  if (at == std::string::npos) return "";
  std::string text = output.substr(output.find('\n', at) + 1);
  for (size_t p; (p = text.find("[rank 0] ")) != std::string::npos;) text.erase(p, 9);
  return text;
}

}  // namespace mg::testing
