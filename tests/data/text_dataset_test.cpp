// The text data of the GPT: the character tokenizer, token files (written, read back, and
// every way a hostile file is refused, naming the file), the fortune corpus, the windows
// (x, y shifted by one), the split by position and the random window starts; the token
// file fuzz target's seeds replayed.
#include "catch_compat.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <minigrad/data/char_tokenizer.h>
#include <minigrad/data/text_dataset.h>
#include <minigrad/data/token_file.h>

#include "fuzz/fuzz_targets.h"
#include "fuzz/replay.h"
#include "special_files.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mg;
using mg::testing::TempDir;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A token file's bytes with any header we like.
std::string token_file_bytes(const std::string& vocab, const std::string& tokens,
                             uint32_t version = 1, int64_t vocab_size = -1, int64_t count = -1) {
  std::string s = "MGTOKENS";
  put_le(s, version, 4);
  put_le(s, vocab_size < 0 ? vocab.size() : static_cast<uint64_t>(vocab_size), 4);
  put_le(s, count < 0 ? tokens.size() : static_cast<uint64_t>(count), 8);
  return s + vocab + tokens;
}

}  // namespace

TEST_CASE("CharTokenizer: the vocabulary is the sorted set of the text's bytes") {
  const std::string text = "hello, world\n";
  const auto tok = data::CharTokenizer::from_text(text);
  CHECK(tok.vocab_size() == 10);  // \n space , d e h l o r w
  CHECK(std::string(tok.vocab().begin(), tok.vocab().end()) == "\n ,dehlorw");
  const std::vector<uint8_t> ids = tok.encode(text);
  CHECK(ids[0] == 5);  // 'h'
  CHECK(ids.back() == 0);
  std::vector<int64_t> wide(ids.begin(), ids.end());
  CHECK(tok.decode(wide) == text);
  // UTF-8 stays bytes, and decodes back to the same bytes.
  const std::string utf8 = "caf\xC3\xA9";
  const auto t2 = data::CharTokenizer::from_text(utf8);
  const auto e = t2.encode(utf8);
  CHECK(t2.decode(std::vector<int64_t>(e.begin(), e.end())) == utf8);

  REQUIRE_THROWS_WITH(tok.encode("hex!"),
                      MG_CONTAINS("CharTokenizer::encode: the character 'x' (0x78) at offset 2 "
                                  "is not in the vocabulary of 10 characters"));
  REQUIRE_THROWS_WITH(tok.decode({1, 10}), MG_CONTAINS("token 10 at position 1 is outside the "
                                                       "vocabulary [0, 10)"));
  REQUIRE_THROWS_WITH(tok.decode({-1}), MG_CONTAINS("token -1 at position 0"));
  REQUIRE_THROWS_WITH(data::CharTokenizer::from_text(""), MG_CONTAINS("the text is empty"));
  REQUIRE_THROWS_WITH(data::CharTokenizer({'b', 'a'}),
                      MG_CONTAINS("the vocabulary must be sorted without repeats, but entry 1 is "
                                  "'a' (0x61) after 'b' (0x62)"));
  REQUIRE_THROWS_WITH(data::CharTokenizer(std::vector<uint8_t>{}),
                      MG_CONTAINS("a vocabulary has 1 to 256 characters, got 0"));
}

TEST_CASE("Token files: written, read back, and every byte of the format as documented") {
  TempDir dir;
  const std::string text = "abracadabra";
  const auto tok = data::CharTokenizer::from_text(text);
  const std::string path = dir / "t.tokens";
  data::write_token_file(path, tok, tok.encode(text));
  const std::string bytes = read_file(path);
  CHECK(bytes == token_file_bytes("abcdr", std::string("\x00\x01\x04\x00\x02\x00\x03\x00\x01\x04\x00", 11)));
  const data::TokenFile back = data::read_token_file(path);
  CHECK(back.tokenizer.vocab() == tok.vocab());
  CHECK(back.tokens == tok.encode(text));
  REQUIRE_THROWS_WITH(data::write_token_file(dir / "bad.tokens", tok, {0, 5}),
                      MG_CONTAINS("write_token_file: " + (dir / "bad.tokens") +
                                  ": token 1 is 5, outside the vocabulary of 5 characters"));
  CHECK_FALSE(fs::exists(dir / "bad.tokens"));
}

