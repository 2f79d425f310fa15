#include <minigrad/parallel/c10d/store/run_id.h>

#include <minigrad/core/error.h>

namespace mg::parallel {

void check_run_id(const std::string& run_id, const std::string& origin) {
  MG_CHECK(!run_id.empty() && run_id.size() <= 128,
           "{}: a run id has 1 to 128 characters, got {}", origin, run_id.size());
  for (const char c : run_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    MG_CHECK(ok, "{}: run id '{}' has the character '{}'; a run id is made of letters, digits "
             "and . _ : -",
             origin, run_id, c);
  }
}

}  // namespace mg::parallel
