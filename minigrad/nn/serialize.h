// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors),
// so that a PyTorch user can open them with `safetensors.torch.load_file`:
//
//   8 bytes     N, the header length, unsigned little-endian
//   N bytes     JSON: {"<name>": {"dtype": "F32"|"F64"|"BF16"|"F16"|"I64", "shape": [..],
//                                 "data_offsets": [begin, end]}, ...,
//                      "__metadata__": {"<key>": "<string>", ...}}
//               padded with spaces to a multiple of 8 bytes
//   the rest    the tensors' raw little-endian bytes; offsets count from here
//
// Files go through minigrad/core/files.h. Writes go to a temporary file
// "<path>.tmp.<pid>.<n>" in the same directory, which is fsync'ed and then renamed over
// <path>: a reader sees the old file or the new one, never half of one, and a failed
// write leaves the old file as it was. A <path> that exists but is not a regular file (a
// directory, a FIFO, /dev/null) is refused; a symbolic link is followed, and the file it
// points to is replaced.
//
// Reads refuse anything but a regular file without blocking on it (a FIFO), check the
// header length against the file's size before allocating, then check the whole header
// (JSON, dtypes, shapes, offsets) before reading the tensors' bytes, and read no byte the
// header does not declare. A truncated or corrupt file is an mg::Error naming the file and
// the fault; so is a float tensor holding a NaN or an infinity, unless
// LoadOptions::allow_non_finite says otherwise.
//
// One checkpoint can hold several things (model, optimizer, random generator, epoch):
//
//   nn::Checkpoint ck;
//   ck.put("model.", nn::state_dict(model));
//   ck.put("optim.", sgd.state_dict());
//   ck.metadata["epoch"] = "3";
//   nn::save_tensors(ck, path);
//   ...
//   nn::Checkpoint ck = nn::load_tensors(path);
//   nn::check_state_dict(model, ck.get("model."), path);   // check both before
//   sgd.check_state_dict(ck.get("optim."), path);          // changing either
//   nn::load_state_dict(model, ck.get("model."), path);
//   sgd.load_state_dict(ck.get("optim."), path);
#pragma once

#include <map>
#include <string>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/module.h>

namespace mg::nn {

using TensorDict = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

// Named tensors plus string metadata: the contents of one safetensors file.
struct Checkpoint {
  TensorDict tensors;
  Metadata metadata;

  // Adds every entry of `entries` as prefix + name; mg::Error if a name is taken.
  void put(const std::string& prefix, const TensorDict& entries);
  // The entries whose names start with `prefix`, with the prefix removed.
  TensorDict get(const std::string& prefix) const;
};

struct LoadOptions {
  // A checkpoint whose float tensors hold a NaN or an infinity (a run that diverged) is
  // refused, naming every such tensor; true loads it as it is.
  bool allow_non_finite = false;
};

// ---- any tensors ----
// Tensors may live on any device and have any strides; they are written contiguous.
void save_tensors(const TensorDict& tensors, const std::string& path,
                  const Metadata& metadata = {});
void save_tensors(const Checkpoint& checkpoint, const std::string& path);
// The tensors come back on the CPU, as fresh leaves without requires_grad.
Checkpoint load_tensors(const std::string& path, const LoadOptions& options = {});

// ---- modules ----
// Parameters (named_parameters() names, e.g. "0.weight") and buffers (named_buffers()),
// as the tensors themselves (not copies).
TensorDict state_dict(const Module& module);
// mg::Error unless `tensors` has exactly the module's names, each with the module's shape
// and dtype; the message lists every missing key, unexpected key and mismatch at once
// and names `source` (a file name, or what the tensors are).
void check_state_dict(const Module& module, const TensorDict& tensors,
                      const std::string& source = "state dict");
// The same check against names, shapes and dtypes given apart from any module's tensors:
// for a holder whose tensors at rest are not what it loads (FSDP under a mixed-precision
// policy: bfloat16 views of a gathered unit, float32 shards that a state dict fills). `op`
// and `holder` name the caller and the thing loaded in the message.
struct TensorSpec {
  Shape shape;
  DType dtype = DType::Float32;
};
void check_state_dict(const std::map<std::string, TensorSpec>& expected, const TensorDict& tensors,
                      const std::string& op, const std::string& holder, const std::string& source);
// check_state_dict, then copies the values into the module's parameters and buffers in
// place (each on its own device), so optimizers holding them see the new values.
void load_state_dict(Module& module, const TensorDict& tensors,
                     const std::string& source = "state dict");

// state_dict(module) to `path` (metadata gets "format": "pt", as safetensors.torch writes).
void save(const Module& module, const std::string& path, const Metadata& metadata = {});
// Reads and checks `path`, then load_state_dict. On any error the module is unchanged.
void load(Module& module, const std::string& path, const LoadOptions& options = {});

}  // namespace mg::nn
