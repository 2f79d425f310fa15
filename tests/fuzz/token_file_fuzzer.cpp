// libFuzzer entry point for the token file reader; the work is in fuzz_targets.h.
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mg::fuzz::token_file_one_input(data, size);
  return 0;
}
