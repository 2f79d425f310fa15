#include <minigrad/parallel/pipeline/pipeline_stage.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/wire.h>

namespace mg::parallel {
namespace {

// The header in front of an activation: [micro-batches, rows, dtype, rank, sizes...].
constexpr int64_t kMaxRank = 8;
constexpr int64_t kHeaderLength = 4 + kMaxRank;

// The tags of the boundary between virtual stages k and k + 1 for micro-batch j: each
// (micro-batch, boundary, kind) has one of its own (train_step checks they fit an int).
constexpr int kHeaderTag = 0, kActivationTag = 1, kGradientTag = 2;
int message_tag(int64_t j, int boundary, int virtual_stages, int kind) {
  return static_cast<int>(3 * (j * virtual_stages + boundary) + kind);
}

}  // namespace

// A receive posted and not yet waited for: the tensor it fills and its Work.
struct PipelineStage::PendingRecv {
  Tensor tensor;
  std::shared_ptr<Work> work;
};

struct PipelineStage::Header {
  int64_t micro_batches = 0, rows = 0;
  DType dtype = DType::Float32;
  Shape shape;
};

PipelineStage::PipelineStage(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                             PipelineStageOptions options)
    : PipelineStage(std::vector<nn::ModulePtr>{std::move(module)}, std::move(group), options) {}

PipelineStage::PipelineStage(std::vector<nn::ModulePtr> model_chunks,
                             std::shared_ptr<ProcessGroup> group, PipelineStageOptions options)
    : chunks_(std::move(model_chunks)), group_(std::move(group)), options_(options) {
  MG_CHECK(!chunks_.empty(), "PipelineStage: no model chunks; a rank needs at least one");
  for (size_t c = 0; c < chunks_.size(); ++c)
    MG_CHECK(chunks_[c] != nullptr, "PipelineStage: the module{} is null",
             chunks_.size() == 1 ? std::string() : fmt::format(" of model chunk {}", c));
  MG_CHECK(group_ != nullptr, "PipelineStage: the process group is null");
  MG_CHECK(options_.chunks >= 1, "PipelineStage: chunks must be at least 1, got {}",
           options_.chunks);
  MG_CHECK(chunks_.size() == 1 || options_.schedule == Schedule::Interleaved1F1B,
           "PipelineStage: {} model chunks on a rank need the interleaved schedule, not {}",
           chunks_.size(), schedule_name(options_.schedule));
  // A rank's chunks hand on to each other through the group: with one rank, to itself.
  MG_CHECK(chunks_.size() == 1 || group_->size() > 1,
           "PipelineStage: {} model chunks on one rank; interleaving needs at least two ranks", chunks_.size());
  for (const nn::ModulePtr& chunk : chunks_) chunk->to(group_->device());
}

Tensor PipelineStage::loss_on_every_rank(const Tensor& loss) const {
  const int p = num_stages();
  const bool last = stage() + 1 == p;
  MG_CHECK(!last || (loss.defined() && loss.numel() == 1),
           "PipelineStage::loss_on_every_rank: the last stage's loss must be a scalar, got {}",
           loss.defined() ? loss.shape().str() : "an undefined tensor");
  NoGradGuard no_grad;
  // Every rank must know the dtype to receive it: the last stage's is sent first.
  Tensor dtype = from_vector(std::vector<int64_t>{last ? static_cast<int64_t>(loss.dtype()) : 0}, Shape{1},
                             group_->device());
  if (p > 1) group_->broadcast(dtype, p - 1)->wait();
  const DType type = static_cast<DType>(dtype.to_vector<int64_t>()[0]);
  Tensor buffer = last ? ops::clone(ops::copy_to(loss.detach(), group_->device()).reshape(Shape{1}))
                       : zeros({1}, type, group_->device());
  if (p > 1) group_->broadcast(context_parallel::wire_view(buffer), p - 1)->wait();
  return buffer.reshape(Shape{});
}

PipeTimeline PipelineStage::last_timeline() const {
  return recorder_ ? recorder_->timeline() : PipeTimeline{};
}

PipelineStage::Header PipelineStage::receive_header(int64_t micro_batch, int virtual_stage) {
  return read_header(post_header_recv(micro_batch, virtual_stage), virtual_stage);
}

PipelineStage::PendingRecv PipelineStage::post_header_recv(int64_t micro_batch, int virtual_stage) {
  const int p = num_stages(), from = virtual_stage - 1;
  Tensor raw = empty({kHeaderLength}, DType::Int64, group_->device());
  auto work = group_->recv(
      raw, from % p, message_tag(micro_batch, from, p * num_model_chunks(), kHeaderTag));
  return {raw, std::move(work)};
}

PipelineStage::Header PipelineStage::read_header(const PendingRecv& posted, int virtual_stage) {
  posted.work->wait();
  const int from = virtual_stage - 1;
  const std::vector<int64_t> v = posted.tensor.to_vector<int64_t>();
  // Any of minigrad's dtypes (Float16 is DType's last): bfloat16 activations under bf16-true.
  MG_CHECK(v[3] >= 1 && v[3] <= kMaxRank && v[2] >= 0 && v[2] <= static_cast<int64_t>(DType::Float16),
           "a malformed activation header from stage {}", from);
  Header h;
  h.micro_batches = v[0];
  h.rows = v[1];
  h.dtype = static_cast<DType>(v[2]);
  h.shape = Shape(std::vector<int64_t>(v.begin() + 4, v.begin() + 4 + v[3]));
  return h;
}

Tensor PipelineStage::train_step(const Tensor& input, const Tensor& target,
                                 const PipeLoss& loss_fn) {
  MG_CHECK(GradMode::is_enabled(), "PipelineStage::train_step runs backward, but grad mode is "
           "off (called under NoGradGuard?)");
  const int s = stage(), p = num_stages(), v = num_model_chunks();
  const int virtual_stages = p * v;
  const bool first = s == 0, last = s + 1 == p;
  const Device device = group_->device();
  MG_CHECK(!first || (input.defined() && input.dim() > 0),
           "PipelineStage: stage 0 (rank 0) needs the batch as input; got {}",
           input.defined() ? "a scalar" : "an undefined tensor");
  MG_CHECK(!last || (target.defined() && target.dim() > 0),
           "PipelineStage: the last stage (rank {}) needs the targets; got {}", s,
           target.defined() ? "a scalar" : "an undefined tensor");
  MG_CHECK(!last || loss_fn != nullptr, "PipelineStage: the last stage needs a loss function");

  // How the batch is cut: stage 0 knows it; the others learn it from the first header.
  std::optional<Header> first_header;
  int64_t rows = 0;
  if (first) {
    rows = input.size(0);
  } else {
    first_header = receive_header(0, s);
    rows = first_header->rows;
  }
  const MicroBatches micro(rows, options_.chunks, "PipelineStage");
  MG_CHECK(first || micro.count() == first_header->micro_batches,
           "PipelineStage: stage {} was made with chunks {}, which cuts {} rows into {} "
           "micro-batches, but stage 0 cut them into {}; give every rank the same chunks",
           s, options_.chunks, rows, micro.count(), first_header->micro_batches);
  MG_CHECK(!last || target.size(0) == rows,
           "PipelineStage: the targets have {} rows, but the batch has {}", target.size(0), rows);
  const int64_t m = micro.count();
  // Every (micro-batch, boundary, kind) has a tag of its own: 3 m v p of them.
  MG_CHECK(m <= (int64_t{1} << 30) / (3 * int64_t{virtual_stages}),
           "PipelineStage: {} micro-batches over {} virtual stages need more message tags "
           "than an int holds",
           m, virtual_stages);
  auto tag_of = [&](int64_t j, int boundary, int kind) {
    return message_tag(j, boundary, virtual_stages, kind);
  };

  // One runner per chunk: virtual stage k = c p + s.
  std::vector<StageRunner> runners;
  runners.reserve(static_cast<size_t>(v));
  for (int c = 0; c < v; ++c) {
    const int k = c * p + s;
    StageRunner::Options o;
    o.stage = k;
    o.first = k == 0;
    o.last = k + 1 == virtual_stages;
    o.checkpoint = options_.checkpoint;
    o.micro_batches = m;
    runners.emplace_back(chunks_[static_cast<size_t>(c)], o);
  }
  if (last) {
    NoGradGuard no_grad;
    const Tensor on_device = target.device() == device ? target : target.to(device);
    std::vector<Tensor> targets;
    std::vector<double> weights;
    for (int64_t j = 0; j < m; ++j) {
      targets.push_back(on_device.narrow(0, micro.offsets[static_cast<size_t>(j)],
                                         micro.sizes[static_cast<size_t>(j)]));
      weights.push_back(options_.weight_by_rows ? micro.weight(j) : 1.0);
    }
    runners.back().set_loss(loss_fn, std::move(targets), std::move(weights));
  }

  recorder_ = std::make_shared<TimelineRecorder>(p);
  const double start = recorder_->now();
  // Sends in flight, with the tensors they read: kept until the step's end.
  std::vector<std::pair<std::shared_ptr<Work>, Tensor>> sends;
  auto send = [&](const Tensor& t, int peer, int tag) {
    const Tensor contiguous = t.is_contiguous() ? t : ops::contiguous(t);
    sends.emplace_back(group_->send(context_parallel::wire_view(contiguous), peer, tag), contiguous);
  };
  int64_t stashed = 0;
  last_max_stashed_ = 0;

  // Receives are posted one pass ahead of need: before a pass computes, the header of this
  // rank's next forward and the gradient of its next backward are asked for, so those
  // messages travel while it computes instead of when it next waits (a receive posted at
  // its pass costs a round trip through the sender, busy by then, on every hand-off).
  // At most one of each waits in flight, so the memory they take is one micro-batch's.
  const std::vector<Action> actions = rank_actions(options_.schedule, s, p, v, m);
  using Key = std::pair<int64_t, int>;  // (micro-batch, chunk)
  std::map<Key, PendingRecv> headers, gradients;
  // What each (micro-batch, chunk) handed on: its gradient comes back in that form.
  std::map<Key, std::pair<Shape, DType>> handed_on;
  auto post_header = [&](int64_t j, int c) {
    if (!headers.count({j, c})) headers.emplace(Key{j, c}, post_header_recv(j, c * p + s));
  };
  auto post_gradient = [&](int64_t j, int c) {
    const auto sent = handed_on.find({j, c});
    if (gradients.count({j, c}) || sent == handed_on.end()) return;
    const int k = c * p + s;
    Tensor g = empty(sent->second.first, sent->second.second, device);
    auto work = group_->recv(context_parallel::wire_view(g), (k + 1) % p,
                             tag_of(j, k, kGradientTag));
    gradients.emplace(Key{j, c}, PendingRecv{g, std::move(work)});
  };
  auto post_ahead = [&](size_t i) {
    bool forward_found = false, backward_found = false;
    for (size_t n = i + 1; n < actions.size() && !(forward_found && backward_found); ++n) {
      const Action& next = actions[n];
      const int k = next.chunk * p + s;
      if (next.pass == Pass::Forward && !forward_found) {
        forward_found = true;
        if (k != 0 && !(next.micro_batch == 0 && next.chunk == 0))
          post_header(next.micro_batch, next.chunk);
      } else if (next.pass == Pass::Backward && !backward_found) {
        backward_found = true;
        if (k + 1 != virtual_stages) post_gradient(next.micro_batch, next.chunk);
      }
    }
  };
  auto take = [](std::map<Key, PendingRecv>& posted, int64_t j, int c) {
    const auto it = posted.find({j, c});
    MG_CHECK(it != posted.end(), "PipelineStage: micro-batch {} has no receive posted", j);
    PendingRecv r = std::move(it->second);
    posted.erase(it);
    return r;
  };

  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int64_t j = a.micro_batch;
    const int c = a.chunk, k = c * p + s;
    const bool first_k = k == 0, last_k = k + 1 == virtual_stages;
    StageRunner& runner = runners[static_cast<size_t>(c)];
    try {
      if (a.pass == Pass::Forward) {
        Tensor x;
        if (first_k) {
          NoGradGuard no_grad;
          const Tensor piece = input.detach().narrow(0, micro.offsets[static_cast<size_t>(j)],
                                                     micro.sizes[static_cast<size_t>(j)]);
          x = piece.device() == device ? ops::contiguous(piece) : piece.to(device);
        } else {
          if (!(j == 0 && c == 0)) post_header(j, c);
          const Header h = j == 0 && c == 0 ? *first_header : read_header(take(headers, j, c), k);
          MG_CHECK(h.micro_batches == m && h.rows == rows,
                   "virtual stage {} sent a header for {} rows in {} micro-batches, but this "
                   "step has {} rows in {}",
                   k - 1, h.rows, h.micro_batches, rows, m);
          x = empty(h.shape, h.dtype, device);
          group_->recv(context_parallel::wire_view(x), (k - 1) % p,
                       tag_of(j, k - 1, kActivationTag))->wait();
        }
        post_ahead(i);
        const double t0 = recorder_->now();
        const Tensor y = runner.forward(j, x);
        recorder_->record(s, j, a.pass, t0, recorder_->now(), c);
        last_max_stashed_ = std::max(last_max_stashed_, ++stashed);
        if (!last_k) {
          MG_CHECK(y.dim() >= 1 && y.dim() <= kMaxRank,
                   "the output has shape {}; a stage hands on tensors of 1 to {} dimensions",
                   y.shape(), kMaxRank);
          std::vector<int64_t> header{m, rows, static_cast<int64_t>(y.dtype()), y.dim()};
          for (int64_t d : y.shape().sizes()) header.push_back(d);
          header.resize(static_cast<size_t>(kHeaderLength), 0);
          const int next = (k + 1) % p;
          send(from_vector(header, {kHeaderLength}, device), next, tag_of(j, k, kHeaderTag));
          send(y, next, tag_of(j, k, kActivationTag));
          handed_on[{j, c}] = {y.shape(), y.dtype()};
        }
      } else {
        Tensor g;
        if (!last_k) {
          post_gradient(j, c);
          const PendingRecv r = take(gradients, j, c);
          r.work->wait();
          g = r.tensor;
        }
        post_ahead(i);
        const double t0 = recorder_->now();
        const Tensor grad_input = runner.backward(j, g);
        recorder_->record(s, j, a.pass, t0, recorder_->now(), c);
        --stashed;
        if (!first_k) send(grad_input, (k - 1) % p, tag_of(j, k - 1, kGradientTag));
      }
    } catch (const std::exception& e) {
      MG_FAIL("PipelineStage: stage {} (rank {}{}) failed in the {} of micro-batch {}: {}",
              v == 1 ? s : k, group_->rank(),
              v == 1 ? std::string() : fmt::format(", model chunk {}", c),
              a.pass == Pass::Forward ? "forward" : "backward", j, e.what());
    }
  }
  for (auto& [work, tensor] : sends) work->wait();
  recorder_->add_window(start, recorder_->now());

  if (!last) return {};
  NoGradGuard no_grad;
  const StageRunner& loss_runner = runners.back();
  Tensor loss = loss_runner.loss(0);
  for (int64_t j = 1; j < m; ++j) loss = loss + loss_runner.loss(j);
  return loss;
}

}  // namespace mg::parallel
