#include "parity/harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "parallel/dp_check.h"  // cpus
#include "parity/models.h"
#include "parallel/tp_check.h"  // shard_kinds: how parallelize_mlp splits each parameter

#include <minigrad/autograd/autocast.h>
#include <minigrad/minigrad.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/gpt_checkpointing.h>
#include <minigrad/models/gpt_plan.h>
#include <minigrad/parallel/clip_grad.h>
#include <minigrad/parallel/context_parallel/context_parallel_loss.h>
#include <minigrad/parallel/context_parallel/ring_attention.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/loss_parallel.h>
#include <minigrad/parallel/partial_gradients.h>
#include <minigrad/parallel/pipeline/split_module.h>
#include <minigrad/parallel/pipeline/mesh_pipeline.h>
#include <minigrad/parallel/placement.h>
#include <minigrad/parallel/sharded/fully_shard.h>
#include <minigrad/parallel/sharded/fully_sharded_data_parallel.h>
#include <minigrad/parallel/sharded/zero_redundancy_optimizer.h>

#ifdef MINIGRAD_WITH_GLOO
#include "distributed/multiprocess.h"
#endif

namespace mg::parity {

namespace {

// n split into `parts` pieces as even as possible, larger first (never fewer pieces).
std::vector<int64_t> even_split(int64_t n, int64_t parts) {
  MG_CHECK(n >= parts, "parity: {} rows cannot feed {} pieces", n, parts);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < parts; ++i) out.push_back(n / parts + (i < n % parts ? 1 : 0));
  return out;
}

Batch rows_at(const Batch& b, const std::vector<int64_t>& rows) {
  std::vector<Tensor> xs, ys;
  for (int64_t r : rows) {
    xs.push_back(b.x.narrow(0, r, 1));
    ys.push_back(b.y.narrow(0, r, 1));
  }
  return {cat(xs, 0), cat(ys, 0)};
}

Batch narrow_rows(const Batch& b, int64_t start, int64_t n) {
  return {b.x.narrow(0, start, n), b.y.narrow(0, start, n)};
}

// This data-parallel rank's rows of the step's batch: DistributedSampler's shard when the
// batch splits evenly (it would pad an uneven one with repeated rows), else a contiguous
// piece. Either way the ranks' rows together are the batch, each row once.
Batch data_parallel_rows(const Batch& whole, int rank, int ranks, int step) {
  const int64_t n = whole.x.size(0);
  if (n % ranks == 0) {
    data::DistributedSampler sampler(n, ranks, rank, /*shuffle=*/true, /*seed=*/7);
    return rows_at(whole, sampler.indices(step));
  }
  const std::vector<int64_t> sizes = even_split(n, ranks);
  int64_t start = 0;
  for (int r = 0; r < rank; ++r) start += sizes[static_cast<size_t>(r)];
  return narrow_rows(whole, start, sizes[static_cast<size_t>(rank)]);
}

// ---- what a form reports ----

enum class CutKind : int32_t { Whole, Rows, Columns, Flat, Elements };

// Which piece of the plain module's tensor a reported piece is.
struct Cut {
  CutKind kind = CutKind::Whole;
  int32_t part = 0, parts = 1;  // Rows, Columns: part `part` of `parts` equal ones
  int64_t offset = 0, numel = 0;  // Flat: elements [offset, offset + numel) of the flattened tensor
  std::vector<int64_t> elements;  // Elements: these of the flattened tensor, in this order
};

// When a piece was reported: after backward, after clipping, after the optimizer step.
enum Phase : int32_t { kGradient, kClippedGradient, kParameter };

const char* phase_name(int32_t phase) {
  return phase == kGradient ? "the gradient" : phase == kClippedGradient ? "the clipped gradient" : "the parameter";
}

struct Piece {
  std::string holder;  // "" in one process, "rank 1", ...
  int32_t param = 0;   // index into the plain module's parameters()
  int32_t phase = kGradient;  // set by train()
  Cut cut;
  std::vector<double> values;
};

struct StepReport {
  double loss = 0.0;  // this process's share of the batch's loss
  std::vector<Piece> pieces;
};

using Report = std::vector<StepReport>;

std::vector<double> values_of(const Tensor& t) {
  MG_CHECK(t.defined(), "parity: a tensor to report is undefined");
  const Tensor c = t.detach().contiguous();
  std::vector<double> out;
  if (c.dtype() == DType::Float32) {
    for (float v : c.to_vector<float>()) out.push_back(v);
  } else if (c.dtype() == DType::Float64) {
    out = c.to_vector<double>();
  } else {
    MG_FAIL("parity: cannot report a tensor of dtype {}", c.dtype());
  }
  return out;
}

void report_whole(StepReport& s, const std::string& holder, const std::vector<Tensor>& params,
                  bool grad) {
  for (size_t k = 0; k < params.size(); ++k) {
    Piece p;
    p.holder = holder;
    p.param = static_cast<int32_t>(k);
    p.values = values_of(grad ? params[k].grad() : params[k]);
    s.pieces.push_back(std::move(p));
  }
}

// A tensor-parallel rank's parameters (parallelize_mlp's shards, in the plain order).
void report_tensor_parallel(StepReport& s, const std::string& holder, const nn::Module& shard,
                            const std::vector<mg::testing::ShardKind>& kinds, int part, int parts,
                            bool grad) {
  const std::vector<Tensor> params = shard.parameters();
  MG_CHECK(params.size() == kinds.size(), "parity: a shard has {} parameters, the model {}",
           params.size(), kinds.size());
  for (size_t k = 0; k < params.size(); ++k) {
    Piece p;
    p.holder = holder;
    p.param = static_cast<int32_t>(k);
    switch (kinds[k]) {
      case mg::testing::ShardKind::Rows: p.cut.kind = CutKind::Rows; break;
      case mg::testing::ShardKind::Columns: p.cut.kind = CutKind::Columns; break;
      case mg::testing::ShardKind::Whole: p.cut.kind = CutKind::Whole; break;
    }
    p.cut.part = part;
    p.cut.parts = parts;
    p.values = values_of(grad ? params[k].grad() : params[k]);
    s.pieces.push_back(std::move(p));
  }
}

// This rank's shard of a FlatParameter (a ZeRO bucket, an FSDP unit): its pieces of the
// parameters, from `shard` (the shard's values or its gradient).
void report_flat_shard(StepReport& s, const std::string& holder, const parallel::FlatParameter& flat,
                       const Tensor& shard) {
  const std::vector<double> v = values_of(shard);
  for (const parallel::ShardLayout::Piece& piece : flat.layout().pieces(flat.rank())) {
    Piece p;
    p.holder = holder;
    p.param = static_cast<int32_t>(flat.indices()[piece.param]);
    p.cut.kind = CutKind::Flat;
    p.cut.offset = piece.param_offset;
    p.cut.numel = piece.numel;
    p.values.assign(v.begin() + piece.shard_offset, v.begin() + piece.shard_offset + piece.numel);
    s.pieces.push_back(std::move(p));
  }
}

// The index of the plain module's parameter named `name` (in named_parameters()). A GPT
// pipeline's last stage holds a copy of the tied wte as "lm_head.weight": it is wte's (the
// Llama's lm_head.weight is its own, listed by the plain Llama).
int32_t index_of(const std::vector<nn::NamedTensor>& plain, const std::string& head_or_name) {
  const bool listed = std::any_of(plain.begin(), plain.end(), [&](const nn::NamedTensor& p) { return p.first == head_or_name; });
  const std::string name = !listed && head_or_name == "lm_head.weight" ? "transformer.wte.weight" : head_or_name;
  size_t k = 0;
  while (k < plain.size() && plain[k].first != name) ++k;
  MG_CHECK(k < plain.size(), "parity: a form reports a parameter '{}' the plain module has not", name);
  return static_cast<int32_t>(k);
}

// Parameters a process holds whole, found among the plain module's (`plain`) by name: for
// a form whose module lists them in another order, or holds only some (a GPT's pipeline
// stage would).
void report_named(StepReport& s, const std::string& holder, const std::vector<nn::NamedTensor>& params,
                  const std::vector<nn::NamedTensor>& plain, bool grad) {
  for (const auto& [name, p] : params) {
    Piece piece;
    piece.holder = holder;
    piece.param = index_of(plain, name);
    piece.values = values_of(grad ? p.grad() : p);
    s.pieces.push_back(std::move(piece));
  }
}

// A rank's parameters as their placements cut them from the plain module's (found by
// name in `plain`): whole where nothing split them, else the elements local_part takes
// (found by letting it take them from a tensor of the elements' numbers).
void report_placed(StepReport& s, const std::string& holder, const std::vector<nn::NamedTensor>& params,
                   const std::vector<nn::NamedTensor>& plain, bool grad) {
  for (const auto& [name, p] : params) {
    const parallel::ParameterSpec* spec = parallel::spec_of(p);
    if (spec == nullptr) {  // whole
      Piece piece;
      piece.holder = holder;
      piece.param = index_of(plain, name);
      piece.values = values_of(grad ? p.grad() : p);
      s.pieces.push_back(std::move(piece));
      continue;
    }
    // Each piece (one; a flat shard's several, FSDP's) cut from the single-device tensor as
    // its placements and flat range say.
    const std::vector<double> values = values_of(grad ? p.grad() : p);
    for (const parallel::ParameterPiece& placed : spec->pieces) {
      Piece piece;
      piece.holder = holder;
      piece.param = index_of(plain, placed.name);
      const Tensor numbers = arange(static_cast<double>(placed.shape.numel()), DType::Float64).reshape(placed.shape);
      piece.cut.kind = CutKind::Elements;
      for (double v : values_of(parallel::local_part(placed, numbers)))
        piece.cut.elements.push_back(static_cast<int64_t>(v));
      const auto at = static_cast<std::ptrdiff_t>(placed.flat ? placed.flat->local_offset : 0);
      piece.values.assign(values.begin() + at,
                          values.begin() + at + static_cast<std::ptrdiff_t>(piece.cut.elements.size()));
      s.pieces.push_back(std::move(piece));
    }
  }
}

// ---- the training loop every form runs (the plain module runs it too) ----

// What differs between forms: one micro-step (forward and backward of `b`, whose loss is
// weighted by `weight`; returns this process's share of the step's loss), the clipping,
// and what it reports.
struct Trainer {
  std::function<Batch(const Batch& whole, int step)> my_rows = [](const Batch& b, int) { return b; };
  std::function<double(const Batch& b, double weight, bool last_micro_step)> micro_step;
  // The weight of a micro-step of `rows` rows out of the step's `batch` (this rank's rows).
  std::function<double(int64_t rows, int64_t batch)> weight = [](int64_t rows, int64_t batch) {
    return static_cast<double>(rows) / static_cast<double>(batch);
  };
  std::function<void()> clip;
  optim::Optimizer* optimizer = nullptr;
  std::function<void(StepReport&, bool grad)> report;
};

Report train(const Config& c, Trainer& t) {
  Report out;
  for (int step = 0; step < c.steps; ++step) {
    StepReport s;
    t.optimizer->zero_grad();
    const Batch mine = t.my_rows(step_batch(c, step), step);
    const std::vector<int64_t> sizes = even_split(mine.x.size(0), c.accumulation);
    int64_t start = 0;
    for (size_t a = 0; a < sizes.size(); ++a) {
      s.loss += t.micro_step(narrow_rows(mine, start, sizes[a]), t.weight(sizes[a], c.batch),
                             a + 1 == sizes.size());
      start += sizes[a];
    }
    // The gradient as backward left it (a scaled one would pass clipping unseen), as
    // clipping left it, and the parameters after the step.
    auto report = [&](int32_t phase) {
      const size_t before = s.pieces.size();
      t.report(s, /*grad=*/phase != kParameter);
      for (size_t i = before; i < s.pieces.size(); ++i) s.pieces[i].phase = phase;
    };
    report(kGradient);
    if (c.optimizer == Optimizer::AdamWClipped) {
      t.clip();
      report(kClippedGradient);
    }
    t.optimizer->step();
    report(kParameter);
    out.push_back(std::move(s));
  }
  return out;
}

// The reference: the plain module on one device, the whole batch in one forward, in
// `dtype` (the row's, or float64: the same initial weights and batches, widened exactly).
Report run_plain(const Config& c, DType dtype) {
  auto model = make_module(c);
  model->to(dtype);  // float64: the row's float32 weights, widened exactly
  auto opt = make_optimizer(c, model->parameters());
  Trainer t;
  t.my_rows = [dtype](const Batch& b, int) {
    return Batch{is_floating_point(b.x.dtype()) ? b.x.to(dtype) : b.x, b.y};
  };
  t.micro_step = [&](const Batch& b, double, bool) {
    MG_CHECK(b.x.size(0) == c.batch, "parity: the plain module takes the whole batch");
    const Tensor loss = model_loss(c, model->forward(b.x), b.y);
    loss.backward();
    return scalar(loss);
  };
  t.clip = [&] {
    const double norm = scalar(nn::utils::clip_grad_norm_(model->parameters(), kMaxNorm));
    MG_CHECK(norm > kMaxNorm, "parity: the gradient's norm {} is below max_norm {}, so the row "
             "would not test clipping", norm, kMaxNorm);
  };
  t.optimizer = opt.get();
  t.report = [&](StepReport& s, bool grad) { report_whole(s, "", model->parameters(), grad); };
  Config whole = c;
  whole.accumulation = 1;  // the reference never accumulates
  return train(whole, t);
}

// A weighted loss: the micro-step's share of the step's mean loss.
Tensor weighted_loss(const Tensor& out, const Tensor& y, double weight) {
  return mul(cross_entropy(out, y), weight);
}
Tensor weighted_loss(const Config& c, const Tensor& out, const Tensor& y, double weight) {
  return mul(model_loss(c, out, y), weight);
}

// ---- the forms in one process ----

Report run_data_parallel(const Config& c) {
  auto plain = make_model(c);
  auto dp = std::make_shared<parallel::DataParallel>(plain, mg::testing::cpus(static_cast<size_t>(c.degree)));
  auto opt = make_optimizer(c, dp->parameters());
  Trainer t;
  t.micro_step = [&](const Batch& b, double w, bool) {
    const Tensor loss = weighted_loss(dp->forward(b.x), b.y, w);
    loss.backward();
    return static_cast<double>(loss.item<float>());
  };
  t.clip = [&] { nn::utils::clip_grad_norm_(dp->parameters(), kMaxNorm); };
  t.optimizer = opt.get();
  t.report = [&](StepReport& s, bool grad) { report_whole(s, "", dp->parameters(), grad); };
  return train(c, t);
}

Report run_pipe(const Config& c) {
  auto plain = make_model(c);
  parallel::PipeOptions options;
  options.chunks = c.degree2;
  options.schedule = c.schedule == Schedule::GPipe ? parallel::Schedule::GPipe : parallel::Schedule::OneFOneB;
  auto pipe = std::make_shared<parallel::Pipe>(plain, mg::testing::cpus(static_cast<size_t>(c.degree)), options);
  auto opt = make_optimizer(c, pipe->parameters());
  Trainer t;
  t.micro_step = [&](const Batch& b, double w, bool) {
    const parallel::PipeStep step = pipe->train_step(
        b.x, b.y, [w](const Tensor& out, const Tensor& y) { return weighted_loss(out, y, w); });
    return static_cast<double>(step.loss.item<float>());
  };
  t.clip = [&] { nn::utils::clip_grad_norm_(pipe->parameters(), kMaxNorm); };
  t.optimizer = opt.get();
  t.report = [&](StepReport& s, bool grad) { report_whole(s, "", pipe->parameters(), grad); };
  return train(c, t);
}

// The GPT with every block recomputed in backward (models/gpt_checkpointing.h): the
// recomputation must draw forward's dropout masks again, so the plain GPT's step is
// taken bit for bit.
Report run_checkpointed(const Config& c) {
  auto gpt = make_gpt(c);
  models::set_block_checkpointing(*gpt);
  auto opt = make_optimizer(c, gpt->parameters());
  Trainer t;
  t.micro_step = [&](const Batch& b, double w, bool) {
    const Tensor loss = weighted_loss(c, gpt->forward(b.x), b.y, w);
    loss.backward();
    return scalar(loss);
  };
  t.clip = [&] { nn::utils::clip_grad_norm_(gpt->parameters(), kMaxNorm); };
  t.optimizer = opt.get();
  t.report = [&](StepReport& s, bool grad) { report_whole(s, "", gpt->parameters(), grad); };
  return train(c, t);
}

Report run_tensor_parallel(const Config& c) {
  auto plain = make_model(c);
  const auto kinds = mg::testing::shard_kinds(*plain);
  auto tp = std::make_shared<parallel::TensorParallel>(*plain, mg::testing::cpus(static_cast<size_t>(c.degree)));
  auto opt = make_optimizer(c, tp->parameters());
  Trainer t;
  t.micro_step = [&](const Batch& b, double w, bool) {
    const Tensor loss = weighted_loss(tp->forward(b.x), b.y, w);
    loss.backward();
    return static_cast<double>(loss.item<float>());
  };
  // Every rank's shards are in this process: the clip reads their placements (no group).
  t.clip = [&] { parallel::clip_grad_norm_(tp->parameters(), nullptr, kMaxNorm); };
  t.optimizer = opt.get();
  t.report = [&](StepReport& s, bool grad) {
    for (int r = 0; r < c.degree; ++r)
      report_tensor_parallel(s, fmt::format("rank {}", r), *tp->shard(r), kinds, r, c.degree, grad);
  };
  return train(c, t);
}

// ---- the forms over Gloo ranks (each runs in a forked rank) ----

#ifdef MINIGRAD_WITH_GLOO

using GroupPtr = std::shared_ptr<parallel::ProcessGroup>;

// A data-parallel rank's rows and weights: the rank's mean loss over its rows, weighted
// by rows * ranks / batch, so that the average over the ranks (DDP's, ZeRO's, FSDP's) is
// the whole batch's mean loss, however unevenly the rows split.
void data_parallel_rows_and_weights(Trainer& t, int dp_rank, int dp_ranks) {
  t.my_rows = [dp_rank, dp_ranks](const Batch& b, int step) {
    return data_parallel_rows(b, dp_rank, dp_ranks, step);
  };
  t.weight = [dp_ranks](int64_t rows, int64_t batch) {
    return static_cast<double>(rows * dp_ranks) / static_cast<double>(batch);
  };
}

// One rank of a multi-rank row. Each form sets up its model (the MLP's `mlp` or the GPT's
// `gpt`, built alike on every rank), which rows the rank takes and how they weigh
// (data-parallel rows: data_parallel_rows_and_weights), the loss (`loss_of`, `share`),
// what follows backward, the clipping, and what it reports: whole parameters
// (report_whole, report_named by name), slices (report_tensor_parallel,
// report_placed, by placement), or flat shards (report_flat_shard). The forms that compose
// (the mesh: DDP over dp around tensor parallelism) share this setup.
Report run_rank(const Config& c, mg::test::RankContext& ctx) {
  const GroupPtr world = ctx.gloo();
  const int rank = ctx.rank, n = ctx.world_size;
  const std::string me = fmt::format("rank {}", rank);
  // The MLP's forms split `mlp`; a transformer's (the GPT's, the Llama's) `transformer`,
  // through its spec. DDP and ZeRO take either as `model`.
  std::optional<models::SplitSpec> spec;
  if (is_transformer(c)) spec = make_transformer(c);
  std::shared_ptr<nn::Sequential> mlp = spec ? nullptr : make_model(c);
  const nn::ModulePtr transformer = spec ? spec->model : nullptr;
  const nn::ModulePtr model = spec ? transformer : nn::ModulePtr(mlp);
  if (transformer && c.recompute) spec->recompute();
  Trainer t;
  std::unique_ptr<optim::Optimizer> opt;
  std::shared_ptr<parallel::DistributedDataParallel> ddp;
  std::unique_ptr<parallel::ZeroRedundancyOptimizer> zero;
  std::shared_ptr<parallel::FullyShardedDataParallel> fsdp_wrapper;  // the MLP's
  std::shared_ptr<parallel::FSDPModule> fsdp;
  std::optional<parallel::DeviceMesh> mesh;
  std::unique_ptr<parallel::PipelineStage> stage;
  nn::ModulePtr shard;  // tensor parallelism: this rank's
  std::unique_ptr<parallel::MeshPipeline> mesh_pipeline;  // the GPT's 4-D mesh: this rank's part
  const auto kinds = mlp ? mg::testing::shard_kinds(*mlp) : std::vector<mg::testing::ShardKind>{};
  nn::Module* forward = model.get();
  double share = 1.0 / n;  // of a weighted loss, this rank's part of the step's loss
  // The loss of a micro-step's output (the model's own unless a form computes it its way),
  // and what runs after each backward.
  std::function<Tensor(const Tensor& out, const Tensor& y)> loss_of = [&c](const Tensor& out, const Tensor& y) {
    return model_loss(c, out, y);
  };
  std::function<void(bool last_micro_step)> after_backward = [](bool) {};

  parallel::DDPOptions ddp_options;
  if (c.bucket_per_tensor) ddp_options.bucket_cap_mb = ddp_options.first_bucket_mb = 4.0 / (1 << 20);
  auto make = [&c](std::vector<Tensor> shards) { return make_optimizer(c, std::move(shards)); };
  const parallel::Schedule schedule = c.schedule == Schedule::GPipe     ? parallel::Schedule::GPipe
                                      : c.schedule == Schedule::OneFOneB ? parallel::Schedule::OneFOneB
                                                                         : parallel::Schedule::Interleaved1F1B;
  switch (c.form) {
    case Form::DDP:
    case Form::Zero1: {
      ddp = std::make_shared<parallel::DistributedDataParallel>(model, world, ddp_options);
      forward = ddp.get();
      if (c.form == Form::DDP) {
        opt = make_optimizer(c, model->parameters());
        t.clip = [&] { nn::utils::clip_grad_norm_(model->parameters(), kMaxNorm); };
      } else {
        parallel::ZeroOptions options;
        options.stage = 1;
        if (c.bucket_per_tensor) options.bucket_cap_mb = 4.0 / (1 << 20);
        zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(model->parameters(), world, make, options);
        t.clip = [&] { zero->clip_grad_norm_(kMaxNorm); };
      }
      data_parallel_rows_and_weights(t, rank, n);
      t.report = [&](StepReport& s, bool grad) { report_whole(s, me, model->parameters(), grad); };
      break;
    }
    case Form::Zero2: {
      parallel::ZeroOptions options;
      options.stage = 2;
      if (c.bucket_per_tensor) options.bucket_cap_mb = 4.0 / (1 << 20);
      zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(model->parameters(), world, make, options);
      t.clip = [&] { zero->clip_grad_norm_(kMaxNorm); };
      data_parallel_rows_and_weights(t, rank, n);
      t.report = [&](StepReport& s, bool grad) {
        if (!grad) return report_whole(s, me, model->parameters(), false);  // every rank keeps all
        for (size_t b = 0; b < zero->num_buckets(); ++b)
          report_flat_shard(s, me, zero->bucket(b), zero->bucket(b).shard().grad());
      };
      break;
    }
    case Form::FSDP: {
      // The GPT: fully_shard on each block, then on the GPT (models/gpt_plan.h); with tp, after
      // its tp plan over the mesh's tp, over the mesh's dp (FSDP x TP). The MLP: FSDP1's wrapper.
      GroupPtr dp_group = world;
      if (transformer && c.tp > 1) {
        mesh.emplace(world, c.degree, c.tp);
        spec->parallelize(*mesh, c.sequence_parallel, {});
        dp_group = mesh->dp_group();
        loss_of = [&c, &mesh](const Tensor& out, const Tensor& y) {
          parallel::LossParallel loss_parallel(*mesh);  // the logits are this rank's vocabulary
          return model_loss(c, out, y);
        };
        // Sequence parallelism's partial gradients, on the shards (FSDP reduce-scattered them
        // over dp in backward; the sum over tp commutes with it), once: the accumulated sum.
        after_backward = [&fsdp](bool last) {
          if (last) parallel::reduce_partial_gradients(fsdp->parameters());
        };
      }
      if (transformer) {
        fsdp = spec->fully_shard(dp_group, {});
      } else {
        fsdp_wrapper = std::make_shared<parallel::FullyShardedDataParallel>(model, world);
        fsdp = fsdp_wrapper->fsdp();
        forward = fsdp_wrapper.get();
      }
      opt = make_optimizer(c, fsdp->parameters());
      t.clip = [&] {  // with tp over the world: the shards' pieces counted as their placements say
        if (mesh) parallel::clip_grad_norm_(fsdp->parameters(), world, kMaxNorm);
        else fsdp->clip_grad_norm_(kMaxNorm);
      };
      data_parallel_rows_and_weights(t, mesh ? mesh->dp_rank() : rank, c.degree);
      t.report = [&, plain = transformer ? transformer->named_parameters() : std::vector<nn::NamedTensor>{}](StepReport& s, bool grad) {
        if (mesh) {  // the shards' pieces, cut as their placements say
          std::vector<nn::NamedTensor> shards;
          for (const Tensor& flat : fsdp->parameters()) shards.emplace_back("", flat);
          return report_placed(s, me, shards, plain, grad);
        }
        for (size_t u = 0; u < fsdp->num_units(); ++u) {
          const parallel::FlatParameter& unit = fsdp->unit(u);
          report_flat_shard(s, me, unit, grad ? unit.shard().grad() : unit.shard());
        }
      };
      break;
    }
    case Form::PipelineStages: {
      if (transformer) {
        // Rank s holds the GPT's virtual stages s, s + n, ..., cut by module name
        // (split_module with the GPT's cut); the first and the last hold a copy of the tied
        // wte each, placed on their tie group, summed over it once, after the last micro-step.
        parallel::PipelineStageOptions options;
        options.chunks = c.degree2;
        options.schedule = schedule;
        stage = std::make_unique<parallel::PipelineStage>(
            parallel::split_module(*transformer, spec->pipeline_cut(n, c.model_chunks), world), world,
            options);
        opt = make_optimizer(c, parallel::chunk_parameter_tensors(stage->model_chunks()));
        t.clip = [&] {  // by placements: each stage's own layers, the tied copy on its tie group's rank 0
          parallel::clip_grad_norm_(parallel::chunk_parameter_tensors(stage->model_chunks()), world, kMaxNorm);
        };
        t.report = [&, plain = transformer->named_parameters()](StepReport& s, bool grad) {
          report_named(s, me, parallel::chunk_parameters(stage->model_chunks()), plain, grad);
        };
        t.micro_step = [&, rank, n](const Batch& b, double w, bool last_micro_step) {
          const bool last = rank == n - 1;
          const Tensor loss = stage->train_step(rank == 0 ? b.x : Tensor(), last ? b.y : Tensor(),
                                                [&c, w](const Tensor& out, const Tensor& y) {
                                                  return weighted_loss(c, out, y, w);
                                                });
          if (last_micro_step)  // the tied copies' shares summed, once
            parallel::reduce_partial_gradients(parallel::chunk_parameter_tensors(stage->model_chunks()));
          return last ? scalar(loss) : 0.0;  // the last rank's alone
        };
        break;
      }
      // Rank s holds stage s: the layers even_balance gives it, and their parameters,
      // which are the plain module's from `first` on.
      MG_CHECK(mlp, "parity: no pipeline of the {} yet", c.model);
      const std::vector<int64_t> balance = parallel::even_balance(static_cast<int64_t>(mlp->size()), n);
      size_t first = 0;
      for (int64_t layer = 0, s = 0; s < rank; ++s)
        for (int64_t l = 0; l < balance[static_cast<size_t>(s)]; ++l, ++layer)
          first += (*mlp)[static_cast<size_t>(layer)]->parameters().size();
      parallel::PipelineStageOptions options;
      options.chunks = c.degree2;
      options.schedule = c.schedule == Schedule::GPipe ? parallel::Schedule::GPipe : parallel::Schedule::OneFOneB;
      stage = std::make_unique<parallel::PipelineStage>(parallel::split_stage(mlp, balance, rank), world, options);
      opt = make_optimizer(c, stage->module()->parameters());
      t.clip = [&] {  // every parameter lives on one rank: add the ranks' partial norms
        nn::utils::clip_grad_norm_(stage->module()->parameters(), kMaxNorm, 2.0, false,
                                   [&](Tensor& partial, nn::utils::NormReduction) {
                                     world->allreduce(partial, parallel::ReduceOp::Sum)->wait();
                                   });
      };
      t.report = [&, first](StepReport& s, bool grad) {
        const auto params = stage->module()->parameters();
        StepReport mine;
        report_whole(mine, me, params, grad);
        for (Piece& p : mine.pieces) {
          p.param += static_cast<int32_t>(first);
          s.pieces.push_back(std::move(p));
        }
      };
      t.micro_step = [&, rank, n](const Batch& b, double w, bool) {
        const bool last = rank == n - 1;
        const Tensor loss = stage->train_step(rank == 0 ? b.x : Tensor(), last ? b.y : Tensor(),
                                              [w](const Tensor& out, const Tensor& y) {
                                                return weighted_loss(out, y, w);
                                              });
        return last ? static_cast<double>(loss.item<float>()) : 0.0;  // the last rank's alone
      };
      break;
    }
    case Form::TensorParallelRanks:
    case Form::Mesh2D: {
      GroupPtr tp_group = world, dp_group;
      int tp_rank = rank, tp_size = n;
      if (c.form == Form::Mesh2D && c.cp > 1) {
        mesh.emplace(world, std::vector<parallel::MeshDim>{{"dp", c.degree}, {"cp", c.cp}, {"tp", c.degree2}});
        tp_group = mesh->tp_group();
        dp_group = mesh->dp_group();
        tp_rank = mesh->tp_rank();
        tp_size = c.degree2;
      } else if (c.form == Form::Mesh2D) {
        mesh.emplace(world, c.degree, c.degree2);
        tp_group = mesh->tp_group();
        dp_group = mesh->dp_group();
        tp_rank = mesh->tp_rank();
        tp_size = c.degree2;
      }
      if (transformer) {
        // The GPT's plans (models/gpt_plan.h): cp's (ring attention) and tp's, in place.
        if (!mesh) mesh.emplace(world, std::vector<parallel::MeshDim>{{"tp", n}});
        spec->parallelize(*mesh, c.sequence_parallel, {});
        shard = transformer;
        // The vocabulary- (and context-) parallel loss of this rank's logits; the partial
        // gradients (sequence parallelism's, cp's) summed after the last micro-step.
        loss_of = [&c, &mesh](const Tensor& out, const Tensor& y) {
          parallel::LossParallel loss_parallel(*mesh);
          return model_loss(c, out, y);
        };
        after_backward = [&transformer](bool last) {
          if (last) parallel::reduce_partial_gradients(transformer->parameters());  // once: the accumulated sum
        };
      } else {
        shard = parallel::parallelize_mlp(*mlp, parallel::tensor_parallel_group(tp_group));
      }
      forward = shard.get();
      if (dp_group) {
        ddp = std::make_shared<parallel::DistributedDataParallel>(shard, dp_group, ddp_options);
        forward = ddp.get();
        data_parallel_rows_and_weights(t, mesh->dp_rank(), mesh->dp_size());
        share = 1.0 / (mesh->dp_size() * c.cp * tp_size);
        if (c.cp > 1)  // the dp rank's rows, then this cp rank's two chunks of each
          t.my_rows = [&mesh, dp_rows = t.my_rows](const Batch& b, int step) {
            const Batch mine = dp_rows(b, step);
            const int cp_rank = mesh->rank("cp"), cp = mesh->size("cp");
            return Batch{parallel::context_parallel::shard_sequence(mine.x, cp_rank, cp),
                         parallel::context_parallel::shard_sequence(mine.y, cp_rank, cp)};
          };
      } else {
        share = 1.0 / tp_size;  // every rank computes the whole loss
      }
      opt = make_optimizer(c, shard->parameters());
      t.clip = [&] {
        if (transformer) {  // the GPT's placements (its plan's, DDP's) say what each rank counts
          parallel::clip_grad_norm_(shard->parameters(), world, kMaxNorm);
          return;
        }
        // The MLP's shards clip through their placements: tp, and dp on the mesh.
        parallel::clip_grad_norm_(shard->parameters(), world, kMaxNorm);
      };
      t.report = [&, tp_rank, tp_size, plain = transformer ? transformer->named_parameters() : std::vector<nn::NamedTensor>{}](
                     StepReport& s, bool grad) {
        if (transformer) return report_placed(s, me, transformer->named_parameters(), plain, grad);
        report_tensor_parallel(s, me, *shard, kinds, tp_rank, tp_size, grad);
      };
      break;
    }
    case Form::ContextParallel: {
      // Every rank holds the whole GPT and its two chunks of every sequence (tokens and
      // targets), takes the position embedding at their global positions and attends
      // through ring attention; the loss is the global mean on every rank, the gradients
      // are summed over the group after backward.
      MG_CHECK(transformer, "parity: context parallelism splits the GPT's sequence, not the {}'s", c.model);
      namespace cp = parallel::context_parallel;
      parallel::parallelize_module(*transformer, world, spec->context_parallel_plan());
      t.my_rows = [rank, n](const Batch& b, int) {
        return Batch{cp::shard_sequence(b.x, rank, n), cp::shard_sequence(b.y, rank, n)};
      };
      share = 1.0 / n;  // every rank computes the whole loss
      opt = make_optimizer(c, transformer->parameters());
      t.micro_step = [&](const Batch& b, double w, bool last) {
        Tensor loss;
        {
          parallel::LossParallel loss_parallel(nullptr, world);  // the mean over the whole sequences
          loss = mul(model_loss(c, transformer->forward(b.x), b.y), w);
        }
        loss.backward();
        if (last) parallel::reduce_partial_gradients(transformer->parameters());  // once, the accumulated sum
        return scalar(loss) * share;
      };
      t.clip = [&] { nn::utils::clip_grad_norm_(transformer->parameters(), kMaxNorm); };
      t.report = [&, plain = transformer->named_parameters()](StepReport& s, bool grad) {
        report_named(s, me, transformer->named_parameters(), plain, grad);
      };
      t.optimizer = opt.get();
      return train(c, t);
    }
    case Form::MeshPipeline: {
      // The GPT split by its plans over cp and tp, then cut over pp (its pipeline cut) and
      // replicated over dp (parallel::MeshPipeline): every micro-batch's loss is its
      // tokens' sum over the whole batch's count, so the micro-steps' losses and gradients
      // add up; the partial gradients (SP's, cp's, the tied embedding's, dp's) summed once,
      // after the last.
      MG_CHECK(transformer, "parity: the 4-D mesh splits the GPT, not the {}", c.model);
      mesh.emplace(world, std::vector<parallel::MeshDim>{{"dp", c.degree}, {"pp", c.pp}, {"cp", c.cp}, {"tp", c.tp}});
      spec->parallelize(*mesh, c.sequence_parallel, {});
      parallel::MeshPipelineOptions options;
      options.micro_batches = c.degree2;
      options.schedule = schedule;
      options.finish_gradients = false;
      mesh_pipeline = std::make_unique<parallel::MeshPipeline>(
          *transformer, *mesh, spec->pipeline_cut(c.pp, c.model_chunks), options);
      opt = make_optimizer(c, mesh_pipeline->parameters());
      t.my_rows = [&](const Batch& b, int) {
        return Batch{mesh_pipeline->local_batch(b.x), mesh_pipeline->local_batch(b.y)};
      };
      share = 1.0 / n;  // every rank returns the whole loss
      t.micro_step = [&](const Batch& b, double, bool last_micro_step) {
        const double targets = static_cast<double>(c.batch * kGptT);
        const Tensor loss = mesh_pipeline->train_step(b.x, b.y, [&](const Tensor& out, const Tensor& y) {
          parallel::LossParallel loss_parallel(*mesh);
          return mul(model_loss(c, out, y, Reduction::Sum), 1.0 / targets);
        });
        if (last_micro_step) mesh_pipeline->finish_gradients();
        return scalar(loss) * share;
      };
      t.clip = [&] { parallel::clip_grad_norm_(mesh_pipeline->parameters(), world, kMaxNorm); };
      t.report = [&, plain = transformer->named_parameters()](StepReport& s, bool grad) {
        report_placed(s, me, mesh_pipeline->named_parameters(), plain, grad);
      };
      t.optimizer = opt.get();
      return train(c, t);
    }
    default:
      MG_FAIL("parity: {} is not a multi-rank form", form_name(c.form));
  }
  t.optimizer = zero ? zero.get() : opt.get();
  if (stage) return train(c, t);
  t.micro_step = [&](const Batch& b, double w, bool last) {
    std::optional<parallel::DistributedDataParallel::NoSyncGuard> no_sync;
    if (ddp && !last) no_sync.emplace(*ddp);  // accumulate locally; the last one reduces
    const Tensor loss = mul(loss_of((*forward)(b.x), b.y), w);  // through its hooks (FSDP's)
    loss.backward();
    after_backward(last);
    return scalar(loss) * share;
  };
  return train(c, t);
}

// A report through the pipe to the parent: plain bytes.
template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(const std::string& in, size_t& pos) {
  MG_CHECK(pos + sizeof(T) <= in.size(), "parity: a rank's report is cut short");
  T v;
  std::memcpy(&v, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

std::string encode(const Report& report) {
  std::string out;
  put(out, static_cast<uint64_t>(report.size()));
  for (const StepReport& s : report) {
    put(out, s.loss);
    put(out, static_cast<uint64_t>(s.pieces.size()));
    for (const Piece& p : s.pieces) {
      put(out, static_cast<uint64_t>(p.holder.size()));
      out += p.holder;
      put(out, p.param);
      put(out, p.phase);
      put(out, static_cast<int32_t>(p.cut.kind));  // field by field: no padding bytes
      put(out, p.cut.part);
      put(out, p.cut.parts);
      put(out, p.cut.offset);
      put(out, p.cut.numel);
      put(out, static_cast<uint64_t>(p.cut.elements.size()));
      for (int64_t e : p.cut.elements) put(out, e);
      put(out, static_cast<uint64_t>(p.values.size()));
      for (double v : p.values) put(out, v);
    }
  }
  return out;
}

Report decode(const std::string& in) {
  size_t pos = 0;
  Report report(get<uint64_t>(in, pos));
  for (StepReport& s : report) {
    s.loss = get<double>(in, pos);
    s.pieces.resize(get<uint64_t>(in, pos));
    for (Piece& p : s.pieces) {
      const auto length = get<uint64_t>(in, pos);
      MG_CHECK(pos + length <= in.size(), "parity: a rank's report is cut short");
      p.holder = in.substr(pos, length);
      pos += length;
      p.param = get<int32_t>(in, pos);
      p.phase = get<int32_t>(in, pos);
      p.cut.kind = static_cast<CutKind>(get<int32_t>(in, pos));
      p.cut.part = get<int32_t>(in, pos);
      p.cut.parts = get<int32_t>(in, pos);
      p.cut.offset = get<int64_t>(in, pos);
      p.cut.numel = get<int64_t>(in, pos);
      p.cut.elements.resize(get<uint64_t>(in, pos));
      for (int64_t& e : p.cut.elements) e = get<int64_t>(in, pos);
      p.values.resize(get<uint64_t>(in, pos));
      for (double& v : p.values) v = get<double>(in, pos);
    }
  }
  return report;
}

// Every rank's report in one: the loss shares added, the pieces side by side.
Report run_ranks(const Config& c) {
  const auto results = mg::test::run_ranks(world_size(c), [&c](mg::test::RankContext& ctx) {
    ctx.start_together();
    ctx.report("report", encode(run_rank(c, ctx)));
  });
  for (const mg::test::RankResult& r : results)
    MG_CHECK(r.ok(), "parity: a rank failed:\n{}", mg::test::describe(results));
  Report merged;
  for (const mg::test::RankResult& r : results) {
    Report one = decode(r.text("report"));
    if (merged.empty()) {
      merged = std::move(one);
      continue;
    }
    MG_CHECK(one.size() == merged.size(), "parity: ranks ran different numbers of steps");
    for (size_t s = 0; s < one.size(); ++s) {
      merged[s].loss += one[s].loss;
      for (Piece& p : one[s].pieces) merged[s].pieces.push_back(std::move(p));
    }
  }
  return merged;
}

#else

Report run_ranks(const Config& c) {
  MG_FAIL("parity: {} needs Gloo, and minigrad was built without it", form_name(c.form));
}

#endif

Report run_form(const Config& c) {
  switch (c.form) {
    case Form::DataParallel: return run_data_parallel(c);
    case Form::Pipe: return run_pipe(c);
    case Form::TensorParallel: return run_tensor_parallel(c);
    case Form::Checkpointed: return run_checkpointed(c);
    default: return run_ranks(c);
  }
}

// ---- the comparison ----
//
// Every value a form reports is compared with the plain module's step in float64 (the same
// initial weights and batches, widened exactly).
//
// A float64 row differs from it in the order of its sums alone: the error of an element,
// |got - want| / max(|want|, 1e-3), stays below kFloat64Tolerance.
//
// A float32 row's tolerance is derived, tensor by tensor, from the plain module's own
// float32 step -- the step PyTorch's float32 would take too: its error against float64, the
// largest over the tensor's elements, is what float32 costs that tensor at that point of the
// run. It is at least the rounding noise of a sum of the N rows a gradient adds up (N = the
// batch's rows, times T for the GPT): sqrt(N) roundings of the tensor's largest element
// (2^-24 each; errors of independent roundings add as a random walk), since a plain
// float32 step can land closer than that by luck, which another order of the same sums
// need not repeat (seen: one parameter within one rounding, the forms 7 to 9 off). It is large
// where the step amplifies rounding: AdamW's first step divides a gradient by its own size,
// so where an exact gradient is near zero its rounding noise becomes a visible parameter
// difference, and another BLAS kernel (OPENBLAS_CORETYPE) moves it. A form rounds in another
// order (its pieces, its collectives), so its error differs element by element but not in
// kind: its largest error over its piece may be kFloat32Multiple times the plain float32
// step's. A fault (a gradient averaged where it is summed, a sum skipped) is an error of the
// size of the value itself: thousands of times that.

double element_error(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return INFINITY;
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-3);
}

constexpr double kUnitRoundoff32 = 0x1p-24;
constexpr double kUnitRoundoffBF16 = 0x1p-8;

// What float32 costs each value of the run: the plain float32 step's error against the
// float64 step, per (step, parameter, phase), and per step for the loss.
struct Float32Error {
  std::vector<double> loss;
  std::vector<std::map<std::pair<int32_t, int32_t>, double>> tensors;  // (param, phase) -> error
};

Float32Error float32_error(const Report& f32, const Report& f64, double rows_summed, double unit_roundoff) {
  const double floor = unit_roundoff * std::sqrt(rows_summed);  // per unit of a tensor's largest element
  MG_CHECK(f32.size() == f64.size(), "parity: the float32 and float64 references ran {} and {} steps",
           f32.size(), f64.size());
  Float32Error e;
  for (size_t s = 0; s < f64.size(); ++s) {
    e.loss.push_back(std::max(std::fabs(f32[s].loss - f64[s].loss), floor * std::fabs(f64[s].loss)));
    std::map<std::pair<int32_t, int32_t>, double> tensors;
    MG_CHECK(f32[s].pieces.size() == f64[s].pieces.size(), "parity: the references report different tensors");
    for (size_t k = 0; k < f64[s].pieces.size(); ++k) {
      const Piece& want = f64[s].pieces[k];
      const Piece& got = f32[s].pieces[k];
      MG_CHECK(got.param == want.param && got.phase == want.phase && got.values.size() == want.values.size(),
               "parity: the references report different tensors");
      double largest = 0.0, error = 0.0;
      for (size_t i = 0; i < want.values.size(); ++i) {
        largest = std::max(largest, std::fabs(want.values[i]));
        error = std::max(error, std::fabs(got.values[i] - want.values[i]));
      }
      tensors[{want.param, want.phase}] = std::max(error, floor * largest);
    }
    e.tensors.push_back(std::move(tensors));
  }
  return e;
}

// The plain tensor's elements that piece `p` holds.
std::vector<double> cut_of(const Tensor& whole, const Cut& cut) {
  const std::vector<double> v = values_of(whole);
  switch (cut.kind) {
    case CutKind::Whole: return v;
    case CutKind::Flat:
      MG_CHECK(cut.offset >= 0 && cut.numel >= 0 && cut.offset + cut.numel <= static_cast<int64_t>(v.size()),
               "parity: a flat piece [{}, +{}) of a tensor of {} elements", cut.offset, cut.numel, v.size());
      return {v.begin() + cut.offset, v.begin() + cut.offset + cut.numel};
    case CutKind::Elements: {
      std::vector<double> out;
      for (int64_t e : cut.elements) {
        MG_CHECK(e >= 0 && e < static_cast<int64_t>(v.size()), "parity: element {} of a tensor of {}", e, v.size());
        out.push_back(v[static_cast<size_t>(e)]);
      }
      return out;
    }
    case CutKind::Rows:
    case CutKind::Columns: {
      const bool rows = cut.kind == CutKind::Rows;
      const int64_t dim = rows ? 0 : 1;
      const Tensor piece = whole.detach().narrow(dim, whole.size(dim) / cut.parts * cut.part,
                                                 whole.size(dim) / cut.parts);
      return values_of(piece);
    }
  }
  return {};
}

int64_t cut_numel(const Tensor& whole, const Cut& cut) {
  switch (cut.kind) {
    case CutKind::Whole: return whole.numel();
    case CutKind::Flat: return cut.numel;
    case CutKind::Elements: return static_cast<int64_t>(cut.elements.size());
    default: return whole.numel() / cut.parts;
  }
}

// The error of `got` against `want` (the float64 step's) as the row's dtype measures it:
// a multiple of the plain float32 step's error `float32` (float32 rows), or relative
// (float64 rows).
double error_of(const Config& c, double got, double want, double float32) {
  if (c.dtype != DType::Float32) return element_error(got, want);
  if (std::isnan(got) || std::isnan(want)) return INFINITY;
  return std::fabs(got - want) / float32;
}

Outcome compare(const Config& c, const Report& plain_report, const std::optional<Float32Error>& float32,
                const Report& form_report, const std::vector<std::string>& names,
                const std::vector<Tensor>& shapes) {
  Outcome o;
  const double tol = tolerance(c.dtype);
  auto fail = [&](int step, const std::string& what) {
    o.pass = false;
    o.failure = fmt::format("{}: step {}: {}", label(c), step, what);
    return o;
  };
  // How an error reads in a message.
  auto error_words = [&](double error, double float32_error) {
    if (c.dtype != DType::Float32) return fmt::format("max relative error {:.3g}", error);
    return fmt::format("its error against the float64 step is {:.3g} times the plain float32 step's {:.3g} (at "
                       "most {} times)", error, float32_error, tol);
  };
  if (form_report.size() != plain_report.size())
    return fail(0, fmt::format("{} steps reported, {} expected", form_report.size(), plain_report.size()));
  for (size_t s = 0; s < plain_report.size(); ++s) {
    const int step = static_cast<int>(s);
    const StepReport& want = plain_report[s];
    const StepReport& got = form_report[s];
    const double loss_float32 = float32 ? float32->loss[s] : 0.0;
    const double loss_error = error_of(c, got.loss, want.loss, loss_float32);
    o.largest_error = std::max(o.largest_error, loss_error);
    if (!(loss_error <= tol))
      return fail(step, fmt::format("the loss is {:.9g}, the plain module's in float64 {:.9g}: {}", got.loss,
                                    want.loss, error_words(loss_error, loss_float32)));
    std::map<std::pair<int32_t, int32_t>, const Piece*> reference;  // (param, phase)
    for (const Piece& p : want.pieces) reference[{p.param, p.phase}] = &p;
    for (const Piece& p : got.pieces) {
      const auto found = reference.find({p.param, p.phase});
      MG_CHECK(found != reference.end(), "parity: {} of parameter {} reported, which the plain module has not",
               phase_name(p.phase), p.param);
      // The plain module's tensor of this piece, rebuilt with its shape.
      const Piece& ref = *found->second;
      const Tensor full = from_vector(ref.values, shapes[static_cast<size_t>(p.param)].shape());
      const std::vector<double> expected = cut_of(full, p.cut);
      const double tensor_float32 = float32 ? float32->tensors[s].at(found->first) : 0.0;
      const std::string what = fmt::format("{} of {}{}{}", phase_name(p.phase),
                                           names[static_cast<size_t>(p.param)],
                                           p.holder.empty() ? "" : " on ", p.holder);
      if (expected.size() != p.values.size())
        return fail(step, fmt::format("{}: {} elements reported, {} expected", what, p.values.size(), expected.size()));
      double worst = 0.0;
      size_t worst_at = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        const double e = error_of(c, p.values[i], expected[i], tensor_float32);
        if (!(e <= worst)) {
          worst = e;
          worst_at = i;
        }
      }
      o.largest_error = std::max(o.largest_error, worst);
      if (!(worst <= tol))
        return fail(step, fmt::format("{} diverges first: {}: element {} of the piece is {:.9g}, the plain "
                                      "module's in float64 {:.9g}",
                                      what, error_words(worst, tensor_float32), worst_at, p.values[worst_at],
                                      expected[worst_at]));
    }
    // Every element of every tensor the plain module reported must have been reported:
    // whole by some holder, or in pieces that together make the whole tensor.
    for (const auto& [key, ref] : reference) {
      bool whole = false;
      int64_t pieces = 0;
      const Tensor& shape = shapes[static_cast<size_t>(key.first)];
      for (const Piece& p : got.pieces) {
        if (p.param != key.first || p.phase != key.second) continue;
        whole = whole || p.cut.kind == CutKind::Whole;
        pieces += cut_numel(shape, p.cut);
      }
      if (!whole && pieces < shape.numel())
        return fail(step, fmt::format("{} of {}: only {} of its {} elements were reported",
                                      phase_name(key.second), names[static_cast<size_t>(key.first)],
                                      pieces, shape.numel()));
    }
  }
  o.pass = true;
  return o;
}

}  // namespace

