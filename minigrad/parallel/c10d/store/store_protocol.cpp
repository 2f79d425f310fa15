#include <minigrad/parallel/c10d/store/store_protocol.h>

#include <fmt/format.h>

namespace mg::parallel::store {

namespace {

uint32_t read_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

Parsed malformed(std::string error) {
  Parsed p;
  p.status = ParseStatus::Malformed;
  p.error = std::move(error);
  return p;
}

}  // namespace

Parsed parse_message(const char* data, std::size_t size, const Limits& limits) {
  Parsed p;
  if (size < kHeaderBytes) {
    p.size = kHeaderBytes;
    return p;
  }
  const uint32_t count = read_u32(data + 1);
  const uint32_t payload = read_u32(data + 5);
  // 64-bit arithmetic: a u32 plus 9, or 4 times a u32, cannot overflow it.
  const uint64_t total = uint64_t{kHeaderBytes} + payload;
  if (count > limits.max_args)
    return malformed(fmt::format("a message of {} arguments (the limit is {})", count,
                                 limits.max_args));
  if (total > limits.max_message_bytes)
    return malformed(fmt::format("a message of {} bytes (the limit is {})", total,
                                 limits.max_message_bytes));
  if (uint64_t{4} * count > payload)
    return malformed(fmt::format("{} arguments cannot fit in a payload of {} bytes", count, payload));
  if (size < total) {
    p.size = static_cast<std::size_t>(total);
    return p;
  }
  const char* const end = data + total;
  const char* pos = data + kHeaderBytes;
  p.message.code = static_cast<uint8_t>(data[0]);
  p.message.args.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (end - pos < 4)
      return malformed(fmt::format("argument {} of {} starts past the payload's end", i, count));
    const uint32_t length = read_u32(pos);
    pos += 4;
    if (static_cast<uint64_t>(end - pos) < length)
      return malformed(fmt::format("argument {} of {} ({} bytes) runs past the payload's end", i,
                                   count, length));
    p.message.args.emplace_back(pos, length);
    pos += length;
  }
  if (pos != end)
    return malformed(fmt::format("{} bytes after the last of {} arguments", end - pos, count));
  p.status = ParseStatus::Complete;
  p.size = static_cast<std::size_t>(total);
  return p;
}

std::size_t message_size(const std::vector<std::string>& args) {
  std::size_t size = kHeaderBytes;
  for (const std::string& a : args) size += 4 + a.size();
  return size;
}

void append_message(std::string& out, uint8_t code, const std::vector<std::string>& args) {
  const std::size_t size = message_size(args);
  out.reserve(out.size() + size);
  out.push_back(static_cast<char>(code));
  put_u32(out, static_cast<uint32_t>(args.size()));
  put_u32(out, static_cast<uint32_t>(size - kHeaderBytes));
  for (const std::string& a : args) {
    put_u32(out, static_cast<uint32_t>(a.size()));
    out += a;
  }
}

std::string encode_message(uint8_t code, const std::vector<std::string>& args) {
  std::string out;
  append_message(out, code, args);
  return out;
}

const char* command_name(uint8_t code) {
  switch (code) {
    case kSet: return "set";
    case kGet: return "get";
    case kAdd: return "add";
    case kCheck: return "check";
    case kWait: return "wait";
    case kHello: return "hello";
    default: return nullptr;
  }
}

std::string check_request(const Message& message) {
  const char* name = command_name(message.code);
  if (name == nullptr) return fmt::format("unknown command {}", message.code);
  std::size_t low = 0, high = 0;  // the arguments it takes
  switch (message.code) {
    case kSet:
    case kAdd: low = high = 2; break;
    case kGet: low = high = 1; break;
    case kCheck:
    case kWait: high = kMaxArgs; break;
    case kHello: low = high = 4; break;
  }
  const std::size_t n = message.args.size();
  if (n < low || n > high) {
    return low == high ? fmt::format("{} with {} arguments (expected {})", name, n, low)
                       : fmt::format("{} with {} arguments", name, n);
  }
  return {};
}

void MessageBuffer::append(const char* data, std::size_t size) { bytes_.append(data, size); }

ParseStatus MessageBuffer::next(Message& message, std::string& error) {
  // Until the bytes the header announced are all here there is nothing to parse: the
  // payload is walked once, when it is complete.
  if (buffered() < needed_) return ParseStatus::NeedMore;
  Parsed p = parse_message(bytes_.data() + start_, buffered(), limits_);
  if (p.status == ParseStatus::Malformed) {
    error = std::move(p.error);
    return ParseStatus::Malformed;
  }
  if (p.status == ParseStatus::NeedMore) {
    needed_ = p.size;
    return ParseStatus::NeedMore;
  }
  message = std::move(p.message);
  start_ += p.size;
  needed_ = kHeaderBytes;
  if (start_ == bytes_.size()) {
    bytes_.clear();
    start_ = 0;
    // A large message leaves a large buffer behind; give it back.
    constexpr std::size_t kKeep = std::size_t{1} << 20;
    if (bytes_.capacity() > kKeep) bytes_.shrink_to_fit();
  } else if (start_ > bytes_.size() / 2) {
    // Move the rest to the front once it is the smaller part: linear in all, however
    // many small messages one read brought.
    bytes_.erase(0, start_);
    start_ = 0;
  }
  return ParseStatus::Complete;
}

}  // namespace mg::parallel::store
