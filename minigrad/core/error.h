// mg::Error and MG_CHECK: every user-facing failure in minigrad is an mg::Error whose
// message names the operation and the shapes, dtypes, devices or file involved.
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace mg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace mg

// MG_CHECK(cond, "fmt string", args...): throws mg::Error with the formatted message.
// The message is built only when the check fails, so checks are cheap on hot paths.
#define MG_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) ::mg::detail::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define MG_FAIL(...) ::mg::detail::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