TEST_CASE("Token files: hostile files are refused, naming the file, before reading past the header") {
  TempDir dir;
  const auto refused = [&](const std::string& name, const std::string& bytes,
                           const std::string& message) {
    INFO(name);
    const std::string path = dir / name;
    write_file(path, bytes);
    REQUIRE_THROWS_WITH(data::read_token_file(path), MG_CONTAINS(path + ": " + message));
    const auto* raw = reinterpret_cast<const uint8_t*>(bytes.data());
    REQUIRE_THROWS_WITH(data::parse_token_file(raw, bytes.size(), name),
                        MG_CONTAINS(name + ": " + message));
  };
  refused("empty", "", "truncated: a token file starts with a 24-byte header, but the file has 0 bytes");
  refused("short", "MGTOKENS\x01", "truncated: a token file starts with a 24-byte header, but the file has 9 bytes");
  refused("magic", std::string(24, 'x'), "not a token file (it does not start with \"MGTOKENS\")");
  refused("version", token_file_bytes("a", "", 2), "token file version 2, but this reader knows version 1");
  refused("vocab0", token_file_bytes("", "", 1, 0), "the header declares a vocabulary of 0 characters");
  refused("vocab257", token_file_bytes("a", "", 1, 257), "the header declares a vocabulary of 257 characters");
  refused("truncated", token_file_bytes("ab", std::string("\x00\x01", 2), 1, -1, 3),
          "truncated: the header declares 2 characters and 3 tokens (29 bytes with the header), "
          "but the file has 28 bytes");
  refused("liar", token_file_bytes("a", std::string(8, '\0'), 1, -1, INT64_MAX),
          "truncated: the header declares 1 character and 9223372036854775807 tokens (9223372036854775832 "
          "bytes with the header), but the file has 33 bytes");
  {
    // 2^64 - 8 tokens: the declared size itself overflows.
    std::string s = token_file_bytes("a", std::string(8, '\0'));
    for (int i = 16; i < 24; ++i) s[static_cast<size_t>(i)] = '\xFF';
    refused("overflow", s, "truncated: the header declares 1 character and 18446744073709551615 "
                          "tokens (more than 2^64 bytes with the header), but the file has 33 bytes");
  }
  refused("trailing", token_file_bytes("ab", std::string("\x00\x01", 2)) + "zz",
          "2 bytes of trailing data: the header declares 2 characters and 2 tokens (28 bytes "
          "with the header), but the file has 30 bytes");
  refused("range", token_file_bytes("ab", std::string("\x00\x02", 2)),
          "token 1 is 2, outside the vocabulary of 2 characters");
  refused("unsorted", token_file_bytes("ba", std::string("\x00", 1)),
          "the vocabulary must be sorted without repeats, but entry 1 is 'a' (0x61) after 'b' (0x62)");

  // Not a regular file: refused without blocking; a missing one names the path.
  const std::string fifo = dir / "fifo.tokens";
  mg::testing::make_fifo(fifo);
  mg::testing::FifoWatchdog watchdog(fifo, 10.0);
  REQUIRE_THROWS_WITH(data::read_token_file(fifo), MG_CONTAINS(fifo));
  REQUIRE_THROWS_WITH(data::read_token_file(dir.path()), MG_CONTAINS("directory"));
  REQUIRE_THROWS_WITH(data::read_token_file(dir / "missing"), MG_CONTAINS(dir / "missing"));
}

TEST_CASE("read_fortunes: the fortune files in name order, '%' lines made empty") {
  TempDir dir;
  write_file(dir / "b", "second\n%\nthird\n");
  write_file(dir / "a", "first\n%\n");
  write_file(dir / "a.dat", "index bytes");  // fortune's index: left out
  fs::create_symlink("a", dir / "a.u8");      // the UTF-8 alias: left out
  fs::create_directory(dir / "sub");
  CHECK(data::read_fortunes(dir.path()) == "first\n\nsecond\n\nthird\n");
  TempDir empty;
  REQUIRE_THROWS_WITH(data::read_fortunes(empty.path()),
                      MG_CONTAINS("read_fortunes: " + empty.path() + " has no fortune files"));
  REQUIRE_THROWS_WITH(data::read_fortunes(dir / "nowhere"),
                      MG_CONTAINS("read_fortunes: cannot list " + (dir / "nowhere")));
  // A FIFO among the fortune files is not read (nor waited on).
  mg::testing::make_fifo(dir / "c");
  CHECK(data::read_fortunes(dir.path()) == "first\n\nsecond\n\nthird\n");
}

