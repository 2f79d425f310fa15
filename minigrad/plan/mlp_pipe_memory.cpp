// plan::mlp_pipe_memory: the MLP's pipeline in one process (parallel::Pipe), its stages'
// threads on one allocator. Each stage's thread is replayed from its schedule
// (parallel::stage_actions) as the levels its allocations pass through; the stages meet
// only where a hand-off is received, so the peak is a range over the states the threads
// can be in together (mlp_formulas.h).
#include <minigrad/plan/mlp_formulas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <minigrad/parallel/comm.h>
#include <minigrad/parallel/pipeline/balance.h>
#include <minigrad/parallel/pipeline/schedule.h>

namespace mg::plan {
namespace {

constexpr double kFloat = 4;

// One op of a stage's nn::Sequential: a Linear fused with the ReLU after it in the same
// stage, a Linear alone (its stage's last layer), or a ReLU alone (its stage's first).
struct Op {
  double out = 0;               // output features
  double weight = 0, bias = 0;  // elements (none for a ReLU)
  bool relu = false;            // its backward starts with ReluBackward (saves its output)
  bool linear = false;
};

struct Stage {
  std::vector<Op> ops;
  double in = 0;  // input features
  bool first = false, last = false;
};

std::vector<Stage> cut_stages(const MLPConfig& config, int stages) {
  // The Sequential: Linear, ReLU per hidden width, then the classifier.
  struct Layer {
    bool linear;
    double in, out;
  };
  std::vector<Layer> layers;
  double width = static_cast<double>(config.inputs);
  for (const int64_t h : config.hidden) {
    layers.push_back({true, width, static_cast<double>(h)});
    layers.push_back({false, static_cast<double>(h), static_cast<double>(h)});
    width = static_cast<double>(h);
  }
  layers.push_back({true, width, static_cast<double>(config.classes)});
  const std::vector<int64_t> balance = parallel::even_balance(static_cast<int64_t>(layers.size()), stages);
  std::vector<Stage> out;
  size_t at = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    Stage stage;
    stage.in = layers[at].in;
    stage.first = s == 0;
    stage.last = s + 1 == balance.size();
    const size_t end = at + static_cast<size_t>(balance[s]);
    for (size_t i = at; i < end; ++i) {
      const Layer& l = layers[i];
      if (!l.linear) {
        stage.ops.push_back({l.out, 0, 0, true, false});
        continue;
      }
      const bool fused = i + 1 < end && !layers[i + 1].linear;  // nn::Sequential's fusion
      stage.ops.push_back({l.out, l.out * l.in, l.out, fused, true});
      if (fused) ++i;
    }
    out.push_back(stage);
    at = end;
  }
  return out;
}

// A hand-off between neighbouring stages, at a point of each stage's thread (a point: what
// the thread holds then, in floats, its parameters' gradients among them).
struct Handoff {
  size_t point;  // the stage's point at which it is pushed (sender) or copied (receiver)
  double floats;  // what the channel alone holds between the two (0: the sender keeps it)
};

// One stage's thread through a step: its points, and its hand-offs by micro-batch.
struct Trajectory {
  std::vector<double> points{0};
  std::vector<parallel::Action> actions;
  std::vector<int> action_of{-1};  // each point's action (an index of `actions`; -1: before the first)
  std::vector<Handoff> send_forward, receive_forward, send_backward, receive_backward;
  double now = 0;
  void mark() {
    points.push_back(now);
    action_of.push_back(static_cast<int>(actions.size()) - 1);
  }
  // Where a point is, by the schedule's names of its actions: "in F3", "after B2", "done".
  std::string where(size_t point) const {
    if (point + 1 == points.size()) return "done";
    const int a = action_of[point];
    if (a < 0) return "not started";
    const bool ends = action_of[point + 1] != a;
    return (ends ? "after " : "in ") + parallel::actions_str({actions[static_cast<size_t>(a)]});
  }
  void add(double floats) {
    now += floats;
    mark();
  }
};

Trajectory replay(const Stage& stage, int s, int stages, const std::vector<double>& rows, bool one_f_one_b) {
  const auto m = static_cast<int64_t>(rows.size());
  Trajectory t;
  for (auto* h : {&t.send_forward, &t.receive_forward, &t.send_backward, &t.receive_backward}) h->resize(rows.size());
  const size_t n = stage.ops.size();
  bool grads_made = false;        // .grad exists once the first backward accumulated (zero_grad precedes the step)
  bool last_graph_alive = false;  // micro-batch m-1's recorded graph, which holds the accumulators
  for (const parallel::Action& a : parallel::stage_actions(
           one_f_one_b ? parallel::Schedule::OneFOneB : parallel::Schedule::GPipe, s, stages, m)) {
    t.actions.push_back(a);
    const auto j = static_cast<size_t>(a.micro_batch);
    const double r = rows[j];
    const bool checkpointed = a.micro_batch + 1 < m;  // except_last
    const double output = r * stage.ops.back().out;
    if (a.pass == parallel::Pass::Forward) {
      t.add(r * stage.in);  // the batch's slice copied in, or the previous stage's output received
      if (!stage.first) t.receive_forward[j] = {t.points.size() - 1, 0};
      double previous = 0;  // without grad each output is freed once the next op made its own
      for (const Op& op : stage.ops) {
        t.add(r * op.out);  // with grad every output stays: saved by its node, or the root
        if (checkpointed && previous > 0) t.add(-previous);
        previous = r * op.out;
      }
      if (stage.last) {
        t.add(1);  // the weighted loss (the step's loss); the logits stay the caller's output
      } else {
        if (checkpointed) t.add(-output);  // from here on the channel's alone
        t.send_forward[j] = {t.points.size() - 1, checkpointed ? output : 0};
      }
      if (!checkpointed) last_graph_alive = true;
      continue;
    }
    if (!stage.last) {  // the gradient of the output received
      t.add(output);
      t.receive_backward[j] = {t.points.size() - 1, 0};
    }
    if (checkpointed)  // the forward again, with grad (the last stage: new logits, a new weighted loss)
      for (const Op& op : stage.ops) t.add(r * op.out);
    // The gradient arriving at the next node. The received one stays the caller's
    // (Pipe's run_action) until the action ends.
    double flowing = stage.last ? 0 : output;
    bool flowing_received = !stage.last;
    auto let_go_flowing = [&] {
      if (!flowing_received) t.now -= flowing;
      flowing_received = false;
    };
    if (stage.last) {
      t.add(2);            // the seed (kept to the end) and MulBackward's gradient of the loss
      t.add(output);       // CrossEntropyBackward's gradient of the logits
      t.add(-1);
      flowing = output;
    }
    // Accumulators made by this graph run as soon as their Linear's node has (the engine
    // runs the latest made first); those of micro-batch m-1's graph, still alive, after the chain.
    const bool own_accumulators = !checkpointed || !last_graph_alive;
    std::vector<double> pending;
    for (size_t k = n; k-- > 0;) {
      const Op& op = stage.ops[k];
      const bool root = k + 1 == n;
      if (op.relu) {  // ReluBackward: the gradient before the ReLU, then its saved output let go
        t.add(r * op.out);
        if (!root) t.now -= r * op.out;
        let_go_flowing();
        t.mark();
        flowing = r * op.out;
      }
      if (!op.linear) continue;  // a ReLU alone, its stage's first op: its gradient is the leaf's
      const double a_in = k == 0 ? r * stage.in : r * stage.ops[k - 1].out;
      const double dx = stage.first && k == 0 ? 0 : a_in;  // the batch needs no gradient
      const double made = op.weight + op.bias;
      t.add(dx + made);  // the input's gradient (none for the batch), the weight's and the bias's
      let_go_flowing();
      t.mark();
      flowing = dx;
      if (!grads_made) continue;  // AccumulateGrad keeps the gradient itself as .grad
      if (own_accumulators) {
        t.now -= made;  // added into .grad at once, then freed
        t.mark();
      } else {
        pending.push_back(made);
      }
    }
    for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
      t.now -= *it;
      t.mark();
    }
    grads_made = true;
    // The stash let go: the input and the root (the last stage: the seed, and the recomputed
    // logits; the recorded ones are the caller's output); the input's gradient is the channel's.
    t.now -= r * stage.in + (stage.last ? 1 + (checkpointed ? output : 0) : output) + flowing;
    t.mark();
    if (!stage.first) t.send_backward[j] = {t.points.size() - 1, flowing};
    if (!stage.last) t.add(-output);  // the received gradient, once the action ends
    if (!checkpointed) last_graph_alive = false;
  }
  return t;
}

