// The parity table: every configuration of every form of parallelism that must take the
// single-device step, one row each. tests/parity runs them (harness.h); tests/repo checks
// that docs/parity.md lists exactly these rows. Plain data: no library code runs here.
//
// A row names the model (the MLP, a tiny GPT: models/gpt.h, or a tiny Llama: models/llama.h), the form and its degrees,
// the optimizer, the gradient-accumulation micro-steps, the batch (the whole step's rows,
// chosen so that the pieces are uneven where the form allows it) and the dtype (float32;
// float64 where the form carries it: Gloo's groups reduce float32 only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/dtype.h>

namespace mg::parity {

enum class Form {
  DataParallel,         // k CPU replicas in one process
  DDP,                  // n Gloo ranks
  Zero1,                // ZeroRedundancyOptimizer stage 1 under DDP, n Gloo ranks
  Zero2,                // ZeroRedundancyOptimizer stage 2, n Gloo ranks
  FSDP,                 // FSDP (ZeRO-3): n Gloo ranks; a transformer's with a tp degree on a dp x tp mesh
  Pipe,                 // Pipe in one process over CPU devices
  PipelineStages,       // PipelineStage: a stage per Gloo rank, send/recv between them
  TensorParallel,       // TensorParallel in one process over CPU devices
  TensorParallelRanks,  // parallelize_mlp over n Gloo ranks
  Mesh2D,               // a dp x tp DeviceMesh: DDP over the dp sub-groups, tp inside
  ContextParallel,      // a transformer's sequence over n Gloo ranks, ring attention
  MeshPipeline,         // a transformer on a dp x pp x cp x tp DeviceMesh (its plan, then MeshPipeline)
  Checkpointed,         // the GPT's blocks recomputed in backward (nn/checkpoint.h), one device
};

enum class Optimizer { SGDMomentum, AdamWClipped };
enum class Schedule { GPipe, OneFOneB, Interleaved1F1B };

struct Config {
  std::string model = "MLP";
  Form form = Form::DataParallel;
  int degree = 1;   // replicas, ranks, stages, tensor-parallel ranks; the meshes' dp
  int degree2 = 1;  // the 2-D mesh's tp; a pipeline's (and the 4-D mesh's) micro-batches per step
  Schedule schedule = Schedule::GPipe;  // pipelines only
  bool bucket_per_tensor = false;       // DDP and ZeRO: tiny buckets, a collective each
  Optimizer optimizer = Optimizer::SGDMomentum;
  int accumulation = 1;  // micro-steps (forward + backward) per optimizer step
  int64_t batch = 11;    // rows per optimizer step, split over micro-steps and ranks
  DType dtype = DType::Float32;
  // nanoGPT's bf16-mixed: float32 parameters, every forward (the plain module's, whose
  // error sets the tolerance, and the form's) under AutocastGuard(CPU, bfloat16).
  bool bf16_mixed = false;
  int steps = 3;
  // The transformers' rows (the GPT's, the Llama's) only:
  bool sequence_parallel = false;  // tensor parallelism (and the mesh's tp) with Megatron's SP
  bool recompute = false;          // every block checkpointed (Checkpointed: always)
  double dropout = 0.0;            // the GPT's dropout (forms whose ranks draw their own masks: 0)
  int cp = 1;                      // the meshes' cp
  int pp = 1, tp = 1;              // the 4-D mesh's pp and tp; FSDP's tp (FSDP x TP)
  int model_chunks = 1;            // per pipeline rank (Interleaved1F1B: more than one)
  int n_layer = 2;                 // the GPT's blocks (a pipeline needs one per virtual stage)
};

inline bool multi_rank(Form form) {
  return form == Form::DDP || form == Form::Zero1 || form == Form::Zero2 || form == Form::FSDP ||
         form == Form::PipelineStages || form == Form::TensorParallelRanks || form == Form::Mesh2D ||
         form == Form::ContextParallel || form == Form::MeshPipeline;
}

inline int world_size(const Config& c) {
  if (c.form == Form::Mesh2D) return c.degree * c.cp * c.degree2;
  if (c.form == Form::MeshPipeline) return c.degree * c.pp * c.cp * c.tp;
  if (c.form == Form::FSDP) return c.degree * c.tp;
  return multi_rank(c.form) ? c.degree : 1;
}

inline std::string form_name(Form form) {
  switch (form) {
    case Form::DataParallel: return "DataParallel";
    case Form::DDP: return "DDP";
    case Form::Zero1: return "ZeRO-1 (DDP)";
    case Form::Zero2: return "ZeRO-2";
    case Form::FSDP: return "FSDP (ZeRO-3)";
    case Form::Pipe: return "Pipe";
    case Form::PipelineStages: return "PipelineStage (ranks)";
    case Form::TensorParallel: return "TensorParallel";
    case Form::TensorParallelRanks: return "tensor parallel (ranks)";
    case Form::Mesh2D: return "mesh: DDP x CP x TP";
    case Form::MeshPipeline: return "4-D mesh: DP x PP x CP x TP";
    case Form::ContextParallel: return "context parallel";
    case Form::Checkpointed: return "checkpointed blocks";
  }
  return "?";
}

// The form's degrees, as the table's column says them.
inline std::string degrees_of_form(const Config& c) {
  const char* schedule = c.schedule == Schedule::GPipe ? "GPipe" : c.schedule == Schedule::OneFOneB ? "1F1B"
                                                                                                  : "interleaved 1F1B";
  const std::string chunks = c.model_chunks > 1 ? fmt::format(", {} chunks per rank", c.model_chunks) : "";
  switch (c.form) {
    case Form::DataParallel: return fmt::format("{} CPU replicas", c.degree);
    case Form::Pipe:
    case Form::PipelineStages:
      return fmt::format("{} stages{} x {} micro-batches, {}{}", c.degree,
                         c.form == Form::PipelineStages ? " on Gloo ranks" : "", c.degree2, schedule, chunks);
    case Form::TensorParallel: return fmt::format("tp {} over CPU devices", c.degree);
    case Form::Mesh2D:
      if (c.cp > 1) return fmt::format("dp {} x cp {} x tp {}, {} Gloo ranks", c.degree, c.cp, c.degree2, world_size(c));
      return fmt::format("dp {} x tp {}, {} Gloo ranks", c.degree, c.degree2, world_size(c));
    case Form::MeshPipeline:
      return fmt::format("dp {} x pp {} x cp {} x tp {}, {} Gloo ranks, {} micro-batches, {}{}", c.degree, c.pp, c.cp,
                         c.tp, world_size(c), c.degree2, schedule, chunks);
    case Form::ContextParallel: return fmt::format("cp {}, {} Gloo ranks", c.degree, c.degree);
    case Form::FSDP:
      if (c.tp > 1) return fmt::format("dp {} x tp {}, {} Gloo ranks", c.degree, c.tp, world_size(c));
      return fmt::format("{} Gloo ranks", c.degree);
    case Form::Checkpointed: return "one device, every block recomputed";
    default:
      return fmt::format("{} Gloo ranks{}", c.degree, c.bucket_per_tensor ? ", a bucket per tensor" : "");
  }
}

// What a GPT row adds to its degrees: sequence parallelism, recomputed blocks, dropout.
inline std::string degrees(const Config& c) {
  std::string out = degrees_of_form(c);
  if (c.sequence_parallel) out += ", sequence parallel";
  if (c.recompute && c.form != Form::Checkpointed) out += ", blocks recomputed";
  if (c.dropout > 0) out += fmt::format(", dropout {}", c.dropout);
  if (c.n_layer != 2) out += fmt::format(", {} blocks", c.n_layer);
  return out;
}

inline std::string optimizer_name(Optimizer o) {
  return o == Optimizer::SGDMomentum ? "SGD, momentum 0.9" : "AdamW + clip_grad_norm_";
}

// The dtype column: float32, float64, or bf16-mixed (float32 parameters under autocast).
inline std::string precision_of(const Config& c) {
  return c.bf16_mixed ? std::string("bf16-mixed") : std::string(dtype_name(c.dtype));
}

// The row's first columns in docs/parity.md, exactly: what tests/repo compares.
inline std::string doc_key(const Config& c) {
  return fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} |", c.model, form_name(c.form),
                     degrees(c), optimizer_name(c.optimizer), c.accumulation, c.batch,
                     precision_of(c), c.steps);
}

