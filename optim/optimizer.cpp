#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

namespace eg::optim {

namespace {
// A parameter moved by Module::to() (its storage, in place) takes its state along: the
// kernels read both through raw pointers of one device.
void follow_device(Tensor& state, const Tensor& p) {
  if (state.defined() && state.device() != p.device()) state = state.to(p.device());
}
}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, double lr) : params_(std::move(params)), lr_(lr) {
  EG_CHECK(lr >= 0 && std::isfinite(lr), "learning rate must be a finite non-negative number, got ", lr);
  for (size_t i = 0; i < params_.size(); ++i)
    EG_CHECK(params_[i].defined() && is_floating(params_[i].dtype()), "parameter ", i,
             " given to the optimizer is not a floating-point tensor");
}

const Tensor& Optimizer::lr_on(Device device) {
  if (!lr_dev_.defined() || lr_dev_.device() != device) {
    lr_dev_ = Tensor::empty({1}, DType::f64, device);
    lr_upload_.reset();
    lr_dev_value_ = std::nan("");
  }
  if (lr_dev_value_ == lr_) return lr_dev_;
  if (device.is_cpu()) {
    lr_dev_.data<double>()[0] = lr_;
  } else {
    if (!lr_upload_) lr_upload_ = std::make_unique<StagedUpload>(device);
    lr_upload_->stage(Tensor::full({1}, lr_, DType::f64));
    lr_upload_->take([this](const Tensor& staged) {
      lr_dev_.copy_(staged);
      return lr_dev_;
    });
  }
  lr_dev_value_ = lr_;
  return lr_dev_;
}

bool Optimizer::uniform(const std::vector<size_t>& members) const {
  std::vector<const void*> data;
  for (size_t i : members) {
    if (params_[i].device() != params_[members[0]].device() || params_[i].dtype() != params_[members[0]].dtype())
      return false;
    data.push_back(params_[i].raw_any());
  }
  // A parameter listed twice is updated twice, one after the other, as the per-parameter
  // loop does; in one multi-tensor call its two updates could run at once.
  std::sort(data.begin(), data.end());
  return std::adjacent_find(data.begin(), data.end()) == data.end();
}

void Optimizer::zero_grad() {
  buckets_.sync(params_);
  buckets_.zero();
}

double Optimizer::clip_grad_norm(double max_norm) {
  buckets_.sync(params_);  // a no-op unless the trainable set changed since zero_grad()
  // Each bucket's sum of squares into its own slot on the device, read once (one host
  // sync a step, not one a bucket: Note [Host syncs] in core/device.h), summed in order.
  const auto& bs = buckets_.buckets();
  double total = 0;
  const bool f32 = std::all_of(bs.begin(), bs.end(), [](const GradBucket& b) { return b.flat.dtype() == DType::f32; });
  if (!f32) {  // f64 buckets (a model of f64 parameters): one read each
    for (auto& b : bs) {
      Tensor ss = Tensor::empty({1}, b.flat.dtype(), b.flat.device());
      ops::call(ops::sum_squares, b.flat, ss);
      total += ss.item();
    }
  } else if (!bs.empty()) {
    Tensor ss = Tensor::empty({int64_t(bs.size())}, bs.front().flat.dtype(), bs.front().flat.device());
    for (size_t i = 0; i < bs.size(); ++i) {
      Tensor slot = ss.slice(int64_t(i), int64_t(i) + 1);
      ops::call(ops::sum_squares, bs[i].flat, slot);
    }
    for (float v : ss.to_vector<float>()) total += v;
  }
  const double norm = std::sqrt(total);
  if (std::isfinite(norm) && norm > max_norm) {
    const double s = max_norm / (norm + 1e-6);
    for (auto& b : buckets_.buckets()) {
      Tensor g = b.flat;
      ops::call(ops::scale, g, g, s);
    }
  }
  return norm;
}

DeferredScalar Optimizer::clip_grad_norm_later(double max_norm) {
  return DeferredScalar::of(clip_grad_norm_on_device(max_norm));
}

Tensor Optimizer::clip_grad_norm_on_device(double max_norm) {
  buckets_.sync(params_);
  const auto& bs = buckets_.buckets();
  const bool f32 = std::all_of(bs.begin(), bs.end(), [](const GradBucket& b) { return b.flat.dtype() == DType::f32; });
  if (!f32 || bs.empty()) {  // read at once, the norm in a host tensor
    Tensor norm = Tensor::empty({1}, DType::f64);
    norm.data<double>()[0] = clip_grad_norm(max_norm);
    return norm;
  }
  const Device dev = bs.front().flat.device();
  Tensor ss = Tensor::empty({int64_t(bs.size())}, DType::f32, dev);
  for (size_t i = 0; i < bs.size(); ++i) {
    Tensor slot = ss.slice(int64_t(i), int64_t(i) + 1);
    ops::call(ops::sum_squares, bs[i].flat, slot);
  }
  Tensor out = Tensor::empty({2}, DType::f64, dev);
  ops::call(ops::clip_coef, ss, out, max_norm);
  const Tensor coef = out.slice(1, 2);
  for (auto& b : bs) {
    Tensor g = b.flat;
    ops::call(ops::scale_by, g, g, coef);
  }
  return out.slice(0, 1);
}

