#include <minigrad/parallel/pipeline/pipe.h>

#include <map>
#include <mutex>

#include <fmt/ranges.h>

#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>
#include <minigrad/parallel/devices/run_per_device.h>
#include <minigrad/parallel/devices/transfer.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/pipeline/channel.h>

namespace mg::parallel {
namespace {

// A copy of `src` (made on `src_stream`) on `device`, allocated on this thread's current
// stream there (`stream`, the receiving stage's) and ordered after the source's work.
Tensor copy_in(const Tensor& src, const Stream& src_stream, Device device, const Stream& stream) {
  if (!src.defined()) return {};
  Tensor dst = empty(src.shape(), src.dtype(), device);
  ordered_copy_(dst, src, src_stream, stream);
  return dst;
}

// Stage s works on its own stream: the caller's current stream on its device for the
// first stage there, an extra stream of that device for each further one, so that two
// stages sharing a GPU still overlap.
std::vector<Stream> stage_streams(const std::vector<Device>& devices) {
  std::vector<Stream> streams;
  std::map<Device, int> seen;
  for (const Device& d : devices) {
    const int k = seen[d]++;
    streams.push_back(k == 0 ? current_stream(d) : stream_from_pool(d, k - 1));
  }
  return streams;
}

}  // namespace

// What one step (or one forward and its backward) shares between the stages' threads.
struct Pipe::Run {
  std::vector<Device> devices;
  std::vector<Stream> streams;  // stage s's
  MicroBatches micro;
  std::vector<StageRunner> runners;
  std::vector<Channel> activations;  // [s]: stage s -> s + 1
  std::vector<Channel> gradients;    // [s]: stage s + 1 -> s
  Tensor input;                      // the batch, cut from the caller's graph
  Stream input_stream;
  bool input_requires_grad = false;
  Tensor grad_output;                // forward(): the gradient of the gathered output
  Stream grad_stream;
  std::vector<Tensor> outputs, input_grads;  // per micro-batch: last stage's, first stage's
  std::shared_ptr<TimelineRecorder> recorder;
  std::mutex error_mutex;
  std::string error;  // the first stage failure

  Run(size_t stages, int64_t rows, int64_t chunks)
      : micro(rows, chunks, "Pipe"),
        activations(stages - 1),
        gradients(stages - 1),
        outputs(static_cast<size_t>(micro.count())),
        input_grads(static_cast<size_t>(micro.count())) {}

  int stages() const { return static_cast<int>(devices.size()); }

  // Runs every stage's list at once, stage s on its thread, device and stream. The
  // stages' streams first wait for the caller's work on their devices, and the caller's
  // streams then wait for the stages': events, no device-wide synchronisation. The
  // first wait is also what makes it safe for a stage's stream to free memory the
  // caller still reads (gradients under SGD, the gathered outputs): every stream that
  // allocates in the next step waits for the caller's work before it writes.
  void execute(const std::function<std::vector<Action>(int)>& actions_of) {
    const double start = recorder->now();
    std::vector<Event> ready(devices.size()), done(devices.size());
    for (size_t s = 0; s < devices.size(); ++s) ready[s].record(current_stream(devices[s]));
    // Stage s on the parallel layer's worker thread s, on its device and stream
    // (run_per_device.h). A stage reports its own failure (fail), naming the action.
    run_per_device(devices, streams, "Pipe: stage", [&](size_t stage) {
      const int s = static_cast<int>(stage);
      std::optional<Action> action;
      try {
        ready[stage].block(streams[stage]);
        for (const Action& a : actions_of(s)) {
          action = a;
          run_action(s, a);
        }
        done[stage].record(streams[stage]);
      } catch (const PipeAborted&) {
        // Another stage failed first; its error is the one to report.
      } catch (const std::exception& e) {
        fail(s, action, e.what());
      }
    });
    for (size_t s = 0; s < devices.size(); ++s) done[s].block(current_stream(devices[s]));
    recorder->add_window(start, recorder->now());
    if (!error.empty()) MG_FAIL("{}", error);
  }

