#include "data/loader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace eg::data {

namespace {

class ImageSamples final : public SampleSource {
 public:
  ImageSamples(std::shared_ptr<const ImageDataset> d, const AugmentOptions& aug) : d_(std::move(d)), aug_(aug) {
    EG_CHECK(d_ && d_->size() > 0, "loader: the dataset is empty");
    EG_CHECK(d_->images.dim() == 4 && d_->images.size(0) == d_->labels.numel() && d_->labels.dtype() == DType::s64,
             "loader: a dataset's images must be [N, C, H, W] with N = its s64 labels' count; got images ",
             shape_str(d_->images.shape()), " and ", d_->labels.numel(), " labels of ", dtype_name(d_->labels.dtype()));
  }
  int64_t size() const override { return d_->size(); }
  Shape sample_shape() const override { return {d_->images.size(1), d_->images.size(2), d_->images.size(3)}; }
  int64_t label(int64_t id) const override { return d_->labels.data<int64_t>()[id]; }
  void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const override {
    augment_into(*d_, id, aug_, seed, epoch, out);
  }

 private:
  std::shared_ptr<const ImageDataset> d_;
  AugmentOptions aug_;
};

}  // namespace

void SampleSource::load_pixels(int64_t, uint64_t, int64_t, uint8_t*) const {
  EG_THROW("internal: this sample source has no 8-bit pixels (has_pixels() is false)");
}
PixelAffine SampleSource::pixel_affine() const {
  EG_THROW("internal: this sample source has no 8-bit pixels (has_pixels() is false)");
}

std::shared_ptr<const SampleSource> image_samples(std::shared_ptr<const ImageDataset> d, const AugmentOptions& aug) {
  return std::make_shared<ImageSamples>(std::move(d), aug);
}

Loader::Loader(std::shared_ptr<const ImageDataset> data, LoaderOptions o)
    : Loader(image_samples(std::move(data), o.augment ? o.aug : AugmentOptions{0, false, o.aug.norm}), o) {}

Loader::Loader(std::shared_ptr<const SampleSource> data, LoaderOptions o) : data_(std::move(data)), opt_(o) {
  EG_CHECK(data_ && data_->size() > 0, "loader: the dataset is empty");
  const Shape shape = data_->sample_shape();
  EG_CHECK(shape.size() == 3 && shape[0] > 0 && shape[1] > 0 && shape[2] > 0,
           "loader: a sample must be [C, H, W] (SampleSource::sample_shape), got ", shape_str(shape));
  pixels_ = o.pixels && data_->has_pixels();
  EG_CHECK(o.batch_size > 0, "loader: batch size must be positive, got ", o.batch_size);
  EG_CHECK(!o.drop_last || data_->size() >= o.batch_size, "loader: batch size ", o.batch_size,
           " is larger than the dataset (", data_->size(), " samples)");
  EG_CHECK(o.workers >= 1 && o.prefetch >= 1, "loader: need at least one worker and one batch of prefetch");
  EG_CHECK(o.augment_variants >= 0, "loader: augment_variants must be 0 (a new augmentation every epoch) or more, got ",
           o.augment_variants);
  EG_CHECK(o.shards >= 1 && o.shard_rank >= 0 && o.shard_rank < o.shards, "loader: shard ", o.shard_rank, " of ",
           o.shards);
  EG_CHECK(!o.drop_last || data_->size() >= o.batch_size * o.shards, "loader: a global batch of ", o.batch_size, " x ",
           o.shards, " ranks is larger than the dataset (", data_->size(), " samples)");
}

Loader::~Loader() { stop_workers(); }

int64_t Loader::batches_per_epoch() const {
  const int64_t n = data_->size(), b = opt_.batch_size * opt_.shards;
  return opt_.drop_last ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> Loader::positions(int64_t index) const {
  const int64_t g = opt_.batch_size * opt_.shards, b0 = index * g, b1 = std::min(data_->size(), b0 + g);
  std::vector<int64_t> p;
  for (int64_t i = b0 + opt_.shard_rank; i < b1; i += opt_.shards) p.push_back(i);
  return p;
}

std::vector<int64_t> Loader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> v(size_t(data_->size()));
  std::iota(v.begin(), v.end(), 0);
  if (!opt_.shuffle) return v;
  // Fisher-Yates with counter-based draws: a pure function of (seed, epoch).
  const uint64_t key = opt_.seed * 0x2545F4914F6CDD1Dull + uint64_t(epoch);
  for (size_t i = v.size() - 1; i > 0; --i) {
    uint64_t r = uint64_t(philox4x32(key, i).x[0]) << 32 | philox4x32(key, i).x[1];
    std::swap(v[i], v[size_t(r % (i + 1))]);
  }
  return v;
}

void Loader::stop_workers() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  stopping_ = false;
}