// One direction of a channel between neighbouring stages, hand-offs in the order both
// make them (micro-batch order, forward; the schedule's backward order, backward): by each
// point of the sender how many it has pushed, by each point of the receiver how many it
// has copied (and whether it holds one it has just copied), and their floats summed in order.
struct Link {
  std::vector<size_t> pushed, received;
  std::vector<bool> copying;
  std::vector<double> floats_before{0};

  Link(const std::vector<Handoff>& sends, size_t sender_points, const std::vector<Handoff>& receipts,
       size_t receiver_points)
      : pushed(sender_points, 0), received(receiver_points, 0), copying(receiver_points, false) {
    std::vector<size_t> order(sends.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return sends[x].point < sends[y].point; });
    for (const size_t j : order) {
      floats_before.push_back(floats_before.back() + sends[j].floats);
      ++pushed[sends[j].point];
      ++received[receipts[j].point];
      copying[receipts[j].point] = true;
    }
    for (size_t i = 1; i < pushed.size(); ++i) pushed[i] += pushed[i - 1];
    for (size_t i = 1; i < received.size(); ++i) received[i] += received[i - 1];
  }
  // The receiver cannot be past a copy of what the sender has not pushed.
  bool allows(size_t sender, size_t receiver) const { return received[receiver] <= pushed[sender]; }
  // What the channel alone holds: pushed, and not yet copied and let go.
  double holding(size_t sender, size_t receiver) const {
    const size_t from = received[receiver] - (copying[receiver] ? 1 : 0), to = pushed[sender];
    return to > from ? floats_before[to] - floats_before[from] : 0;
  }
};

