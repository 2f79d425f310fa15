#include "command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace mg::samples {

namespace {

void print_bad_option(const std::string& program, const std::string& what) {
  std::fflush(stdout);
  fmt::print(stderr, "{}: error: {}\nRun with --help for more information.\n", program, what);
}

}  // namespace

std::optional<int> parse_command_line(CLI::App& app, const std::string& program, int argc,
                                      char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help: printed by CLI11, exit code 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_bad_option(program, e.what());
    return kExitBadOption;
  }
  return std::nullopt;
}

int report_error(const std::string& program, const std::exception& e) {
  if (dynamic_cast<const OptionError*>(&e) != nullptr) {
    print_bad_option(program, e.what());
    return kExitBadOption;
  }
  std::fflush(stdout);
  fmt::print(stderr, "{}: error: {}\n", program, e.what());
  return 1;
}

CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0 || v <= 0)
          return fmt::format("must be a positive integer, got '{}'", value);
        return {};
      },
      "INT>0");
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        errno = 0;
        (void)std::strtoull(value.c_str(), &end, 10);
        if (value.empty() || value[0] == '-' || *end != '\0' || errno != 0)
          return fmt::format("must be an integer >= 0, got '{}'", value);
        return {};
      },
      "UINT");
}

CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !std::isfinite(v) || v < 0)
          return fmt::format("must be a number >= 0, got '{}'", value);
        return {};
      },
      "FLOAT>=0");
}

}  // namespace mg::samples
