// SplitGPT's single-device layout (gpt_parallel.h): the whole model and AdamW's state
// gathered from a split's parts for a checkpoint and the sample, and scattered back on
// resume, so that a checkpoint is the same file under every split.
//
//   tp       each sharded tensor all-gathered over tp with the indices each rank holds
//            (TensorParallelGPT::shard_of of a tensor of indices): any shard, any layout;
//   pp       the same inside each stage, then broadcast over pp from the stage that holds
//            the tensor (parallel::stage_of under the GPT's pipeline cut: the blocks as
//            gpt_pipeline_cut deals them, wte and wpe on the first stage, ln_f on the
//            last). The last stage's lm_head.weight is a copy of
//            wte, kept equal to it (the same summed gradient, the same AdamW steps), so
//            the checkpoint has wte alone (nanoGPT's lm_head.weight is wte) and a resume
//            sets both copies from it;
//   zero 1|2 every rank holds the whole parameters; the two ZeroRedundancyOptimizers'
//            full_state_dict() (PyTorch's consolidate_state_dict) gather AdamW's state
//            onto rank 0, load_full_state_dict() keeps each rank's shard of it;
//   zero 3   FSDP's full_state_dict() (the parameters, on rank 0) and the flat shards'
//            AdamW state through parallel::gather_full_optimizer_state; back with
//            load_full_state_dict() and shard_full_optimizer_state().
// The state of each parameter goes into `whole`, an AdamW over gpt's parameters grouped
// as the single-device run's, by parameter: its state_dict() is the single-device one.
#include "gpt_parallel.h"

#include <map>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt_context_parallel.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/sharded/sharded_state.h>

