#include <minigrad/data/text_dataset.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <minigrad/core/error.h>
#include <minigrad/core/files.h>
#include <minigrad/core/philox.h>

namespace mg::data {

// ---------------------------------------------------------------- the corpus

namespace {

// A fortune file's text with each "%" line (the separator between fortunes) made empty.
void append_fortunes(std::string& out, const std::string& text) {
  size_t line = 0;
  while (line < text.size()) {
    size_t end = text.find('\n', line);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string_view l(text.data() + line, end - line);
    if (l == "%\n" || l == "%") {
      out.push_back('\n');
    } else {
      out.append(l);
    }
    line = end;
  }
}

}  // namespace

std::string read_fortunes(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find('.') != std::string::npos) continue;  // the .dat indexes, the .u8 links
    if (!it->is_regular_file(ec)) continue;
    names.push_back(name);
  }
  MG_CHECK(!ec, "read_fortunes: cannot list {}: {} (Debian's `fortunes` package installs the "
                "fortune files in {})", dir, ec.message(), kFortunesDir);
  MG_CHECK(!names.empty(), "read_fortunes: {} has no fortune files (Debian's `fortunes` package "
                           "installs them in {})", dir, kFortunesDir);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& name : names) {
    const std::string path = (fs::path(dir) / name).string();
    files::OpenedFile file = files::open_for_reading("read_fortunes", path);
    MG_CHECK(file.size <= (uint64_t{1} << 30),
             "read_fortunes: {} has {} bytes, more than the 1 GiB a fortune file may have", path,
             file.size);
    std::string text(static_cast<size_t>(file.size), '\0');
    files::read_exactly("read_fortunes", path, file.fd.get(), 0, text.data(), text.size());
    append_fortunes(out, text);
  }
  return out;
}

// ---------------------------------------------------------------- windows

TokenWindows::TokenWindows(std::shared_ptr<const std::vector<uint8_t>> tokens, int64_t begin,
                           int64_t end, int64_t block_size, std::string name)
    : tokens_(std::move(tokens)),
      begin_(begin),
      end_(end),
      block_size_(block_size),
      name_(std::move(name)) {
  MG_CHECK(tokens_ != nullptr, "{}: no tokens", name_);
  MG_CHECK(block_size >= 1, "{}: block_size must be positive, got {}", name_, block_size);
  const auto total = static_cast<int64_t>(tokens_->size());
  MG_CHECK(begin >= 0 && begin <= end && end <= total,
           "{}: tokens [{}, {}) are not within the {} tokens", name_, begin, end, total);
  // end - begin > block_size, without the block_size + 1 that overflows for INT64_MAX.
  MG_CHECK(end - begin > block_size,
           "{}: {} tokens are fewer than one window of block_size + 1 = {} tokens", name_,
           end - begin, block_size == INT64_MAX ? std::string("2^63") : std::to_string(block_size + 1));
}

Example TokenWindows::get(int64_t index) const {
  Batch b = get_batch({index});
  return Example{b.data.reshape({block_size_}), b.target.reshape({block_size_})};
}

Batch TokenWindows::get_batch(const std::vector<int64_t>& starts) const {
  const auto batch = static_cast<int64_t>(starts.size());
  Tensor x = empty({batch, block_size_}, DType::Int64);
  Tensor y = empty({batch, block_size_}, DType::Int64);
  int64_t* xs = x.data<int64_t>();
  int64_t* ys = y.data<int64_t>();
  const uint8_t* tokens = tokens_->data() + begin_;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = starts[static_cast<size_t>(b)];
    MG_CHECK(start >= 0 && start < size(), "{}: window {} out of range [0, {})", name_, start,
             size());
    for (int64_t t = 0; t < block_size_; ++t) {
      xs[b * block_size_ + t] = tokens[start + t];
      ys[b * block_size_ + t] = tokens[start + t + 1];
    }
  }
  return Batch{x, y};
}

TokenSplits split_tokens(std::vector<uint8_t> tokens, int64_t block_size, double train_fraction) {
  MG_CHECK(std::isfinite(train_fraction) && train_fraction > 0.0 && train_fraction < 1.0,
           "split_tokens: train_fraction must be in (0, 1), got {}", train_fraction);
  const auto total = static_cast<int64_t>(tokens.size());
  const auto cut = static_cast<int64_t>(std::floor(static_cast<double>(total) * train_fraction));
  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(tokens));
  return TokenSplits{
      std::make_shared<TokenWindows>(shared, 0, cut, block_size, "split_tokens (train)"),
      std::make_shared<TokenWindows>(shared, cut, total, block_size, "split_tokens (val)")};
}

std::vector<int64_t> random_windows(int64_t count, int64_t windows, uint64_t seed, int64_t step) {
  MG_CHECK(count >= 0 && windows >= 1 && step >= 0,
           "random_windows: needs count >= 0, windows >= 1 and step >= 0, got {}, {} and {}",
           count, windows, step);
  std::vector<int64_t> out(static_cast<size_t>(count));
  // Step s draws from blocks s * 2^32 onwards: its own stream.
  uint64_t block = static_cast<uint64_t>(step) << 32;
  const auto bound = static_cast<uint64_t>(windows);
  const uint64_t threshold = (0 - bound) % bound;  // redraw below it: no modulo bias
  for (auto& start : out) {
    uint64_t word = 0;
    do {
      const philox::Uint4 r = philox::philox4x32(seed, block++);
      word = (static_cast<uint64_t>(r.x) << 32) | r.y;
    } while (word < threshold);
    start = static_cast<int64_t>(word % bound);
  }
  return out;
}

}  // namespace mg::data
