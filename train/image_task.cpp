#include "train/image_task.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>

#include "autograd/node.h"
#include "layers/layers.h"
#include "train/freezing.h"

namespace eg::train {

data::FolderTransform folder_transform(const TrainConfig& c, bool train) {
  data::FolderTransform t;
  t.size = c.image_size > 0 ? c.image_size : 224;
  t.channels = c.image_channels;
  t.crop_pct = c.crop_pct;
  t.train = train;
  if (t.channels == 1) t.norm.mean[0] = 0.449f, t.norm.std[0] = 0.226f;  // ImageNet's, averaged over R, G, B
  for (size_t k = 0; k < c.image_mean.size() && k < 3; ++k) t.norm.mean[k] = float(c.image_mean[k]);
  for (size_t k = 0; k < c.image_std.size() && k < 3; ++k) t.norm.std[k] = float(c.image_std[k]);
  return t;
}

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

ImageTask::ImageTask(ImageData user_data) : user_(std::move(user_data)) {}

namespace {

// The first n samples of a source: --train-limit and --test-limit on a user's data.
class FirstSamples final : public data::SampleSource {
 public:
  FirstSamples(std::shared_ptr<const data::SampleSource> s, int64_t n) : s_(std::move(s)), n_(n) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return s_->sample_shape(); }
  int64_t label(int64_t id) const override { return s_->label(id); }
  void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const override { s_->load(id, seed, epoch, out); }

 private:
  std::shared_ptr<const data::SampleSource> s_;
  int64_t n_;
};

std::shared_ptr<const data::SampleSource> first(std::shared_ptr<const data::SampleSource> s, int64_t n) {
  if (n <= 0 || n >= s->size()) return s;
  return std::make_shared<FirstSamples>(std::move(s), n);
}

// --skip-bad-images: each file left out is named once per process (the reason names its
// path), however often an epoch or an evaluation meets it again.
void warn_left_out(const std::vector<std::pair<int64_t, std::string>>& left_out) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [id, reason] : left_out)
    if (warned.insert(reason).second)
      std::fprintf(stderr, "warning: left out (--skip-bad-images): %s\n", reason.c_str());
}

// A label outside [0, classes) is the data's error, named in its terms with its sample:
// the loss sees only a row (the CPU's names a target index, the GPU's gives a NaN loss).
void check_labels(const data::Batch& b, int64_t classes, const char* split) {
  const int64_t* y = b.y.data<int64_t>();
  for (int64_t i = 0; i < b.y.numel(); ++i)
    EG_CHECK(y[i] >= 0 && y[i] < classes, "the ", split, " sample ", b.ids[size_t(i)], " has label ", y[i],
             ", but labels are 0 to ", classes - 1, " (", classes, " classes)");
}

}  // namespace

ImageSplits in_memory_splits(const TrainConfig& c) {
  const data::DatasetInfo& info = data::dataset_info(c.dataset);
  ImageSplits s;
  s.num_classes = c.classes.empty() ? info.classes : int64_t(c.classes.size());
  auto train = std::make_shared<data::ImageDataset>(
      data::load_image_dataset({c.dataset, c.data_dir, c.train_limit, c.classes}, true));
  if (c.val_fraction > 0) {
    EG_CHECK(train->size() >= 2, "--val-fraction needs at least 2 training images, got ", train->size());
    auto [valid, rest] = hold_out(*train, c.val_fraction, c.seed);
    s.valid = data::image_samples(std::make_shared<data::ImageDataset>(std::move(valid)), {0, false, info.norm});
    *train = std::move(rest);
  }
  s.train_what = c.val_fraction > 0 ? " images after --val-fraction" : " images";
  data::AugmentOptions aug{0, false, info.norm};
  if (c.augment) aug.crop_padding = train->images.size(2) >= 32 ? 4 : 2, aug.hflip = true;
  s.train = data::image_samples(train, aug);
  auto test = std::make_shared<data::ImageDataset>(
      data::load_image_dataset({c.dataset, c.data_dir, c.test_limit, c.classes}, false));
  const auto geometry = [](const data::ImageDataset& d) {
    return Shape(d.images.shape().begin() + 1, d.images.shape().end());
  };
  EG_CHECK(geometry(*test) == geometry(*train), "dataset ", c.dataset, ": the test images are ",
           shape_str(geometry(*test)), " and the training images ", shape_str(geometry(*train)),
           " ([channels, height, width]); both splits must have the same size");
  s.test = data::image_samples(test, {0, false, info.norm});
  s.eval_batch = 500, s.eval_workers = 1;
  return s;
}

