// Note [Graphed steps] in train/graphed_step.h.
#include "train/graphed_step.h"

#include <cmath>

#include "core/error.h"

namespace eg::train {

GraphedStep::GraphedStep(dist::Strategy& strategy, optim::Optimizer& opt, Generator* gen, Options o)
    : strategy_(strategy), opt_(opt), gen_(gen), o_(o) {
  EG_CHECK(strategy.device().is_cuda(), "--cuda-graphs on runs on a GPU (--device cuda), not on ",
           strategy.device().str());
  EG_CHECK(strategy.steps_on_device(), "--cuda-graphs on: a captured step is one process's (this run has ",
           strategy.size(), " ranks); use --cuda-graphs off");
  EG_CHECK(o.warmup >= 1, "internal: a graphed step warms up at least once");
}

GraphedStep::~GraphedStep() = default;

bool GraphedStep::replaying() const { return graph_ && graph_->captured(); }

int64_t GraphedStep::replays() const { return graph_ ? graph_->replays() : 0; }

size_t GraphedStep::graph_bytes() const { return graph_ ? graph_->pool_bytes() : 0; }

void GraphedStep::reset() {
  outputs_ = {};
  graph_.reset();
  eager_ = 0;
  drawn_ = 0;
  samples_ = 0;
}

dist::StepResult GraphedStep::run(const std::function<Tensor()>& forward, int64_t samples, bool eager) {
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
  if (eager) {
    d = strategy_.step_on_device(forward(), samples, opt_, o_.grad_clip);
  } else if (replaying()) {
    EG_CHECK(samples == samples_, "internal: a graph captured for ", samples_, " samples replayed for ", samples,
             " (reset() first)");
    graph_->replay();
    if (gen_) (void)gen_->reserve(drawn_);
    d = outputs_;
    replayed_last_ = true;
    ++replayed_steps_;
  } else if (eager_ < o_.warmup || !opt_.ready_to_capture()) {
    ++eager_;
    d = strategy_.step_on_device(forward(), samples, opt_, o_.grad_clip);
  } else {
    if (o_.before_capture) o_.before_capture();
    graph_ = std::make_unique<DeviceGraph>(dev);
    const uint64_t before = gen_ ? gen_->offset() : 0;
    try {
      graph_->capture([&] {
        outputs_ = strategy_.step_on_device(forward(), samples, opt_, o_.grad_clip);
        if (outputs_.loss.defined()) outputs_.loss = outputs_.loss.detach();  // its graph freed, its storage kept
      });
      opt_.check_replayable();
    } catch (const Error& e) {
      // The captured host code ran (counters moved) for a step that never ran: no way on.
      outputs_ = {};
      graph_.reset();
      EG_THROW(e.what(),
               "; the run stops (its files are as the last checkpoint left them): --cuda-graphs off "
               "trains this step eagerly");
    }
    drawn_ = gen_ ? gen_->offset() - before : 0;
    samples_ = samples;
    ++captures_;
    graph_->replay();  // the capture ran nothing: this is its step
    d = outputs_;
  }
  return dist::deferred_result(d, samples, o_.grad_clip);
}

}  // namespace eg::train
