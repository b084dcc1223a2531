#include "freeze/controller.h"

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include "autograd/node.h"
#include "core/error.h"
#include "core/side_stream.h"
#include "freeze/plasticity.h"

namespace eg::freeze {

int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void background_thread_setup(const ControllerOptions& o, bool renice) {
  omp_set_num_threads(std::max(1, o.threads));
  if (renice && o.nice > 0) (void)setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), o.nice);  // best effort
}

namespace {

void idle() { std::this_thread::sleep_for(std::chrono::microseconds(500)); }

// A reading from the two Grams. NaN or Inf (a diverged snapshot or training step; past
// calibration the int8 reference no longer looks at its inputs' values) is an error,
// never a reading.
double plasticity_of(const Tensor& train_gram, const Tensor& ref_gram, int64_t module) {
  const double p = sp_loss_from_grams(train_gram, ref_gram);
  EG_CHECK(std::isfinite(p), "the plasticity of layer module ", module,
           " is NaN or Inf: the reference model's or the training model's output diverged");
  return p;
}

}  // namespace

PlasticityController::PlasticityController(const models::ModelConfig& mc, ControllerOptions o)
    : PlasticityController(quant::model_factory(mc), o) {}

PlasticityController::PlasticityController(quant::ModelFactory make_model, ControllerOptions o)
    : make_model_(std::move(make_model)),
      opt_(o),
      in_q_(size_t(std::max(1, o.capacity))),
      ref_q_(size_t(std::max(1, o.capacity))),
      res_q_(size_t(std::max(8, 4 * o.capacity))) {
  EG_CHECK(opt_.max_cpu_load > 0, "plasticity controller: the CPU load below which the reference runs must be > 0, ",
           "got ", opt_.max_cpu_load);
  if (opt_.max_cpu_load < 1) cpu_load_ = opt_.cpu_load ? opt_.cpu_load : std::function<double()>(CpuLoadProbe());
  if (!opt_.synchronous) {
    ref_thread_ = std::thread([this] { reference_loop(); });
    plast_thread_ = std::thread([this] { plasticity_loop(); });
  }
}

PlasticityController::~PlasticityController() {
  stop_ = true;
  ref_bell_.ring();
  plast_bell_.ring();
  if (ref_thread_.joinable()) ref_thread_.join();
  if (plast_thread_.joinable()) plast_thread_.join();
}

void PlasticityController::set_snapshot(std::shared_ptr<const Snapshot> snap) { snapshot_ = std::move(snap); }

void PlasticityController::land(Input& in) {
  if (in.unit_input_later.defined()) in.unit_input = std::exchange(in.unit_input_later, {}).get();
  if (in.train_later.defined()) in.train = std::exchange(in.train_later, {}).get();
}

void PlasticityController::build_reference(const Input& in) {
  if (in.snap != built_from_) {
    ref_.reset();
    built_from_.reset();
    ref_ = quant::make_reference(opt_.precision, make_model_, *in.snap, opt_.gpu, opt_.calibration_batches, opt_.bn);
    const bool restore = in.snap == restored_for_;
    quant::Calibration cal = std::exchange(restored_, {});
    restored_for_.reset();  // once, whether or not it applies cleanly
    if (restore) ref_->set_calibration(cal);
    built_from_ = in.snap;
    ++builds_;
  }
}

Tensor PlasticityController::reference_gram(const Input& in) {
  build_reference(in);
  autograd::NoGradGuard ng;
  if (in.unit_input.defined()) return sp_gram(ref_->activation_from(in.unit_input, in.begin, in.module));
  return sp_gram(ref_->activation(in.x, in.module, in.x2));
}

quant::Calibration PlasticityController::calibration_for(const std::shared_ptr<const Snapshot>& snap) const {
  if (snap && snap == restored_for_) return restored_;  // restored, and no evaluation since
  if (!ref_ || !snap || built_from_ != snap) return {};
  return ref_->calibration();
}

void PlasticityController::restore_calibration(std::shared_ptr<const Snapshot> snap, quant::Calibration c) {
  restored_for_ = std::move(snap);
  restored_ = std::move(c);
}

