#include <minigrad/parallel/c10d/bucketing.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::parallel {

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(
    const std::vector<Tensor>& params, size_t first_bucket_bytes, size_t bucket_bytes) {
  struct Open {
    DType dtype;
    std::vector<size_t> params;
    size_t bytes = 0;
  };
  std::vector<Open> open;
  std::vector<std::vector<size_t>> closed;
  auto close = [&](Open& o) {
    closed.push_back(std::move(o.params));
    o.params.clear();
    o.bytes = 0;
  };
  for (size_t k = params.size(); k-- > 0;) {
    const Tensor& p = params[k];
    auto it = std::find_if(open.begin(), open.end(), [&](const Open& o) { return o.dtype == p.dtype(); });
    if (it == open.end()) {
      open.push_back(Open{p.dtype(), {}, 0});
      it = open.end() - 1;
    }
    it->params.push_back(k);
    it->bytes += p.nbytes();
    const size_t limit = closed.empty() ? first_bucket_bytes : bucket_bytes;
    if (it->bytes >= limit) close(*it);
  }
  for (Open& o : open)
    if (!o.params.empty()) close(o);
  return closed;
}

size_t bucket_bytes_from_mib(double mib, const char* who, const char* option) {
  MG_CHECK(std::isfinite(mib) && mib > 0.0, "{}: {} must be positive, got {}", who, option, mib);
  return std::max<size_t>(1, static_cast<size_t>(mib * 1024.0 * 1024.0));
}

std::string quoted_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 10; ++i)
    out += (out.empty() ? "'" : ", '") + names[i] + "'";
  if (names.size() > 10) out += fmt::format(" and {} more", names.size() - 10);
  return out;
}

}  // namespace mg::parallel
