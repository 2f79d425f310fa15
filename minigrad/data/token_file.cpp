#include <minigrad/data/token_file.h>

#include <cstring>
#include <string_view>

#include <minigrad/core/error.h>
#include <minigrad/core/files.h>

namespace mg::data {

namespace {

constexpr char kMagic[8] = {'M', 'G', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kVersion = 1;

uint32_t read_le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

uint64_t read_le64(const uint8_t* p) {
  return uint64_t{read_le32(p)} | (uint64_t{read_le32(p + 4)} << 32);
}

void append_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// "1 character", "2 characters".
std::string count_str(uint64_t n, const char* noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// What the header says, checked against the file's size.
struct Header {
  uint32_t vocab_size = 0;
  uint64_t token_count = 0;
  uint64_t total = 0;  // header + vocabulary + tokens
};

Header parse_header(const uint8_t* bytes, uint64_t available, uint64_t file_size,
                    const std::string& name) {
  MG_CHECK(available >= kTokenFileHeaderBytes,
           "{}: truncated: a token file starts with a {}-byte header, but the file has {} bytes",
           name, kTokenFileHeaderBytes, file_size);
  MG_CHECK(std::memcmp(bytes, kMagic, sizeof kMagic) == 0,
           "{}: not a token file (it does not start with \"MGTOKENS\")", name);
  const uint32_t version = read_le32(bytes + 8);
  MG_CHECK(version == kVersion, "{}: token file version {}, but this reader knows version {}",
           name, version, kVersion);
  Header h;
  h.vocab_size = read_le32(bytes + 12);
  h.token_count = read_le64(bytes + 16);
  MG_CHECK(h.vocab_size >= 1 && h.vocab_size <= 256,
           "{}: the header declares a vocabulary of {} characters; a token file has 1 to 256",
           name, h.vocab_size);
  const uint64_t declared_vocab = kTokenFileHeaderBytes + h.vocab_size;
  const bool overflow = __builtin_add_overflow(declared_vocab, h.token_count, &h.total);
  MG_CHECK(!overflow && h.total <= file_size,
           "{}: truncated: the header declares {} and {} ({} bytes with the header), but the "
           "file has {} bytes",
           name, count_str(h.vocab_size, "character"), count_str(h.token_count, "token"),
           overflow ? std::string("more than 2^64") : std::to_string(h.total), file_size);
  MG_CHECK(h.total == file_size,
           "{}: {} bytes of trailing data: the header declares {} and {} ({} bytes with the "
           "header), but the file has {} bytes",
           name, file_size - h.total, count_str(h.vocab_size, "character"),
           count_str(h.token_count, "token"), h.total, file_size);
  return h;
}

}  // namespace

TokenFile parse_token_file(const uint8_t* bytes, std::size_t size, const std::string& name) {
  const Header h = parse_header(bytes, size, size, name);
  const uint8_t* vocab = bytes + kTokenFileHeaderBytes;
  CharTokenizer tokenizer(std::vector<uint8_t>(vocab, vocab + h.vocab_size), name);
  const uint8_t* tokens = vocab + h.vocab_size;
  for (uint64_t i = 0; i < h.token_count; ++i)
    MG_CHECK(tokens[i] < h.vocab_size,
             "{}: token {} is {}, outside the vocabulary of {} characters", name, i, tokens[i],
             h.vocab_size);
  return TokenFile{std::move(tokenizer),
                   std::vector<uint8_t>(tokens, tokens + static_cast<std::size_t>(h.token_count))};
}

TokenFile read_token_file(const std::string& path) {
  const char* op = "read_token_file";
  files::OpenedFile file = files::open_for_reading(op, path);
  uint8_t header[kTokenFileHeaderBytes];
  const auto available = std::min<uint64_t>(file.size, kTokenFileHeaderBytes);
  files::read_exactly(op, path, file.fd.get(), 0, header, static_cast<std::size_t>(available));
  // The sizes are checked against the file's size before the rest is read or allocated.
  const Header h = parse_header(header, available, file.size, path);
  MG_CHECK(h.total <= SIZE_MAX, "{}: the file has {} bytes, more than this machine can address",
           path, h.total);
  std::vector<uint8_t> bytes(static_cast<std::size_t>(h.total));
  std::memcpy(bytes.data(), header, kTokenFileHeaderBytes);
  files::read_exactly(op, path, file.fd.get(), kTokenFileHeaderBytes,
                      bytes.data() + kTokenFileHeaderBytes, bytes.size() - kTokenFileHeaderBytes);
  return parse_token_file(bytes.data(), bytes.size(), path);
}

void write_token_file(const std::string& path, const CharTokenizer& tokenizer,
                      const std::vector<uint8_t>& tokens) {
  const std::vector<uint8_t>& vocab = tokenizer.vocab();
  for (std::size_t i = 0; i < tokens.size(); ++i)
    MG_CHECK(tokens[i] < vocab.size(),
             "write_token_file: {}: token {} is {}, outside the vocabulary of {} characters", path,
             i, tokens[i], vocab.size());
  std::string out(kMagic, sizeof kMagic);
  append_le(out, kVersion, 4);
  append_le(out, vocab.size(), 4);
  append_le(out, tokens.size(), 8);
  out.append(reinterpret_cast<const char*>(vocab.data()), vocab.size());
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size());
  files::write_atomically("write_token_file", path, out);
}

}  // namespace mg::data