double tolerance(DType dtype) { return dtype == DType::Float32 ? kFloat32Multiple : kFloat64Tolerance; }

Outcome run_row(const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  Outcome o;
  try {
    auto model = make_module(c);
    std::vector<std::string> names;
    std::vector<Tensor> shapes;
    for (const auto& [name, p] : model->named_parameters()) {
      names.push_back(name);
      shapes.push_back(p.detach());
    }
    const Report float64_report = run_plain(c, DType::Float64);
    std::optional<Float32Error> float32;
    const double rows_summed = static_cast<double>(c.batch * (is_transformer(c) ? kGptT : 1));
    // bf16-mixed: the plain module's step and the form's under autocast (without the cast
    // cache: a step's micro-batches each cast the weights, as torch's regions per forward
    // would); the plain bf16-mixed step's error against float64 is then what bfloat16 costs
    // each tensor, at least sqrt(N) roundings of 2^-8, and a form may be the same multiple
    // of it as a float32 row of its float32 error: both are roundings of one size, placed
    // differently.
    if (c.dtype == DType::Float32) {
      const AutocastGuard region(DeviceType::CPU, DType::BFloat16, c.bf16_mixed, false);
      float32 = float32_error(run_plain(c, DType::Float32), float64_report, rows_summed,
                              c.bf16_mixed ? kUnitRoundoffBF16 : kUnitRoundoff32);
    }
    Report form_report;
    {
      const AutocastGuard region(DeviceType::CPU, DType::BFloat16, c.bf16_mixed, false);
      form_report = run_form(c);
    }
    o = compare(c, float64_report, float32, form_report, names, shapes);
  } catch (const std::exception& e) {
    o.pass = false;
    o.failure = fmt::format("{}: {}", label(c), e.what());
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

std::vector<Config> rows_of(const std::vector<Form>& forms, const std::string& model) {
  std::vector<Config> out;
  for (const Config& c : parity_table())
    if ((forms.empty() || std::find(forms.begin(), forms.end(), c.form) != forms.end()) &&
        (model.empty() || c.model == model))
      out.push_back(c);
  return out;
}

std::string markdown(const std::vector<Config>& rows, const std::vector<Outcome>& outcomes,
                     const std::vector<std::vector<std::string>>& caught, double seconds) {
  MG_CHECK(rows.size() == outcomes.size() && rows.size() == caught.size(),
           "parity: {} rows, {} outcomes, {} lists of faults", rows.size(), outcomes.size(), caught.size());
  std::string out = fmt::format(R"(# The parity table

Every row is one configuration of one form of parallelism, trained for its steps beside
the plain single-device module on the same batches: after every step's backward (and
clipping) every gradient, after every optimizer step every parameter, and every step's
loss must equal the plain module's step in float64 (the same initial weights and batches,
widened exactly), within what float32 costs:

- A float32 row's tolerance is derived per tensor. The plain module's own float32 step,
  against its float64 step, shows what float32 costs that tensor at that point of the run:
  its largest error over the tensor's elements (at least the rounding noise of a sum of the
  N rows a gradient adds up, sqrt(N) roundings of 2^-24 of the largest element: N is the
  batch's rows, times T for the GPT). That is what PyTorch's float32 step costs too, and it moves with
  OpenBLAS's kernels (`OPENBLAS_CORETYPE`), and is large where AdamW's first step divides a
  near-zero gradient by its own size. A form's largest error on each tensor may be {}
  times that: the "largest error" column is that multiple (under all six of OpenBLAS's
  x86-64 kernel sets the table stays under 2.7; `make test` runs it under each the CPU can
  run).
- A float64 row's error of an element, `|got - want| / max(|want|, 1e-3)`, must stay under
  {:.0e}; the column is that relative error.
- A bf16-mixed row (nanoGPT's way: float32 parameters, every forward under
  `AutocastGuard(CPU, bfloat16)`) is held to the plain module's own bf16-mixed step in the
  same way: that step's error against float64, tensor by tensor (at least sqrt(N) roundings
  of 2^-8), is what bfloat16 costs; the form's largest error may be the same multiple of it,
  since both are bfloat16 roundings of one size placed in another order. The column is
  that multiple. The faults still fail these rows: a fault's error is of the size of the
  value, hundreds of times bfloat16's. All but one: a sharded weight recorded as
  Replicate moves only the clip's coefficient, by a fraction of a percent, which reads 3.2
  and 7.8 times bfloat16's error on the MLP's TensorParallel and dp x tp rows (under 8);
  their float32 rows catch it.

A rank that keeps a piece of a tensor (a ZeRO or FSDP shard, a tensor-parallel slice, the
GPT's q, k and v rows of a rank's heads) is compared on that piece, and the pieces must
cover every element.

The gradients are compared as backward leaves them, before clipping too: clipping rescales
the whole gradient to max_norm, so a gradient scaled by a constant (averaged where it must
be summed) would pass the clipped comparison unseen.

The last column names the deliberate faults (`minigrad/core/fault_injection.h`) that make
the row fail: the harness switches each on in turn, on every row, and `make test` checks
that each fails some row of the forms it lives in. The MLP's forms seed no random
generator per rank, so "a rank seeded like its neighbour" is played by DistributedSampler
handing a rank its neighbour's shard of the batch (the rows with even batches draw theirs
from it).

