// Define-by-run autograd: Nodes and edges of the backward graph.
// An op records a Node only when grad mode is on and some input requires grad. A
// Node's `next` edges point at the Nodes that produced its inputs (an AccumulateGrad
// for a leaf that requires grad, nothing for an input that does not), so
// needs_input_grad(i) tells a backward which gradients anyone wants: a frozen conv's
// weight has no edge, and its weight-gradient kernel is never run.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace eg::autograd {

using Tensors = std::vector<Tensor>;

struct Node;
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
};

// Note [Iterative graph destruction]
// A graph is a chain of shared_ptrs (Node -> Edge -> Node, and Node -> saved tensor ->
// its grad_fn). Freed recursively, a deep network's graph (ResNet-110, a long
// sequence) overflows the stack. ~Node therefore moves the nodes it solely owns onto
// an explicit stack and frees them one at a time (take_children).
struct Node {
  virtual ~Node();
  // Moves out the Nodes this node keeps alive (edges; saved tensors' histories when
  // this node holds the last reference to them), for iterative destruction.
  virtual void take_children(std::vector<std::shared_ptr<Node>>& out);
  // Gradients w.r.t. each input (one per `next` edge; undefined where not needed)
  // from the gradients w.r.t. each output (undefined for outputs nobody used).
  virtual Tensors apply(Tensors grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors once the backward has run (unless retain_graph).
  virtual void release() {}

  bool needs_input_grad(size_t i) const { return i < next.size() && next[i].fn != nullptr; }
  // Where input i's gradient may be added as it is computed (undefined: nowhere); set by
  // the engine while apply() runs. See Note [Gradient destinations].
  const Tensor& destination(size_t i) const {
    static const Tensor none;
    return i < destinations.size() ? destinations[i] : none;
  }
  std::vector<Edge> next;
  std::vector<Tensor> destinations;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;  // creation order; later nodes run first when several are ready
};

// Sink for a leaf tensor: accumulates into its .grad (in place when it exists, so a
// gradient that lives in an optimizer bucket stays there).
// It runs as soon as its gradient is complete, ahead of every other ready node (the
// highest sequence number, as in PyTorch): a parameter's gradient is then final as early
// as backward allows, which the overlapped gradient sync relies on (Note [Gradient-ready hook]).
struct AccumulateGrad final : Node {
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> v) : var(std::move(v)) { sequence_nr = UINT64_MAX; }
  Tensors apply(Tensors grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  std::weak_ptr<TensorImpl> var;
};

// A Node whose backward is a function over saved tensors. The saved tensors are
// dropped by release(), so activations are freed as soon as their backward ran.
struct FunctionNode final : Node {
  using Backward = std::function<Tensors(const Tensors& grad_outputs, const Tensors& saved, const Node& self)>;
  FunctionNode(std::string n, Backward b) : name_(std::move(n)), backward_(std::move(b)) {}
  Tensors apply(Tensors grads) override;
  std::string name() const override { return name_; }
  void release() override {
    saved.clear();
    released_ = true;
  }
  ~FunctionNode() override;
  Tensors saved;
  void take_children(std::vector<std::shared_ptr<Node>>& out) override;

 private:
  std::string name_;
  Backward backward_;
  bool released_ = false;
};

// Note [Gradient destinations]
// A gradient with two terms is summed in a pass of its own: a residual block's input
// (the shortcut's term and the first convolution's), a parameter's .grad (which lives in
// an optimizer bucket, and takes an axpy). When a node runs and the engine already holds
// one term of an input's gradient, it offers that term to the node as the input's
// destination(i): a buffered gradient that nothing but the engine references, or the
// leaf's .grad. A backward that can add its result into it as it computes it (cuDNN's
// beta = 1, MXNet's kAddTo) does, and returns the destination itself; the engine then has
// nothing left to add. A backward that does not returns a gradient of its own, summed
// as before. The sum's terms come in the same order either way, so where a kernel computes
// and then adds (ref, cpu) the bits are the separate add's. On by default;
// EG_GRAD_DESTINATIONS=0 (or set_gradient_destinations(false), on this thread) turns it
// off, to compare.
bool gradient_destinations();
void set_gradient_destinations(bool on);

// Grad mode (thread-local). NoGradGuard disables recording for its scope.
bool grad_enabled();
void set_grad_enabled(bool on);
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// True when an op on these inputs must record a Node.
bool needs_record(const Tensors& inputs);
// Records `node` as the producer of `outputs` from `inputs` (sets edges, grad_fn,
// requires_grad). Call only when needs_record(inputs).
void record(const std::shared_ptr<Node>& node, const Tensors& inputs, const std::vector<Tensor*>& outputs);
// Convenience: makes a FunctionNode and records it when needed; returns it (or null).
std::shared_ptr<FunctionNode> record_function(const char* name, const Tensors& inputs,
                                              const std::vector<Tensor*>& outputs, Tensors saved,
                                              FunctionNode::Backward backward);

// Runs the backward pass from `roots` with `grads` (undefined: ones, for a scalar
// root). Iterative (no recursion), so a 1000-layer network cannot overflow the stack.
void backward(const Tensors& roots, const Tensors& grads = {}, bool retain_graph = false);

// Note [Gradient-ready hook]
// Data-parallel training starts a bucket's all-reduce as soon as its last gradient is
// complete (dist/grad_sync.h), so the engine says when a leaf's .grad is final in this
// backward. A leaf used k times in the graph (a tied embedding: source, target and output
// projection) has k AccumulateGrad nodes, one per use; the engine counts them in its
// first pass and calls the hook after the last has run. A leaf the graph does not reach
// (unused, or frozen) is never announced: the caller handles what was not. The hook runs
// on the thread that called backward(), which installs it for its own backward passes.
using GradReadyHook = std::function<void(const TensorImpl* leaf)>;
class GradReadyScope {
 public:
  explicit GradReadyScope(GradReadyHook hook);
  ~GradReadyScope();
  GradReadyScope(const GradReadyScope&) = delete;
  GradReadyScope& operator=(const GradReadyScope&) = delete;

 private:
  GradReadyHook prev_;
};

// Number of Nodes reachable from t's grad_fn (tests: a frozen prefix records none).
size_t graph_size(const Tensor& t);

}  // namespace eg::autograd