ImageSplits folder_splits(const TrainConfig& c) {
  data::ImageFolder train = data::scan_image_folder(c.data_dir + "/train");
  data::ImageFolder test = data::scan_image_folder(c.data_dir + "/val", &train.classes);
  auto limit = [](data::ImageFolder& f, int64_t n) {
    if (n <= 0 || n >= f.size()) return;
    f.files.resize(size_t(n)), f.labels.resize(size_t(n));
  };
  limit(train, c.train_limit);
  limit(test, c.test_limit);
  ImageSplits s;
  s.num_classes = int64_t(train.classes.size());
  s.resolved = {{"classes", train.classes}};
  s.train_what = " images in " + c.data_dir + "/train";
  s.description = c.data_dir + ": " + std::to_string(train.classes.size()) + " classes, " +
                  std::to_string(train.size()) + " training images, " + std::to_string(test.size()) + " in val/, " +
                  std::to_string(c.image_size > 0 ? c.image_size : 224) + " pixels square";
  if (train.left_out + test.left_out > 0)
    s.description +=
        "; " + std::to_string(train.left_out + test.left_out) + " files not named *.jpg, *.jpeg or *.png left out";
  // The limit keeps the first images in class order (as the IDX datasets' first images):
  // a small one may hold a few classes only, which the user should see.
  const int64_t kept = int64_t(std::set<int64_t>(train.labels.begin(), train.labels.end()).size());
  if (kept < int64_t(train.classes.size()))
    s.description += "; note: --train-limit " + std::to_string(c.train_limit) +
                     " keeps the first images in class order, which hold " + std::to_string(kept) + " of the " +
                     std::to_string(train.classes.size()) + " classes";
  // Without augmentation training sees the evaluation's centre crops.
  s.train = std::make_shared<data::FolderSamples>(std::move(train), folder_transform(c, c.augment));
  s.test = std::make_shared<data::FolderSamples>(std::move(test), folder_transform(c, false));
  return s;
}

ImageSplits user_splits(ImageData d, const TrainConfig& c) {
  EG_CHECK(d.train && d.test, "ImageData: the training and test samples are both needed (train, test)");
  if (d.num_classes == 0) d.num_classes = int64_t(d.classes.size());
  EG_CHECK(d.num_classes > 0, "ImageData: how many classes? set num_classes (or name them in classes)");
  EG_CHECK(d.classes.empty() || int64_t(d.classes.size()) == d.num_classes, "ImageData: ", d.classes.size(),
           " class names for ", d.num_classes, " classes");
  EG_CHECK(c.val_fraction == 0, "--val-fraction holds out images of a built-in dataset; give a user's validation ",
           "samples as ImageData::valid");
  EG_CHECK(c.classes.empty(),
           "--classes selects classes of a built-in dataset; give a user's samples of the "
           "classes wanted");
  const Shape shape = d.train->sample_shape();
  EG_CHECK(shape.size() == 3 && shape[0] > 0 && shape[1] > 0 && shape[1] == shape[2],
           "ImageData: a sample must be f32 [C, H, W] with H == W, the training samples' shape is ", shape_str(shape));
  for (auto* split : {&d.test, &d.valid})
    if (*split)
      EG_CHECK((*split)->sample_shape() == shape, "ImageData: the ", split == &d.test ? "test" : "validation",
               " samples' shape ", shape_str((*split)->sample_shape()), " differs from the training samples' ",
               shape_str(shape));
  ImageSplits s;
  s.train = first(d.train, c.train_limit);
  s.test = first(d.test, c.test_limit);
  s.valid = d.valid;
  EG_CHECK(s.test->size() > 0, "ImageData: the test split has no samples");
  s.num_classes = d.num_classes;
  s.resolved = {{"num_classes", d.num_classes}};
  if (!d.classes.empty()) s.resolved["classes"] = d.classes;
  s.train_what = " training samples";
  s.description = c.dataset + ": " + std::to_string(d.num_classes) + " classes, " + std::to_string(s.train->size()) +
                  " training samples of " + shape_str(shape) + ", " + std::to_string(s.test->size()) + " test" +
                  (s.valid ? ", " + std::to_string(s.valid->size()) + " validation" : std::string());
  return s;
}