// Stage s and s + 1's channels: activations forward, gradients back.
struct Neighbours {
  Link forward, backward;
  Neighbours(const Trajectory& x, const Trajectory& y)
      : forward(x.send_forward, x.points.size(), y.receive_forward, y.points.size()),
        backward(y.send_backward, y.points.size(), x.receive_backward, x.points.size()) {}
  // Whether point a of stage s and b of s + 1 can be at once, and what their channels hold then.
  bool together(size_t a, size_t b, double& channel) const {
    if (!forward.allows(a, b) || !backward.allows(b, a)) return false;
    channel = forward.holding(a, b) + backward.holding(b, a);
    return true;
  }
};

}  // namespace

std::optional<MLPPipeMemory> mlp_pipe_memory(const MLPConfig& config, int stages, int64_t rows, int64_t chunks,
                                             bool one_f_one_b, MLPOptimizer optimizer) {
  const auto layers = static_cast<int64_t>(2 * config.hidden.size() + 1);
  if (stages < 2 || stages > layers || rows < 1 || chunks < 1) return std::nullopt;
  std::vector<double> r;
  for (const int64_t size : parallel::comm::chunk_sizes(rows, chunks)) r.push_back(static_cast<double>(size));
  const std::vector<Stage> cut = cut_stages(config, stages);
  std::vector<Trajectory> threads;
  for (int s = 0; s < stages; ++s) threads.push_back(replay(cut[static_cast<size_t>(s)], s, stages, r, one_f_one_b));

  // Over the chain of stages (each meets its neighbours only): for every point of stage s,
  // the least and the most the stages 0..s (from the left) or s..p-1 (from the right) can
  // hold with it. `best` picks the least or the most.
  const auto S = static_cast<size_t>(stages);
  const double none = std::numeric_limits<double>::quiet_NaN();
  std::vector<Neighbours> links;
  for (size_t s = 0; s + 1 < threads.size(); ++s) links.emplace_back(threads[s], threads[s + 1]);
  struct Sweep {
    std::vector<std::vector<double>> value;
    std::vector<std::vector<size_t>> from;  // the neighbour's point the value was reached with
  };
  auto sweep = [&](bool most, bool from_left) {
    Sweep w{std::vector<std::vector<double>>(S), std::vector<std::vector<size_t>>(S)};
    for (size_t k = 0; k < S; ++k) {
      const size_t s = from_left ? k : S - 1 - k;
      const Trajectory& here = threads[s];
      w.value[s].assign(here.points.size(), none);
      w.from[s].assign(here.points.size(), 0);
      for (size_t i = 0; i < here.points.size(); ++i) {
        if (k == 0) {
          w.value[s][i] = here.points[i];
          continue;
        }
        const size_t o = from_left ? s - 1 : s + 1;
        double pick = none;
        for (size_t i2 = 0; i2 < threads[o].points.size(); ++i2) {
          if (std::isnan(w.value[o][i2])) continue;
          double channel = 0;
          const bool ok = from_left ? links[o].together(i2, i, channel) : links[s].together(i, i2, channel);
          if (!ok) continue;
          const double v = w.value[o][i2] + channel;
          if (std::isnan(pick) || (most ? v > pick : v < pick)) {
            pick = v;
            w.from[s][i] = i2;
          }
        }
        if (!std::isnan(pick)) w.value[s][i] = pick + here.points[i];
      }
    }
    return w;
  };
  const Sweep least_left = sweep(false, true), least_right = sweep(false, false), most_left = sweep(true, true);
  // Each stage's place at a moment, followed from one point along the sweeps' choices.
  auto places = [&](size_t s, size_t i, const Sweep* left, const Sweep* right) {
    std::vector<std::string> at(S);
    at[s] = threads[s].where(i);
    for (size_t k = s, p = i; left && k > 0; --k) at[k - 1] = threads[k - 1].where(p = left->from[k][p]);
    for (size_t k = s, p = i; right && k + 1 < S; ++k) at[k + 1] = threads[k + 1].where(p = right->from[k][p]);
    return at;
  };
  double low = 0, high = 0;
  std::vector<std::string> low_at, high_at;
  for (size_t s = 0; s < S; ++s)
    for (size_t i = 0; i < threads[s].points.size(); ++i) {
      if (std::isnan(least_left.value[s][i]) || std::isnan(least_right.value[s][i])) continue;
      // Every run passes stage s's point i; the least the others can hold with it.
      const double v = least_left.value[s][i] + least_right.value[s][i] - threads[s].points[i];
      if (v > low) {
        low = v;
        low_at = places(s, i, &least_left, &least_right);
      }
    }
  for (size_t i = 0; i < threads[S - 1].points.size(); ++i)
    if (!std::isnan(most_left.value[S - 1][i]) && most_left.value[S - 1][i] > high) {
      high = most_left.value[S - 1][i];
      high_at = places(S - 1, i, &most_left, nullptr);
    }
  // After the threads: every stage at its end, the outputs gathered into one tensor.
  double end = static_cast<double>(rows) * static_cast<double>(config.classes) + 1;  // and the losses summed
  for (const Trajectory& t : threads) end += t.points.back();
  const std::vector<std::string> gathered(S, "gathering the outputs");
  if (end > low) {
    low = end;
    low_at = gathered;
  }
  if (end > high) {
    high = end;
    high_at = gathered;
  }

  const std::vector<int64_t> numels = mlp_parameter_numels(config);
  double psi = 0;
  for (const int64_t x : numels) psi += static_cast<double>(x);
  MLPPipeMemory out;
  out.low.params = kFloat * psi;
  out.low.optimizer = mlp_optimizer_bytes(optimizer, psi, static_cast<double>(numels.size()));
  // The running loss beside the stages' threads (the batch is the data's).
  out.low.activations = kFloat * (low + 1);
  out.racing = kFloat * (high - low);
  out.low_at = low_at;
  out.high_at = high_at;
  return out;
}

}  // namespace mg::plan
