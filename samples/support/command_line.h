// The command line of the sample programs: parsing with CLI11, validators whose messages
// say what is wanted, and one way of reporting a bad flag, whatever found it:
//
//   <program>: error: <what is wrong>
//   Run with --help for more information.
//
// and exit code 2 (kExitBadOption), as getopt-style tools do. Any other failure prints
// "<program>: error: ..." and exits with 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <minigrad/core/error.h>

namespace mg::samples {

inline constexpr int kExitBadOption = 2;

// A flag value that parsing alone could not refuse (a GPU id that this machine does not
// have, say): reported as a bad flag.
class OptionError : public Error {
 public:
  explicit OptionError(const std::string& message) : Error(message) {}
};

// An error that report_error has already printed: reporting it again prints nothing and
// returns its exit code (for a rank that must say why before the others leave).
class ReportedError : public Error {
 public:
  explicit ReportedError(int exit_code) : Error("(already reported)"), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Parses argv with `app`. Returns the exit code when the program should stop here
// (--help: 0, after printing it; a bad flag: kExitBadOption, after reporting it), or
// std::nullopt when it should run. An option of one value given twice takes the last
// (take_last_value), as torchrun's and nanoGPT's users expect when they override a
// script's flags by appending their own.
std::optional<int> parse_command_line(CLI::App& app, const std::string& program, int argc,
                                      char** argv);

// Makes every option of `app` (and of its subcommands) that takes one value take the last
// of several occurrences (`--iters 100000 ... --iters 2` is 2), where CLI11 refuses them
// ("At Most 1 required but received 2"). Options of several values keep them all.
void take_last_value(CLI::App& app);

// Reports `e` as "<program>: error: ..." on stderr (stdout flushed first, so the lines
// come out in order) and returns the exit code: kExitBadOption for an OptionError, else 1
// (a ReportedError: its own code, and nothing printed).
int report_error(const std::string& program, const std::exception& e);

// ---- numbers: the one checked path of every program's flags (samples and bench alike) ----
//
// The whole text must be the number (no trailing garbage, no leading space, no "0x"), an
// integer must lie in [low, high] and a number must be finite (no nan, no inf) and lie in
// [low, high]. Otherwise an OptionError "<flag> expects ..., got '<text>'", where a text
// longer than 40 characters is cut short, so that no message grows with the input.
int64_t parse_integer(std::string_view flag, std::string_view text, int64_t low, int64_t high);
double parse_number(std::string_view flag, std::string_view text, double low, double high);
// Seconds to wait: a finite number >= 0, at most a year (a longer wait is a mistake, and
// durations built from it must not overflow).
inline constexpr double kMaxSeconds = 365.0 * 24 * 3600;
double parse_seconds(std::string_view flag, std::string_view text);
// A comma-separated list of integers in [low, high], each checked as parse_integer does;
// at most `max_items` of them (checked before any is stored).
std::vector<int64_t> parse_integer_list(std::string_view flag, std::string_view text,
                                        int64_t low, int64_t high, std::size_t max_items);

// Validators for CLI11 that check through the functions above (CLI11's own PositiveNumber
// prints its range as 0 to 1.8e308 and calls "abc" out of range). The message names the
// option, as CLI11 prefixes it.
CLI::Validator integer_in(int64_t low, int64_t high);
CLI::Validator number_in(double low, double high);
CLI::Validator positive_integer();      // [1, 2^63 - 1]; the option's type bounds it further
CLI::Validator non_negative_integer();  // [0, 2^63 - 1]
CLI::Validator non_negative_number();   // finite, >= 0
CLI::Validator seconds();               // finite, in [0, kMaxSeconds]

}  // namespace mg::samples
