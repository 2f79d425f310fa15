#include <minigrad/parallel/context_parallel/style.h>

#include <minigrad/nn/transformer_layers.h>
#include <minigrad/parallel/context_parallel/ring_attention.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>

namespace mg::parallel {

void ContextParallel::apply(nn::Module& root, const std::string& name, const ParallelContext& context) const {
  nn::Module& module = module_at(root, name);
  auto* host = dynamic_cast<nn::AttentionHost*>(&module);
  MG_CHECK(host != nullptr,
           "ContextParallel replaces the attention of a module that attends through a replaceable function "
           "(nn::AttentionHost), and '{}' is a {}", name, module.type_name());
  host->set_attention_function(context_parallel::ring_attention_function(context.group));
}

void ContextParallelPositions::apply(nn::Module& root, const std::string& name,
                                     const ParallelContext& context) const {
  const int rank = context.group->rank(), cp = context.group->size();
  module_at(root, name).register_forward_pre_hook([rank, cp, name](nn::Module&, const Tensor& positions) {
    MG_CHECK(positions.dim() == 1 && positions.dtype() == DType::Int64,
             "ContextParallelPositions on '{}': expected positions int64 [T], got {} ({})", name,
             positions.shape(), positions.dtype());
    // This rank's local sequence is T/cp of T positions: chunks rank and 2 cp - 1 - rank.
    const int64_t T = positions.size(0) * cp;
    context_parallel::chunk_length(T, cp, "ContextParallelPositions");
    return context_parallel::sequence_positions(T, rank, cp, positions.device());
  });
}

}  // namespace mg::parallel
