// The backward engine: dependency counting over the reachable graph, then a ready
// queue ordered by sequence number (latest first), with per-node gradient buffers.
// Both passes use explicit stacks; nothing recurses.
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <queue>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autograd/node.h"
#include "kernels/ops.h"

namespace eg::autograd {

namespace {

// The gradient a scalar root's backward starts from: 1, as a copy made on the root's
// device of a 1 kept there, not one written on the host and uploaded, which on a GPU
// would make every backward wait for the host (Note [Host syncs] in core/device.h). The
// kept ones live until the process exits (never freed: no device memory is released
// after the allocators are gone).
Tensor unit_gradient(const Tensor& root) {
  static std::mutex mu;
  static auto* ones = new std::map<std::tuple<int, int, int>, Tensor>();
  const Device d = root.device();
  Tensor one;
  {
    std::lock_guard<std::mutex> lock(mu);
    Tensor& kept = (*ones)[{int(d.type), d.index, int(root.dtype())}];
    if (!kept.defined()) kept = Tensor::ones({1}, root.dtype(), d);
    one = kept;
  }
  return one.reshape(root.shape()).clone();
}
thread_local bool g_grad_enabled = true;
thread_local bool g_destinations = [] {
  const char* e = std::getenv("EG_GRAD_DESTINATIONS");
  return !(e && std::string(e) == "0");
}();
thread_local GradReadyHook g_grad_ready;
uint64_t next_sequence_nr() {
  static std::atomic<uint64_t> n{0};
  return n++;
}

// a + b without touching either (they may be aliased elsewhere).
Tensor add_grads(const Tensor& a, const Tensor& b) {
  EG_CHECK(a.shape() == b.shape(), "gradient shapes disagree: ", shape_str(a.shape()), " vs ", shape_str(b.shape()));
  Tensor r = Tensor::empty(a.shape(), a.dtype(), a.device());
  ops::call(ops::binary_fwd, ops::Binary::add, a, b, r);  // one pass (a clone and an axpy took two)
  return r;
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
bool gradient_destinations() { return g_destinations; }
void set_gradient_destinations(bool on) { g_destinations = on; }
GradReadyScope::GradReadyScope(GradReadyHook hook) : prev_(std::exchange(g_grad_ready, std::move(hook))) {}
GradReadyScope::~GradReadyScope() { g_grad_ready = std::move(prev_); }
void set_grad_enabled(bool on) { g_grad_enabled = on; }

Tensors AccumulateGrad::apply(Tensors grads) {
  auto v = var.lock();
  if (!v || !grads[0].defined()) return {};
  Tensor g = grads[0];
  EG_CHECK(g.shape() == v->shape, "gradient of shape ", shape_str(g.shape()), " for a parameter of shape ",
           shape_str(v->shape));
  if (v->grad) {
    Tensor acc(v->grad);
    ops::call(ops::axpy, g, acc, 1.0);
  } else {
    v->grad = g.clone().impl_ptr();
  }
  return {};
}

void Node::take_children(std::vector<std::shared_ptr<Node>>& out) {
  for (auto& e : next)
    if (e.fn) out.push_back(std::move(e.fn));
}

void FunctionNode::take_children(std::vector<std::shared_ptr<Node>>& out) {
  Node::take_children(out);
  for (auto& t : saved)
    if (t.defined() && t.impl_ptr().use_count() == 1 && t.impl().grad_fn) out.push_back(std::move(t.impl().grad_fn));
  saved.clear();
}

namespace {
// See Note [Iterative graph destruction]. Called from each destructor that owns
// children, where the virtual take_children still resolves to that class.
void release_graph(Node& self) {
  std::vector<std::shared_ptr<Node>> stack;
  self.take_children(stack);
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    if (n.use_count() == 1) n->take_children(stack);
  }
}
}  // namespace

Node::~Node() { release_graph(*this); }
FunctionNode::~FunctionNode() { release_graph(*this); }

Tensors FunctionNode::apply(Tensors grads) {
  EG_CHECK(!released_, "backward through ", name_,
           " a second time: its saved tensors were freed; pass retain_graph=true to the first backward");
  bool any = false;
  for (auto& g : grads) any |= g.defined();
  if (!any) return Tensors(next.size());
  return backward_(grads, saved, *this);
}

bool needs_record(const Tensors& inputs) {
  if (!g_grad_enabled) return false;
  for (auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& node, const Tensors& inputs, const std::vector<Tensor*>& outputs) {
  node->sequence_nr = next_sequence_nr();
  node->next.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    if (t.grad_fn()) node->next[i] = {t.grad_fn(), t.impl().output_nr};
    else node->next[i] = {std::make_shared<AccumulateGrad>(t.impl_ptr()), 0};
  }
  node->num_outputs = uint32_t(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    TensorImpl& o = outputs[k]->impl();
    o.grad_fn = node;
    o.output_nr = uint32_t(k);
    o.requires_grad = true;
  }
}

std::shared_ptr<FunctionNode> record_function(const char* name, const Tensors& inputs,
                                              const std::vector<Tensor*>& outputs, Tensors saved,
                                              FunctionNode::Backward backward) {
  if (!needs_record(inputs)) return nullptr;
  auto n = std::make_shared<FunctionNode>(name, std::move(backward));
  n->saved = std::move(saved);
  record(n, inputs, outputs);
  return n;
}

namespace {
// Sets n.destinations (Note [Gradient destinations]): for each input, the term of its
// gradient the engine already holds, if nothing else can see it change: a buffered
// gradient referenced by the buffer alone (no other buffer, no view, no caller), or a
// leaf's .grad, which AccumulateGrad would add into in place anyway.
void offer_destinations(Node& n, std::unordered_map<Node*, Tensors>& buffers) {
  n.destinations.assign(n.next.size(), Tensor());
  for (size_t i = 0; i < n.next.size(); ++i) {
    const Edge& e = n.next[i];
    if (!e.fn) continue;
    if (auto* a = dynamic_cast<AccumulateGrad*>(e.fn.get())) {
      if (auto v = a->var.lock(); v && v->grad) n.destinations[i] = Tensor(v->grad);
      continue;
    }
    auto it = buffers.find(e.fn.get());
    if (it == buffers.end() || e.input_nr >= it->second.size()) continue;
    bool twice = false;  // one term offered to two of n's inputs would be added to twice
    for (size_t j = 0; j < i; ++j) twice |= n.next[j].fn == e.fn && n.next[j].input_nr == e.input_nr;
    if (twice) continue;
    const Tensor& b = it->second[e.input_nr];
    if (b.defined() && b.impl_ptr().use_count() == 1 && b.impl().storage.use_count() == 1) n.destinations[i] = b;
  }
}
}  // namespace

void backward(const Tensors& roots, const Tensors& grads, bool retain_graph) {
  NoGradGuard no_grad;  // the backward itself records nothing
  const bool destinations = g_destinations;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, Tensors> buffers;
  std::vector<Node*> stack;
  auto seed = [&](Node* n, uint32_t nr, const Tensor& g) {
    Tensors& b = buffers[n];
    if (b.size() < n->num_outputs) b.resize(n->num_outputs);
    b[nr] = b[nr].defined() ? add_grads(b[nr], g) : g;
  };
  std::vector<std::shared_ptr<Node>> leaf_roots;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    EG_CHECK(r.requires_grad(), "backward() on a tensor that does not require grad (", r.str(),
             "): nothing in its history has requires_grad=true, or it was computed under NoGradGuard");
    Tensor g = i < grads.size() && grads[i].defined() ? grads[i] : Tensor();
    if (!g.defined()) {
      EG_CHECK(r.numel() == 1, "backward() without a gradient needs a scalar, got shape ", shape_str(r.shape()));
      g = unit_gradient(r);
    }
    std::shared_ptr<Node> fn = r.grad_fn();
    uint32_t nr = r.impl().output_nr;
    if (!fn) {  // a leaf as root: accumulate directly
      fn = std::make_shared<AccumulateGrad>(r.impl_ptr());
      leaf_roots.push_back(fn);
      nr = 0;
    }
    seed(fn.get(), nr, g);
    stack.push_back(fn.get());
  }
  // Pass 1: count how many edges reach each node, and (for the gradient-ready hook) how
  // many AccumulateGrad nodes each leaf has. See Note [Gradient-ready hook].
  const GradReadyHook& hook = g_grad_ready;
  std::unordered_map<const TensorImpl*, int> uses;
  auto count_use = [&](Node* n) {
    if (auto* a = dynamic_cast<AccumulateGrad*>(n))
      if (auto v = a->var.lock()) ++uses[v.get()];
  };
  std::unordered_set<Node*> seen(stack.begin(), stack.end());
  if (hook)
    for (Node* n : seen) count_use(n);
  std::vector<Node*> todo(seen.begin(), seen.end());
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    for (auto& e : n->next) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) {
        todo.push_back(e.fn.get());
        if (hook) count_use(e.fn.get());
      }
    }
  }
  // Pass 2: run nodes whose dependencies are all satisfied, latest first.
  auto later = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later)> ready(later);
  for (Node* n : std::unordered_set<Node*>(stack.begin(), stack.end()))
    if (deps[n] == 0) ready.push(n);
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Tensors in = std::move(buffers[n]);
    buffers.erase(n);
    in.resize(n->num_outputs);
    if (destinations) offer_destinations(*n, buffers);
    Tensors out = n->apply(std::move(in));
    Tensors dest = std::move(n->destinations);
    n->destinations.clear();
    if (!retain_graph) n->release();
    if (hook)
      if (auto* a = dynamic_cast<AccumulateGrad*>(n))
        if (auto v = a->var.lock(); v && --uses[v.get()] == 0) hook(v.get());
    for (size_t i = 0; i < n->next.size(); ++i) {
      Edge& e = n->next[i];
      if (!e.fn) continue;
      const bool added = i < dest.size() && i < out.size() && dest[i].defined() && out[i].is_same(dest[i]);
      if (i < out.size() && out[i].defined() && !added) seed(e.fn.get(), e.input_nr, out[i]);
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }
}

size_t graph_size(const Tensor& t) {
  if (!t.defined() || !t.grad_fn()) return 0;
  std::unordered_set<Node*> seen{t.grad_fn().get()};
  std::vector<Node*> todo{t.grad_fn().get()};
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    for (auto& e : n->next)
      if (e.fn && seen.insert(e.fn.get()).second) todo.push_back(e.fn.get());
  }
  return seen.size();
}

}  // namespace eg::autograd

namespace eg {
void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}
}  // namespace eg
