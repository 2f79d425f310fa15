#include <minigrad/parallel/pipeline/pipeline_stage.h>

#include <optional>
#include <utility>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {
namespace {

// The header in front of an activation: [micro-batches, rows, dtype, rank, sizes...].
constexpr int64_t kMaxRank = 8;
constexpr int64_t kHeaderLength = 4 + kMaxRank;

int tag_of(int64_t micro_batch, int kind) { return static_cast<int>(3 * micro_batch + kind); }
constexpr int kHeaderTag = 0, kActivationTag = 1, kGradientTag = 2;

}  // namespace

struct PipelineStage::Header {
  int64_t micro_batches = 0, rows = 0;
  DType dtype = DType::Float32;
  Shape shape;
};

PipelineStage::PipelineStage(nn::ModulePtr module, std::shared_ptr<ProcessGroup> group,
                             PipelineStageOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  MG_CHECK(module_ != nullptr, "PipelineStage: the module is null");
  MG_CHECK(group_ != nullptr, "PipelineStage: the process group is null");
  MG_CHECK(options_.chunks >= 1, "PipelineStage: chunks must be at least 1, got {}",
           options_.chunks);
  module_->to(group_->device());
}

PipeTimeline PipelineStage::last_timeline() const {
  return recorder_ ? recorder_->timeline() : PipeTimeline{};
}

PipelineStage::Header PipelineStage::receive_header(int64_t micro_batch) {
  Tensor raw = empty({kHeaderLength}, DType::Int64, group_->device());
  group_->recv(raw, stage() - 1, tag_of(micro_batch, kHeaderTag))->wait();
  const std::vector<int64_t> v = raw.to_vector<int64_t>();
  MG_CHECK(v[3] >= 1 && v[3] <= kMaxRank && (v[2] == static_cast<int64_t>(DType::Float32) ||
                                             v[2] == static_cast<int64_t>(DType::Int64)),
           "a malformed activation header from stage {}", stage() - 1);
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
  const int s = stage(), p = num_stages();
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
    first_header = receive_header(0);
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

  StageRunner::Options o;
  o.stage = s;
  o.first = first;
  o.last = last;
  o.checkpoint = options_.checkpoint;
  o.micro_batches = m;
  StageRunner runner(module_, o);
  if (last) {
    NoGradGuard no_grad;
    const Tensor on_device = target.device() == device ? target : target.to(device);
    std::vector<Tensor> targets;
    std::vector<double> weights;
    for (int64_t j = 0; j < m; ++j) {
      targets.push_back(on_device.narrow(0, micro.offsets[static_cast<size_t>(j)],
                                         micro.sizes[static_cast<size_t>(j)]));
      weights.push_back(micro.weight(j));
    }
    runner.set_loss(loss_fn, std::move(targets), std::move(weights));
  }

  recorder_ = std::make_shared<TimelineRecorder>(p);
  const double start = recorder_->now();
  // Sends in flight, with the tensors they read: kept until the step's end.
  std::vector<std::pair<std::shared_ptr<Work>, Tensor>> sends;
  std::vector<Shape> sent_shapes(static_cast<size_t>(m));
  auto send = [&](const Tensor& t, int peer, int tag) {
    const Tensor contiguous = t.is_contiguous() ? t : ops::contiguous(t);
    sends.emplace_back(group_->send(contiguous, peer, tag), contiguous);
  };

  for (const Action& a : stage_actions(options_.schedule, s, p, m)) {
    const int64_t j = a.micro_batch;
    try {
      if (a.pass == Pass::Forward) {
        Tensor x;
        if (first) {
          NoGradGuard no_grad;
          const Tensor piece = input.detach().narrow(0, micro.offsets[static_cast<size_t>(j)],
                                                     micro.sizes[static_cast<size_t>(j)]);
          x = piece.device() == device ? ops::contiguous(piece) : piece.to(device);
        } else {
          const Header h = j == 0 ? *first_header : receive_header(j);
          x = empty(h.shape, h.dtype, device);
          group_->recv(x, s - 1, tag_of(j, kActivationTag))->wait();
        }
        const double t0 = recorder_->now();
        const Tensor y = runner.forward(j, x);
        recorder_->record(s, j, a.pass, t0, recorder_->now());
        if (!last) {
          MG_CHECK(y.dim() >= 1 && y.dim() <= kMaxRank,
                   "the output has shape {}; a stage hands on tensors of 1 to {} dimensions",
                   y.shape(), kMaxRank);
          std::vector<int64_t> header{m, rows, static_cast<int64_t>(y.dtype()), y.dim()};
          for (int64_t d : y.shape().sizes()) header.push_back(d);
          header.resize(static_cast<size_t>(kHeaderLength), 0);
          send(from_vector(header, {kHeaderLength}, device), s + 1, tag_of(j, kHeaderTag));
          send(y, s + 1, tag_of(j, kActivationTag));
          sent_shapes[static_cast<size_t>(j)] = y.shape();
        }
      } else {
        Tensor g;
        if (!last) {
          g = empty(sent_shapes[static_cast<size_t>(j)], DType::Float32, device);
          group_->recv(g, s + 1, tag_of(j, kGradientTag))->wait();
        }
        const double t0 = recorder_->now();
        const Tensor grad_input = runner.backward(j, g);
        recorder_->record(s, j, a.pass, t0, recorder_->now());
        if (!first) send(grad_input, s - 1, tag_of(j, kGradientTag));
      }
    } catch (const std::exception& e) {
      MG_FAIL("PipelineStage: stage {} (rank {}) failed in the {} of micro-batch {}: {}", s,
              group_->rank(), a.pass == Pass::Forward ? "forward" : "backward", j, e.what());
    }
  }
  for (auto& [work, tensor] : sends) work->wait();
  recorder_->add_window(start, recorder_->now());
  last_max_stashed_ = runner.max_stashed();

  if (!last) return {};
  NoGradGuard no_grad;
  Tensor loss = runner.loss(0);
  for (int64_t j = 1; j < m; ++j) loss = loss + runner.loss(j);
  return loss;
}

}  // namespace mg::parallel