void ImageTask::setup(const TrainConfig& c, dist::Communicator& comm) {
  c_ = c;
  comm_ = &comm;
  dev_ = Device::parse(c.device);
  if (user_) data_ = user_splits(*user_, c);
  else if (data::dataset_info(c.dataset).kind == data::DataKind::image_folder) data_ = folder_splits(c);
  else data_ = in_memory_splits(c);
  build_model();
  data::LoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.workers = c.workers;
  // Batches in flight grow with the workers (a GPU run's 15 share each batch and start the
  // next ones while the step consumes one): as many as workers, at least the default 4.
  lo.prefetch = std::max(lo.prefetch, c.workers);
  lo.seed = c.seed;
  lo.shard_rank = comm.rank(), lo.shards = comm.size();
  lo.skip_bad = c.skip_bad_images;
  // --augment-mode sample: epoch e loads a sample's fixed augmentation e mod N. Otherwise
  // the epoch itself (without augmentation an image dataset's sample is the same in every
  // epoch; a library user's source sees the real epoch, as it always has).
  const bool fixed = c.augment && c.augment_mode == AugmentMode::sample;
  variants_ = fixed ? c.augment_variants : 1;
  lo.augment_variants = fixed ? variants_ : 0;
  staged_ = !c.freezing.cache;
  lo.pixels = staged_ && dev_.is_cuda();
  loader_ = std::make_unique<data::Loader>(data_.train, lo);
  if (staged_) x_up_ = std::make_unique<StagedUpload>(dev_), y_up_ = std::make_unique<StagedUpload>(dev_);
  if (loader_->pixels()) {
    const data::PixelAffine a = loader_->pixel_affine();
    const int64_t ch = int64_t(a.scale.size());
    host_scale_ = Tensor::from_vector(a.scale, {ch}), host_zero_ = Tensor::from_vector(a.zero, {ch});
    scale_ = host_scale_.to(dev_), zero_ = host_zero_.to(dev_);
  }
}

void ImageTask::build_model() {
  EG_CHECK(data_.train->size() >= c_.batch_size * comm_->size(), "--batch-size ", c_.batch_size,
           comm_->size() > 1 ? " x " + std::to_string(comm_->size()) + " ranks" : std::string(),
           " is larger than the training set (", data_.train->size(), data_.train_what, ")");
  // Dropout (MobileNetV2's head, a user's model) draws from the generator the model was
  // built with, so that generator lives as long as the model and its state is in every
  // checkpoint, as the translation task's.
  gen_ = Generator(c_.seed);
  model_ = models::build_model(model_config(), gen_);
  // One that draws from another generator (a layer's default, the process-wide one) would
  // be outside the checkpoint (no exact resume), the same on every rank, and shared with
  // the reference model's builds on their thread (a data race).
  for (auto& [name, mod] : model_->named_modules())
    if (auto* d = dynamic_cast<nn::Dropout*>(mod); d && d->p > 0)
      EG_CHECK(d->draws_from() == &gen_, "model '", c_.model, "': its Dropout '", name,
               "' draws from another generator than the one its builder was given; pass the builder's ",
               "Generator& g to nn::Dropout (and to nn::MultiHeadAttention)");
  model_->to(dev_);
}

