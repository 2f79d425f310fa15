// The TCPStore's wire format, and its parser as a pure function over bytes (no socket, no
// state), so the server, the client and the fuzzer (tests/fuzz/store_fuzzer.cpp) read
// messages through the same few lines. Internal to parallel/c10d/store.
//
// A message, request or reply, is a 9-byte header and a payload, little-endian:
//   u8   code      a command (requests) or a reply code
//   u32  count     how many arguments follow
//   u32  payload   how many bytes follow the header
//   then `count` times: a u32 length and that many bytes.
// The header gives the whole size before any payload arrives, so a reader refuses an
// oversized message from its first 9 bytes, never keeps more than one message's bytes, and
// never parses a message twice, however TCP cuts it up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mg::parallel::store {

enum Command : uint8_t {
  kSet = 1,    // key, value
  kGet = 2,    // key                  (answered once the key exists)
  kAdd = 3,    // key, decimal delta
  kCheck = 4,  // keys...
  kWait = 5,   // keys...              (answered once every key exists)
  kHello = 6,  // magic, protocol version, run id, rank: the first message of a connection
};
enum ReplyCode : uint8_t { kOk = 100, kValue = 101, kError = 102 };

constexpr const char* kMagic = "minigrad-tcpstore";
constexpr const char* kProtocolVersion = "2";
constexpr std::size_t kHeaderBytes = 9;
// More keys than any wait of a real job names; bounds the per-argument bookkeeping
// (a std::string each) that a message of empty arguments would otherwise multiply.
constexpr std::size_t kMaxArgs = 1 << 16;

struct Limits {
  std::size_t max_message_bytes = std::size_t{64} << 20;  // header included
  std::size_t max_args = kMaxArgs;
};

struct Message {
  uint8_t code = 0;
  std::vector<std::string> args;
};

enum class ParseStatus { NeedMore, Complete, Malformed };

struct Parsed {
  ParseStatus status = ParseStatus::NeedMore;
  // NeedMore: the bytes the message needs in all (kHeaderBytes until the header is in).
  // Complete: the bytes it took.
  std::size_t size = 0;
  Message message;    // Complete
  std::string error;  // Malformed: what is wrong, in words
};

// Parses the message at the start of `data`. Never reads past `size`, never allocates
// more than the message's own bytes, and refuses a header over `limits` at once.
Parsed parse_message(const char* data, std::size_t size, const Limits& limits);

// The encoding parse_message reads (the one encoding: parsing and re-encoding a message
// gives back its bytes).
void append_message(std::string& out, uint8_t code, const std::vector<std::string>& args);
std::string encode_message(uint8_t code, const std::vector<std::string>& args);
// The encoded size, without encoding.
std::size_t message_size(const std::vector<std::string>& args);

// Whether a parsed request is a known command with the arguments it needs; empty when it
// is, otherwise what is wrong ("set with 3 arguments (expected 2)").
std::string check_request(const Message& message);
const char* command_name(uint8_t code);

// The bytes received on one connection, cut into messages: append what recv returned,
// then take messages with next() until it says NeedMore. The buffer holds at most one
// message plus what arrived behind it, and is released once a large message is taken.
class MessageBuffer {
 public:
  explicit MessageBuffer(Limits limits) : limits_(limits) {}

  void append(const char* data, std::size_t size);
  // Complete: `message` is the next one. NeedMore: wait for more bytes. Malformed:
  // `error` says why; the connection is out of step and must be closed.
  ParseStatus next(Message& message, std::string& error);
  // Bytes received and not yet taken as messages.
  std::size_t buffered() const { return bytes_.size() - start_; }

 private:
  Limits limits_;
  std::string bytes_;
  std::size_t start_ = 0;                 // where the next message begins in bytes_
  std::size_t needed_ = kHeaderBytes;     // bytes the next message needs, once known
};

}  // namespace mg::parallel::store
