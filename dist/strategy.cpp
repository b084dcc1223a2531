#include "dist/strategy.h"

#include <algorithm>
#include <cmath>

#include "autograd/functions.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "layers/layers.h"
#include "models/model.h"
#include "optim/optimizer.h"

namespace eg::dist {

std::string rank_device_name(const std::string& device, int size, int local_rank, int local_size) {
  if (size == 1) return device;
  if (device == "cuda") return "cuda:" + std::to_string(local_rank);
  EG_CHECK(!Device::parse(device).is_cuda() || local_size == 1, "--device ", device, " with ", local_size,
           " ranks on this host would put them all on one GPU; use --device cuda (each rank takes cuda:<its local "
           "rank>)");
  return device;
}

namespace {

Device rank_device(const Communicator& comm, const std::string& device) {
  const Device dev = Device::parse(rank_device_name(device, comm.size(), comm.local_rank(), comm.local_size()));
  if (!dev.is_cuda()) return dev;
  EG_CHECK(cuda_available(), "--device ", device, ": ",
           built_with_cuda() ? "no CUDA GPU is visible" : "this build has no CUDA support (rebuild with -DEG_CUDA=ON)");
  EG_CHECK(dev.index < cuda_device_count(), "--device ", device, ": rank ", comm.rank(), " would train on ", dev.str(),
           " but this host has ", cuda_device_count(), " GPU", cuda_device_count() == 1 ? "" : "s",
           comm.size() > 1 ? "; run at most one rank per GPU on a host" : "");
  return dev;
}

}  // namespace

Strategy::Strategy(Communicator& comm, const std::string& device, GradSyncOptions sync, optim::LossScaleOptions scaling)
    : comm_(comm), device_(rank_device(comm, device)), sync_options_(sync), scaler_(scaling) {
  if (comm.size() > 1) {
    kind_ = device_.is_cuda() ? Kind::gpu_ranks : Kind::cpu_ranks;
    if (kind_ == Kind::gpu_ranks) nccl_ = make_nccl(comm, device_);
    sync_ = std::make_unique<GradSync>(nccl_ ? *nccl_ : comm, sync);
  }
  prev_training_device_ = set_training_device(device_);
}

Strategy::~Strategy() { set_training_device(prev_training_device_); }

uint64_t Strategy::rank_seed(uint64_t seed) const {
  const int r = rank();
  return r == 0 ? seed : seed ^ (0x9E3779B97F4A7C15ull * uint64_t(r) + 0x72616e6bull);
}

std::string Strategy::describe(int64_t batch_size, int threads) const {
  if (size() == 1) return "";
  return "data-parallel over " + std::to_string(size()) + " ranks (" + comm_.backend() +
         (kind_ == Kind::gpu_ranks ? ", gradients over NCCL" : "") + "): --batch-size " + std::to_string(batch_size) +
         " per rank, global batch " + std::to_string(batch_size * size()) + "; " + std::to_string(threads) +
         " threads per rank";
}

bool Strategy::steps_on_device() const { return !sync_; }

DeviceStep Strategy::step_on_device(const Tensor& loss, int64_t samples, optim::Optimizer& opt, double grad_clip) {
  EG_CHECK(steps_on_device(), "internal: step_on_device is one process's step");
  const bool scaling = scaler_.enabled();
  EG_CHECK(!scaling || !loss.defined() || loss.dtype() == DType::f32,
           "internal: a scaled step on the device takes an f32 loss, got ", loss.str());
  DeviceStep d;
  if (loss.defined() && loss.dtype() != DType::f32 && loss.dtype() != DType::f64) {
    d.loss = Tensor::empty(loss.shape(), DType::f32, loss.device());  // a 16-bit loss (a user's model's), widened
    ops::call(ops::cast, loss, d.loss);
  } else {
    d.loss = loss;
  }
  Tensor scaled = loss;
  if (scaling && loss.defined()) {  // optim/loss_scaler.h, decided on the device
    const Tensor s = scaler_.scale_on(loss.device());
    d.loss_scale = s.clone();  // before this step's update
    scaled = fn::scale_by(loss, s);
  }
  opt.zero_grad();
  if (scaled.defined()) scaled.backward();
  if (scaling && loss.defined()) d.found_inf = scaler_.unscale_on_device(opt.grad_buckets());
  if (grad_clip > 0) d.grad_norm = opt.clip_grad_norm_on_device(grad_clip);  // an overflow's: not finite, unused
  if (samples > 0) {
    if (d.found_inf.defined()) opt.step_unless(d.found_inf);
    else opt.step();
  }
  if (d.found_inf.defined()) scaler_.update(d.found_inf);
  return d;
}

StepResult Strategy::step(const Tensor& loss, int64_t samples, optim::Optimizer& opt, int64_t step, double grad_clip) {
  StepResult r;
  // A 16-bit loss under loss scaling (a user's model's) is scaled on the host's reading path.
  if (steps_on_device() && !(scaler_.enabled() && loss.defined() && loss.dtype() != DType::f32)) {
    const DeviceStep d = step_on_device(loss, samples, opt, grad_clip);  // Note [Deferred reads]
    return deferred_result(d, samples, grad_clip);
  }
  if (sync_ && grad_comm().enqueues() && !scaler_.enabled())
    return step_ranks_deferred(loss, samples, opt, step, grad_clip);
  r = step_reading(loss, samples, opt, step, grad_clip);
  r.loss_later = DeferredScalar(r.loss);
  if (grad_clip > 0) r.grad_norm_later = DeferredScalar(r.grad_norm);
  return r;
}

StepResult deferred_result(const DeviceStep& d, int64_t samples, double grad_clip) {
  StepResult r;
  r.deferred = true;
  r.loss = NAN;
  r.count = samples;
  r.grad_norm = NAN;
  r.loss_later = d.loss.defined() ? DeferredScalar::of(d.loss) : DeferredScalar(0.0);
  if (grad_clip > 0) r.grad_norm_later = DeferredScalar::of(d.grad_norm);
  if (d.found_inf.defined()) {
    r.overflow_later = DeferredScalar::of(d.found_inf);
    r.loss_scale_later = DeferredScalar::of(d.loss_scale);
  }
  return r;
}

// Note [Deferred reads across ranks]
// GPU ranks agree on what the host knows before backward (the sample counts, the buckets'
// layout: dist::agree_on_step) and leave the loss on the device: each rank's share of
// the global mean (its loss scaled by its share of the count, the value backward starts
// from) is all-reduced with the gradients on the communication stream, and the global
// mean reaches the host as a DeferredScalar behind the join. Every rank gets the same
// bits from the all-reduce, so every rank settles the same value at the same step, and a
// non-finite one stops all of them there, before anything is saved, as one process's
// deferred step does (the update of that step has run: its weights are never written).
// Host communicators (CPU ranks over MPI) keep reading the loss in the step: on the CPU
// it is known when forward returns, and their all-reduces run on a thread of their own.
StepResult Strategy::step_ranks_deferred(const Tensor& loss, int64_t samples, optim::Optimizer& opt, int64_t step,
                                         double grad_clip) {
  StepResult r;
  r.deferred = true;
  r.loss = NAN;
  r.grad_norm = NAN;
  opt.zero_grad();
  const StepTotals t = agree_on_step(comm_, 0.0, double(samples), opt.grad_buckets().layout_hash(), step);
  r.count = int64_t(t.count);
  Tensor scaled = loss.defined() ? fn::scale(loss, double(samples) / std::max(t.count, 1.0)) : loss;
  // This rank's share of the mean, in f32 (a 16-bit loss widened), all-reduced beside the
  // gradients; a rank without samples adds 0 and still joins the collective.
  Tensor mean = Tensor::zeros({1}, DType::f32, device_);
  if (scaled.defined() && scaled.dtype() == DType::f32) mean.copy_(scaled);
  else if (scaled.defined()) ops::call(ops::cast, scaled.reshape({1}), mean);
  grad_comm().all_reduce_unjoined(mean);
  sync_->begin(opt.grad_buckets(), opt.params());
  sync_->backward(scaled);
  sync_->finish();  // joins the all-reduces, the loss's too
  r.loss_later = DeferredScalar::of(mean);
  if (grad_clip > 0) r.grad_norm_later = opt.clip_grad_norm_later(grad_clip);
  if (r.count > 0) opt.step();
  return r;
}

StepResult Strategy::step_reading(const Tensor& loss, int64_t samples, optim::Optimizer& opt, int64_t step,
                                  double grad_clip) {
  StepResult r;
  r.loss = loss.defined() ? loss.item() : 0.0;
  r.count = samples;
  opt.zero_grad();
  Tensor scaled = loss;
  if (sync_) {  // the global mean: see Note [Data-parallel training]
    const StepTotals t =
        agree_on_step(comm_, r.loss * double(samples), double(samples), opt.grad_buckets().layout_hash(), step);
    r.loss = t.loss_sum / std::max(t.count, 1.0);
    r.count = int64_t(t.count);
    if (scaled.defined()) scaled = fn::scale(scaled, double(samples) / std::max(t.count, 1.0));
  }
  if (!std::isfinite(r.loss)) {
    r.not_finite = StepResult::NotFinite::loss;
    return r;
  }
  const double loss_scale = scaler_.enabled() ? scaler_.scale() : 0.0;
  if (scaler_.enabled() && scaled.defined()) scaled = fn::scale(scaled, loss_scale);
  if (sync_) {
    sync_->begin(opt.grad_buckets(), opt.params());
    sync_->backward(scaled);
    sync_->finish();
  } else if (scaled.defined()) {
    scaled.backward();
  }
  if (scaler_.enabled()) {
    r.loss_scale = loss_scale;
    const Tensor found = scaler_.unscale_on_device(opt.grad_buckets());
    r.skipped_overflow = found.item() != 0;
    scaler_.update(found);
    if (r.skipped_overflow) return r;  // the weights stay as they were
  }
  r.grad_norm = grad_clip > 0 ? opt.clip_grad_norm(grad_clip) : NAN;
  if (grad_clip > 0 && !std::isfinite(r.grad_norm)) {
    r.not_finite = StepResult::NotFinite::grad_norm;
    return r;
  }
  if (r.count > 0) opt.step();  // a global batch whose every sample was left out trains nothing
  return r;
}

void Strategy::average_running_stats(models::Model& m) const {
  if (size() == 1) return;
  for (auto& [name, mod] : m.named_modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(mod))
      for (Tensor* t : {&bn->running_mean, &bn->running_var}) {
        Tensor h = t->device().is_cpu() ? *t : t->to(Device::cpu());
        comm_.all_reduce(h);
        ops::call(ops::scale, h, h, 1.0 / comm_.size());
        if (!t->device().is_cpu()) t->copy_(h);
      }
}

void Strategy::save(nlohmann::json& state) const {
  if (sync_) state["gradient_sync_bytes"] = sync_->stats().bytes;
  if (scaler_.enabled()) scaler_.save(state);
}

void Strategy::load(const nlohmann::json& state) {
  if (sync_) sync_->set_bytes(state.value("gradient_sync_bytes", int64_t(0)));
  if (scaler_.enabled()) scaler_.load(state);
}

void Strategy::summarize(nlohmann::json& sj) const {
  if (scaler_.enabled()) {
    sj["loss_scale_final"] = scaler_.scale();
    sj["steps_skipped_overflow"] = scaler_.skipped();
  }
  if (!sync_) return;
  const GradSyncStats& gs = sync_->stats();
  sj["gradient_sync_bytes"] = gs.bytes;  // this rank's, over the run
  sj["gradient_sync_bytes_per_step"] = gs.last_step_bytes;  // the last step's (freezing lowers it)
  sj["gradient_sync_wait_seconds"] = gs.wait_seconds;  // this invocation's
  if (kind_ == Kind::gpu_ranks) {  // the compute stream's wait for NCCL after backward, timed on the device
    sj["gradient_sync_device_wait_seconds"] = gs.device_wait_seconds;
    sj["gradient_sync_device_waits_timed"] = gs.device_waits_timed;
  }
  sj["gradient_sync_overlap"] = sync_options_.overlap;
  sj["gradient_sync_dtype"] = dtype_name(sync_options_.dtype);
  sj["gradient_buckets_launched_in_backward"] = gs.buckets_launched_in_backward;
  sj["gradient_buckets_launched"] = gs.buckets;
}

}  // namespace eg::dist
