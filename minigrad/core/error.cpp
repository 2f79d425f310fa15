#include <minigrad/core/error.h>

namespace mg::detail {

// The source location is kept out of the message itself: users read what went wrong;
// MG_DEBUG_LOCATION=1 appends where, for developers chasing a failure.
[[noreturn]] void throw_error(const char* file, int line, const std::string& message) {
  static const bool with_location = [] {
    const char* v = std::getenv("MG_DEBUG_LOCATION");
    return v != nullptr && v[0] == '1';
  }();
  if (with_location) throw Error(fmt::format("{} ({}:{})", message, file, line));
  throw Error(message);
}

}  // namespace mg::detail
