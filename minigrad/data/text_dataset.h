// Text for a language model: a corpus read from plain-text files, and the windows a
// GPT trains on, as nanoGPT's get_batch: a window of block_size + 1 tokens starting
// anywhere gives the input x = tokens[i, i + T) and the target y = tokens[i + 1, i + T + 1)
// (each position predicts the next token). The tokens are split by position, the first
// 90% for training and the rest for validation, so the two never share a window.
//
//   auto corpus = data::read_fortunes();                       // Debian's `fortunes`
//   auto tokenizer = data::CharTokenizer::from_text(corpus);
//   auto split = data::split_tokens(tokenizer.encode(corpus), block_size);
//   data::Batch b = split.train->get_batch(data::random_windows(12, split.train->size(), seed, step));
//   // b.data: int64 [12, block_size] (x), b.target: int64 [12, block_size] (y)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/data/dataset.h>

namespace mg::data {

// Where Debian's `fortunes` package puts its fortune files (plain text, about 2.5 MB).
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The text of every fortune file in `dir` (the files without an extension; the .dat
// indexes and the .u8 links are left out), in name order, each fortune's "%" separator
// line turned into an empty line. Every file is read through files.h (a regular file,
// never blocking); mg::Error naming the directory when it has no fortune files.
std::string read_fortunes(const std::string& dir = kFortunesDir);

// The windows of a run of tokens: example i is (x, y) = (tokens[i, i + T),
// tokens[i + 1, i + T + 1)), int64 [T] each, for i in [0, size()), size() = length - T.
class TokenWindows : public Dataset {
 public:
  // tokens[begin, end) of a shared token array; mg::Error unless it holds at least
  // block_size + 1 tokens (one window).
  TokenWindows(std::shared_ptr<const std::vector<uint8_t>> tokens, int64_t begin, int64_t end,
               int64_t block_size, std::string name = "TokenWindows");

  int64_t size() const override { return end_ - begin_ - block_size_; }
  Example get(int64_t index) const override;
  // x [B, T] and y [B, T], int64 on the CPU, filled straight from the tokens.
  Batch get_batch(const std::vector<int64_t>& starts) const override;

  int64_t block_size() const { return block_size_; }
  int64_t token_count() const { return end_ - begin_; }

 private:
  std::shared_ptr<const std::vector<uint8_t>> tokens_;
  int64_t begin_, end_, block_size_;
  std::string name_;
};

struct TokenSplits {
  std::shared_ptr<TokenWindows> train, val;
};

// The first `train_fraction` of the tokens (rounded down) for training, the rest for
// validation; mg::Error naming the sizes when either part is shorter than one window.
TokenSplits split_tokens(std::vector<uint8_t> tokens, int64_t block_size,
                         double train_fraction = 0.9);

// `count` window starts in [0, windows), drawn with replacement (as nanoGPT's
// torch.randint) from Philox keyed by `seed`; `step` selects its own stream, so step s of
// a resumed run draws what step s of the first run drew.
std::vector<int64_t> random_windows(int64_t count, int64_t windows, uint64_t seed, int64_t step);

}  // namespace mg::data
