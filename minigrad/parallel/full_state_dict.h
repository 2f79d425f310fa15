// The single-device model's state dict from any split, and back into any other split
// (torch.distributed.checkpoint's get_model_state_dict / set_model_state_dict with
// full_state_dict=True), read off the placements (placement.h): no form's own code.
//
//   nn::TensorDict whole = parallel::full_state_dict(shard->named_parameters(), world);
//   nn::save_tensors(whole, "model.safetensors");        // the single-device checkpoint
//   ...                                                   // another split, another world size
//   parallel::load_full_state_dict(other->named_parameters(), nn::load_tensors(path).tensors);
//
// `named` are the tensors this rank holds under the single-device model's names where no
// spec names them: a tp shard's named_parameters() (parallelize_mlp keeps the names), a DDP
// replica's module's, FSDP's flat shards (fsdp->named_parameters(): their pieces carry the
// names), a pipeline stage's parameters under the whole model's names, and buffers alike.
//
// full_state_dict gathers every rank's counted pieces (piece_exchange.h) and ends with the
// whole dict on every rank, on the CPU (every rank can then write or check it; the cost is
// the model's memory on each). load_full_state_dict needs no communication: every rank
// passes the same whole dict (read from one file) and copies its part of each tensor into
// its own (local_part), so a dict saved under one split loads under any other. It checks
// everything before it writes anything: a name the dict lacks, a tensor of another shape or
// dtype, a placement that does not divide the tensor, each named in one mg::Error. Names in
// the dict that no tensor of `named` needs are not an error (another pipeline stage's).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// A collective over `world` (null: every rank's tensors are in this process).
nn::TensorDict full_state_dict(const std::vector<nn::NamedTensor>& named,
                               const std::shared_ptr<ProcessGroup>& world);
nn::TensorDict full_state_dict(const std::vector<nn::NamedTensor>& named, const DeviceMesh& mesh);

// Not a collective. `source` names the dict in messages (a file name).
void load_full_state_dict(const std::vector<nn::NamedTensor>& named, const nn::TensorDict& full,
                          const std::string& source = "state dict");

}  // namespace mg::parallel
