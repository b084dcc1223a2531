#include "train/image_task.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "autograd/node.h"
#include "train/freezing.h"

namespace eg::train {

int64_t num_classes(const std::string& dataset) { return dataset == "cifar100" ? 100 : 10; }

std::pair<data::ImageDataset, data::ImageDataset> hold_out(const data::ImageDataset& d, double fraction,
                                                           uint64_t seed) {
  const int64_t n = d.size(), k = std::clamp<int64_t>(int64_t(std::llround(double(n) * fraction)), 1, n - 1);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Fisher-Yates with counter-based draws, keyed apart from the loader's epoch orders.
  const uint64_t key = seed * 0x9E3779B97F4A7C15ull ^ 0x76616c6964ull;
  for (size_t i = order.size() - 1; i > 0; --i) {
    const Philox4 r = philox4x32(key, i);
    std::swap(order[i], order[size_t((uint64_t(r.x[0]) << 32 | r.x[1]) % (i + 1))]);
  }
  std::sort(order.begin(), order.begin() + k);  // each part keeps the dataset's order
  std::sort(order.begin() + k, order.end());
  auto take = [&](size_t from, size_t to) {
    Shape s = d.images.shape();
    s[0] = int64_t(to - from);
    data::ImageDataset r{Tensor::empty(s, DType::u8), Tensor::empty({s[0]}, DType::s64)};
    const int64_t per = d.images.numel() / n;
    for (size_t i = from; i < to; ++i) {
      std::memcpy(r.images.data<uint8_t>() + int64_t(i - from) * per, d.images.data<uint8_t>() + order[i] * per,
                  size_t(per));
      r.labels.data<int64_t>()[i - from] = d.labels.data<int64_t>()[order[i]];
    }
    return r;
  };
  return {take(0, size_t(k)), take(size_t(k), size_t(n))};
}

void ImageTask::setup(const TrainConfig& c, dist::Communicator& comm) {
  c_ = c;
  comm_ = &comm;
  dev_ = Device::parse(c.device);
  auto train = data::load_image_dataset({c.dataset, c.data_dir, c.train_limit}, true);
  if (c.val_fraction > 0) {
    EG_CHECK(train.size() >= 2, "--val-fraction needs at least 2 training images, got ", train.size());
    auto [valid, rest] = hold_out(train, c.val_fraction, c.seed);
    valid_ = std::make_shared<data::ImageDataset>(std::move(valid));
    train = std::move(rest);
  }
  train_ = std::make_shared<data::ImageDataset>(std::move(train));
  test_ = std::make_shared<data::ImageDataset>(data::load_image_dataset({c.dataset, c.data_dir, c.test_limit}, false));
  const int64_t global_batch = c.batch_size * comm.size();
  EG_CHECK(train_->size() >= global_batch, "--batch-size ", c.batch_size,
           comm.size() > 1 ? " x " + std::to_string(comm.size()) + " ranks" : std::string(),
           " is larger than the training set (", train_->size(), " images", valid_ ? " after --val-fraction" : "", ")");
  models::ModelConfig mc;
  mc.name = c.model;
  mc.in_channels = train_->images.size(1);
  mc.image_size = train_->images.size(2);
  mc.num_classes = num_classes(c.dataset);
  Generator g(c.seed);
  model_ = models::build_model(mc, g);
  model_->to(dev_);

  data::LoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.augment = c.augment;
  lo.augment_per_sample = c.augment_mode == AugmentMode::sample;
  lo.aug.crop_padding = c.augment ? (train_->images.size(2) >= 32 ? 4 : 2) : 0;
  lo.aug.hflip = c.augment;
  lo.aug.norm = data::default_normalization(c.dataset);
  lo.workers = c.workers;
  lo.seed = c.seed;
  lo.shard_rank = comm.rank(), lo.shards = comm.size();
  loader_ = std::make_unique<data::Loader>(train_, lo);
}

void ImageTask::configure_freezing(freeze::PolicyConfig& pc) const {
  pc.model.in_channels = train_->images.size(1);
  pc.model.image_size = train_->images.size(2);
  pc.model.num_classes = num_classes(c_.dataset);
}

void ImageTask::attach(FreezeRun& fr) {
  if (c_.freeze_cache)
    fr.use_cache(c_.freeze_cache_dir.empty() ? c_.out : c_.freeze_cache_dir, train_->size(),
                 !c_.freeze_cache_dir.empty());
}

StepOutput ImageTask::training_step(FreezeRun& fr, int64_t capture) {
  StepOutput out;
  Tensor logits = fr.forward(batch_.x, batch_.ids, dev_, capture, &out.captured);
  if (fr.caching()) fr.prefetch(loader_->upcoming_ids(1));  // gathered while this step runs
  out.loss = fn::cross_entropy(logits, batch_.y.to(dev_));
  out.samples = batch_.y.numel();
  out.input = batch_.x;
  return out;
}

std::vector<Split> ImageTask::epoch_splits() const {
  if (valid_) return {Split::valid, Split::test};
  return {Split::test};
}

Metrics ImageTask::evaluate(Split s) {
  return evaluate_images(*model_, s == Split::valid ? *valid_ : *test_, c_.dataset, dev_, comm_);
}

Metrics evaluate_images(models::Model& m, const data::ImageDataset& d, const std::string& dataset, Device dev,
                        dist::Communicator* comm) {
  autograd::NoGradGuard ng;
  const bool was_training = m.is_training();
  m.eval();
  // This rank's share: a contiguous range of the split.
  const int64_t rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
  const int64_t begin = d.size() * rank / ranks, end = d.size() * (rank + 1) / ranks;
  double counts[2] = {0, 0};  // loss sum, correct
  if (end > begin) {
    data::LoaderOptions o;
    o.batch_size = 500;
    o.shuffle = false;
    o.drop_last = false;
    o.aug.norm = data::default_normalization(dataset);
    auto share = ranks == 1 ? std::make_shared<data::ImageDataset>(d)
                            : std::make_shared<data::ImageDataset>(
                                  data::ImageDataset{d.images.slice(begin, end), d.labels.slice(begin, end)});
    data::Loader l(share, o);
    l.start_epoch(0);
    data::Batch b;
    while (l.next(b)) {
      Tensor logits = m.forward(b.x.to(dev));
      counts[0] += fn::cross_entropy(logits, b.y.to(dev)).item() * double(b.y.numel());
      const std::vector<int64_t> pred = fn::argmax(logits).to_vector<int64_t>();
      for (int64_t i = 0; i < b.y.numel(); ++i) counts[1] += pred[size_t(i)] == b.y.data<int64_t>()[i];
    }
  }
  if (ranks > 1) {
    Tensor t = Tensor::from_vector(std::vector<double>(counts, counts + 2), {2});
    comm->all_reduce(t);
    counts[0] = t.data<double>()[0], counts[1] = t.data<double>()[1];
  }
  if (was_training) m.train();
  return {{"accuracy", counts[1] / double(d.size())}, {"loss", counts[0] / double(d.size())}};
}

void ImageTask::summarize(nlohmann::json& sj) const {
  sj["parameters"] = model_->num_parameters();
  sj["flops_per_sample"] = model_->flops_per_sample();
}

}  // namespace eg::train