models::ModelConfig ImageTask::model_config() const {
  const Shape s = data_.train->sample_shape();
  models::ModelConfig mc;
  mc.name = c_.model;
  mc.in_channels = s[0];
  mc.image_size = s[1];
  mc.num_classes = data_.num_classes;
  mc.small_input = mc.image_size <= 64;  // the ImageNet stem (7x7 stride 2, max pool) for ImageNet-sized inputs
  return mc;
}

void ImageTask::configure_freezing(freeze::PolicyConfig& pc) const {
  const models::ModelConfig mc = model_config();
  pc.model.in_channels = mc.in_channels;
  pc.model.image_size = mc.image_size;
  pc.model.num_classes = mc.num_classes;
  pc.model.small_input = mc.small_input;
  std::vector<int64_t> counts(size_t(mc.num_classes), 0);
  for (int64_t i = 0; i < data_.train->size(); ++i) {
    const int64_t y = data_.train->label(i);
    if (y >= 0 && y < mc.num_classes) ++counts[size_t(y)];
  }
  pc.constant_loss = freeze::constant_prediction_loss(counts, c_.label_smoothing);
}

void ImageTask::attach(FreezeRun& fr) {
  if (c_.freezing.cache)
    fr.use_cache(c_.freezing.cache_dir.empty() ? c_.out : c_.freezing.cache_dir, data_.train->size() * variants_,
                 !c_.freezing.cache_dir.empty());
}

nlohmann::json ImageTask::resolved() const { return data_.resolved; }

Shape ImageTask::sample_shape() const { return data_.train ? data_.train->sample_shape() : Shape{}; }

std::string ImageTask::description() const { return data_.description; }

bool ImageTask::next_batch() {
  if (staged_) {  // a batch staged and never trained on (a run stopped between): dropped
    for (auto* up : {x_up_.get(), y_up_.get()})
      if (up->staged()) up->take([](const Tensor&) { return Tensor(); });
  }
  if (!loader_->next(batch_)) return false;
  warn_left_out(batch_.left_out);
  check_labels(batch_, data_.num_classes, "training");
  left_out_here_ += int64_t(batch_.left_out.size());
  if (staged_ && !batch_.ids.empty()) x_up_->stage(batch_.x), y_up_->stage(batch_.y);
  return true;
}

void ImageTask::save_state(nlohmann::json& state) {
  double here = double(left_out_here_);
  if (comm_->size() > 1) {
    Tensor t = Tensor::from_vector(std::vector<double>{here}, {1});
    comm_->all_reduce(t);
    here = t.item();
  }
  left_out_total_ = left_out_restored_ + int64_t(here);
  state["images_left_out"] = left_out_total_;
}

void ImageTask::load_state(const nlohmann::json& state) {
  left_out_total_ = left_out_restored_ = state.value("images_left_out", int64_t(0));
  left_out_here_ = 0;
}

Task::GraphBatch ImageTask::stage_graph_batch() {
  GraphBatch g;
  if (batch_.ids.empty()) return g;
  EG_CHECK(staged_, "internal: --cuda-graphs on without staged batches");
  const Shape xs = batch_.x.shape(), ys = batch_.y.shape();
  // Made for --batch-size samples at once: a short batch fits at the same addresses.
  const int64_t rows = std::max<int64_t>(1, xs[0]);
  graph_x_ = x_in_.place(xs, DType::f32, dev_, c_.batch_size * (batch_.x.numel() / rows));
  graph_y_ = y_in_.place(ys, batch_.y.dtype(), dev_, c_.batch_size * (batch_.y.numel() / rows));
  // Written in place: the graph of this shape reads these tensors' storage.
  (void)x_up_->take([&](const Tensor& d) {
    if (d.dtype() == DType::u8) ops::call(ops::image_normalize, d, scale_, zero_, graph_x_);
    else graph_x_.copy_(d);
    return Tensor();
  });
  (void)y_up_->take([&](const Tensor& d) {
    graph_y_.copy_(d);
    return Tensor();
  });
  g.shape = xs;
  g.shape.insert(g.shape.end(), ys.begin(), ys.end());
  g.samples = batch_.y.numel();
  g.moves = x_in_.moves() + y_in_.moves();
  return g;
}

