// docs/parity.md is written by a run of the parity table (tests/parity); here it is checked
// against the table itself (tests/parity/table.h), without running it: the page must list
// exactly the table's rows, each passing. The errors it shows are a machine's run, so
// only their form is checked (a number), not their values.
#include "catch_compat.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "parity/table.h"

namespace {

std::vector<std::string> split_cells(const std::string& rest) {
  // " 3.1e-06 | pass | faults |" -> {"3.1e-06", "pass", "faults"}
  std::vector<std::string> cells;
  std::stringstream in(rest);
  for (std::string cell; std::getline(in, cell, '|');) {
    const size_t first = cell.find_first_not_of(' ');
    const size_t last = cell.find_last_not_of(' ');
    if (first != std::string::npos) cells.push_back(cell.substr(first, last - first + 1));
  }
  return cells;
}

}  // namespace

TEST_CASE("repository: docs/parity.md lists exactly the parity table's rows, each passing "
          "(rewrite it with build/bin/test_parity \"[write-docs]\")") {
  std::ifstream file(std::string(MINIGRAD_SOURCE_DIR) + "/docs/parity.md");
  REQUIRE(file.good());
  // The page's rows: every line of the table but its header and separator.
  std::vector<std::string> lines;
  bool in_table = false;
  for (std::string line; std::getline(file, line);) {
    if (line.rfind("| model |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table || line.rfind("|---", 0) == 0) continue;
    if (line.rfind("| ", 0) != 0) break;
    lines.push_back(line);
  }
  const std::vector<mg::parity::Config> table = mg::parity::parity_table();
  std::vector<std::string> problems;
  std::vector<bool> used(lines.size(), false);
  for (const mg::parity::Config& c : table) {
    const std::string key = mg::parity::doc_key(c);
    size_t found = lines.size();
    for (size_t i = 0; i < lines.size(); ++i)
      if (!used[i] && lines[i].rfind(key, 0) == 0) found = i;
    if (found == lines.size()) {
      problems.push_back("missing: " + key);
      continue;
    }
    used[found] = true;
    const std::vector<std::string> cells = split_cells(lines[found].substr(key.size()));
    if (cells.size() < 2) {
      problems.push_back("no error and result: " + lines[found]);
      continue;
    }
    char* end = nullptr;
    const double error = std::strtod(cells[0].c_str(), &end);
    if (end == cells[0].c_str() || *end != '\0' || !std::isfinite(error))
      problems.push_back("the largest error is not a number: " + lines[found]);
    if (cells[1] != "pass") problems.push_back("not passing: " + lines[found]);
  }
  for (size_t i = 0; i < lines.size(); ++i)
    if (!used[i]) problems.push_back("not a row of tests/parity/table.h: " + lines[i]);
  std::string all;
  for (const std::string& p : problems) all += "\n  " + p;
  INFO("docs/parity.md has " << lines.size() << " rows, the table " << table.size() << ":" << all);
  CHECK(problems.empty());
}
