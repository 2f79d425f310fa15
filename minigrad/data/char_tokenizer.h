// A character-level tokenizer, as nanoGPT's shakespeare_char: the vocabulary is the
// sorted set of the characters of a text, and a token is a character's index in it.
// A character here is a byte (the corpora are ASCII with a few UTF-8 sequences, which
// become a few tokens each and decode back to the same bytes): at most 256 tokens, one
// byte each in a token file (token_file.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mg::data {

class CharTokenizer {
 public:
  // The distinct bytes of `text`, sorted (an empty text is an mg::Error: no vocabulary).
  static CharTokenizer from_text(std::string_view text);
  // `vocab[i]` is the byte token i stands for: 1 to 256 bytes, strictly increasing
  // (mg::Error naming `source` otherwise).
  explicit CharTokenizer(std::vector<uint8_t> vocab, const std::string& source = "CharTokenizer");

  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::vector<uint8_t>& vocab() const { return vocab_; }

  // The tokens of `text`; a byte outside the vocabulary is an mg::Error naming it and
  // its offset.
  std::vector<uint8_t> encode(std::string_view text) const;
  // The text of `tokens`; a token outside [0, vocab_size) is an mg::Error.
  std::string decode(const std::vector<int64_t>& tokens) const;

 private:
  std::vector<uint8_t> vocab_;
  std::array<int16_t, 256> token_of_{};  // -1: the byte is not in the vocabulary
};

}  // namespace mg::data