// One line naming the row, for failure messages.
inline std::string label(const Config& c) {
  return fmt::format("{}, {} ({}), {}, accumulation {}, batch {}, {}, {} steps", c.model,
                     form_name(c.form), degrees(c), optimizer_name(c.optimizer), c.accumulation,
                     c.batch, precision_of(c), c.steps);
}

// The GPT's rows: the tiny GPT of harness.cpp (make_gpt), AdamW + clip_grad_norm_, float32
// (Gloo's groups reduce float32 only) unless the form carries float64. Batches of 5
// sequences split unevenly over the data-parallel ranks (3+2, 2+2+1); tensor and context
// parallelism give every rank all of the batch's sequences (3; 2+1 with 2 micro-steps).
// A new form of the GPT is a line here and a case (or a GPT branch) in harness.cpp's
// run_rank; a new degree (a mesh's cp) a field of Config, named in degrees().
inline void gpt_rows(std::vector<Config>& rows) {
  auto add = [&rows](Form form, int degree, int64_t batch, DType dtype = DType::Float32) -> Config& {
    Config c;
    c.model = "GPT";
    c.form = form;
    c.degree = degree;
    c.optimizer = Optimizer::AdamWClipped;
    c.batch = batch;
    c.dtype = dtype;
    rows.push_back(c);
    return rows.back();
  };
  // Recomputed blocks draw forward's dropout masks again: with dropout on, in float64.
  Config& recomputed = add(Form::Checkpointed, 1, 3, DType::Float64);
  recomputed.recompute = true;
  recomputed.dropout = 0.1;
  add(Form::TensorParallelRanks, 2, 3);
  add(Form::TensorParallelRanks, 3, 3);
  Config& sp = add(Form::TensorParallelRanks, 2, 3);
  sp.sequence_parallel = true;
  sp.accumulation = 2;  // SP's sums over tp once, after the last micro-step
  add(Form::Mesh2D, 2, 5).degree2 = 2;
  Config& mesh_sp = add(Form::Mesh2D, 2, 5);
  mesh_sp.degree2 = 2;
  mesh_sp.sequence_parallel = true;
  mesh_sp.accumulation = 2;
  add(Form::ContextParallel, 2, 3).accumulation = 2;
  add(Form::ContextParallel, 3, 3, DType::Float64);
  add(Form::DDP, 2, 5).accumulation = 2;
  add(Form::Zero1, 2, 5);
  add(Form::Zero2, 2, 5);
  add(Form::FSDP, 2, 5);
  add(Form::FSDP, 3, 5);
  add(Form::FSDP, 2, 5).recompute = true;
  // FSDP x TP on a dp x tp mesh (torchtitan's default): the tp plan, then fully_shard over dp.
  add(Form::FSDP, 2, 5).tp = 2;
  Config& fsdp_sp = add(Form::FSDP, 2, 5);
  fsdp_sp.tp = 2;
  fsdp_sp.sequence_parallel = true;
  fsdp_sp.accumulation = 2;  // SP's sums over tp once, after the last micro-step
  // The GPT's pipeline (split_module with models/gpt_plan.h's cut) on Gloo ranks:
  // micro-batches fewer and more than the stages, 3 stages, the interleaved schedule; a
  // block per virtual stage. The tied wte sits on the first and the last stage: clipping
  // counts it once.
  auto pipeline = [&add](int stages, int micro, Schedule schedule, int chunks, int n_layer) -> Config& {
    Config& c = add(Form::PipelineStages, stages, 5);
    c.degree2 = micro;
    c.schedule = schedule;
    c.model_chunks = chunks;
    c.n_layer = n_layer;
    return c;
  };
  pipeline(2, 1, Schedule::OneFOneB, 1, 2).accumulation = 2;  // the tied sum once, after the last
  pipeline(2, 4, Schedule::OneFOneB, 1, 2);
  pipeline(3, 4, Schedule::OneFOneB, 1, 3);
  pipeline(2, 2, Schedule::Interleaved1F1B, 2, 4);
  // Context parallelism inside the mesh (parallelize_gpt on dp x cp x tp).
  Config& cp_tp = add(Form::Mesh2D, 1, 3);
  cp_tp.cp = 2;
  cp_tp.degree2 = 2;
  Config& dp_cp_tp = add(Form::Mesh2D, 2, 5);
  dp_cp_tp.cp = 2;
  dp_cp_tp.degree2 = 2;
  // The pipeline of tensor-parallel stages (parallelize_gpt, then MeshPipeline), replicated over dp.
  auto mesh_pipeline = [&add](int dp, int pp, int cp, int tp, int64_t batch) -> Config& {
    Config& c = add(Form::MeshPipeline, dp, batch);
    c.pp = pp;
    c.cp = cp;
    c.tp = tp;
    c.degree2 = 2;
    c.schedule = Schedule::OneFOneB;
    return c;
  };
  mesh_pipeline(1, 2, 1, 2, 3);
  mesh_pipeline(2, 2, 1, 2, 5);
  mesh_pipeline(2, 2, 2, 2, 5);  // all four dimensions: 16 ranks
}

