#include "dist/grad_sync.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "autograd/node.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace eg::dist {

StepTotals agree_on_step(Communicator& comm, double loss_sum, double count, uint64_t layout, int64_t step) {
  struct Msg {
    double loss_sum, count;
    uint64_t layout;
  };
  const Msg mine{loss_sum, count, layout};
  const auto all = comm.all_gather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  StepTotals t;
  std::vector<Msg> msgs(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    EG_CHECK(all[r].size() == sizeof(Msg), "step ", step, ": rank ", r, " sent a malformed step message");
    std::memcpy(&msgs[r], all[r].data(), sizeof(Msg));
    t.loss_sum += msgs[r].loss_sum, t.count += msgs[r].count;
  }
  for (size_t r = 1; r < msgs.size(); ++r)
    EG_CHECK(msgs[r].layout == msgs[0].layout, "step ", step, ": rank ", r,
             "'s gradient buckets differ from rank 0's (layout hash ", msgs[r].layout, " vs ", msgs[0].layout,
             "): the ranks train different parameters, e.g. a layer frozen on one rank only; stopped before the "
             "all-reduce, which would mix unrelated gradients");
  return t;
}

GradSync::GradSync(Communicator& comm, GradSyncOptions o)
    : comm_(comm), o_(o), use_thread_(o.overlap && !comm.enqueues()) {
  EG_CHECK(o.dtype == DType::f32 || o.dtype == DType::bf16, "--grad-sync-dtype: f32 or bf16, got ",
           dtype_name(o.dtype));
  if (use_thread_) thread_ = std::thread([this] { worker(); });
}

GradSync::~GradSync() {
  bool idle;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    idle = done_ == next_;
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  // Unwinding from a failure mid-step, the thread may be inside an all-reduce the other
  // ranks will never join; the failure ends the job (dist::abort_job), so it is not waited for.
  if (idle) thread_.join();
  else thread_.detach();
}

void GradSync::begin(const optim::GradBuckets& buckets, const std::vector<Tensor>& params) {
  std::lock_guard<std::mutex> l(mu_);
  EG_CHECK(queue_.empty() && done_ == flats_.size(), "GradSync::begin: the last step's all-reduces are unfinished");
  bucket_of_.clear();
  pending_.clear();
  flats_.clear();
  wire_.clear();
  for (auto& b : buckets.buckets()) {
    for (size_t i : b.members) bucket_of_[params[i].impl_ptr().get()] = flats_.size();
    pending_.push_back(int64_t(b.members.size()));
    flats_.push_back(b.flat);
    wire_.push_back(o_.dtype == DType::f32 ? b.flat : Tensor::empty(b.flat.shape(), o_.dtype, b.flat.device()));
  }
  next_ = 0, done_ = 0;
  stats_.last_step_bytes = 0;
}

void GradSync::backward(const Tensor& loss) {
  if (!loss.defined()) return;
  autograd::GradReadyScope scope([this](const TensorImpl* leaf) { ready(leaf); });
  loss.backward();
}

void GradSync::ready(const TensorImpl* leaf) {
  auto it = bucket_of_.find(leaf);
  if (it == bucket_of_.end()) return;  // not a trained parameter
  --pending_[it->second];
  if (!o_.overlap) return;
  while (next_ < flats_.size() && pending_[next_] == 0) {
    ++stats_.buckets_launched_in_backward;
    launch(next_++);
  }
}

void GradSync::launch(size_t b) {
  // The cast runs here, on the training thread, so that the communication thread runs
  // nothing but the communicator's calls.
  if (o_.dtype != DType::f32) ops::call(ops::cast, flats_[b], wire_[b]);
  const int64_t n = int64_t(wire_[b].nbytes());
  stats_.bytes += n, stats_.last_step_bytes += n, ++stats_.buckets;
  if (!use_thread_) {
    const auto t0 = std::chrono::steady_clock::now();
    comm_.all_reduce_unjoined(wire_[b]);  // joined in finish() (an enqueuing communicator)
    stats_.comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++done_;
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(b);
  }
  cv_.notify_all();
}

void GradSync::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  while (next_ < flats_.size()) launch(next_++);
  if (use_thread_) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return error_ || done_ == flats_.size(); });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  comm_.join();
  stats_.device_wait_seconds = comm_.join_wait_seconds();
  stats_.device_waits_timed = comm_.joins_timed();
  if (o_.dtype != DType::f32)
    for (size_t b = 0; b < flats_.size(); ++b) ops::call(ops::cast, wire_[b], flats_[b]);
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
}

void GradSync::worker() {
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      b = queue_.front();
      queue_.pop_front();
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm_.all_reduce(wire_[b]);
    } catch (...) {
      std::lock_guard<std::mutex> l(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      stats_.comm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace eg::dist