TEST_CASE("TokenWindows: x and y are the window and the window shifted by one, 90/10 split") {
  std::vector<uint8_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>(i);
  const auto split = data::split_tokens(tokens, 4);
  CHECK(split.train->token_count() == 90);
  CHECK(split.val->token_count() == 10);
  CHECK(split.train->size() == 86);  // starts 0..85: the last window ends at token 89
  CHECK(split.val->size() == 6);
  const data::Batch b = split.train->get_batch({0, 85});
  CHECK(b.data.shape() == Shape{2, 4});
  CHECK(b.data.dtype() == DType::Int64);
  CHECK(b.data.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 85, 86, 87, 88});
  CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 86, 87, 88, 89});
  const data::Batch v = split.val->get_batch({5});  // val's last window: tokens 95..99
  CHECK(v.data.to_vector<int64_t>() == std::vector<int64_t>{95, 96, 97, 98});
  CHECK(v.target.to_vector<int64_t>() == std::vector<int64_t>{96, 97, 98, 99});
  const data::Example e = split.val->get(0);
  CHECK(e.data.shape() == Shape{4});
  CHECK(e.target.to_vector<int64_t>() == std::vector<int64_t>{91, 92, 93, 94});

  REQUIRE_THROWS_WITH(split.train->get_batch({86}),
                      MG_CONTAINS("split_tokens (train): window 86 out of range [0, 86)"));
  REQUIRE_THROWS_WITH(split.val->get_batch({-1}), MG_CONTAINS("window -1 out of range [0, 6)"));
  REQUIRE_THROWS_WITH(data::split_tokens(tokens, 10),
                      MG_CONTAINS("split_tokens (val): 10 tokens are fewer than one window of "
                                  "block_size + 1 = 11 tokens"));
  REQUIRE_THROWS_WITH(data::split_tokens(tokens, INT64_MAX),
                      MG_CONTAINS("fewer than one window of block_size + 1 = 2^63 tokens"));
  REQUIRE_THROWS_WITH(data::split_tokens(tokens, 0), MG_CONTAINS("block_size must be positive, got 0"));
  REQUIRE_THROWS_WITH(data::split_tokens(tokens, 4, 1.0),
                      MG_CONTAINS("split_tokens: train_fraction must be in (0, 1), got 1"));
}

TEST_CASE("random_windows: in range, reproducible per (seed, step), different across steps") {
  const auto a = data::random_windows(1000, 7, 42, 3);
  CHECK(a == data::random_windows(1000, 7, 42, 3));
  CHECK(a != data::random_windows(1000, 7, 42, 4));
  CHECK(a != data::random_windows(1000, 7, 43, 3));
  std::set<int64_t> seen(a.begin(), a.end());
  CHECK(seen.size() == 7);  // every start is drawn
  CHECK(*seen.begin() == 0);
  CHECK(*seen.rbegin() == 6);
  CHECK(data::random_windows(0, 7, 1, 0).empty());
  REQUIRE_THROWS_WITH(data::random_windows(3, 0, 1, 0),
                      MG_CONTAINS("random_windows: needs count >= 0, windows >= 1 and step >= 0"));
}

TEST_CASE("Token files: the fortune corpus encodes, writes and reads back") {
  INFO("Debian's fortunes package (scripts/install-deps.sh) installs the corpus in " << data::kFortunesDir);
  REQUIRE(fs::is_directory(data::kFortunesDir));
  const std::string text = data::read_fortunes();
  CHECK(text.size() > 2'000'000);
  const auto tok = data::CharTokenizer::from_text(text);
  CHECK(tok.vocab_size() > 90);
  CHECK(tok.vocab_size() < 140);
  TempDir dir;
  data::write_token_file(dir / "fortunes.tokens", tok, tok.encode(text));
  const data::TokenFile back = data::read_token_file(dir / "fortunes.tokens");
  CHECK(back.tokens.size() == text.size());
  std::vector<int64_t> head(back.tokens.begin(), back.tokens.begin() + 200);
  CHECK(back.tokenizer.decode(head) == text.substr(0, 200));
}

TEST_CASE("fuzz replay: token file reader on the seed corpus and every past crash") {
  const std::vector<std::string> inputs = mg::fuzz::replay_inputs("token_file");
  REQUIRE(inputs.size() >= 8);
  for (const std::string& path : inputs) {
    INFO(path);
    const std::vector<uint8_t> bytes = mg::fuzz::read_bytes(path);
    CHECK_NOTHROW(mg::fuzz::token_file_one_input(bytes.data(), bytes.size()));
  }
  // The seeds themselves: the valid ones read, the near misses are refused.
  const std::string dir = std::string(MINIGRAD_SOURCE_DIR) + "/tests/fuzz/corpus/token_file/";
  CHECK(data::read_token_file(dir + "all-bytes.tokens").tokens.size() == 256);
  CHECK(data::read_token_file(dir + "empty.tokens").tokens.empty());
  REQUIRE_THROWS_WITH(data::read_token_file(dir + "liar.tokens"),
                      MG_CONTAINS("(more than 2^64 bytes with the header)"));
  REQUIRE_THROWS_WITH(data::read_token_file(dir + "token-out-of-range.tokens"),
                      MG_CONTAINS("token 2 is 2, outside the vocabulary of 2 characters"));
}
