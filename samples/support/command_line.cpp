#include "command_line.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <limits>
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

void take_last_value(CLI::App& app) {
  for (CLI::Option* option : app.get_options())
    if (option->get_items_expected_max() == 1 &&
        option->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw)
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) take_last_value(*sub);
}

std::optional<int> parse_command_line(CLI::App& app, const std::string& program, int argc,
                                      char** argv) {
  take_last_value(app);
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
  if (const auto* reported = dynamic_cast<const ReportedError*>(&e)) return reported->exit_code();
  if (dynamic_cast<const OptionError*>(&e) != nullptr) {
    print_bad_option(program, e.what());
    return kExitBadOption;
  }
  std::fflush(stdout);
  fmt::print(stderr, "{}: error: {}\n", program, e.what());
  return 1;
}

namespace {

// The text as a message shows it: at most 40 characters.
std::string shown(std::string_view text) {
  constexpr std::size_t kMax = 40;
  if (text.size() <= kMax) return std::string(text);
  return fmt::format("{}... ({} characters)", text.substr(0, kMax), text.size());
}

std::string integer_range(int64_t low, int64_t high) {
  if (high == std::numeric_limits<int64_t>::max()) return fmt::format("an integer >= {}", low);
  return fmt::format("an integer in [{}, {}]", low, high);
}

std::string number_range(double low, double high) {
  if (high == std::numeric_limits<double>::max())
    return fmt::format("a finite number >= {:g}", low);
  return fmt::format("a number in [{:g}, {:g}]", low, high);
}

}  // namespace

int64_t parse_integer(std::string_view flag, std::string_view text, int64_t low, int64_t high) {
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(copy.c_str(), &end, 10);
  const bool digits_only = !copy.empty() && (std::isdigit(static_cast<unsigned char>(copy[0])) ||
                                             ((copy[0] == '-' || copy[0] == '+') &&
                                              copy.size() > 1));
  if (!digits_only || *end != '\0' || errno != 0 || v < low || v > high)
    throw OptionError(fmt::format("{} expects {}, got '{}'", flag, integer_range(low, high),
                                  shown(text)));
  return static_cast<int64_t>(v);
}

double parse_number(std::string_view flag, std::string_view text, double low, double high) {
  const std::string copy(text);
  char* end = nullptr;
  const double v = std::strtod(copy.c_str(), &end);
  const bool starts_well =
      !copy.empty() && !std::isspace(static_cast<unsigned char>(copy[0]));
  if (!starts_well || *end != '\0' || !std::isfinite(v) || v < low || v > high)
    throw OptionError(fmt::format("{} expects {}, got '{}'", flag, number_range(low, high),
                                  shown(text)));
  return v;
}

double parse_seconds(std::string_view flag, std::string_view text) {
  return parse_number(flag, text, 0.0, kMaxSeconds);
}

std::vector<int64_t> parse_integer_list(std::string_view flag, std::string_view text,
                                        int64_t low, int64_t high, std::size_t max_items) {
  const std::size_t items = static_cast<std::size_t>(std::count(text.begin(), text.end(), ',')) + 1;
  if (items > max_items)
    throw OptionError(fmt::format("{} takes at most {} comma-separated values, got {}", flag,
                                  max_items, items));
  std::vector<int64_t> out;
  out.reserve(items);
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    out.push_back(parse_integer(flag, text.substr(start, comma == std::string_view::npos
                                                            ? std::string_view::npos
                                                            : comma - start),
                                low, high));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// CLI11 prefixes a validator's message with the option's name; the message itself is ours
// without the flag, which parse_* put first.
CLI::Validator integer_in(int64_t low, int64_t high) {
  return CLI::Validator(
      [low, high](std::string& value) -> std::string {
        try {
          (void)parse_integer("", value, low, high);
        } catch (const OptionError& e) {
          return std::string(e.what()).substr(1);  // "expects ..." without the empty flag
        }
        return {};
      },
      "INT");
}

CLI::Validator number_in(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& value) -> std::string {
        try {
          (void)parse_number("", value, low, high);
        } catch (const OptionError& e) {
          return std::string(e.what()).substr(1);
        }
        return {};
      },
      "NUMBER");
}

CLI::Validator positive_integer() {
  return integer_in(1, std::numeric_limits<int64_t>::max()).description("INT>0");
}

CLI::Validator non_negative_integer() {
  return integer_in(0, std::numeric_limits<int64_t>::max()).description("UINT");
}

CLI::Validator non_negative_number() {
  return number_in(0, std::numeric_limits<double>::max()).description("FLOAT>=0");
}

CLI::Validator seconds() { return number_in(0, kMaxSeconds).description("SECONDS"); }

}  // namespace mg::samples