// The Llama's rows: the GPT's forms through the Llama's own spec (models/llama_plan.h) and
// the same harness, the same batches and optimizer. Grouped-query attention splits its query
// and kv heads over tp; RoPE takes a cp rank's positions; no tie between its stages.
inline void llama_rows(std::vector<Config>& rows) {
  auto add = [&rows](Form form, int degree, int64_t batch, DType dtype = DType::Float32) -> Config& {
    Config c;
    c.model = "Llama";
    c.form = form;
    c.degree = degree;
    c.optimizer = Optimizer::AdamWClipped;
    c.batch = batch;
    c.dtype = dtype;
    rows.push_back(c);
    return rows.back();
  };
  add(Form::TensorParallelRanks, 2, 3);
  Config& sp = add(Form::TensorParallelRanks, 2, 3);
  sp.sequence_parallel = true;
  sp.accumulation = 2;  // SP's sums over tp once, after the last micro-step
  add(Form::ContextParallel, 2, 3).accumulation = 2;
  add(Form::ContextParallel, 2, 3, DType::Float64);
  for (int chunks : {1, 2}) {
    Config& c = add(Form::PipelineStages, 2, 5);
    c.degree2 = chunks == 1 ? 4 : 2;
    c.schedule = chunks == 1 ? Schedule::OneFOneB : Schedule::Interleaved1F1B;
    c.model_chunks = chunks;
    c.n_layer = 2 * chunks;
  }
  add(Form::Zero1, 2, 5);
  add(Form::Zero2, 2, 5);
  add(Form::FSDP, 2, 5);
  add(Form::FSDP, 3, 5);
  add(Form::FSDP, 2, 5).recompute = true;  // every layer run again in backward
  // dp 2 x pp 2 x tp 2 (8 ranks), and with cp 2 all four dimensions (16 ranks). The 16-rank
  // row steps with SGD: under AdamW its gradients stay within 3 times the plain float32 step's
  // error, but AdamW's first step divides near-zero clipped gradients (o_proj's) by their own
  // size and moves those parameters 7.7 times the plain step's error, near the table's 8, as
  // models.h says of the GPT's lr; SGD's step is linear in the gradient.
  for (int cp : {1, 2}) {
    Config& mesh = add(Form::MeshPipeline, 2, 5);
    mesh.pp = 2;
    mesh.cp = cp;
    mesh.tp = 2;
    mesh.degree2 = 2;
    mesh.schedule = Schedule::OneFOneB;
    if (cp == 2) mesh.optimizer = Optimizer::SGDMomentum;
  }
}