namespace mg::samples {

namespace {

constexpr const char* kWte = "transformer.wte.weight";
constexpr const char* kHead = "lm_head.weight";

// Parameter `index`'s entries of a full optimizer state dict ("<name>.<index>").
optim::TensorDict state_of(const nn::TensorDict& full, size_t index) {
  const std::string suffix = "." + std::to_string(index);
  optim::TensorDict out;
  for (const auto& [key, t] : full)
    if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
      out.emplace(key.substr(0, key.size() - suffix.size()), t);
  return out;
}

// `state` into a full optimizer state dict as parameter `index`'s.
void put_state(nn::TensorDict& full, size_t index, const optim::TensorDict& state) {
  for (const auto& [key, t] : state) full.emplace(key + "." + std::to_string(index), t);
}

std::vector<const parallel::FlatParameter*> units_of(const parallel::FSDPModule& fsdp) {
  std::vector<const parallel::FlatParameter*> units;
  for (size_t u = 0; u < fsdp.num_units(); ++u) units.push_back(&fsdp.unit(u));
  return units;
}

}  // namespace

std::vector<nn::NamedTensor> SplitGPT::named_parts() const {
  return pipeline_ ? pipeline_->named_parameters() : trained().named_parameters();
}

Tensor SplitGPT::shard_of(const std::string& name, const Tensor& full) const {
  return pipeline_ ? pipeline_->shard_of(name, full) : tp_model_->shard_of(name, full);
}

Tensor SplitGPT::gather(const std::string& name, const Tensor& part) {
  const Tensor whole = gpt_->parameter(name);
  if (split_.tp == 1 || models::TensorParallelGPT::is_replicated(name)) return part;
  NoGradGuard no_grad;
  const auto& tp_group = mesh_->group("tp");
  const int n = tp_group->size();
  // Which elements of the whole tensor this rank holds: shard_of a tensor of their
  // indices (exact in float32 below 2^24), gathered with the values.
  const int64_t count = whole.numel();
  MG_CHECK(count < (int64_t{1} << 24), "SplitGPT::gather: {} has {} elements", name, count);
  std::vector<float> index(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) index[static_cast<size_t>(i)] = static_cast<float>(i);
  const Tensor mine = shard_of(name, from_vector(index, whole.shape()));
  const int64_t m = mine.numel();
  MG_CHECK(part.numel() == m, "SplitGPT::gather: {}: {} elements here, a shard holds {}", name, part.numel(), m);
  const Tensor local = ops::contiguous(cat({reshape(part, {m}), reshape(ops::copy_to(mine, part.device()), {m})}, 0));
  Tensor all = zeros({n * 2 * m}, DType::Float32, local.device());
  tp_group->all_gather(all, local)->wait();
  const std::vector<float> got = ops::copy_to(all, Device::cpu()).to_vector<float>();
  std::vector<float> values(static_cast<size_t>(count), 0.0f);
  for (int r = 0; r < n; ++r) {
    const size_t at = static_cast<size_t>(r) * static_cast<size_t>(2 * m);
    for (size_t i = 0; i < static_cast<size_t>(m); ++i)
      values[static_cast<size_t>(got[at + static_cast<size_t>(m) + i])] = got[at + i];
  }
  return ops::copy_to(from_vector(values, whole.shape()), part.device());
}

int SplitGPT::pipeline_owner(const std::string& name) const {
  // Chunk c of pp rank r is virtual stage c p + r (wte is the first stage's: its name comes first).
  const parallel::PipelineCut cut = models::gpt_pipeline_cut(gpt_->config(), split_.pp, split_.model_chunks);
  return parallel::stage_of(*gpt_, cut, name) % split_.pp;
}

Tensor SplitGPT::gather_over_pipeline(const std::string& name, const Tensor& part, const Tensor& like) {
  NoGradGuard no_grad;
  const auto& pp_group = mesh_->group("pp");
  const int owner = pipeline_owner(name);
  const bool mine = pp_group->rank() == owner;
  // The owning stage's tp group gathers (a collective of that stage's ranks alone).
  Tensor whole = mine ? ops::contiguous(ops::clone(gather(name, part)))
                      : zeros(gpt_->parameter(name).shape(), like.dtype(), pp_group->device());
  pp_group->broadcast(parallel::context_parallel::wire_view(whole), owner)->wait();
  return whole;
}

std::shared_ptr<models::GPT> SplitGPT::gather_whole_model() {
  NoGradGuard no_grad;
  if (fsdp_) {  // FSDP's full parameters, on rank 0, into a GPT there
    nn::TensorDict state = fsdp_->full_state_dict();
    if (state.empty()) return nullptr;
    state[kHead] = state.at(kWte);  // the tied head, by nanoGPT's name
    if (!gathered_) {
      gathered_ = std::make_shared<models::GPT>(gpt_->config());
      gathered_->to(fsdp_->parameters().front().device());
    }
    gathered_->load_state_dict(state, "FSDP's gathered parameters");
    return gathered_;
  }
  if (pipeline_) {
    std::map<std::string, Tensor> parts;
    for (const auto& [name, p] : pipeline_->named_parameters()) parts.emplace(name, p);
    const Tensor like = parts.begin()->second;
    for (const auto& [name, whole] : gpt_->named_parameters()) {
      const auto it = parts.find(name);
      ops::copy_(whole, gather_over_pipeline(name, it == parts.end() ? Tensor() : it->second, like));
    }
    return gpt_;
  }
  if (tp_model_)
    for (const auto& [name, shard] : tp_model_->named_parameters()) ops::copy_(gpt_->parameter(name), gather(name, shard));
  return gpt_;
}

void SplitGPT::finish_for_sampling() {
  const std::shared_ptr<models::GPT> whole = gather_whole_model();
  if (fsdp_) {
    if (whole) gpt_ = whole;
    return;
  }
  if (split_.cp > 1 && !pipeline_) models::set_attention_function(*gpt_, {});
}

std::string SplitGPT::name_of(const Tensor& p) const {
  for (const auto& [name, q] : named_parts())
    if (q.is_same(p)) return name;
  MG_CHECK(false, "SplitGPT: the optimizer holds a tensor of shape {} that is no parameter of the model", p.shape());
  return "";
}

size_t SplitGPT::whole_index(const optim::Optimizer& whole, const Tensor& p) const {
  const std::vector<Tensor>& params = whole.parameters();
  for (size_t j = 0; j < params.size(); ++j)
    if (params[j].is_same(p)) return j;
  MG_CHECK(false, "SplitGPT: the whole model's optimizer has no parameter of shape {}", p.shape());
  return 0;
}

size_t SplitGPT::whole_index(const optim::Optimizer& whole, const std::string& name) const {
  return whole_index(whole, gpt_->parameter(name));
}

void SplitGPT::gather_optimizer(const std::vector<optim::Optimizer*>& optimizers, optim::Optimizer& whole) {
  NoGradGuard no_grad;
  const bool root = mesh_->group("dp")->rank() == 0;  // --zero: dp is the whole mesh
  if (!zero_.empty()) {  // --zero 1|2: each one's full state on rank 0, by original parameter
    for (parallel::ZeroRedundancyOptimizer* zero : zero_) {
      const nn::TensorDict full = zero->full_state_dict();
      if (!root) continue;
      const std::vector<Tensor>& params = zero->full_parameters();
      for (size_t i = 0; i < params.size(); ++i)
        whole.set_state(whole_index(whole, params[i]), state_of(full, i), "the gathered ZeRO state");
    }
    return;
  }
  MG_CHECK(optimizers.size() == 1, "SplitGPT::gather_optimizer: {} optimizers, expected one", optimizers.size());
  const optim::Optimizer& shards = *optimizers.front();
  if (fsdp_) {  // the units' flat shards: their state gathered by original parameter (gpt's order)
    const nn::TensorDict full = parallel::gather_full_optimizer_state(shards.state_dict(), units_of(*fsdp_),
                                                                      *mesh_->group("dp"));
    if (!root) return;
    const std::vector<Tensor> params = gpt_->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      whole.set_state(whole_index(whole, params[i]), state_of(full, i), "the gathered FSDP state");
    return;
  }
  const std::vector<Tensor>& params = shards.parameters();
  if (pipeline_) {
    // Every stage walks gpt's parameters in one order; the stage holding each gathers it
    // over tp and broadcasts it over pp. Every parameter steps every step (its gradient
    // zeroed where none arrived), so the state's names are those of any parameter's here.
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < params.size(); ++i) index.emplace(name_of(params[i]), i);
    const optim::TensorDict like = shards.state(0);
    const Device device = mesh_->group("pp")->device();
    for (const auto& [name, p] : gpt_->named_parameters()) {
      const auto it = index.find(name);
      const optim::TensorDict mine = it == index.end() ? optim::TensorDict{} : shards.state(it->second);
      MG_CHECK(it == index.end() || mine.size() == like.size(),
               "SplitGPT::gather_optimizer: {} has {} state tensors, another parameter {}", name, mine.size(), like.size());
      optim::TensorDict state;
      for (const auto& [key, t] : like) {
        const Tensor part = it == index.end() ? Tensor() : mine.at(key);
        if (t.dim() > 0) {  // per element (exp_avg, exp_avg_sq): a part of the parameter's shape
          state[key] = gather_over_pipeline(name, part, t);
          continue;
        }
        // One value per parameter (step): the owner's, as it is.
        Tensor value = part.defined() ? ops::clone(ops::copy_to(part, device)) : zeros(t.shape(), t.dtype(), device);
        mesh_->group("pp")->broadcast(parallel::context_parallel::wire_view(value), pipeline_owner(name))->wait();
        state[key] = value;
      }
      whole.set_state(whole_index(whole, name), state, "the gathered pipeline state");
    }
    return;
  }
  MG_CHECK(tp_model_ != nullptr, "SplitGPT::gather_optimizer: nothing is sharded under {}", split_.str());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = name_of(params[i]);
    optim::TensorDict state;
    // A state tensor of the parameter's shape (exp_avg, exp_avg_sq) is split as it is.
    for (const auto& [key, t] : shards.state(i))
      state[key] = t.shape() == params[i].shape() ? gather(name, t) : t;
    whole.set_state(whole_index(whole, name), state, "the gathered shards");
  }
}

