// The header in front of every point-to-point message (ProcessGroup::send / recv): what
// the sender sent, so that the receiver can refuse a message its recv does not expect
// (other shapes, dtype or size) before any of it lands in the receiving tensors. Neither
// Gloo nor NCCL can: Gloo aborts the process on a message longer than the receive buffer
// and leaves a shorter one's tail unwritten; NCCL hangs or truncates.
//
// The header has a fixed size, so the receiver can always take it whole; then it takes
// the payload into its tensors when the header matches, or into scratch memory (thrown
// away) when it does not, so the sender's send completes and later messages between the
// two ranks stay in step. Shared by both backends; not part of the user API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel::detail {

struct MessageHeader {
  static constexpr uint32_t kMagic = 0x3250474d;  // "MGP2"
  uint32_t magic = kMagic;
  uint32_t dtype = 0;  // static_cast<uint32_t>(DType)
  int32_t tag = 0;
  uint32_t tensors = 0;
  uint64_t numel = 0;        // over all tensors
  uint64_t shapes_hash = 0;  // FNV-1a over the tensor count and every shape
  char shapes[224] = {};     // "[3, 4], [5]", cut short if longer, NUL-terminated
};
static_assert(sizeof(MessageHeader) == 256, "the header travels as 256 raw bytes");

// The header of a message made of `tensors` (already checked: defined, one dtype).
MessageHeader message_header(const std::vector<Tensor>& tensors, int tag);

// "1 tensor of float32 [3, 4], 12 elements"; "2 tensors of int64 [2], [3], 5 elements".
std::string describe(const MessageHeader& header);

// Whether a received header announces exactly the message `expected` describes.
bool same_message(const MessageHeader& received, const MessageHeader& expected);

// The payload size a received header announces, in bytes; an mg::Error naming `what` (the
// recv) when the header is not one of ours or its size overflows.
std::size_t payload_bytes(const MessageHeader& header, const std::string& what);

}  // namespace mg::parallel::detail
