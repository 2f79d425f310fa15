#include <minigrad/parallel/c10d/p2p_message.h>

#include <algorithm>
#include <cstring>

#include <minigrad/core/error.h>

namespace mg::parallel::detail {

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv1a(uint64_t hash, int64_t value) {
  for (int byte = 0; byte < 8; ++byte) {
    hash ^= static_cast<uint64_t>(value >> (8 * byte)) & 0xffu;
    hash *= kFnvPrime;
  }
  return hash;
}

}  // namespace

MessageHeader message_header(const std::vector<Tensor>& tensors, int tag) {
  MessageHeader header;
  header.dtype = static_cast<uint32_t>(tensors.at(0).dtype());
  header.tag = tag;
  header.tensors = static_cast<uint32_t>(tensors.size());
  uint64_t hash = fnv1a(kFnvOffset, static_cast<int64_t>(tensors.size()));
  std::string shapes;
  for (const Tensor& t : tensors) {
    header.numel += static_cast<uint64_t>(t.numel());  // each numel was checked at creation
    hash = fnv1a(hash, t.dim());
    for (int64_t size : t.shape()) hash = fnv1a(hash, size);
    if (!shapes.empty()) shapes += ", ";
    shapes += t.shape().str();
  }
  header.shapes_hash = hash;
  const size_t room = sizeof(header.shapes) - 1;
  if (shapes.size() > room) shapes = shapes.substr(0, room - 3) + "...";
  std::memcpy(header.shapes, shapes.data(), shapes.size());
  return header;
}

std::string describe(const MessageHeader& header) {
  const std::string dtype = header.dtype <= static_cast<uint32_t>(DType::Float16)
                                ? std::string(dtype_name(static_cast<DType>(header.dtype)))
                                : "an unknown dtype";
  const std::string shapes(header.shapes, strnlen(header.shapes, sizeof(header.shapes)));
  return fmt::format("{} tensor{} of {} {}, {} element{}", header.tensors,
                     header.tensors == 1 ? "" : "s", dtype, shapes, header.numel,
                     header.numel == 1 ? "" : "s");
}

bool same_message(const MessageHeader& received, const MessageHeader& expected) {
  return received.magic == expected.magic && received.dtype == expected.dtype &&
         received.tensors == expected.tensors && received.numel == expected.numel &&
         received.shapes_hash == expected.shapes_hash;
}

std::size_t payload_bytes(const MessageHeader& header, const std::string& what) {
  MG_CHECK(header.magic == MessageHeader::kMagic,
           "{}: the message header is not a minigrad one (magic {:#x}); the stream of messages "
           "is out of step",
           what, header.magic);
  MG_CHECK(header.dtype <= static_cast<uint32_t>(DType::Float16),  // the last of DType's
           "{}: the message header names dtype {}, which is none of minigrad's", what,
           header.dtype);
  const auto dtype = static_cast<DType>(header.dtype);
  std::size_t bytes = 0;
  MG_CHECK(!__builtin_mul_overflow(static_cast<std::size_t>(header.numel), element_size(dtype),
                                   &bytes) &&
               header.numel <= static_cast<uint64_t>(SIZE_MAX),
           "{}: the message header announces {} elements, too many to hold", what, header.numel);
  return bytes;
}

}  // namespace mg::parallel::detail
