#include <minigrad/data/char_tokenizer.h>

#include <minigrad/core/error.h>

namespace mg::data {

namespace {

// "'a' (0x61)", or "0x07" for a byte that does not print.
std::string byte_str(uint8_t b) {
  if (b >= 0x20 && b < 0x7F) return fmt::format("'{}' (0x{:02X})", static_cast<char>(b), b);
  return fmt::format("0x{:02X}", b);
}

}  // namespace

CharTokenizer CharTokenizer::from_text(std::string_view text) {
  MG_CHECK(!text.empty(), "CharTokenizer::from_text: the text is empty, so there is no vocabulary");
  std::array<bool, 256> seen{};
  for (const char c : text) seen[static_cast<uint8_t>(c)] = true;
  std::vector<uint8_t> vocab;
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<size_t>(b)]) vocab.push_back(static_cast<uint8_t>(b));
  return CharTokenizer(std::move(vocab));
}

CharTokenizer::CharTokenizer(std::vector<uint8_t> vocab, const std::string& source)
    : vocab_(std::move(vocab)) {
  MG_CHECK(!vocab_.empty() && vocab_.size() <= 256,
           "{}: a vocabulary has 1 to 256 characters, got {}", source, vocab_.size());
  token_of_.fill(-1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    MG_CHECK(i == 0 || vocab_[i] > vocab_[i - 1],
             "{}: the vocabulary must be sorted without repeats, but entry {} is {} after {}",
             source, i, byte_str(vocab_[i]), byte_str(vocab_[i - 1]));
    token_of_[vocab_[i]] = static_cast<int16_t>(i);
  }
}

std::vector<uint8_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<uint8_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    const int16_t token = token_of_[b];
    MG_CHECK(token >= 0, "CharTokenizer::encode: the character {} at offset {} is not in the "
                         "vocabulary of {} characters", byte_str(b), i, vocab_.size());
    out[i] = static_cast<uint8_t>(token);
  }
  return out;
}

std::string CharTokenizer::decode(const std::vector<int64_t>& tokens) const {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    MG_CHECK(t >= 0 && t < vocab_size(),
             "CharTokenizer::decode: token {} at position {} is outside the vocabulary [0, {})",
             t, i, vocab_.size());
    out[i] = static_cast<char>(vocab_[static_cast<size_t>(t)]);
  }
  return out;
}

}  // namespace mg::data