bool PlasticityController::submit(int64_t step, int64_t module, const Tensor& x, const Tensor& train_out,
                                  const Tensor& x2, const Tensor& unit_input, int64_t begin) {
  EG_CHECK(snapshot_, "plasticity evaluation before the reference model was created");
  EG_CHECK(x.device().is_cpu() && (!x2.defined() || x2.device().is_cpu()),
           "the reference model's input must be on the CPU");
  EG_CHECK(!unit_input.defined() || (begin > 0 && begin <= module), "plasticity evaluation: the unit's input is ",
           "that of layer module ", begin, ", which is not after the first and up to ", module);
  // A full queue drops the reading before anything is copied: a copy from the GPU
  // dropped before it lands would make this thread wait for it.
  if (!opt_.synchronous && in_q_.full()) {
    ++dropped_;
    return false;
  }
  Input in{step, module, x, x2, Tensor(), {}, begin, snapshot_, Tensor(), false, {}, {}};
  // A GPU reference takes the unit's input where it is (on its side stream, after the
  // kernels that wrote it: Note [Side streams]); a CPU one gets a copy that the training
  // thread does not wait for (HostCopy): the reference's thread waits for it.
  if (unit_input.defined()) {
    if (unit_input.is_cuda() && !quant::reference_on_gpu(opt_.precision)) {
      in.unit_input_later = HostCopy::of(unit_input);
    } else {
      EG_CHECK(!unit_input.is_cuda() || unit_input.device() == opt_.gpu, "plasticity evaluation: the unit's input ",
               "is on ", unit_input.device().str(), ", the GPU reference on ", opt_.gpu.str());
      in.unit_input = unit_input.detach();
      if (!opt_.synchronous && unit_input.is_cuda()) in.unit_input_written = StreamMark::here(unit_input.device());
    }
  }
  if (train_out.is_cuda()) {
    in.train_later = HostCopy::of(sp_gram(train_out));  // only b x b leaves the GPU
    in.train_is_gram = true;
  } else {
    in.train = train_out.detach();
  }
  if (opt_.synchronous) {
    land(in);
    const int64_t t0 = thread_cpu_ns();
    Tensor gr = reference_gram(in);
    Tensor gt = in.train_is_gram ? in.train : sp_gram(in.train);
    sync_results_.push_back({step, module, plasticity_of(gt, gr, module)});
    cpu_ns_ += thread_cpu_ns() - t0;
    ++completed_;
    return true;
  }
  if (!in_q_.try_push(std::move(in))) {
    ++dropped_;
    return false;
  }
  ++submitted_;
  ref_bell_.ring();
  return true;
}

bool CpuLoadProbe::read(Sample& s) {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return false;
  unsigned long long v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // user nice system idle iowait irq softirq steal
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                            &v[6], &v[7]);
  std::fclose(f);
  if (n < 4) return false;
  s.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  s.total = s.busy + v[3] + v[4];
  s.at = std::chrono::steady_clock::now();
  return true;
}

double CpuLoadProbe::operator()() {
  Sample now;
  if (!have_ || std::chrono::steady_clock::now() - last_.at > std::chrono::seconds(1)) {
    if (!read(last_)) return 0;
    std::this_thread::sleep_for(window_);
  }
  if (!read(now)) return 0;
  // Signed: iowait may go backwards (proc(5)).
  const double total = double(int64_t(now.total - last_.total)), busy = double(int64_t(now.busy - last_.busy));
  last_ = now;
  have_ = true;
  return total > 0 ? std::min(1.0, std::max(0.0, busy / total)) : 0;
}

void PlasticityController::wait_for_spare_cpu() {
  if (!cpu_load_) return;
  const auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  // drain(): the training thread waits for this result, so the CPU it leaves is spare.
  // (draining_ is read again after the probe, which may sleep for its window.)
  while (!stop_ && !draining_.load() && cpu_load_() > opt_.max_cpu_load && !draining_.load()) {
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // /proc/stat counts in 10 ms ticks
  }
  if (waited) {
    ++deferred_;
    deferred_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }
}

