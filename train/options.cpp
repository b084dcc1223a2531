// The table of options (train/config.h): each row names a flag, its config.json key,
// its group in --help, what a resume may do with it, how its value is read and written,
// its own rule and its recipe defaults (the builders: train/option_rows.h). The command
// line, config.json, validation, the recipes and the resume check all come from here.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/device.h"
#include "core/error.h"
#include "models/model.h"
#include "train/config.h"
#include "train/option_rows.h"

namespace eg::train {

using json = nlohmann::json;

namespace {
using namespace rows;

std::vector<Option> make_options() {
  using G = OptionGroup;
  const OnResume F = OnResume::fixed, Free = OnResume::free;
  std::vector<Option> t;
  // ---- run
  t.push_back(checked(text("--model", "model", G::run, F, "the model to train", &TrainConfig::model, "NAME"),
                      [](const TrainConfig& c) {
    EG_CHECK(member(models::model_names(), c.model), "--model: unknown model '", c.model,
             "' (known: ", joined(models::model_names()), ")");
  }));
  t.push_back(checked(text("--out", "out", G::run, Free, "output directory", &TrainConfig::out, "DIR"),
                      [](const TrainConfig& c) { EG_CHECK(!c.out.empty(), "--out must name a directory"); }));
  t.push_back(checked(text("--device", "device", G::run, F, "cpu or cuda[:N]", &TrainConfig::device, "cpu|cuda:N"),
                      [](const TrainConfig& c) { Device::parse(c.device); }));  // throws naming the device string
  t.push_back(
      recipe(number("--epochs", "epochs", G::run, F,
                    "epochs to train; on --resume without freezing it may grow when the LR of every step already "
                    "taken stays the same (constant or inverse-sqrt schedules, explicit --milestones)",
                    &TrainConfig::epochs, Rule<int64_t>{[](int64_t v) { return v > 0; }, "positive"}),
             [](TrainConfig& c, int) {
    if (recipe_of(c) == Recipe::image_folder) c.epochs = 90;
    if (recipe_of(c) == Recipe::image_folder_mobilenet) c.epochs = 150;
      }));
  t.push_back(number("--seed", "seed", G::run, F, "seed of the initialisation, shuffling and augmentation",
                     &TrainConfig::seed));
  t.push_back(checked(number("--threads", "threads", G::run, OnResume::warn,
                             "CPU threads (0: all cores, or 1 when training on a GPU, whose loader then takes the "
                             "other cores; config.json records the count used)",
                             &TrainConfig::threads),
                      [](const TrainConfig& c) { check_cpu_count("--threads", c.threads, "0 (all cores)"); }));
  t.push_back(choice("--cpu-winograd", "cpu_winograd", G::run, F,
                     "Winograd for the CPU's 3x3 convolutions with >= 32 channels where oneDNN has it (AVX-512); "
                     "off: all direct, as PyTorch (default on, or off when EG_CPU_WINOGRAD=0; config.json records "
                     "the choice)",
                     &TrainConfig::cpu_winograd, Names<Switch>{{"on", Switch::on}, {"off", Switch::off}}));
  t.push_back(choice("--tf32", "tf32", G::run, F,
                     "TF32 tensor cores for CUDA f32 convolutions and matmuls (PyTorch's allow_tf32; its default is "
                     "on for convolutions): faster, with 10-bit mantissas in the products (default off, or on when "
                     "EG_ALLOW_TF32=1; config.json records the choice; no effect on the CPU)",
                     &TrainConfig::tf32, Names<Switch>{{"on", Switch::on}, {"off", Switch::off}}));
  t.push_back(choice("--precision", "precision", G::run, F,
                     "f32, or bf16 mixed precision as PyTorch's autocast: convolutions with bf16 activations and "
                     "weights (f32 accumulation), batch norm and activations on the bf16 activations with f32 "
                     "statistics, the loss, the other layers, the master weights, gradients and optimizer in f32 "
                     "(the CPU and CUDA); or fp16 the same way with loss scaling (--loss-scale), on GPUs",
                     &TrainConfig::precision,
                     Names<DType>{{"f32", DType::f32}, {"bf16", DType::bf16}, {"fp16", DType::f16}}));
  t.push_back(choice("--cuda-graphs", "cuda_graphs", G::run, Free,
                     "on: capture the training step as a CUDA graph after a warm-up and replay it, a graph per "
                     "batch shape (all captured anew after a freeze or an unfreeze; a step taking a plasticity "
                     "reading runs eagerly); one GPU, one process, no --freeze-cache",
                     &TrainConfig::cuda_graphs, kOnOff));
  t.push_back(number("--cuda-graph-limit", "cuda_graph_limit", G::run, Free,
                     "--cuda-graphs on keeps at most N graphs, those of the most frequent batch shapes (sharing one "
                     "memory pool: the largest step's activations, and each graph's outputs); steps of other shapes "
                     "run eagerly. 0: 8 for translation "
                     "(few shapes with --pad-to-multiple), 1 for image models (an epoch's short last batch runs "
                     "eagerly)",
                     &TrainConfig::cuda_graph_limit, Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(flag_switch("--resume", "resume", G::run, Free, "continue from DIR/checkpoint.safetensors",
                          &TrainConfig::resume));
  t.push_back(number("--checkpoint-every", "checkpoint_every", G::run, Free,
                     "also checkpoint every N steps (0: at epoch ends only)", &TrainConfig::checkpoint_every,
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--keep-checkpoints", "keep_checkpoints", G::run, Free,
                     "keep the newest N checkpoints (checkpoint-<step>.safetensors beside checkpoint.safetensors); "
                     "--resume falls back to an older one when the newest cannot be read",
                     &TrainConfig::keep_checkpoints, Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  t.push_back(number("--log-every", "log_every", G::run, Free, "metrics.jsonl and progress every N steps",
                     &TrainConfig::log_every, Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  t.push_back(number("--eval-every", "eval_every", G::run, Free,
                     "also evaluate the loss on the validation split (test without one) every N steps, logged as "
                     "\"eval\" lines in metrics.jsonl with the perplexity; no BLEU (0: at epoch ends only)",
                     &TrainConfig::eval_every,
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "0 (epoch ends only) or a number of steps"}));
  t.push_back(number("--target-accuracy", "target_accuracy", G::run, F,
                     "report the time to reach this test accuracy (0..1 or 0..100)", &TrainConfig::target_accuracy,
                     Rule<double>{[](double v) { return v >= 0 && v <= 100; }, "in [0, 1] or [0, 100]"}));
  t.push_back(text("--init-from", "init_from", G::run, F,
                   "start from the weights in FILE (a model.safetensors, best.safetensors or checkpoint, or a "
                   "torchvision state dict of resnet18/50 or mobilenet_v2 in safetensors: "
                   "tools/torch-to-safetensors) where names and shapes match, saying which were missing, of "
                   "other shapes (a new head) or not in the model",
                   &TrainConfig::init_from, "FILE"));
  t.push_back(text_list("--init-exclude", "init_exclude", G::run, F,
                        "with --init-from: leave these tensors or modules at their initialisation even where the "
                        "file has them in the same shape (a head initialised afresh: head, or torchvision's fc)",
                        &TrainConfig::init_exclude, "NAME,..."));
  t.push_back(number("--stop-after-steps", "stop_after_steps", G::hidden, Free,
                     "testing: end this invocation after N steps, as if killed", &TrainConfig::stop_after_steps,
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  // ---- data
  t.push_back(
      recipe(text("--dataset", "dataset", G::data, F,
                  "the dataset: fashion-mnist, mnist, cifar10, cifar100, synthetic, imagefolder (--data-dir DIR with "
                  "DIR/train/<class>/* and DIR/val/<class>/*, JPEG or PNG); translation: en-es",
                  &TrainConfig::dataset, "NAME"),
             [](TrainConfig& c, int) {
    if (recipe_of(c) == Recipe::transformer) c.dataset = "en-es";
      }));
  t.push_back(checked(number_list("--classes", "select_classes", G::data, F,
                                  "IDX datasets (fashion-mnist, mnist): keep only these classes, relabelled 0, 1, "
                                  "... in the order given (a transfer task: 5,6,7,8,9)",
                                  &TrainConfig::classes, "K1,K2,..."),
                      [](const TrainConfig& c) {
    for (size_t i = 0; i < c.classes.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        EG_CHECK(c.classes[i] != c.classes[j], "--classes names class ", c.classes[i], " twice");
  }));
  t.push_back(text("--data-dir", "data_dir", G::data, Free,
                   "dataset directory (fashion-mnist defaults to Debian's package, en-es to datasets/en-es)",
                   &TrainConfig::data_dir, "DIR"));
  t.push_back(number("--image-size", "image_size", G::data, F,
                     "--dataset imagefolder: the side of the square crops the network sees (0: 224); training "
                     "takes a RandomResizedCrop of it, evaluation the centre of the image resized to size x 256/224",
                     &TrainConfig::image_size,
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "positive (or 0: the default)"}));
  t.push_back(number("--image-channels", "image_channels", G::data, F,
                     "--dataset imagefolder: 3 (RGB, as PIL's convert(\"RGB\")) or 1 (grey, as torchvision's "
                     "Grayscale())",
                     &TrainConfig::image_channels,
                     Rule<int64_t>{[](int64_t v) { return v == 1 || v == 3; }, "1 (grey) or 3 (RGB)"}));
  t.push_back(number("--crop-pct", "crop_pct", G::data, F,
                     "--dataset imagefolder: evaluation resizes the short side to --image-size / X and takes the "
                     "centre crop (timm's crop_pct; 0.875: 256 for 224; 1: the whole short side)",
                     &TrainConfig::crop_pct, Rule<double>{[](double v) { return v > 0 && v <= 1; }, "in (0, 1]"}));
  t.push_back(
      checked(number_list("--image-mean", "image_mean", G::data, F,
                          "--dataset imagefolder: per-channel mean for normalising, in [0, 1] (default ImageNet's "
                          "0.485,0.456,0.406; grey: 0.449)",
                          &TrainConfig::image_mean),
              [](const TrainConfig& c) {
    for (double v : c.image_mean) EG_CHECK(std::isfinite(v), "--image-mean must be finite numbers, got ", v);
      }));
  t.push_back(checked(number_list("--image-std", "image_std", G::data, F,
                                  "--dataset imagefolder: per-channel standard deviation for normalising (default "
                                  "ImageNet's 0.229,0.224,0.225; grey: 0.226)",
                                  &TrainConfig::image_std),
                      [](const TrainConfig& c) {
    for (double v : c.image_std) EG_CHECK(v > 0 && std::isfinite(v), "--image-std must be positive numbers, got ", v);
  }));
  t.push_back(flag_switch("--skip-bad-images", "skip_bad_images", G::data, F,
                          "--dataset imagefolder: leave out an image file that cannot be read or decoded, warning "
                          "once with its path and the reason and counting it (summary.json images_left_out), "
                          "instead of stopping the run",
                          &TrainConfig::skip_bad_images));
  t.push_back(number("--train-limit", "train_limit", G::data, F, "use the first N training images (or sentence pairs)",
                     &TrainConfig::train_limit, Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--test-limit", "test_limit", G::data, F,
                     "use the first N test images (translation: valid and test pairs)", &TrainConfig::test_limit,
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number("--val-fraction", "val_fraction", G::data, F,
                     "hold out this fraction of the training images (seeded) as a validation split; the best epoch "
                     "and best.safetensors are then chosen on it (0: none, the best is selected on test)",
                     &TrainConfig::val_fraction, Rule<double>{[](double v) { return v >= 0 && v < 1; }, "in [0, 1)"}));
  t.push_back(
      flag_switch("--no-augment", "augment", G::data, F, "no random crop and flip", &TrainConfig::augment, false));
  t.push_back(choice("--augment-mode", "augment_mode", G::data, F,
                     "epoch: a new random crop and flip for every sample every epoch; sample: one per sample for the "
                     "whole run, or --augment-variants of them (stateless, as --freeze-cache on needs)",
                     &TrainConfig::augment_mode,
                     Names<AugmentMode>{{"epoch", AugmentMode::epoch}, {"sample", AugmentMode::sample}}));
  t.push_back(number("--augment-variants", "augment_variants", G::data, F,
                     "--augment-mode sample: each sample's N fixed crops and flips, seen in turn (epoch e sees the one "
                     "--augment-mode epoch would in epoch e mod N; N >= the epochs is --augment-mode epoch); the "
                     "activation cache keeps an entry for each (N times the memory)",
                     &TrainConfig::augment_variants, Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  t.push_back(checked(number("--workers", "workers", G::data, Free,
                             "data loader threads, decoding and augmenting ahead of the step (0: the rank's cores "
                             "less the training threads, at least 1; config.json records the count used)",
                             &TrainConfig::workers),
                      [](const TrainConfig& c) {
    check_cpu_count("--workers", c.workers, "0 (the cores a rank has less its training threads)");
  }));
  // ---- optimisation
  t.push_back(
      recipe(number("--batch-size", "batch_size", G::optimisation, F,
                    "samples (sentences) per step on each rank; the global batch is this times the number of ranks",
                    &TrainConfig::batch_size, Rule<int64_t>{[](int64_t v) { return v > 0; }, "positive"}),
             [](TrainConfig& c, int) {
    if (recipe_of(c) == Recipe::transformer) c.batch_size = 64;
      }));
  t.push_back(recipe(choice("--optimizer", "optimizer", G::optimisation, F, "the optimizer", &TrainConfig::optimizer,
                            Names<OptimizerKind>{{"sgd", OptimizerKind::sgd}, {"adamw", OptimizerKind::adamw}}),
                     [](TrainConfig& c, int) {
    const Recipe r = recipe_of(c);
    if (r == Recipe::transformer) c.optimizer = OptimizerKind::adamw;
    if (r == Recipe::image_folder || r == Recipe::image_folder_mobilenet) c.optimizer = OptimizerKind::sgd;
  }));
  t.push_back(recipe(number("--lr", "lr", G::optimisation, F, "base learning rate", &TrainConfig::lr,
                            Rule<double>{[](double v) { return v > 0 && std::isfinite(v); }, "a positive number"}),
                     [](TrainConfig& c, int world) {
    const Recipe r = recipe_of(c);
    if (r == Recipe::transformer) c.lr = 5e-4;
    if (r == Recipe::image_folder) c.lr = 0.1 * global_batch(c, world) / 256;
    if (r == Recipe::image_folder_mobilenet) c.lr = 0.05 * global_batch(c, world) / 256;
  }));
  t.push_back(recipe(number("--momentum", "momentum", G::optimisation, F, "SGD momentum", &TrainConfig::momentum,
                            Rule<double>{[](double v) { return v >= 0 && v < 1; }, "in [0, 1)"}),
                     [](TrainConfig& c, int) {
    const Recipe r = recipe_of(c);
    if (r == Recipe::image_folder || r == Recipe::image_folder_mobilenet) c.momentum = 0.9;
  }));
  t.push_back(
      flag_switch("--nesterov", "nesterov", G::optimisation, F, "SGD with Nesterov momentum", &TrainConfig::nesterov));
  t.push_back(recipe(number("--weight-decay", "weight_decay", G::optimisation, F, "weight decay",
                            &TrainConfig::weight_decay, Rule<double>{[](double v) { return v >= 0; }, "non-negative"}),
                     [](TrainConfig& c, int) {
    const Recipe r = recipe_of(c);
    if (r == Recipe::transformer) c.weight_decay = 0;
    if (r == Recipe::image_folder) c.weight_decay = 1e-4;
    if (r == Recipe::image_folder_mobilenet) c.weight_decay = 4e-5;
  }));
  {
    Option o = row("--adam-betas", "adam_betas", G::optimisation, F, "AdamW beta1,beta2", "B1,B2");
    o.get = [](const TrainConfig& c) { return json::array({c.adam_beta1, c.adam_beta2}); };
    o.set = [](TrainConfig& c, const json& j) {
      json v = j;
      if (j.is_string()) {
        const std::string s = j.get<std::string>();
        const size_t comma = s.find(',');
        EG_CHECK(comma != std::string::npos, "--adam-betas must be two numbers B1,B2, got '", s, "'");
        v = json::array({s.substr(0, comma), s.substr(comma + 1)});
      }
      EG_CHECK(v.is_array() && v.size() == 2, "--adam-betas must be two numbers B1,B2, got ", j.dump());
      c.adam_beta1 = to_number<double>("--adam-betas", v[0]);
      c.adam_beta2 = to_number<double>("--adam-betas", v[1]);
    };
    o.check = [](const TrainConfig& c) {
      EG_CHECK(c.adam_beta1 >= 0 && c.adam_beta1 < 1 && c.adam_beta2 >= 0 && c.adam_beta2 < 1,
               "--adam-betas must both be in [0, 1), got ", c.adam_beta1, ",", c.adam_beta2);
    };
    o.recipe_default = [](TrainConfig& c, int) {
      if (recipe_of(c) == Recipe::transformer) c.adam_beta1 = 0.9, c.adam_beta2 = 0.98;
    };
    t.push_back(o);
  }
  t.push_back(recipe(choice("--lr-schedule", "lr_schedule", G::optimisation, F, "the learning-rate schedule",
                            &TrainConfig::lr_schedule,
                            Names<Schedule>{{"step", Schedule::step},
                                            {"multistep", Schedule::step},
                                            {"cosine", Schedule::cosine},
                                            {"constant", Schedule::constant},
                                            {"inverse-sqrt", Schedule::inverse_sqrt},
                                            {"linear", Schedule::linear}}),
                     [](TrainConfig& c, int) {
    const Recipe r = recipe_of(c);
    if (r == Recipe::transformer) c.lr_schedule = Schedule::inverse_sqrt;
    if (r == Recipe::image_folder) c.lr_schedule = Schedule::step;
    if (r == Recipe::image_folder_mobilenet) c.lr_schedule = Schedule::cosine;
  }));
  t.push_back(recipe(
      checked(
          number_list("--milestones", "milestones", G::optimisation, F,
                      "epochs at which step multiplies the LR by --gamma (default: half and three quarters of "
                      "--epochs, rounded down; image folders: a third, two thirds and 8/9)",
                      &TrainConfig::milestones, "E1,E2,..."),
          [](const TrainConfig& c) {
    EG_CHECK(std::is_sorted(c.milestones.begin(), c.milestones.end()), "--milestones must be ascending");
    for (int64_t m : c.milestones) EG_CHECK(m > 0, "--milestones must be positive epochs, got ", m);
          }),
      [](TrainConfig& c, int) {
    if (recipe_of(c) != Recipe::image_folder || c.lr_schedule != Schedule::step) return;
    const int64_t e = c.epochs;  // 30, 60, 80 of 90
    c.milestones.clear();
    for (int64_t m : {e / 3, 2 * e / 3, 8 * e / 9})
      if (m > 0 && (c.milestones.empty() || m > c.milestones.back())) c.milestones.push_back(m);
  }));
  t.push_back(number("--gamma", "gamma", G::optimisation, F, "the step schedule's LR factor", &TrainConfig::gamma,
                     Rule<double>{[](double v) { return v > 0 && v <= 1; }, "in (0, 1]"}));
  t.push_back(
      recipe(number("--warmup-steps", "warmup_steps", G::optimisation, F, "linear LR warmup over N steps",
                    &TrainConfig::warmup_steps, Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}),
             [](TrainConfig& c, int) {
    // A shorter warmup for the smaller models, which see fewer steps.
    if (recipe_of(c) == Recipe::transformer) c.warmup_steps = c.model == "transformer-base" ? 4000 : 1000;
      }));
  t.push_back(
      recipe(number("--label-smoothing", "label_smoothing", G::optimisation, F,
                    "label smoothing of the training loss, as PyTorch's CrossEntropyLoss(label_smoothing=X) "
                    "(default 0; Transformers 0.1); evaluation losses are unsmoothed",
                    &TrainConfig::label_smoothing, Rule<double>{[](double v) { return v >= 0 && v < 1; }, "in [0, 1)"}),
             [](TrainConfig& c, int) {
    if (recipe_of(c) == Recipe::transformer) c.label_smoothing = 0.1;
      }));
  t.push_back(number("--grad-clip", "grad_clip", G::optimisation, F,
                     "clip the gradients' global L2 norm to X before each step (0: no clipping); step lines in "
                     "metrics.jsonl then log grad_norm, the norm before clipping",
                     &TrainConfig::grad_clip,
                     Rule<double>{[](double v) { return v >= 0; }, "non-negative (0: no clipping)"}));
  t.push_back(recipe(choice("--loss-scale", "loss_scale", G::optimisation, F,
                            "off, or dynamic: the loss multiplied by a scale before backward and the gradients "
                            "divided by it after, a step whose gradients overflow skipped and the scale halved, "
                            "doubled after --loss-scale-growth-interval clean steps (torch.cuda.amp.GradScaler; "
                            "default: dynamic with --precision fp16, else off)",
                            EG_FIELD(loss_scale.dynamic), Names<bool>{{"off", false}, {"dynamic", true}}),
                     [](TrainConfig& c, int) {
    if (c.precision == DType::f16) c.loss_scale.dynamic = true;
  }));
  t.push_back(number("--loss-scale-init", "loss_scale_init", G::optimisation, F,
                     "--loss-scale dynamic: the first scale (2^16, as GradScaler's)", EG_FIELD(loss_scale.init),
                     Rule<double>{[](double v) { return v > 0 && std::isfinite(v); }, "a positive number"}));
  t.push_back(number("--loss-scale-growth-interval", "loss_scale_growth_interval", G::optimisation, F,
                     "--loss-scale dynamic: clean steps in a row after which the scale doubles",
                     EG_FIELD(loss_scale.growth_interval),
                     Rule<int64_t>{[](int64_t v) { return v >= 1; }, "at least 1"}));
  // ---- data-parallel training
  t.push_back(number("--bucket-cap-mb", "bucket_cap_mb", G::parallel, OnResume::warn,
                     "gradient buckets after the first (1 MiB) hold up to this many MiB; each is all-reduced as one",
                     &TrainConfig::bucket_cap_mb,
                     Rule<double>{[](double v) { return v > 0 && v <= 4096; }, "in (0, 4096] MiB"}));
  t.push_back(choice("--grad-sync-overlap", "grad_sync_overlap", G::parallel, Free,
                     "on: all-reduce each gradient bucket during backward, as soon as its gradients are complete; "
                     "off: all of them after backward",
                     EG_FIELD(grad_sync.overlap), kOnOff));
  t.push_back(choice("--grad-sync-dtype", "grad_sync_dtype", G::parallel, F,
                     "f32, or bf16: gradient buckets rounded to bf16 for the all-reduce, half the bytes (as DDP's "
                     "bf16_compress_hook), summed in f32 where the backend allows; the optimizer gets f32 gradients",
                     EG_FIELD(grad_sync.dtype), Names<DType>{{"f32", DType::f32}, {"bf16", DType::bf16}}));
  add_freezing_options(t);  // freezing, reference model, activation cache: train/options_freezing.cpp
  // ---- translation
  t.push_back(checked(number("--vocab-size", "vocab_size", G::translation, F,
                             "SentencePiece vocabulary, shared by both languages", &TrainConfig::vocab_size),
                      [](const TrainConfig& c) {
    EG_CHECK(c.vocab_size > 4, "--vocab-size must exceed the 4 special tokens (pad, bos, eos, unk), got ",
             c.vocab_size);
  }));
  t.push_back(number("--max-len", "max_len", G::translation, F,
                     "tokens per sentence; longer training pairs are dropped", &TrainConfig::max_len,
                     Rule<int64_t>{[](int64_t v) { return v >= 2; }, "at least 2 tokens"}));
  t.push_back(number("--max-tokens", "max_tokens", G::translation, F,
                     "batch by this many tokens instead of --batch-size (0: by sentences)", &TrainConfig::max_tokens,
                     Rule<int64_t>{[](int64_t v) { return v >= 0; }, "non-negative"}));
  t.push_back(number(
      "--pad-to-multiple", "pad_to_multiple", G::translation, F,
      "pad training batches' source and target lengths up to a multiple of N (fairseq's "
      "--required-seq-len-multiple): a few batch shapes, each captured once under --cuda-graphs on, "
      "and tensor-core-friendly lengths; --max-tokens counts the padded lengths. Padding is masked: only "
      "rounding and dropout's draws change",
      &TrainConfig::pad_to_multiple, Rule<int64_t>{[](int64_t v) { return v >= 1 && v <= 1024; }, "in [1, 1024]"}));
  return t;
}

}  // namespace

// Threads beyond the machine's CPUs only slow a step (64 on 2 cores: 50x), and
// thousands of them cannot all start: refused, naming the count.
void check_cpu_count(const char* flag, int v, const char* zero) {
  const int cpus = int(std::max(1u, std::thread::hardware_concurrency()));
  EG_CHECK(v >= 0 && v <= cpus, flag, " must be ", zero, " or a count up to this machine's ", cpus,
           " CPUs (more threads than CPUs only slow training), got ", v);
}

const std::vector<Option>& options() {
  static const std::vector<Option> table = make_options();
  return table;
}

}  // namespace eg::train
