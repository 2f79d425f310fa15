// Token files: a text encoded once (char_tokenizer.h) and read back by every run. Every
// number is little-endian:
//
//   offset  0   8 bytes   magic "MGTOKENS"
//   offset  8   uint32    format version (1)
//   offset 12   uint32    vocab_size, 1 to 256
//   offset 16   uint64    token_count
//   offset 24   vocab_size bytes: the character of each token, strictly increasing
//   then        token_count bytes: the tokens, each < vocab_size
//
// and nothing after them. As the IDX reader (idx.h), the reader is written for hostile
// files: it refuses anything but a regular file without blocking on it (files.h), reads
// the header first, checks that the sizes it declares are exactly the file's size
// (overflow-checked) before it allocates or reads a byte more, and names the file and the
// fault in every mg::Error. The fuzz harness calls parse_token_file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/data/char_tokenizer.h>

namespace mg::data {

inline constexpr std::size_t kTokenFileHeaderBytes = 24;

struct TokenFile {
  CharTokenizer tokenizer;
  std::vector<uint8_t> tokens;
};

// Parses the bytes of a token file; `name` (its path) begins every error message.
TokenFile parse_token_file(const uint8_t* bytes, std::size_t size, const std::string& name);

// Reads and parses the token file at `path`.
TokenFile read_token_file(const std::string& path);

// Writes a token file with files::write_atomically; tokens outside the tokenizer's
// vocabulary are an mg::Error.
void write_token_file(const std::string& path, const CharTokenizer& tokenizer,
                      const std::vector<uint8_t>& tokens);

}  // namespace mg::data
