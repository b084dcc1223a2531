// Image classification as a task of the training loop (train/task.h): the built-in
// image models (ResNets, MobileNetV2) on an in-memory image dataset or an ImageNet-style
// image folder (decoded as it is loaded), cross-entropy, accuracy and loss on the test
// split (and on a held-out validation split with --val-fraction), with the activation
// cache of the frozen prefix.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/image_folder.h"
#include "data/loader.h"
#include "train/task.h"

namespace eg::train {

class ImageTask : public Task {
 public:
  void setup(const TrainConfig& c, dist::Communicator& comm) override;
  models::Model& model() override { return *model_; }
  void configure_freezing(freeze::PolicyConfig& pc) const override;
  void attach(FreezeRun& fr) override;
  int64_t batches_per_epoch() const override { return loader_->batches_per_epoch(); }
  void start_epoch(int64_t epoch, int64_t first_batch) override { loader_->start_epoch(epoch, first_batch); }
  bool next_batch() override { return loader_->next(batch_); }
  StepOutput training_step(FreezeRun& fr, int64_t capture) override;
  std::vector<Split> epoch_splits() const override;
  Metrics evaluate(Split s) override;
  std::string selection_metric() const override { return "accuracy"; }
  bool higher_is_better() const override { return true; }
  void summarize(nlohmann::json& summary) const override;
  nlohmann::json resolved() const override;
  std::string description() const override;

 private:
  void setup_folder(const TrainConfig& c, dist::Communicator& comm);
  models::ModelConfig model_config() const;
  void build_model(int64_t train_size, const std::string& what);  // checks the batch fits
  TrainConfig c_;
  dist::Communicator* comm_ = nullptr;
  Device dev_;
  std::shared_ptr<data::ImageDataset> train_, valid_, test_;  // in-memory datasets
  std::shared_ptr<data::FolderSamples> folder_train_, folder_test_;  // --dataset imagefolder
  models::ModelPtr model_;
  std::unique_ptr<data::Loader> loader_;
  data::Batch batch_;
};

int64_t num_classes(const std::string& dataset);

// Per-class counts of an evaluation (by label): correct predictions and samples. The
// caller sizes `total` to the number of classes.
struct PerClass {
  std::vector<int64_t> correct, total;
};

// Accuracy and mean cross-entropy of `m` on every sample of `s`, in eval mode; with
// `comm`, each rank evaluates its share and the counts are summed.
Metrics evaluate_samples(models::Model& m, std::shared_ptr<const data::SampleSource> s, Device dev, int workers,
                         dist::Communicator* comm = nullptr, PerClass* per_class = nullptr);

// The same on an in-memory dataset (normalised as `dataset` is).
Metrics evaluate_images(models::Model& m, const data::ImageDataset& d, const std::string& dataset, Device dev,
                        dist::Communicator* comm = nullptr, PerClass* per_class = nullptr);

// `fraction` of `d`'s samples, drawn by a seeded shuffle, and the rest: (held out, kept).
std::pair<data::ImageDataset, data::ImageDataset> hold_out(const data::ImageDataset& d, double fraction, uint64_t seed);

}  // namespace eg::train
