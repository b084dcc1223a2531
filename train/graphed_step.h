// A training step captured once as a CUDA graph and replayed (`--cuda-graphs on`).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device_graph.h"
#include "core/rng.h"
#include "dist/strategy.h"
#include "optim/optimizer.h"

namespace eg::train {

// Note [Graphed steps]
// On a GPU, one process, a training step is all device work: the forward from inputs the
// caller keeps (the same tensors every step), backward, loss scaling's unscale, skip and
// update, clipping and the optimizer (Strategy::step_on_device). A GraphedStep runs it eagerly for
// `warmup` steps (cuDNN's plans, the allocators' blocks, the optimizer's state and a
// frozen prefix's autocast weights are made then), and on while the optimizer would
// still launch host values (an fp16 overflow skips the step that makes SGD's momentum
// buffers: Optimizer::ready_to_capture), captures the next one into a
// DeviceGraph (Note [Device graphs] in core/device_graph.h) and replays that graph for
// every step after, the capture's own step included. Around a replay the host does what
// the captured host code did once: before it, the model's generator marks the step and
// its seed and base counter are rewritten on the device (Note [Random state on the
// device] in core/rng.h) and the learning rate is written where the optimizer's kernels
// read it; after it, the generator moves past the counters the step reserved (the
// optimizer keeps its step counts on the device, advanced by the replay). The loss and the
// gradient norm are the graph's output tensors, each replay's read late as an eager
// step's are (Note [Deferred reads]). A step that runs other work (a freeze, an
// unfreeze, another batch shape or sample count) needs another graph: reset() drops this
// one and the next steps warm up and capture anew.
class GraphedStep {
 public:
  struct Options {
    int warmup = 3;  // eager steps before the capture (more while the optimizer is not ready_to_capture)
    double grad_clip = 0;  // > 0: the gradients' global norm clipped to it
    // Called before a capture: other threads' GPU work (the plasticity reference's) waits
    // until it is over, which a capture on another thread might otherwise not survive.
    std::function<void()> before_capture;
  };
  // `gen`: the generator the model's dropout draws from (nullptr: none).
  GraphedStep(dist::Strategy& strategy, optim::Optimizer& opt, Generator* gen, Options o);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // One step of this rank's `samples` (> 0); `forward` returns the loss (its autocast
  // scope inside). Replays the graph once captured, with the same sample count; `eager`
  // runs this one step eagerly (a plasticity reading's), the graph kept and the warm-up
  // not advanced.
  dist::StepResult run(const std::function<Tensor()>& forward, int64_t samples, bool eager = false);
  bool replaying() const;
  // The last run() replayed the graph: its host code did not run (a capture's did).
  bool replayed_last() const { return replayed_last_; }
  void reset();  // the next steps warm up and capture again
  int64_t captures() const { return captures_; }
  int64_t replays() const;  // of the graph captured last, its capture's step included
  int64_t replayed_steps() const { return replayed_steps_; }  // steps replayed over every graph (captures not counted)
  size_t graph_bytes() const;  // what its allocations hold on the device

 private:
  dist::Strategy& strategy_;
  optim::Optimizer& opt_;
  Generator* gen_;
  Options o_;
  int eager_ = 0;  // warm-up steps since the last reset
  int64_t captures_ = 0;
  std::unique_ptr<DeviceGraph> graph_;
  dist::DeviceStep outputs_;  // the graph's: written by every replay
  uint64_t drawn_ = 0;  // the generator's counters the captured step reserved
  int64_t samples_ = 0;  // the captured step's
  bool replayed_last_ = false;
  int64_t replayed_steps_ = 0;
};

}  // namespace eg::train
