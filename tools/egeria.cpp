// The egeria command line:
//   egeria train --model resnet20 --dataset fashion-mnist --epochs 15 --out runs/r20
//   egeria eval  --out runs/r20
//   egeria bench step --model resnet56 --batch-size 128 --device cpu
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  CLI::App app{"egeria: DNN training with knowledge-guided layer freezing"};
  app.require_subcommand(1);
  eg::train::TrainConfig c;

  auto* train = app.add_subcommand("train", "train a built-in model");
  train->add_option("--model", c.model, "resnet20|32|44|56|110, resnet18|50, mobilenetv2")->capture_default_str();
  train->add_option("--dataset", c.dataset, "fashion-mnist, mnist, cifar10, cifar100, synthetic")->capture_default_str();
  train->add_option("--data-dir", c.data_dir, "dataset directory (fashion-mnist defaults to Debian's package)");
  train->add_option("--epochs", c.epochs)->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--batch-size", c.batch_size)->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--lr", c.lr, "base learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--optimizer", c.optimizer)->capture_default_str()->check(CLI::IsMember({"sgd", "adamw"}));
  train->add_option("--momentum", c.momentum)->capture_default_str()->check(CLI::Range(0.0, 0.999999));
  train->add_flag("--nesterov", c.nesterov);
  train->add_option("--weight-decay", c.weight_decay)->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--lr-schedule", c.lr_schedule)
      ->capture_default_str()
      ->check(CLI::IsMember({"step", "multistep", "cosine", "constant", "inverse-sqrt", "linear"}));
  train->add_option("--milestones", c.milestones, "epochs at which step/multistep multiply the LR by --gamma")->delimiter(',');
  train->add_option("--gamma", c.gamma)->capture_default_str();
  train->add_option("--warmup-steps", c.warmup_steps)->capture_default_str()->check(CLI::NonNegativeNumber);
  train->add_option("--device", c.device, "cpu or cuda:N")->capture_default_str();
  train->add_option("--threads", c.threads, "CPU threads (0: all cores)")->capture_default_str();
  train->add_option("--seed", c.seed)->capture_default_str();
  train->add_option("--train-limit", c.train_limit, "use the first N training images")->check(CLI::NonNegativeNumber);
  train->add_option("--test-limit", c.test_limit, "use the first N test images")->check(CLI::NonNegativeNumber);
  train->add_option("--target-accuracy", c.target_accuracy, "report time to reach this test accuracy");
  train->add_option("--out", c.out, "output directory")->capture_default_str();
  train->add_flag("--resume", c.resume, "continue from DIR/checkpoint.safetensors");
  train->add_option("--checkpoint-every", c.checkpoint_every, "also checkpoint every N steps")->check(CLI::NonNegativeNumber);
  train->add_option("--log-every", c.log_every)->capture_default_str()->check(CLI::PositiveNumber);
  train->add_option("--workers", c.workers, "data loader threads")->capture_default_str()->check(CLI::PositiveNumber);
  train->add_flag("!--no-augment", c.augment, "disable random crop and flip");
  train->add_option("--freeze", c.freeze, "layer freezing policy")->capture_default_str();
  train->add_option("--stop-after-steps", c.stop_after_steps, "end after N steps of this invocation (testing)");

  std::string eval_out, eval_data;
  int64_t eval_limit = 0;
  auto* eval = app.add_subcommand("eval", "evaluate a run's checkpoint on its test split");
  eval->add_option("--out", eval_out, "the run's output directory")->required();
  eval->add_option("--data-dir", eval_data);
  eval->add_option("--test-limit", eval_limit)->check(CLI::NonNegativeNumber);

  std::string bmodel = "resnet56", bdevice = "cpu";
  int64_t bbatch = 128;
  int biters = 10, bthreads = 0;
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  auto* step = bench->add_subcommand("step", "training-step throughput (JSON line)");
  step->add_option("--model", bmodel)->capture_default_str();
  step->add_option("--batch-size", bbatch)->capture_default_str()->check(CLI::PositiveNumber);
  step->add_option("--device", bdevice)->capture_default_str();
  step->add_option("--iterations", biters)->capture_default_str()->check(CLI::PositiveNumber);
  step->add_option("--threads", bthreads)->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*train) {
      auto s = eg::train::run_training(c);
      if (s.completed)
        std::printf("final test accuracy %.2f%% (best %.2f%%), %.1f s, %.0f images/s; summary in %s/summary.json\n",
                    100 * s.final_test_accuracy, 100 * s.best_test_accuracy, s.train_seconds, s.images_per_second,
                    c.out.c_str());
    } else if (*eval) {
      auto r = eg::train::evaluate_checkpoint(eval_out, eval_data, eval_limit);
      std::printf("%s\n", nlohmann::json{{"test_accuracy", r.accuracy}, {"test_loss", r.loss}, {"samples", r.samples}}
                              .dump()
                              .c_str());
    } else if (*step) {
      auto r = eg::train::bench_step(bmodel, bbatch, bdevice, biters, bthreads);
      std::printf("%s\n", nlohmann::json{{"model", bmodel}, {"batch_size", bbatch}, {"device", bdevice},
                                         {"images_per_second", r.samples_per_second},
                                         {"median_step_ms", r.median_step_ms}, {"iterations", r.iterations}}
                              .dump()
                              .c_str());
    }
  } catch (const eg::Error& e) {
    std::fprintf(stderr, "egeria: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "egeria: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