void PlasticityController::reference_loop() {
  // A reference on the training GPU queues its work on a stream of its own, beside the
  // training's (Note [Side streams] in core/side_stream.h); it waits for no CPU load.
  const bool on_gpu = quant::reference_on_gpu(opt_.precision);
  background_thread_setup(opt_, !on_gpu);
  std::unique_ptr<SideStream> side;
  while (!stop_) {
    auto in = in_q_.try_pop();
    if (!in) {
      ref_bell_.wait([this] { return stop_.load() || !in_q_.empty(); });
      continue;
    }
    if (!on_gpu) wait_for_spare_cpu();
    if (stop_) break;
    const int64_t t0 = thread_cpu_ns();
    Pair r{in->step, in->module, Tensor(), Tensor(), in->train_is_gram};
    try {
      if (on_gpu && !side) side = std::make_unique<SideStream>(opt_.gpu);
      if (side) {
        // Queued before the training Gram's copy is waited for (land): the side stream
        // waits on the device for the unit's input, and the timed span is the forward's.
        build_reference(*in);
        in->unit_input_written.wait();
        const StreamMark begun = StreamMark::here(opt_.gpu, true);
        r.ref = reference_gram(*in);
        const StreamMark ended = StreamMark::here(opt_.gpu, true);
        // The Gram comes to the host on the side stream (the plasticity thread's copy
        // would go on the compute stream, unordered with this one); once it has, nothing
        // queued here reads the training's tensors that `in` is about to drop.
        side->synchronize();
        gpu_ns_ += int64_t(ended.seconds_since(begun) * 1e9);
        r.ref = r.ref.to(Device::cpu());
        land(*in);
        r.train = std::move(in->train);
      } else {
        land(*in);
        r.train = std::move(in->train);
        r.ref = reference_gram(*in);
      }
    } catch (const std::exception& e) {
      r.ref = Tensor();  // reported as a dropped evaluation
      note_error(e.what());
      if (side) {
        try {
          side->synchronize();  // before `in` drops tensors its queued work may read
        } catch (const std::exception&) {  // the device failed: the training thread will say so
        }
      }
    }
    cpu_ns_ += thread_cpu_ns() - t0;
    while (!stop_ && !ref_q_.try_push(std::move(r))) idle();  // back-pressure: rare, short
    plast_bell_.ring();
  }
}

void PlasticityController::plasticity_loop() {
  background_thread_setup(opt_);
  while (!stop_) {
    auto p = ref_q_.try_pop();
    if (!p) {
      plast_bell_.wait([this] { return stop_.load() || !ref_q_.empty(); });
      continue;
    }
    const int64_t t0 = thread_cpu_ns();
    bool ok = false;
    if (p->ref.defined()) {
      try {
        Tensor gt = p->train_is_gram ? p->train : sp_gram(p->train);
        Result res{p->step, p->module, plasticity_of(gt, p->ref, p->module)};
        while (!stop_ && !res_q_.try_push(std::move(res))) idle();
        ok = true;
      } catch (const std::exception& e) {
        note_error(e.what());
      }
    }
    ++(ok ? completed_ : dropped_);
    ++finished_;
    cpu_ns_ += thread_cpu_ns() - t0;
  }
}

std::vector<PlasticityController::Result> PlasticityController::poll() {
  // Synchronous results, and asynchronous ones that drain() took off the queue, first.
  std::vector<Result> out;
  out.swap(sync_results_);
  if (!opt_.synchronous)
    while (auto r = res_q_.try_pop()) out.push_back(*r);
  return out;
}

void PlasticityController::drain() {
  if (opt_.synchronous) return;
  const auto t0 = std::chrono::steady_clock::now();
  draining_ = true;
  // Keep taking results meanwhile: a full result queue would stall the plasticity thread.
  for (;;) {
    while (auto r = res_q_.try_pop()) sync_results_.push_back(*r);
    if (finished_.load() >= submitted_.load() || stop_) break;
    idle();
  }
  // A result pushed just before `finished_` counted it is on the queue now.
  while (auto r = res_q_.try_pop()) sync_results_.push_back(*r);
  draining_ = false;
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void PlasticityController::note_error(const std::string& what) {
  std::lock_guard<std::mutex> lk(error_mu_);
  if (first_error_.empty()) first_error_ = what;
}

std::string PlasticityController::first_error() const {
  std::lock_guard<std::mutex> lk(error_mu_);
  return first_error_;
}

double PlasticityController::background_cpu_seconds() const { return double(cpu_ns_.load()) * 1e-9; }

}  // namespace eg::freeze
