// Note [Graphed steps] in train/graphed_step.h.
#include "train/graphed_step.h"

#include <algorithm>

#include "core/error.h"

namespace eg::train {

GraphPolicy::GraphPolicy(int warmup, int64_t limit) : warmup_(warmup), limit_(limit) {
  EG_CHECK(warmup >= 1, "internal: a graphed step warms up at least once");
  EG_CHECK(limit >= 1, "--cuda-graph-limit must be at least 1, got ", limit);
}

void GraphPolicy::reset() {
  eager_ = 0;
  clock_ = 0;
  seen_.clear();
  captured_.clear();
}

GraphPolicy::Action GraphPolicy::next(const GraphKey& key, bool ready, std::optional<GraphKey>* evict) {
  evict->reset();
  const int64_t seen = ++seen_[key];
  ++clock_;
  if (auto it = captured_.find(key); it != captured_.end()) {
    it->second = clock_;
    return Action::replay;
  }
  // Warm-up, and a shape's first step: eager.
  if (eager_ < warmup_ || !ready || seen < 2) {
    ++eager_;
    return Action::eager;
  }
  if (int64_t(captured_.size()) >= limit_) {
    auto least = captured_.begin();  // the fewest steps; of those, the one idle longest
    for (auto it = captured_.begin(); it != captured_.end(); ++it) {
      const int64_t a = seen_.at(it->first), b = seen_.at(least->first);
      if (a < b || (a == b && it->second < least->second)) least = it;
    }
    // Twice as often: two shapes about as frequent do not take turns (each turn a capture).
    if (seen <= 2 * seen_.at(least->first)) return Action::eager;
    *evict = least->first;
    captured_.erase(least);
  }
  captured_[key] = clock_;
  return Action::capture;
}

Tensor GraphInput::place(const Shape& shape, DType dtype, Device dev, int64_t reserve) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (!buf_.defined() || buf_.dtype() != dtype || buf_.device() != dev || buf_.numel() < n) {
    if (buf_.defined()) ++moves_;
    buf_ = Tensor::empty({std::max(n, reserve)}, dtype, dev);
  }
  return buf_.slice(0, n).reshape(shape);
}

GraphedStep::GraphedStep(dist::Strategy& strategy, optim::Optimizer& opt, Generator* gen, Options o)
    : strategy_(strategy), opt_(opt), gen_(gen), o_(o), policy_(o.warmup, o.limit) {
  EG_CHECK(strategy.device().is_cuda(), "--cuda-graphs on runs on a GPU (--device cuda), not on ",
           strategy.device().str());
  EG_CHECK(strategy.steps_on_device(), "--cuda-graphs on: a captured step is one process's (this run has ",
           strategy.size(), " ranks); use --cuda-graphs off");
}

GraphedStep::~GraphedStep() = default;

int64_t GraphedStep::replays() const { return last_ ? last_->replays() : 0; }

size_t GraphedStep::graph_bytes() const { return pool_ ? pool_->bytes() : 0; }

void GraphedStep::reset() {
  graphs_.clear();
  pool_.reset();  // released with its last graph: the next captures start a pool of their own
  last_ = nullptr;
  policy_.reset();
}

dist::DeviceStep GraphedStep::capture(Graph& g, const std::function<Tensor()>& forward, int64_t samples) {
  try {
    if (o_.before_capture) o_.before_capture();
    g.graph = std::make_unique<DeviceGraph>(strategy_.device(), pool_);  // Note [Shared graph pools]
    if (!pool_) pool_ = g.graph->pool();
  } catch (...) {
    reset();  // no graph half made: the policy's record of this one goes too
    throw;
  }
  const uint64_t before = gen_ ? gen_->offset() : 0;
  try {
    g.graph->capture([&] {
      g.outputs = strategy_.step_on_device(forward(), samples, opt_, o_.grad_clip);
      if (g.outputs.loss.defined()) g.outputs.loss = g.outputs.loss.detach();  // its graph freed, its storage kept
    });
    opt_.check_replayable();
  } catch (const Error& e) {
    // The captured host code ran (counters moved) for a step that never ran: no way on.
    reset();
    EG_THROW(e.what(),
             "; the run stops (its files are as the last checkpoint left them): --cuda-graphs off "
             "trains this step eagerly");
  } catch (...) {
    reset();  // no graph left half made, whatever was thrown
    throw;
  }
  g.drawn = gen_ ? gen_->offset() - before : 0;
  ++captures_;
  last_ = g.graph.get();
  g.graph->replay();  // the capture ran nothing: this is its step
  return g.outputs;
}

dist::StepResult GraphedStep::run(const GraphKey& key, const std::function<Tensor()>& forward, int64_t samples,
                                  bool eager) {
  EG_CHECK(samples > 0, "internal: a graphed step has samples");
  const Device dev = strategy_.device();
  // What replays read from the device, written before the step (no host wait).
  if (gen_) {
    gen_->mark_step();
    (void)gen_->state_on(dev);
  }
  opt_.prepare_replay(dev);
  dist::DeviceStep d;
  replayed_last_ = false;
  std::optional<GraphKey> evict;
  const GraphPolicy::Action a = eager ? GraphPolicy::Action::eager : policy_.next(key, opt_.ready_to_capture(), &evict);
  if (evict) {
    if (last_ == graphs_.at(*evict).graph.get()) last_ = nullptr;
    graphs_.erase(*evict);  // its blocks idle in the pool, for the new capture
  }
  switch (a) {
    case GraphPolicy::Action::eager: d = strategy_.step_on_device(forward(), samples, opt_, o_.grad_clip); break;
    case GraphPolicy::Action::capture: d = capture(graphs_[key], forward, samples); break;
    case GraphPolicy::Action::replay: {
      Graph& g = graphs_.at(key);
      g.graph->replay();
      if (gen_) (void)gen_->reserve(g.drawn);
      d = g.outputs;
      replayed_last_ = true;
      ++replayed_steps_;
      break;
    }
  }
  return dist::deferred_result(d, samples, o_.grad_clip);
}

}  // namespace eg::train