  void run_action(int s, const Action& a) {
    const auto j = static_cast<size_t>(a.micro_batch);
    const bool last = s + 1 == stages();
    if (a.pass == Pass::Forward) {
      Tensor x = s == 0 ? copy_in(input.narrow(0, micro.offsets[j], micro.sizes[j]),
                                  input_stream, devices[0], streams[0])
                        : receive(activations[static_cast<size_t>(s - 1)], s, a);
      const double t0 = recorder->now();
      Tensor y = runners[static_cast<size_t>(s)].forward(a.micro_batch, x);
      recorder->record(s, a.micro_batch, a.pass, t0, recorder->now());
      if (last) {
        outputs[j] = std::move(y);
      } else {
        activations[static_cast<size_t>(s)].push({a.micro_batch, std::move(y), streams[s]});
      }
    } else {
      Tensor g;
      if (!last) {
        g = receive(gradients[static_cast<size_t>(s)], s, a);
      } else if (grad_output.defined()) {
        g = copy_in(grad_output.narrow(0, micro.offsets[j], micro.sizes[j]), grad_stream,
                    devices[s], streams[s]);
      }
      const double t0 = recorder->now();
      Tensor grad_input = runners[static_cast<size_t>(s)].backward(a.micro_batch, g);
      recorder->record(s, a.micro_batch, a.pass, t0, recorder->now());
      if (s == 0) {
        input_grads[j] = std::move(grad_input);
      } else {
        gradients[static_cast<size_t>(s - 1)].push({a.micro_batch, std::move(grad_input), streams[s]});
      }
    }
  }

  // The next hand-off from a neighbour, copied onto stage s's device and stream. The
  // hand-off (and with it the sender's tensor) is dropped only after the copy was
  // queued, and the sender's stream waits for the copy before it can reuse the memory.
  Tensor receive(Channel& channel, int s, const Action& a) {
    Handoff h = channel.pop();
    MG_CHECK(h.micro_batch == a.micro_batch,
             "received micro-batch {} where the schedule expects {} (a schedule bug)",
             h.micro_batch, a.micro_batch);
    return copy_in(h.tensor, h.stream, devices[static_cast<size_t>(s)],
                   streams[static_cast<size_t>(s)]);
  }

  void fail(int s, const std::optional<Action>& action, const char* what) {
    {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error.empty()) return;
      error = action ? fmt::format("Pipe: stage {} (on {}) failed in the {} of micro-batch {}: {}",
                                   s, devices[static_cast<size_t>(s)],
                                   action->pass == Pass::Forward ? "forward" : "backward",
                                   action->micro_batch, what)
                     : fmt::format("Pipe: stage {} (on {}) failed: {}", s,
                                   devices[static_cast<size_t>(s)], what);
    }
    for (Channel& c : activations) c.abort();
    for (Channel& c : gradients) c.abort();
  }

  // The first stage's input gradients as one tensor on the input's device.
  Tensor input_gradient() const {
    NoGradGuard no_grad;
    const Tensor g = cat(input_grads, 0);
    return g.device() == input.device() ? g : g.to(input.device());
  }
};

// The gathered output's grad_fn under forward(): runs the stages' backwards, GPipe
// order, each on its stage's thread, and hands back the input's gradient.
class Pipe::Backward final : public Node {
 public:
  explicit Backward(std::shared_ptr<Run> run) : Node("PipeBackward"), run_(std::move(run)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    MG_CHECK(run_ != nullptr,
             "Pipe: backward through the same forward a second time (its stages' graphs were "
             "freed by the first backward)");
    const std::shared_ptr<Run> run = std::move(run_);
    run->grad_output = grad_outputs[0];
    run->grad_stream = current_stream(run->grad_output.device());
    const int stages = run->stages();
    const int64_t m = run->micro.count();
    run->execute([&](int s) {
      std::vector<Action> backwards;
      for (const Action& a : stage_actions(Schedule::GPipe, s, stages, m))
        if (a.pass == Pass::Backward) backwards.push_back(a);
      return backwards;
    });
    return {run->input_requires_grad ? run->input_gradient() : Tensor()};
  }
  void release_saved() override { run_.reset(); }

 private:
  std::shared_ptr<Run> run_;
};

