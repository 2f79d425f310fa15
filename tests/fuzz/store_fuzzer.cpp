// libFuzzer entry point for the TCPStore's message parser; the work is in fuzz_targets.h.
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mg::fuzz::store_one_input(data, size);
  return 0;
}