void Loader::start_epoch(int64_t epoch, int64_t start_batch) {
  stop_workers();
  EG_CHECK(start_batch >= 0 && start_batch <= batches_per_epoch(), "loader: cannot start epoch ", epoch, " at batch ",
           start_batch, " of ", batches_per_epoch());
  epoch_ = epoch;
  order_ = epoch_order(epoch);
  consumed_ = issued_ = start_batch;
  end_ = batches_per_epoch();
  building_.clear();
  ready_.clear();
  failed_.clear();
  for (int i = 0; i < opt_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

Loader::Building& Loader::open_batch(int64_t index) {
  const std::vector<int64_t> pos = positions(index);
  Building& f = building_[index];
  f.n = int64_t(pos.size());
  Shape shape = data_->sample_shape();
  shape.insert(shape.begin(), f.n);
  f.b.index = index;
  f.b.x = Tensor::empty(shape, pixels_ ? DType::u8 : DType::f32);
  f.b.y = Tensor::empty({f.n}, DType::s64);
  for (int64_t p : pos) f.ids.push_back(order_[size_t(p)]);
  f.bad.assign(size_t(f.n), std::string());
  return f;
}

// The batch as one worker building it alone would have made it: the loaded samples'
// rows packed in position order, the left-out ones listed in that order.
void Loader::finish(int64_t index, Building& f) {
  if (f.error) {
    failed_[index] = f.error;
  } else {
    Batch& b = f.b;
    const Shape& s = data_->sample_shape();
    const size_t row = size_t(s[0] * s[1] * s[2]) * dtype_size(b.x.dtype());
    char* x = static_cast<char*>(b.x.raw());
    int64_t* y = b.y.data<int64_t>();
    int64_t kept = 0;
    for (int64_t i = 0; i < f.n; ++i) {
      const int64_t id = f.ids[size_t(i)];
      if (!f.bad[size_t(i)].empty()) {
        b.left_out.emplace_back(id, f.bad[size_t(i)]);
        continue;
      }
      if (kept != i) std::memmove(x + size_t(kept) * row, x + size_t(i) * row, row);
      b.ids.push_back(id);
      y[kept++] = data_->label(id);
    }
    if (kept < f.n) b.x = b.x.slice(0, kept), b.y = b.y.slice(0, kept);
    ready_[index] = std::move(b);
  }
  building_.erase(index);
}

void Loader::worker_loop() {
  const Shape& s = data_->sample_shape();
  const int64_t per = s[0] * s[1] * s[2];
  for (;;) {
    int64_t index = 0, first = 0, last = 0;
    Building* f = nullptr;
    {
      std::unique_lock<std::mutex> l(mu_);
      // The oldest batch with unclaimed samples, else a new one inside the prefetch window.
      auto claimable = [&] {
        for (auto& [i, b] : building_)
          if (b.next < b.n) return true;
        return issued_ < end_ && issued_ < consumed_ + opt_.prefetch;
      };
      cv_.wait(l, [&] { return stopping_ || claimable(); });
      if (stopping_) return;
      for (auto& [i, b] : building_)
        if (b.next < b.n) {
          index = i, f = &b;
          break;
        }
      if (!f) {
        index = issued_++;
        try {
          f = &open_batch(index);
        } catch (...) {  // its memory: raised when the batch is consumed, as a sample's errors
          building_.erase(index);
          failed_[index] = std::current_exception();
          l.unlock();
          cv_.notify_all();
          continue;
        }
      }
      // A few samples a claim: enough to keep the lock out of the way of cheap samples
      // (in-memory images), few enough that every worker gets some of a batch.
      const int64_t chunk = std::clamp<int64_t>(f->n / (2 * int64_t(opt_.workers)), 1, 16);
      first = f->next, last = std::min(f->n, first + chunk);
      f->next = last;
      if (f->n == 0) {  // an empty share (data parallelism's last batch)
        finish(index, *f);
        l.unlock();
        cv_.notify_all();
        continue;
      }
    }
    std::exception_ptr error;
    std::vector<std::pair<int64_t, std::string>> bad;
    const int64_t drawn = augmentation_epoch(epoch_, opt_.augment_variants);
    for (int64_t i = first; i < last && !error; ++i) {
      try {
        if (pixels_) data_->load_pixels(f->ids[size_t(i)], opt_.seed, drawn, f->b.x.data<uint8_t>() + i * per);
        else data_->load(f->ids[size_t(i)], opt_.seed, drawn, f->b.x.data<float>() + i * per);
      } catch (const BadSample& e) {
        if (!opt_.skip_bad) error = std::current_exception();
        else bad.emplace_back(i, e.what());
      } catch (...) {  // raised when the batch is consumed, so that errors come in epoch order
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [i, why] : bad) f->bad[size_t(i)] = why;
      if (error && !f->error) f->error = error;
      f->done += last - first;
      if (f->done == f->n) finish(index, *f);
    }
    cv_.notify_all();
  }
}

bool Loader::next(Batch& b) {
  std::unique_lock<std::mutex> l(mu_);
  if (consumed_ >= end_) return false;
  EG_CHECK(!threads_.empty(), "loader: start_epoch() was not called");
  cv_.wait(l, [&] { return failed_.count(consumed_) || ready_.count(consumed_); });
  if (auto f = failed_.find(consumed_); f != failed_.end()) std::rethrow_exception(f->second);
  b = std::move(ready_[consumed_]);
  ready_.erase(consumed_++);
  l.unlock();
  cv_.notify_all();
  return true;
}

std::vector<int64_t> Loader::upcoming_ids(int64_t batches) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int64_t> v;
  for (int64_t b = consumed_; b < std::min(end_, consumed_ + batches); ++b)
    for (int64_t i : positions(b)) v.push_back(order_[size_t(i)]);
  return v;
}

}  // namespace eg::data
