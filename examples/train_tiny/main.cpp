// train_tiny: trains a small CNN on Fashion-MNIST through egeria's public API.
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

  data::ImageDataset train = data::load_mnist_split(dir, "train"), test = data::load_mnist_split(dir, "t10k");
  n_train = std::min(n_train, train.size());
  Tensor xtr = data::normalize_images(train.images.slice(0, n_train), 0.2860, 0.3530);
  Tensor ytr = train.labels.slice(0, n_train);
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
  const int64_t bs = 32;
  auto sched = optim::linear_warmup(optim::cosine_lr(3e-3, epochs * (n_train / bs)), 20);
  int64_t step = 0;
  auto start = std::chrono::steady_clock::now();
  Generator shuffle_gen(1);
  for (int e = 0; e < epochs; ++e) {
    model->train();
    double total = 0;
    int64_t steps = 0;
    for (int64_t b = 0; b + bs <= n_train; b += bs, ++steps) {
      opt.set_lr(sched->lr_at(step++));
      Tensor loss = loss_fn((*model)(xtr.slice(b, b + bs)), ytr.slice(b, b + bs));
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