SGD::SGD(std::vector<Tensor> params, double lr, SgdOptions o)
    : Optimizer(std::move(params), lr), options(o), momentum_(params_.size()) {
  EG_CHECK(o.momentum >= 0 && o.weight_decay >= 0, "SGD: momentum and weight decay must be non-negative");
  EG_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD: nesterov needs momentum > 0 and no dampening");
}

void SGD::step() {
  const ops::SgdParams sp{lr_, options.momentum, options.dampening, options.weight_decay, options.nesterov, false};
  std::vector<size_t> multi;  // the active parameters past their first step
  last_host_lr_ = false;
  // Loss scaling's overflow flag as the per-parameter launches need it: read once, if at all.
  int host_skip = -1;
  auto skipped = [&] {
    if (host_skip < 0) host_skip = skip_if_.defined() && skip_if_.item() != 0;
    return host_skip == 1;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!active(p)) continue;
    follow_device(momentum_[i], p);
    if (options.momentum > 0 && !momentum_[i].defined()) {  // the buffer starts as the gradient
      last_host_lr_ = true;
      if (skipped()) continue;
      momentum_[i] = Tensor::empty(p.shape(), p.dtype(), p.device());
      ops::SgdParams first = sp;
      first.first_step = true;
      ops::call(ops::sgd_step, p, p.grad(), momentum_[i], first);
    } else {
      multi.push_back(i);
    }
  }
  if (multi.empty()) return;
  if (!uniform(multi)) {  // parameters on several devices or of several dtypes
    last_host_lr_ = true;
    if (skipped()) return;
    for (size_t i : multi) ops::call(ops::sgd_step, params_[i], params_[i].grad(), momentum_[i], sp);
    return;
  }
  std::vector<Tensor> ps, gs, bs;
  for (size_t i : multi) ps.push_back(params_[i]), gs.push_back(params_[i].grad()), bs.push_back(momentum_[i]);
  const Tensor& lr = lr_on(ps[0].device());
  ops::SgdParams on_device = sp;
  on_device.lr = 0;  // read from `lr`
  ops::run(ops::sgd_step_multi, ops::pick_backend(ops::sgd_step_multi.has(ops::Backend::cpu), ps[0]), lr, ps, gs, bs,
           on_device, skip_if_);
}

std::vector<size_t> Optimizer::active_members() const {
  std::vector<size_t> m;
  for (size_t i = 0; i < params_.size(); ++i)
    if (active(params_[i])) m.push_back(i);
  return m;
}

void Optimizer::check_one_launch(const char* who) const {
  EG_CHECK(uniform(active_members()), who,
           ": a captured step must be one multi-tensor launch, and these parameters are on several devices or of "
           "several dtypes (--cuda-graphs off trains them)");
}

bool SGD::ready_to_capture() const {
  check_one_launch("SGD");
  if (options.momentum == 0) return true;
  for (size_t i : active_members())
    if (!momentum_[i].defined()) return false;
  return true;
}

void SGD::check_replayable() const {
  EG_CHECK(!last_host_lr_,
           "SGD: a step to replay must be a multi-tensor one past every momentum buffer's first "
           "step (parameters of one device and dtype): its learning rate is read on the device");
}

std::map<std::string, Tensor> SGD::state_dict() const {
  std::map<std::string, Tensor> sd;
  for (size_t i = 0; i < momentum_.size(); ++i)
    if (momentum_[i].defined()) sd[std::to_string(i) + ".momentum"] = momentum_[i];
  return sd;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& sd) {
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = sd.find(std::to_string(i) + ".momentum");
    if (it == sd.end()) {
      momentum_[i] = Tensor();
      continue;
    }
    EG_CHECK(it->second.shape() == params_[i].shape(), "optimizer state for parameter ", i, " has shape ",
             shape_str(it->second.shape()), " but the parameter is ", shape_str(params_[i].shape()));
    momentum_[i] = it->second.to(params_[i].device()).clone();
  }
}

AdamW::AdamW(std::vector<Tensor> params, double lr, AdamWOptions o)
    : Optimizer(std::move(params), lr),
      options(o),
      m_(params_.size()),
      v_(params_.size()),
      steps_(params_.size(), 0),
      step_dev_(params_.size()) {
  EG_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "AdamW: betas must be in [0, 1)");
  EG_CHECK(o.eps > 0, "AdamW: eps must be positive");
}

int64_t AdamW::count(size_t i) const { return step_dev_[i].defined() ? int64_t(step_dev_[i].item()) : steps_[i]; }