std::vector<int64_t> ImageTask::cache_keys(const std::vector<int64_t>& ids) const {
  if (variants_ == 1) return ids;
  const int64_t drawn = data::augmentation_epoch(loader_->epoch(), variants_);
  std::vector<int64_t> keys(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) keys[i] = ids[i] * variants_ + drawn;
  return keys;
}

Tensor ImageTask::host_images() const {
  if (batch_.x.dtype() != DType::u8) return batch_.x;
  Tensor images = Tensor::empty(batch_.x.shape());
  ops::call(ops::image_normalize, batch_.x, host_scale_, host_zero_, images);
  return images;
}

StepOutput ImageTask::graph_forward(FreezeRun& fr) {
  StepOutput out;
  Tensor logits =
      fr.forward({graph_x_, Tensor(), [this] { return host_images(); }, Tensor()}, cache_keys(batch_.ids), dev_);
  out.loss = fn::cross_entropy(logits, graph_y_, c_.label_smoothing);
  out.samples = batch_.y.numel();
  return out;
}

StepOutput ImageTask::training_step(FreezeRun& fr) {
  StepOutput out;
  if (batch_.ids.empty()) return out;  // this rank's share is empty, or every image was left out
  // The step's own tensors: clones of the device copies (the staging buffers are reused),
  // on the CPU the batch itself.
  auto own = [](const Tensor& t) { return t.is_cuda() ? t.clone() : t; };
  Tensor x = batch_.x, y;
  if (staged_) {
    x = x_up_->take([&](const Tensor& d) {
      if (d.dtype() != DType::u8) return own(d);
      Tensor images = Tensor::empty(d.shape(), DType::f32, d.device());
      ops::call(ops::image_normalize, d, scale_, zero_, images);
      return images;
    });
    y = y_up_->take(own);
  } else {
    y = batch_.y.to(dev_);
  }
  Tensor logits = fr.forward({x, Tensor(), [this] { return host_images(); }, Tensor()}, cache_keys(batch_.ids), dev_);
  if (fr.caching()) fr.prefetch(cache_keys(loader_->upcoming_ids(1)));  // gathered while this step runs
  out.loss = fn::cross_entropy(logits, y, c_.label_smoothing);
  out.samples = batch_.y.numel();
  return out;
}

std::vector<Split> ImageTask::epoch_splits() const {
  if (data_.valid) return {Split::valid, Split::test};
  return {Split::test};
}

Metrics ImageTask::evaluate(Split s) {
  return evaluate_samples(*model_, s == Split::valid ? data_.valid : data_.test, dev_,
                          data_.eval_workers > 0 ? data_.eval_workers : c_.workers, comm_, nullptr, c_.skip_bad_images,
                          data_.eval_batch);
}