void SplitGPT::scatter_whole_state(const nn::TensorDict& model, const optim::Optimizer& whole,
                                   const std::vector<optim::Optimizer*>& optimizers) {
  NoGradGuard no_grad;
  const std::string source = "the checkpoint's whole state";
  if (fsdp_) {  // each rank keeps its shards of the parameters and of their state
    nn::TensorDict params = model;
    params.erase(kHead);
    fsdp_->load_full_state_dict(params, source);
    nn::TensorDict full;
    const std::vector<Tensor> originals = gpt_->parameters();
    for (size_t i = 0; i < originals.size(); ++i) put_state(full, i, whole.state(whole_index(whole, originals[i])));
    optimizers.front()->load_state_dict(parallel::shard_full_optimizer_state(full, units_of(*fsdp_), source), source);
    return;
  }
  gpt_->load_state_dict(model, source);  // under --zero 1|2 the buckets' views: the shards too
  if (!zero_.empty()) {
    for (parallel::ZeroRedundancyOptimizer* zero : zero_) {
      nn::TensorDict full;
      const std::vector<Tensor>& params = zero->full_parameters();
      for (size_t i = 0; i < params.size(); ++i) put_state(full, i, whole.state(whole_index(whole, params[i])));
      zero->load_full_state_dict(full, source);
    }
    return;
  }
  MG_CHECK(tp_model_ || pipeline_, "SplitGPT::scatter_whole_state: nothing is sharded under {}", split_.str());
  // The pipeline's head copy of wte is cut from wte, as the pipeline cut it at the start.
  const auto whole_name = [](const std::string& name) { return name == kHead ? std::string(kWte) : name; };
  for (const auto& [name, p] : named_parts()) ops::copy_(p, shard_of(name, gpt_->parameter(whole_name(name))));
  optim::Optimizer& shards = *optimizers.front();
  const std::vector<Tensor>& params = shards.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = name_of(params[i]);
    const Tensor full = gpt_->parameter(whole_name(name));
    optim::TensorDict state;
    for (const auto& [key, t] : whole.state(whole_index(whole, whole_name(name))))
      state[key] = t.shape() == full.shape() ? shard_of(name, t) : t;
    shards.set_state(i, state, "the checkpoint's shards");
  }
}

}  // namespace mg::samples
