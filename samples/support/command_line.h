// The command line of the sample programs: parsing with CLI11, validators whose messages
// say what is wanted, and one way of reporting a bad flag, whatever found it:
//
//   <program>: error: <what is wrong>
//   Run with --help for more information.
//
// and exit code 2 (kExitBadOption), as getopt-style tools do. Any other failure prints
// "<program>: error: ..." and exits with 1.
#pragma once

#include <optional>
#include <string>

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

// Parses argv with `app`. Returns the exit code when the program should stop here
// (--help: 0, after printing it; a bad flag: kExitBadOption, after reporting it), or
// std::nullopt when it should run.
std::optional<int> parse_command_line(CLI::App& app, const std::string& program, int argc,
                                      char** argv);

// Reports `e` as "<program>: error: ..." on stderr (stdout flushed first, so the lines
// come out in order) and returns the exit code: kExitBadOption for an OptionError, else 1.
int report_error(const std::string& program, const std::exception& e);

// Validators for CLI11 (whose PositiveNumber prints its range as 0 to 1.8e308 and calls
// "abc" out of range).
CLI::Validator positive_integer();
CLI::Validator non_negative_integer();
CLI::Validator non_negative_number();

}  // namespace mg::samples
