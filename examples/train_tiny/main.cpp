// train_tiny: trains a small CNN on Fashion-MNIST with a hand-written loop over egeria's
// public API (layers, optimizer, schedule, loader); examples/custom_cnn trains a model
// through train::fit, with checkpoints, logs and Egeria's freezing.
//   train_tiny [data_dir] [train_images] [epochs]
// data_dir defaults to /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
#include <egeria.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

using namespace eg;

int main(int argc, char** argv) try {
  std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  int64_t n_train = argc > 2 ? std::atoll(argv[2]) : 10000;
  int epochs = argc > 3 ? std::atoi(argv[3]) : 1;
  EG_CHECK(n_train > 0 && epochs > 0, "usage: train_tiny [data_dir] [train_images > 0] [epochs > 0]");

  auto train = std::make_shared<data::ImageDataset>(data::load_mnist_split(dir, "train"));
  const data::ImageDataset test = data::load_mnist_split(dir, "t10k");
  n_train = std::min(n_train, train->size());
  train->images = train->images.slice(0, n_train), train->labels = train->labels.slice(0, n_train);
  Tensor xte = data::normalize_images(test.images, 0.2860, 0.3530);

  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Conv2d>(1, 32, 3, nn::Conv2dOptions{1, 1, 1, 1, false}),
                                 std::make_shared<nn::BatchNorm2d>(32), nn::ReLU(), nn::MaxPool2d(2, 2),
                                 std::make_shared<nn::Conv2d>(32, 64, 3, nn::Conv2dOptions{1, 1, 1, 1, false}),
                                 std::make_shared<nn::BatchNorm2d>(64), nn::ReLU(), nn::MaxPool2d(2, 2),
                                 std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64 * 7 * 7, 10)});
  optim::AdamW opt(model->parameters(), 3e-3, {0.9, 0.999, 1e-8, 1e-4});
  nn::CrossEntropyLoss loss_fn;
  // The loader shuffles each epoch (its order a function of the seed and the epoch), and
  // normalises and flips the images on a background worker while the step runs.
  data::LoaderOptions lo;
  lo.batch_size = 32;
  lo.augment = true;
  lo.aug.hflip = true;
  lo.aug.norm.mean[0] = 0.2860f, lo.aug.norm.std[0] = 0.3530f;
  lo.seed = 1;
  data::Loader loader(train, lo);
  auto sched = optim::linear_warmup(optim::cosine_lr(3e-3, epochs * loader.batches_per_epoch()), 20);
  int64_t step = 0;
  auto start = std::chrono::steady_clock::now();
  for (int e = 0; e < epochs; ++e) {
    model->train();
    double total = 0;
    int64_t steps = 0;
    loader.start_epoch(e);
    for (data::Batch b; loader.next(b); ++steps) {
      opt.set_lr(sched->lr_at(step++));
      Tensor loss = loss_fn((*model)(b.x), b.y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      total += loss.item();
    }
    std::printf("epoch %d: mean train loss %.4f over %lld steps\n", e + 1, total / double(steps), (long long)steps);
  }
  model->eval();
  int64_t correct = 0;
  {
    autograd::NoGradGuard no_grad;
    for (int64_t b = 0; b < test.size(); b += 500) {
      int64_t e = std::min(test.size(), b + 500);
      const std::vector<int64_t> pred = fn::argmax((*model)(xte.slice(b, e))).to_vector<int64_t>();
      for (int64_t i = 0; i < e - b; ++i) correct += pred[size_t(i)] == test.labels.data<int64_t>()[b + i];
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("test accuracy %.2f%% (%lld/%lld) after %d epoch(s) on %lld images, %.1f s\n",
              100.0 * double(correct) / double(test.size()), (long long)correct, (long long)test.size(), epochs,
              (long long)n_train, secs);
  return 0;
} catch (const eg::Error& e) {
  std::fprintf(stderr, "train_tiny: error: %s\n", e.what());
  return 1;
}