The GPT's rows train a tiny GPT (`models/gpt.h`: 2 blocks, 6 heads of 2, vocabulary 24,
sequences of 12, no biases; a pipeline row that needs a block per virtual stage has 3 or 4,
as its degrees say) with AdamW (lr 1e-3) and clipping; its plain module is the same GPT on
one device and the whole batch. A pipeline's first and last stage each hold the tied
embedding (wte, and the head's copy of it): the copies' gradients are summed over the two,
and clipping counts the tied weight once. Gloo's groups reduce float32, so the GPT's rows
over ranks are float32, except context parallelism, whose ring carries float64 too. Dropout is
on only where the form draws the plain GPT's masks: the checkpointed blocks, which must
draw forward's masks again when they recompute (and do: bit for bit, in float64); where
ranks draw their own masks (tensor parallelism's sharded regions, every rank's own rows or
positions) no row could equal the plain GPT's.

The Llama's rows train a tiny Llama (`models/llama.h`: 2 layers, 4 query heads of 4 and 2 kv
heads, SwiGLU width 24, vocabulary 24, sequences of 12; 4 layers for the interleaved
pipeline) split by its own spec (`models/llama_plan.h`: its tp and cp plans, its FSDP units,
its pipeline cut) through the same harness code as the GPT's: tensor parallelism splits the
query heads and the kv heads (a rank keeps each of its query heads' kv head), context
parallelism turns q and k by RoPE at the rank's chunks' positions, and its head is its own
weight (no tie between the pipeline's stages). The 16-rank Llama row steps with SGD: under
AdamW its gradients stay within 3 times the plain step's float32 error, but AdamW's first
step divides near-zero clipped gradients by their own size (as the GPT's lr note says) and
moves those parameters 7.7 times it, too near this table's multiple to be a test of the split.

Written by `build/bin/test_parity "[write-docs]"` (or `make parity-docs`); `tests/repo`
checks that this page lists exactly the rows of `tests/parity/table.h`, each passing.
The harness: [`tests/parity/`](../tests/parity/harness.h). The run that wrote it: {} rows in {:.0f} s
(multi-rank rows fork their Gloo ranks on loopback).

| model | form | degrees | optimizer | accumulation | batch | dtype | steps | largest error (float32: × its float32 error; bf16-mixed: × its bf16-mixed error) | result | faults caught |
|---|---|---|---|---|---|---|---|---|---|---|
)", kFloat32Multiple, kFloat64Tolerance, rows.size(), seconds);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string faults;
    for (const std::string& f : caught[i]) faults += (faults.empty() ? "" : "; ") + f;
    const std::string error = rows[i].dtype == DType::Float32 ? fmt::format("{:.1f}", outcomes[i].largest_error)
                                                              : fmt::format("{:.1e}", outcomes[i].largest_error);
    out += fmt::format("{} {} | {} | {} |\n", doc_key(rows[i]), error,
                       outcomes[i].pass ? "pass" : "FAIL", faults.empty() ? "-" : faults);
  }
  return out;
}

}  // namespace mg::parity
