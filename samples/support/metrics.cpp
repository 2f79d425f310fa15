#include "metrics.h"

#include <cstdio>
#include <sstream>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::samples {

std::string metrics_csv(const std::vector<EpochMetrics>& history) {
  std::string out = std::string(kMetricsHeader) + "\n";
  for (const EpochMetrics& m : history)
    out += fmt::format("{},{:.6f},{:.6f},{:.4f},{:.2f}\n", m.epoch, m.train_loss, m.test_loss,
                       m.test_accuracy, m.seconds);
  return out;
}

std::vector<EpochMetrics> parse_metrics_csv(const std::string& text, const std::string& source) {
  std::vector<EpochMetrics> history;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    if (number == 1) {
      MG_CHECK(line == kMetricsHeader, "{}: line 1 is '{}', expected the header '{}'", source,
               line, kMetricsHeader);
      continue;
    }
    if (line.empty()) continue;
    EpochMetrics m;
    char tail = 0;
    const int fields = std::sscanf(line.c_str(), "%d,%lf,%lf,%lf,%lf%c", &m.epoch, &m.train_loss,
                                   &m.test_loss, &m.test_accuracy, &m.seconds, &tail);
    MG_CHECK(fields == 5, "{}: line {} ('{}') is not epoch,train_loss,test_loss,test_accuracy,"
                          "seconds",
             source, number, line);
    history.push_back(m);
  }
  return history;
}

}  // namespace mg::samples