// Every row. The batches: 11 splits unevenly over 2 and 3 (6+5, 4+4+3); 26 over 4
// micro-steps and 2 or 3 ranks (7+7+6+6; 9+9+8); 12 and 24 split evenly, for the rows
// whose ranks draw their rows with DistributedSampler (it pads an uneven dataset by
// repeating rows, which is not the same batch).
inline std::vector<Config> parity_table() {
  std::vector<Config> rows;
  const Optimizer sgd = Optimizer::SGDMomentum, adamw = Optimizer::AdamWClipped;
  auto add = [&rows](Form form, int degree, Optimizer optimizer, int accumulation, int64_t batch) -> Config& {
    Config c;
    c.form = form;
    c.degree = degree;
    c.optimizer = optimizer;
    c.accumulation = accumulation;
    c.batch = batch;
    rows.push_back(c);
    return rows.back();
  };
  for (int k : {2, 3})
    for (Optimizer o : {sgd, adamw})
      for (int acc : {1, 4}) add(Form::DataParallel, k, o, acc, acc == 1 ? 11 : 26);
  for (int n : {2, 3})
    for (Optimizer o : {sgd, adamw})
      for (int acc : {1, 4}) add(Form::DDP, n, o, acc, n == 2 ? (acc == 1 ? 12 : 24) : (acc == 1 ? 11 : 26));
  add(Form::DDP, 2, sgd, 1, 12).bucket_per_tensor = true;
  add(Form::DDP, 3, adamw, 4, 26).bucket_per_tensor = true;
  for (int n : {2, 3})
    for (Optimizer o : {sgd, adamw}) add(Form::Zero1, n, o, 1, n == 2 ? 12 : 11);
  add(Form::Zero1, 2, adamw, 4, 24);
  for (int n : {2, 3})
    for (Optimizer o : {sgd, adamw}) add(Form::Zero2, n, o, 1, n == 2 ? 12 : 11);
  add(Form::Zero2, 3, sgd, 4, 26);
  add(Form::Zero2, 2, adamw, 1, 11).bucket_per_tensor = true;
  for (int n : {2, 3})
    for (Optimizer o : {sgd, adamw}) add(Form::FSDP, n, o, 1, n == 2 ? 12 : 11);
  add(Form::FSDP, 2, adamw, 4, 24);
  struct PipeShape { int stages, micro; Schedule schedule; };
  for (PipeShape p : {PipeShape{2, 4, Schedule::GPipe}, PipeShape{2, 4, Schedule::OneFOneB},
                      PipeShape{3, 3, Schedule::GPipe}, PipeShape{3, 4, Schedule::OneFOneB}})
    for (Optimizer o : {sgd, adamw}) {
      Config& c = add(Form::Pipe, p.stages, o, 1, 11);
      c.degree2 = p.micro;
      c.schedule = p.schedule;
    }
  for (PipeShape p : {PipeShape{2, 3, Schedule::OneFOneB}, PipeShape{3, 2, Schedule::GPipe}}) {
    Config& c = add(Form::Pipe, p.stages, p.stages == 2 ? adamw : sgd, 4, 26);
    c.degree2 = p.micro;
    c.schedule = p.schedule;
  }
  for (PipeShape p : {PipeShape{2, 4, Schedule::GPipe}, PipeShape{3, 3, Schedule::OneFOneB}})
    for (Optimizer o : {sgd, adamw}) {
      Config& c = add(Form::PipelineStages, p.stages, o, o == sgd ? 1 : 4, o == sgd ? 11 : 26);
      c.degree2 = p.micro;
      c.schedule = p.schedule;
    }
  for (Optimizer o : {sgd, adamw})
    for (int acc : {1, 4}) add(Form::TensorParallel, 2, o, acc, acc == 1 ? 11 : 26);
  for (Optimizer o : {sgd, adamw}) add(Form::TensorParallelRanks, 2, o, o == sgd ? 1 : 4, o == sgd ? 11 : 26);
  for (Optimizer o : {sgd, adamw}) {
    Config& c = add(Form::Mesh2D, 2, o, 1, o == sgd ? 11 : 12);
    c.degree2 = 2;
  }
  gpt_rows(rows);
  llama_rows(rows);
  // bf16-mixed: the forms again under autocast, each against the plain module's bf16-mixed
  // step (harness.cpp's tolerance: the same multiple of that step's own error).
  auto mixed = [&rows](Config c) { c.bf16_mixed = true; rows.push_back(c); };
  auto mlp = [&](Form form, int degree, Optimizer o, int acc, int64_t batch) {
    Config c;
    c.form = form;
    c.degree = degree;
    c.optimizer = o;
    c.accumulation = acc;
    c.batch = batch;
    return c;
  };
  mixed(mlp(Form::DataParallel, 2, adamw, 1, 11));
  mixed(mlp(Form::DDP, 2, adamw, 4, 24));
  mixed(mlp(Form::Zero1, 2, adamw, 1, 12));
  mixed(mlp(Form::Zero2, 2, adamw, 1, 12));
  mixed(mlp(Form::FSDP, 2, adamw, 1, 12));
  Config stages = mlp(Form::PipelineStages, 2, sgd, 1, 11);
  stages.degree2 = 4;
  stages.schedule = Schedule::GPipe;
  mixed(stages);
  mixed(mlp(Form::TensorParallelRanks, 2, adamw, 4, 26));
  // The in-process forms and the MLP's mesh: Pipe (1F1B), TensorParallel over CPU devices
  // (their worker threads run under the caller's autocast region), dp x tp.
  Config pipe = mlp(Form::Pipe, 2, adamw, 1, 11);
  pipe.degree2 = 4;
  pipe.schedule = Schedule::OneFOneB;
  mixed(pipe);
  mixed(mlp(Form::TensorParallel, 2, adamw, 1, 11));
  Config mesh = mlp(Form::Mesh2D, 2, adamw, 1, 12);
  mesh.degree2 = 2;
  mixed(mesh);
  for (const Config& c : std::vector<Config>(rows)) {  // the GPT's: tp with SP, cp, the 4-D mesh, FSDP
    if (c.model != "GPT" || c.bf16_mixed || c.dtype != DType::Float32) continue;
    const bool pick = (c.form == Form::TensorParallelRanks && c.sequence_parallel && c.degree == 2) ||
                      (c.form == Form::MeshPipeline && c.degree == 2 && c.pp == 2 && c.cp == 1 && c.tp == 2) ||
                      (c.form == Form::FSDP && c.tp == 1 && c.degree == 2 && !c.recompute) ||
                      (c.form == Form::Mesh2D && c.cp == 2 && c.degree == 1);
    if (pick) mixed(c);
  }
  for (const Config& c : std::vector<Config>(rows)) {  // the Llama's: tp with SP, FSDP, pp 1F1B, dp x pp x tp
    if (c.model != "Llama" || c.bf16_mixed || c.dtype != DType::Float32) continue;
    const bool pick = (c.form == Form::TensorParallelRanks && c.sequence_parallel) ||
                      (c.form == Form::FSDP && c.degree == 2 && !c.recompute) ||
                      (c.form == Form::PipelineStages && c.schedule == Schedule::OneFOneB) ||
                      (c.form == Form::MeshPipeline && c.cp == 1);
    if (pick) mixed(c);
  }
  return rows;
}

}  // namespace mg::parity