Pipe::Pipe(nn::ModulePtr module, std::vector<Device> devices, PipeOptions options)
    : nn::Module("Pipe"), devices_(std::move(devices)), options_(std::move(options)) {
  MG_CHECK(module != nullptr, "Pipe: the module is null");
  auto sequential = std::dynamic_pointer_cast<nn::Sequential>(module);
  MG_CHECK(sequential != nullptr,
           "Pipe: the module must be an nn::Sequential, whose layers are cut into stages in "
           "order; got {}",
           module->type_name());
  MG_CHECK(!devices_.empty(), "Pipe: expected at least one device, one per stage");
  const int count = backend(DeviceType::CUDA).device_count();
  for (size_t s = 0; s < devices_.size(); ++s)
    MG_CHECK(devices_[s].is_cpu() || devices_[s].index() < count,
             "Pipe: devices[{}] is {}, but {} CUDA device{} visible", s, devices_[s], count,
             count == 1 ? " is" : "s are");
  MG_CHECK(options_.chunks >= 1, "Pipe: chunks must be at least 1, got {}", options_.chunks);
  MG_CHECK(options_.schedule != Schedule::Interleaved1F1B,
           "Pipe: the interleaved schedule needs several model chunks per rank, which "
           "PipelineStage holds; Pipe runs gpipe or 1f1b");
  const auto layers = static_cast<int64_t>(sequential->size());
  const auto stages = static_cast<int64_t>(devices_.size());
  MG_CHECK(layers >= stages,
           "Pipe: the module has {} layer{} for {} devices; every stage needs at least one",
           layers, layers == 1 ? "" : "s", stages);
  balance_ = options_.balance.empty() ? even_balance(layers, stages) : options_.balance;
  MG_CHECK(balance_.size() == devices_.size(), "Pipe: balance [{}] has {} entries for {} devices",
           fmt::join(balance_, ", "), balance_.size(), devices_.size());

  // Stage s: its layers, under their own names. Each stage's backward runs on its own
  // thread, so a parameter in two stages would have its gradient accumulated by two
  // threads at once: refused, before anything moves.
  std::map<const TensorImpl*, size_t> owner;  // parameter -> stage
  for (size_t s = 0; s < devices_.size(); ++s) {
    stages_.push_back(split_stage(sequential, balance_, static_cast<int>(s), "Pipe"));
    for (const auto& [name, p] : stages_.back()->named_parameters()) {
      const auto [it, fresh] = owner.emplace(p.impl(), s);
      MG_CHECK(fresh, "Pipe: parameter '{}' is used by stages {} and {}; a layer may appear "
               "in one stage only", name, it->second, s);
    }
  }
  for (size_t s = 0; s < devices_.size(); ++s) stages_[s]->to(devices_[s]);
  register_module("module", sequential);
}

Pipe::~Pipe() = default;

std::shared_ptr<Pipe::Run> Pipe::start_run(const Tensor& input, bool training) {
  MG_CHECK(input.defined(), "Pipe: the input is an undefined tensor");
  MG_CHECK(input.dim() > 0, "Pipe: the input is a scalar; it needs a batch dimension to cut "
           "into micro-batches");
  auto run = std::make_shared<Run>(devices_.size(), input.size(0), options_.chunks);
  run->devices = devices_;
  run->streams = stage_streams(devices_);
  run->input = input.detach();
  run->input_stream = current_stream(input.device());
  run->input_requires_grad = training && input.requires_grad();
  const int p = num_stages();
  for (int s = 0; s < p; ++s) {
    StageRunner::Options o;
    o.stage = s;
    o.first = s == 0;
    o.last = s + 1 == p;
    o.checkpoint = options_.checkpoint;
    o.micro_batches = run->micro.count();
    o.training = training;
    o.input_requires_grad = run->input_requires_grad;
    run->runners.emplace_back(stages_[static_cast<size_t>(s)], o);
  }
  run->recorder = std::make_shared<TimelineRecorder>(p);
  last_recorder_ = run->recorder;
  return run;
}

Tensor Pipe::forward(const Tensor& input) {
  const bool training = GradMode::is_enabled();
  MG_CHECK(!training || options_.schedule == Schedule::GPipe,
           "Pipe: forward() with grad mode on runs the gpipe schedule only: 1f1b interleaves "
           "forward and backward, so the loss must be computed inside the step. Call "
           "train_step(input, target, loss_fn), or forward() under NoGradGuard for inference");
  if (training) plan_if_needed(input);
  const std::shared_ptr<Run> run = start_run(input, training);
  const int64_t m = run->micro.count();
  run->execute([&](int s) {
    std::vector<Action> forwards;
    for (const Action& a : stage_actions(Schedule::GPipe, s, num_stages(), m))
      if (a.pass == Pass::Forward) forwards.push_back(a);
    return forwards;
  });
  Tensor out;
  {
    NoGradGuard no_grad;
    out = cat(run->outputs, 0);
  }
  last_max_stashed_.clear();
  for (const StageRunner& r : run->runners) last_max_stashed_.push_back(r.max_stashed());
  bool wants_graph = run->input_requires_grad;
  for (const Tensor& p : parameters()) wants_graph = wants_graph || p.requires_grad();
  if (training && wants_graph) connect_node(std::make_shared<Backward>(run), {input}, {out});
  return out;
}

