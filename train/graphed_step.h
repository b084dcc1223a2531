// A training step captured once as a CUDA graph and replayed (`--cuda-graphs on`).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

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
// step's are (Note [Deferred reads]).
//
// A graph serves batches of one shape (its key; the caller's inputs for that shape must
// keep their storage while the graph lives), so a task whose batches take several shapes
// (translation: lengths padded to a multiple, data::BatcherOptions::pad_to_multiple) gets
// a graph per shape, as torch.compile's CUDA graphs do, up to `limit` of them, all
// capturing into one private pool (Note [Shared graph pools] in core/device_graph.h: the
// memory of the largest step's activations, not the sum; each replay's outputs are read,
// their deferred copies queued, before another graph replays). A shape's first step runs eagerly (its
// blocks and plans made outside a capture), its second is captured. With `limit` graphs
// held, a new shape is captured only once it has been seen more than twice as often as
// the least-used graph's, which is dropped: the graphs settle on the most frequent shapes
// without two about as frequent taking turns, and the others' steps run eagerly
// (GraphPolicy). The sample count is the step's own: one
// process's captured step is the same for any count > 0 (it only decides that the
// optimizer steps). A step that runs other work (a freeze, an unfreeze: another frozen
// prefix) needs other graphs: reset() drops them all and the next steps warm up anew.

using GraphKey = std::vector<int64_t>;

// Which steps a GraphedStep runs eagerly, captures or replays (Note [Graphed steps]).
class GraphPolicy {
 public:
  enum class Action { eager, capture, replay };
  GraphPolicy(int warmup, int64_t limit);
  // The next step, of a batch of shape `key`; `ready`: the optimizer would capture
  // (Optimizer::ready_to_capture). On a capture with `limit` graphs held, `evict` is set
  // to the key of the graph to drop first.
  Action next(const GraphKey& key, bool ready, std::optional<GraphKey>* evict);
  void reset();  // no graph held; warm-up anew
  int64_t graphs() const { return int64_t(captured_.size()); }

 private:
  int warmup_;
  int64_t limit_;
  int eager_ = 0;  // warm-up steps since the last reset
  uint64_t clock_ = 0;  // steps since the last reset
  std::map<GraphKey, int64_t> seen_;  // steps of each shape since the last reset
  std::map<GraphKey, uint64_t> captured_;  // a graph's key and when it last ran
};

// A graph's input tensor, kept by the task: the batches of every shape at one address,
// views of the front of one device buffer, so that each shape's graph goes on reading
// where its batches are written (Note [Graphed steps]). The buffer moves only to grow
// (or change dtype); moves() counts that, after which every graph reading it is stale.
class GraphInput {
 public:
  // A contiguous [shape] view of the buffer's front, on `dev`; `reserve` (elements, with a
  // smaller shape) makes the buffer that big at once, so that it need not move later.
  Tensor place(const Shape& shape, DType dtype, Device dev, int64_t reserve = 0);
  int64_t moves() const { return moves_; }

 private:
  Tensor buf_;  // 1-D
  int64_t moves_ = 0;
};

class GraphedStep {
 public:
  struct Options {
    int warmup = 3;  // eager steps before the first capture (more while the optimizer is not ready_to_capture)
    double grad_clip = 0;  // > 0: the gradients' global norm clipped to it
    // Called before a capture: other threads' GPU work (the plasticity reference's) waits
    // until it is over, which a capture on another thread might otherwise not survive.
    std::function<void()> before_capture;
    int64_t limit = 1;  // graphs held at once (--cuda-graph-limit)
  };
  // `gen`: the generator the model's dropout draws from (nullptr: none).
  GraphedStep(dist::Strategy& strategy, optim::Optimizer& opt, Generator* gen, Options o);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // One step of this rank's `samples` (> 0) of a batch of shape `key`; `forward` returns
  // the loss (its autocast scope inside). Replays the shape's graph once captured; `eager`
  // runs this one step eagerly (a plasticity reading's), the graphs kept and the warm-up
  // not advanced.
  dist::StepResult run(const GraphKey& key, const std::function<Tensor()>& forward, int64_t samples,
                       bool eager = false);
  // The last run() replayed a graph: its host code did not run (a capture's did).
  bool replayed_last() const { return replayed_last_; }
  void reset();  // the graphs dropped: the next steps warm up and capture again
  int64_t captures() const { return captures_; }
  int64_t graphs() const { return int64_t(graphs_.size()); }
  int64_t replays() const;  // of the graph captured last, its capture's step included
  int64_t replayed_steps() const { return replayed_steps_; }  // steps replayed over every graph (captures not counted)
  size_t graph_bytes() const;  // what the graphs' pool holds on the device

 private:
  struct Graph {
    std::unique_ptr<DeviceGraph> graph;
    dist::DeviceStep outputs;  // the graph's: written by every replay
    uint64_t drawn = 0;  // the generator's counters the captured step reserved
  };
  dist::DeviceStep capture(Graph& g, const std::function<Tensor()>& forward, int64_t samples);

  dist::Strategy& strategy_;
  optim::Optimizer& opt_;
  Generator* gen_;
  Options o_;
  GraphPolicy policy_;
  std::map<GraphKey, Graph> graphs_;
  std::shared_ptr<GraphPool> pool_;  // every graph's (Note [Shared graph pools]); none before a capture
  const DeviceGraph* last_ = nullptr;  // captured last
  int64_t captures_ = 0;
  bool replayed_last_ = false;
  int64_t replayed_steps_ = 0;
};

}  // namespace eg::train