void AdamW::step() {
  std::vector<size_t> members;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i];
    if (!active(p)) continue;
    follow_device(m_[i], p), follow_device(v_[i], p);
    if (!m_[i].defined()) {
      m_[i] = Tensor::zeros(p.shape(), p.dtype(), p.device());
      v_[i] = Tensor::zeros(p.shape(), p.dtype(), p.device());
    }
    members.push_back(i);
  }
  last_host_counts_ = false;
  if (members.empty()) return;
  if (!uniform(members)) {  // parameters on several devices or of several dtypes: counts on the host
    last_host_counts_ = true;
    if (skip_if_.defined() && skip_if_.item() != 0) return;  // loss scaling's overflow (one read)
    for (size_t i : members) {
      steps_[i] = count(i) + 1;
      step_dev_[i] = Tensor();
      const ops::AdamWParams one{lr_, options.beta1, options.beta2, options.eps, options.weight_decay, steps_[i]};
      ops::call(ops::adamw_step, params_[i], params_[i].grad(), m_[i], v_[i], one);
    }
    return;
  }
  std::vector<Tensor> ps, gs, ms, vs, counts;
  for (size_t i : members) {
    if (step_dev_[i].defined() && step_dev_[i].device() != params_[i].device())  // moved: back to the host first
      steps_[i] = count(i), step_dev_[i] = Tensor();
    if (!step_dev_[i].defined())  // from here on the device's
      step_dev_[i] = steps_[i] == 0 ? Tensor::zeros({1}, DType::f64, params_[i].device())
                                    : Tensor::full({1}, double(steps_[i]), DType::f64, params_[i].device());
    ps.push_back(params_[i]), gs.push_back(params_[i].grad()), ms.push_back(m_[i]), vs.push_back(v_[i]);
    counts.push_back(step_dev_[i]);
  }
  const Tensor& lr = lr_on(ps[0].device());
  // The learning rate and the counts are read on the device (p.lr, p.step: not read).
  const ops::AdamWParams ap{0, options.beta1, options.beta2, options.eps, options.weight_decay, 0};
  ops::run(ops::adamw_step_multi, ops::pick_backend(ops::adamw_step_multi.has(ops::Backend::cpu), ps[0]), lr, ps, gs,
           ms, vs, counts, ap, skip_if_);
}

bool AdamW::ready_to_capture() const {
  check_one_launch("AdamW");
  // A parameter's first multi-tensor step moves its count to the device from the host.
  for (size_t i : active_members())
    if (!step_dev_[i].defined() || step_dev_[i].device() != params_[i].device()) return false;
  return true;
}

void AdamW::check_replayable() const {
  EG_CHECK(!last_host_counts_,
           "AdamW: a step to replay must be a multi-tensor one (parameters of one device and dtype): the "
           "per-parameter step's bias corrections are host values a replay would repeat");
}

std::map<std::string, Tensor> AdamW::state_dict() const {
  std::map<std::string, Tensor> sd;
  for (size_t i = 0; i < m_.size(); ++i) {
    if (!m_[i].defined()) continue;
    std::string k = std::to_string(i);
    sd[k + ".exp_avg"] = m_[i];
    sd[k + ".exp_avg_sq"] = v_[i];
    sd[k + ".step"] = Tensor::full({1}, double(count(i)), DType::s64);
  }
  return sd;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& sd) {
  for (size_t i = 0; i < params_.size(); ++i) {
    step_dev_[i] = Tensor();  // the count is steps_ until the next multi-tensor step
    std::string k = std::to_string(i);
    auto m = sd.find(k + ".exp_avg"), v = sd.find(k + ".exp_avg_sq"), s = sd.find(k + ".step");
    if (m == sd.end() || v == sd.end() || s == sd.end()) {
      m_[i] = v_[i] = Tensor();
      steps_[i] = 0;
      continue;
    }
    EG_CHECK(m->second.shape() == params_[i].shape() && v->second.shape() == params_[i].shape(),
             "AdamW state for parameter ", i, " does not match its shape ", shape_str(params_[i].shape()));
    m_[i] = m->second.to(params_[i].device()).clone();
    v_[i] = v->second.to(params_[i].device()).clone();
    steps_[i] = int64_t(s->second.item());
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  double total = 0;
  for (auto& p : params) {
    if (!p.grad().defined()) continue;
    Tensor ss = Tensor::empty({1}, p.grad().dtype(), p.device());
    ops::call(ops::sum_squares, p.grad(), ss);
    total += ss.item();
  }
  double norm = std::sqrt(total);
  if (std::isfinite(norm) && norm > max_norm) {
    double s = max_norm / (norm + 1e-6);
    for (auto& p : params) {
      if (!p.grad().defined()) continue;
      Tensor g = p.grad();
      ops::call(ops::scale, g, g, s);
    }
  }
  return norm;
}

}  // namespace eg::optim
