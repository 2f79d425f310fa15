// libFuzzer entry point for random programs of tensor ops; the work is in tensor_ops_target.h.
#include "tensor_ops_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mg::fuzz::tensor_ops_one_input(data, size);
  return 0;
}