PipeStep Pipe::train_step(const Tensor& input, const Tensor& target, const PipeLoss& loss_fn) {
  MG_CHECK(GradMode::is_enabled(), "Pipe::train_step runs backward, but grad mode is off "
           "(called under NoGradGuard?)");
  MG_CHECK(loss_fn != nullptr, "Pipe::train_step: the loss function is empty");
  MG_CHECK(input.defined() && target.defined() && input.dim() > 0 && target.dim() > 0 &&
               input.size(0) == target.size(0),
           "Pipe::train_step: the input ({}) and the target ({}) must have the same number of "
           "rows",
           input.defined() ? fmt::format("shape {}", input.shape()) : "undefined",
           target.defined() ? fmt::format("shape {}", target.shape()) : "undefined");
  plan_if_needed(input);
  const std::shared_ptr<Run> run = start_run(input, /*training=*/true);
  const int p = num_stages();
  const int64_t m = run->micro.count();

  // The last stage computes each micro-batch's loss, weighted by its share of the rows.
  const Device last = devices_.back();
  std::vector<Tensor> targets;
  std::vector<double> weights;
  {
    NoGradGuard no_grad;
    const Tensor on_last = target.device() == last ? target : target.to(last);
    for (int64_t j = 0; j < m; ++j) {
      targets.push_back(on_last.narrow(0, run->micro.offsets[static_cast<size_t>(j)],
                                       run->micro.sizes[static_cast<size_t>(j)]));
      weights.push_back(run->micro.weight(j));
    }
  }
  run->runners.back().set_loss(loss_fn, std::move(targets), std::move(weights));

  run->execute([&](int s) { return stage_actions(options_.schedule, s, p, m); });

  PipeStep step;
  {
    NoGradGuard no_grad;
    DeviceGuard guard(last);
    step.loss = run->runners.back().loss(0);
    for (int64_t j = 1; j < m; ++j) step.loss = step.loss + run->runners.back().loss(j);
    step.output = cat(run->outputs, 0);
  }
  last_max_stashed_.clear();
  for (const StageRunner& r : run->runners) last_max_stashed_.push_back(r.max_stashed());
  if (run->input_requires_grad) run_backward({input}, {run->input_gradient()}, false);
  return step;
}

std::vector<StagePlan> Pipe::plan(const Tensor& batch) {
  MG_CHECK(batch.defined() && batch.dim() > 0, "Pipe::plan: the batch needs a batch dimension");
  const MicroBatches micro(batch.size(0), options_.chunks, "Pipe::plan");
  const int p = num_stages();
  AutoGradMode grad_mode(true);
  std::vector<StagePlan> plan;
  Tensor x = batch.detach().narrow(0, 0, micro.sizes[0]);
  for (int s = 0; s < p; ++s) {
    const Device device = devices_[static_cast<size_t>(s)];
    DeviceGuard guard(device);
    StagePlan sp;
    sp.stage = s;
    sp.device = device;
    sp.layers = balance_[static_cast<size_t>(s)];
    sp.in_flight = max_in_flight(options_.schedule, s, p, micro.count());
    sp.checkpoint = options_.checkpoint;
    for (const Tensor& param : stages_[static_cast<size_t>(s)]->parameters()) {
      sp.parameter_bytes += param.nbytes();
      if (param.requires_grad() && !param.grad().defined()) sp.gradient_bytes += param.nbytes();
    }
    // The dry run: what one micro-batch's forward leaves allocated while its graph lives.
    Tensor leaf = copy_to_device(x, device);
    sp.input_bytes = leaf.nbytes();
    if (leaf.dtype() == DType::Float32 && (s > 0 || batch.requires_grad()))
      leaf.set_requires_grad(true);
    const std::size_t before = memory_allocated(device);
    const Tensor out = stages_[static_cast<size_t>(s)]->forward(leaf);
    const std::size_t after = memory_allocated(device);
    sp.activation_bytes = sp.input_bytes + (after > before ? after - before : 0);
    x = out.detach();
    plan.push_back(sp);
  }
  return plan;
}

void Pipe::plan_if_needed(const Tensor& input) {
  if (!options_.check_memory || !input.defined() || input.dim() == 0) return;
  const MicroBatches micro(input.size(0), options_.chunks, "Pipe");
  std::vector<int64_t> sizes = input.shape().sizes();
  sizes[0] = micro.sizes[0];
  const Shape shape(sizes);
  if (planned_shape_ && *planned_shape_ == shape) return;
  last_plan_ = plan(input);
  check_plan_fits(last_plan_);
  planned_shape_ = shape;
}

PipeTimeline Pipe::last_timeline() const {
  return last_recorder_ ? last_recorder_->timeline() : PipeTimeline{};
}

const std::shared_ptr<nn::Sequential>& Pipe::stage(int s) const {
  MG_CHECK(s >= 0 && s < num_stages(), "Pipe: stage {} out of range for {} stages", s,
           num_stages());
  return stages_[static_cast<size_t>(s)];
}

std::string Pipe::extra_repr() const {
  return fmt::format("devices={}, balance=[{}], chunks={}, schedule={}, checkpoint={}",
                     device_list_str(devices_), fmt::join(balance_, ", "), options_.chunks,
                     schedule_name(options_.schedule), checkpoint_name(options_.checkpoint));
}

nn::ModulePtr Pipe::copy_node() const {
  MG_FAIL("Pipe: a Pipe cannot be cloned or replicated (its stages own threads and devices); "
          "clone the nn::Sequential and build a new Pipe from the copy");
}

}  // namespace mg::parallel