namespace {

// Accuracy and mean loss over the loader's batches, reduced over the ranks from counts.
Metrics evaluate_batches(models::Model& m, data::Loader& l, Device dev, dist::Communicator* comm, PerClass* per_class) {
  autograd::NoGradGuard ng;
  struct Restore {  // training mode back however the evaluation ends (an error a caller catches)
    models::Model& m;
    bool was;
    ~Restore() {
      if (was) m.train();
    }
  } restore{m, m.is_training()};
  m.eval();
  l.start_epoch(0);
  data::Batch b;
  // Loss sum, correct, samples, left out; then per class: correct, samples (the same size on every rank).
  const size_t classes = per_class ? per_class->total.size() : 0;
  std::vector<double> counts(4 + 2 * classes, 0.0);
  while (l.next(b)) {
    warn_left_out(b.left_out);
    counts[3] += double(b.left_out.size());
    if (b.ids.empty()) continue;  // this rank's share of a short last batch, or all left out
    Tensor logits = m.forward(b.x.to(dev));
    check_labels(b, logits.size(1), "evaluation");
    counts[0] += fn::cross_entropy(logits, b.y.to(dev)).item() * double(b.y.numel());
    const std::vector<int64_t> pred = fn::argmax(logits).to_vector<int64_t>();
    for (int64_t i = 0; i < b.y.numel(); ++i) {
      const int64_t y = b.y.data<int64_t>()[i];
      counts[1] += pred[size_t(i)] == y;
      if (per_class) {
        EG_CHECK(y >= 0 && size_t(y) < classes, "evaluation: label ", y, " of ", classes, " classes");
        counts[size_t(4 + 2 * y)] += pred[size_t(i)] == y, counts[size_t(5 + 2 * y)] += 1;
      }
    }
    counts[2] += double(b.y.numel());
  }
  if (comm && comm->size() > 1) {
    Tensor t = Tensor::from_vector(counts, {int64_t(counts.size())});
    comm->all_reduce(t);
    counts = t.to_vector<double>();
  }
  EG_CHECK(counts[2] > 0 || counts[3] == 0, "evaluation: all ", int64_t(counts[3]),
           " images of the split were left out as unreadable (--skip-bad-images): there is nothing to evaluate");
  if (per_class) {
    per_class->correct.assign(classes, 0);
    for (size_t k = 0; k < classes; ++k)
      per_class->correct[k] = int64_t(counts[4 + 2 * k]), per_class->total[k] = int64_t(counts[5 + 2 * k]);
  }
  Metrics r = {{"accuracy", counts[1] / std::max(counts[2], 1.0)}, {"loss", counts[0] / std::max(counts[2], 1.0)}};
  if (counts[3] > 0) r["images_left_out"] = counts[3];
  return r;
}

// Evaluation batches: each rank takes its share of every global batch.
data::LoaderOptions eval_options(int64_t batch, int workers, dist::Communicator* comm, bool skip_bad = false) {
  data::LoaderOptions o;
  o.skip_bad = skip_bad;
  o.batch_size = batch;
  o.shuffle = false;
  o.drop_last = false;
  o.workers = std::max(1, workers);
  if (comm) o.shard_rank = comm->rank(), o.shards = comm->size();
  return o;
}

}  // namespace

Metrics evaluate_samples(models::Model& m, std::shared_ptr<const data::SampleSource> s, Device dev, int workers,
                         dist::Communicator* comm, PerClass* per_class, bool skip_bad, int64_t batch) {
  data::Loader l(std::move(s), eval_options(batch, workers, comm, skip_bad));
  return evaluate_batches(m, l, dev, comm, per_class);
}

Metrics evaluate_images(models::Model& m, const data::ImageDataset& d, const std::string& dataset, Device dev,
                        dist::Communicator* comm, PerClass* per_class) {
  auto s = data::image_samples(std::make_shared<data::ImageDataset>(d), {0, false, data::dataset_info(dataset).norm});
  return evaluate_samples(m, std::move(s), dev, 1, comm, per_class, false, 500);
}

void ImageTask::summarize(nlohmann::json& sj) const {
  if (c_.skip_bad_images) sj["images_left_out"] = left_out_total_;
  if (!data_.resolved.empty()) sj["classes"] = data_.num_classes;  // an image folder's or a user's
  sj["parameters"] = model_->num_parameters();
  sj["flops_per_sample"] = model_->flops_per_sample();
}

}  // namespace eg::train
