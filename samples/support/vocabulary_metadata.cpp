#include "vocabulary_metadata.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/error.h>

namespace mg::samples {

namespace {

std::string character_name(uint8_t c) {
  if (c == '\n') return "\\n";
  if (c == ' ') return "space";
  if (c == '\t') return "\\t";
  if (std::isprint(c)) return std::string(1, static_cast<char>(c));
  return fmt::format("\\x{:02x}", c);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string vocabulary_metadata(const data::CharTokenizer& tokenizer) {
  std::string out;
  for (uint8_t c : tokenizer.vocab()) out += fmt::format("{:02x}", c);
  return out;
}

data::CharTokenizer tokenizer_from_metadata(const std::string& value, const std::string& source) {
  MG_CHECK(!value.empty() && value.size() % 2 == 0 && value.size() <= 512,
           "{}: the checkpoint's vocabulary ('{}' in its metadata) is {} hex digits; expected "
           "2 per character, 1 to 256 characters",
           source, kVocabularyKey, value.size());
  std::vector<uint8_t> vocab;
  for (size_t i = 0; i < value.size(); i += 2) {
    const int high = hex_digit(value[i]), low = hex_digit(value[i + 1]);
    MG_CHECK(high >= 0 && low >= 0,
             "{}: the checkpoint's vocabulary ('{}' in its metadata) has '{}' at offset {}, "
             "not a hex digit pair",
             source, kVocabularyKey, value.substr(i, 2), i);
    vocab.push_back(static_cast<uint8_t>(high * 16 + low));
  }
  // CharTokenizer checks the order (strictly increasing) and names the source.
  return data::CharTokenizer(std::move(vocab), source + ": the checkpoint's vocabulary");
}

std::string describe_vocabulary(const data::CharTokenizer& tokenizer) {
  const std::vector<uint8_t>& v = tokenizer.vocab();
  std::string shown;
  const size_t limit = 12;
  for (size_t i = 0; i < std::min(v.size(), limit); ++i) shown += (i ? ", " : "") + character_name(v[i]);
  if (v.size() > limit) shown += ", ...";
  return fmt::format("{} character{}: {}", v.size(), v.size() == 1 ? "" : "s", shown);
}

void check_same_vocabulary(const data::CharTokenizer& checkpoint, const data::CharTokenizer& corpus,
                           const std::string& source) {
  if (checkpoint.vocab() == corpus.vocab()) return;
  const std::vector<uint8_t>& a = checkpoint.vocab();
  const std::vector<uint8_t>& b = corpus.vocab();
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  const std::string where =
      k < a.size() && k < b.size()
          ? fmt::format("token {} is {} in the checkpoint, {} in the corpus", k, character_name(a[k]),
                        character_name(b[k]))
          : fmt::format("the {} has {} more", a.size() > b.size() ? "checkpoint" : "corpus",
                        a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
  MG_FAIL("{}: the checkpoint's vocabulary ({}) is not the corpus's ({}): {}, so its token ids "
          "would stand for other characters. Resume on the text it was trained on (--data-dir, "
          "--tokens), or sample from it alone with --sample-only",
          source, describe_vocabulary(checkpoint), describe_vocabulary(corpus), where);
}

}  // namespace mg::samples
