// Image classification as a task of the training loop (train/task.h): an image model
// (built-in, or a user's made known by models::register_model) on an in-memory image
// dataset of the table (data::datasets()), an ImageNet-style image folder (decoded as it
// is loaded) or a user's own samples (ImageData), every split a data::SampleSource;
// cross-entropy, accuracy and loss on the test split (and on a validation split), with
// the activation cache of the frozen prefix.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/staged_upload.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "train/graphed_step.h"
#include "train/task.h"

namespace eg::train {

// A user's classification data, given through the C++ API instead of --dataset: each
// split a data::SampleSource (size, sample shape, label, and sample i as f32 [C, H, W]
// for (seed, epoch, i)). The model is --model's (TrainConfig::model), built for the
// samples' channels and size and for `num_classes`.
struct ImageData {
  std::shared_ptr<const data::SampleSource> train, test;
  // Optional: the best epoch and best.safetensors are then chosen on it, as with --val-fraction.
  std::shared_ptr<const data::SampleSource> valid;
  int64_t num_classes = 0;  // 0: classes.size()
  std::vector<std::string> classes;  // optional: the classes' names, in label order (config.json, weights)
};

// The data an image task trains on, whichever way it came: each split a SampleSource (an
// in-memory dataset through data::image_samples, an image folder's data::FolderSamples, a
// user's own), and what the run records of it.
struct ImageSplits {
  std::shared_ptr<const data::SampleSource> train, valid, test;  // valid: optional
  int64_t num_classes = 0;
  std::string train_what;  // the training samples, for messages: " images in DIR/train"
  std::string description;  // the run's line on its data (empty: the dataset's name says it all)
  nlohmann::json resolved = nlohmann::json::object();  // what config.json records of the data
  // Evaluation's global batch and loader workers (0: --workers). In-memory datasets keep
  // their 500 on one worker, as their stored results were measured.
  int64_t eval_batch = 100;
  int eval_workers = 0;
};

// The three ways in: --dataset's in-memory datasets (with --val-fraction's hold-out and
// the loader's augmentation), --dataset imagefolder, and a user's ImageData (after
// --train-limit / --test-limit).
ImageSplits in_memory_splits(const TrainConfig& c);
ImageSplits folder_splits(const TrainConfig& c);
ImageSplits user_splits(ImageData d, const TrainConfig& c);

class ImageTask : public Task {
 public:
  ImageTask() = default;  // the data named by --dataset
  explicit ImageTask(ImageData user_data);  // a user's; TrainConfig::dataset only names it in the logs
  void setup(const TrainConfig& c, dist::Communicator& comm) override;
  models::Model& model() override {
    EG_CHECK(model_, "ImageTask::model(): train::fit builds the model (from TrainConfig::model); to start from ",
             "weights, set TrainConfig::init_from");
    return *model_;
  }
  Generator& generator() override { return gen_; }
  void configure_freezing(freeze::PolicyConfig& pc) const override;
  void attach(FreezeRun& fr) override;
  int64_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
  void start_epoch(int64_t epoch, int64_t first_batch) override { loader_->start_epoch(epoch, first_batch); }
  bool next_batch() override;
  StepOutput training_step(FreezeRun& fr) override;
  bool graphable() const override { return true; }
  GraphBatch stage_graph_batch() override;
  StepOutput graph_forward(FreezeRun& fr) override;
  std::vector<Split> epoch_splits() const override;
  Metrics evaluate(Split s) override;
  std::string selection_metric() const override { return "accuracy"; }
  bool higher_is_better() const override { return true; }
  void summarize(nlohmann::json& summary) const override;
  void save_state(nlohmann::json& state) override;  // images_left_out, summed over the ranks
  void load_state(const nlohmann::json& state) override;
  nlohmann::json resolved() const override;
  Shape sample_shape() const override;
  std::string description() const override;

 private:
  models::ModelConfig model_config() const;
  void build_model();  // checks the batch fits
  // The reference model's batch on the host: the f32 batch, or the pixels normalised as
  // on the device.
  Tensor host_images() const;
  // The activation cache's entries for these training samples in the loader's epoch: one
  // per sample and fixed augmentation (id x variants_ + the epoch's augmentation).
  std::vector<int64_t> cache_keys(const std::vector<int64_t>& ids) const;
  TrainConfig c_;
  dist::Communicator* comm_ = nullptr;
  Device dev_;
  std::optional<ImageData> user_;  // a user's samples, as given
  ImageSplits data_;
  Generator gen_;  // the model's: its initialisation, then its dropout
  models::ModelPtr model_;
  std::unique_ptr<data::Loader> loader_;
  data::Batch batch_;
  // The training batches' way to the device (Note [Staged uploads]): staged when the
  // loader hands a batch over, taken by its step; not with the activation cache, which
  // wants the batch on the host. An image folder's batches travel to a GPU as 8-bit
  // pixels, normalised there with scale_ and zero_ (on the device).
  bool staged_ = false;
  std::unique_ptr<StagedUpload> x_up_, y_up_;
  // The fixed augmentations a training sample is seen in under --augment-mode sample
  // (--augment-variants), each an activation cache entry of its own; else 1.
  int64_t variants_ = 1;
  // --cuda-graphs on: the batch the graphs read (images, labels), rewritten every step at
  // the front of buffers made for --batch-size samples (a short batch has a graph of its
  // own at the same addresses: Note [Graphed steps] in train/graphed_step.h).
  GraphInput x_in_, y_in_;
  Tensor graph_x_, graph_y_;
  Tensor scale_, zero_, host_scale_, host_zero_;
  // --skip-bad-images: training samples left out, over the run (every rank's, as of the
  // last checkpoint), and by this rank since the run started or resumed.
  int64_t left_out_total_ = 0, left_out_restored_ = 0, left_out_here_ = 0;
};

// An image folder's transform for training or evaluation from the run's options
// (--image-size, --image-channels, --crop-pct, --image-mean, --image-std).
data::FolderTransform folder_transform(const TrainConfig& c, bool train);

// Per-class counts of an evaluation (by label): correct predictions and samples. The
// caller sizes `total` to the number of classes.
struct PerClass {
  std::vector<int64_t> correct, total;
};

// Accuracy and mean cross-entropy of `m` on every sample of `s`, in eval mode, in global
// batches of `batch`; with `comm`, each rank evaluates its share and the counts are summed.
// With `skip_bad`, a sample that cannot be loaded (data::BadSample) is left out, and
// counted as "images_left_out" when there are any.
Metrics evaluate_samples(models::Model& m, std::shared_ptr<const data::SampleSource> s, Device dev, int workers,
                         dist::Communicator* comm = nullptr, PerClass* per_class = nullptr, bool skip_bad = false,
                         int64_t batch = 100);

// The same on an in-memory dataset (normalised as the table's `dataset` is), 500 a batch.
Metrics evaluate_images(models::Model& m, const data::ImageDataset& d, const std::string& dataset, Device dev,
                        dist::Communicator* comm = nullptr, PerClass* per_class = nullptr);

// `fraction` of `d`'s samples, drawn by a seeded shuffle, and the rest: (held out, kept).
std::pair<data::ImageDataset, data::ImageDataset> hold_out(const data::ImageDataset& d, double fraction, uint64_t seed);

}  // namespace eg::train
