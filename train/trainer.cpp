#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/parallel.h"
#include "dist/strategy.h"
#include "freeze/partition.h"
#include "optim/optimizer.h"
#include "quant/reference.h"
#include "train/checkpoint.h"
#include "train/graphed_step.h"
#include "train/image_task.h"
#include "train/translation_task.h"

namespace eg::train {

using json = nlohmann::json;

std::unique_ptr<Task> make_task(const TrainConfig& c, const models::TransformerConfig* arch) {
  if (arch || models::is_translation_model(c.model))
    return std::make_unique<TranslationTask>(arch ? std::optional<models::TransformerConfig>(*arch) : std::nullopt);
  return std::make_unique<ImageTask>();
}

Summary run_training(const TrainConfig& c) { return fit(*make_task(c), c); }

Summary run_translation(const TrainConfig& c, const models::TransformerConfig* arch) {
  TranslationTask task(arch ? std::optional<models::TransformerConfig>(*arch) : std::nullopt);
  return fit(task, c);
}

namespace {

EvalResult evaluate_translation_checkpoint(const Checkpoint& ck, const std::string& data_dir, int64_t test_limit,
                                           const std::string& precision) {
  const json& cfg = ck.config;
  EG_CHECK(cfg.contains("arch") && cfg.contains("vocab_size"), "'", ck.path,
           "' has no Transformer architecture in its metadata");
  const std::string dir = translation_data_dir(data_dir.empty() ? cfg.value("data_dir", "") : data_dir);
  data::Tokenizer tok = data::Tokenizer::load(data::tokenizer_path(dir, cfg.at("vocab_size")));
  const TextSplit test = read_text_split(dir, "test", test_limit, tok, cfg.at("max_len"), false);
  models::TransformerConfig mc = arch_from_json(cfg.at("arch"));
  EG_CHECK(mc.vocab == tok.vocab_size(), "tokenizer '", tok.path(), "' has ", tok.vocab_size(), " pieces, but '",
           ck.path, "' was trained with ", mc.vocab, " (was the tokenizer retrained?)");
  Generator g(0);
  auto m = std::make_shared<models::Transformer>(mc, g);
  m->load_state_dict(model_tensors(ck.tensors));
  if (precision == "int8") quant::convert_to_int8(*m);  // every Linear dynamically quantised
  Metrics e = evaluate_translation(*m, test, tok, Device::cpu());
  EvalResult r;
  r.loss = e.at("loss");
  r.bleu = e.at("bleu");
  r.translation = true;
  r.samples = test.pairs->size();
  return r;
}

}  // namespace

namespace {

// An image model described by `cfg` (a run's config.json, or eval's flags) evaluated on
// its dataset's test split (an image folder's val/), its weights put in by `load`.
using LoadWeights = std::function<void(models::Model&, const Shape& sample_shape)>;
EvalResult evaluate_image_model(const json& cfg, const LoadWeights& load, const std::string& data_dir,
                                int64_t test_limit, const std::string& precision, int64_t calibration_batches,
                                bool per_class) {
  const std::string dataset = cfg.at("dataset");
  if (data::dataset_info(dataset).kind ==
      data::DataKind::image_folder) {  // its val/ split, with the run's classes and crop size
    const std::vector<std::string> classes = cfg.at("classes");
    const std::string dir = data_dir.empty() ? cfg.value("data_dir", "") : data_dir;
    data::ImageFolder val = data::scan_image_folder(dir + "/val", &classes);
    if (test_limit > 0 && test_limit < val.size())
      val.files.resize(size_t(test_limit)), val.labels.resize(size_t(test_limit));
    TrainConfig tc;  // the options the transform is made from, as the run had them
    tc.image_size = cfg.value("image_size", int64_t(0));
    tc.image_channels = cfg.value("image_channels", int64_t(3));
    tc.crop_pct = cfg.value("crop_pct", 224.0 / 256.0);
    tc.image_mean = cfg.value("image_mean", std::vector<double>{});
    tc.image_std = cfg.value("image_std", std::vector<double>{});
    const data::FolderTransform t = folder_transform(tc, false);
    const int64_t n = val.size();
    auto src = std::make_shared<data::FolderSamples>(std::move(val), t);
    models::ModelConfig mc;
    mc.name = cfg.at("model");
    mc.in_channels = t.channels;
    mc.image_size = t.size;
    mc.small_input = t.size <= 64;
    mc.num_classes = int64_t(classes.size());
    Generator g(0);
    auto m = models::build_model(mc, g);
    load(*m, {t.channels, t.size, t.size});
    if (precision == "int8") quant::convert_to_int8(*m, calibration_batches);
    EvalResult r{};
    if (per_class) r.per_class.total.resize(classes.size());
    const Metrics e = evaluate_samples(*m, src, Device::cpu(), std::max(1, cfg.value("workers", 1)), nullptr,
                                       per_class ? &r.per_class : nullptr, cfg.value("skip_bad_images", false));
    r.accuracy = e.at("accuracy"), r.loss = e.at("loss"), r.samples = n;
    if (per_class) r.classes = classes;
    return r;
  }
  const std::vector<int64_t> selected = cfg.value("select_classes", std::vector<int64_t>{});  // --classes
  data::ImageDataset test = data::load_image_dataset(
      {dataset, data_dir.empty() ? cfg.value("data_dir", "") : data_dir, test_limit, selected}, false);
  models::ModelConfig mc;
  mc.name = cfg.at("model");
  mc.in_channels = test.images.size(1);
  mc.image_size = test.images.size(2);
  mc.num_classes = selected.empty() ? data::dataset_info(dataset).classes : int64_t(selected.size());
  Generator g(0);
  auto m = models::build_model(mc, g);
  load(*m, Shape(test.images.shape().begin() + 1, test.images.shape().end()));
  if (precision == "int8") quant::convert_to_int8(*m, calibration_batches);
  EvalResult r{};
  if (per_class) r.per_class.total.resize(size_t(mc.num_classes));
  const Metrics e = evaluate_images(*m, test, dataset, Device::cpu(), nullptr, per_class ? &r.per_class : nullptr);
  r.accuracy = e.at("accuracy"), r.loss = e.at("loss"), r.samples = test.size();
  for (size_t k = 0; per_class && k < r.per_class.total.size(); ++k) r.classes.push_back(std::to_string(k));
  return r;
}

}  // namespace

EvalResult evaluate_checkpoint(const std::string& out, const std::string& data_dir, int64_t test_limit,
                               const std::string& precision, int64_t calibration_batches, bool per_class) {
  EG_CHECK(precision == "fp32" || precision == "int8", "eval: unknown precision '", precision, "' (fp32, int8)");
  Checkpoints ckpts(out, 1, {});
  EG_CHECK(ckpts.any(), "cannot open '", ckpts.newest_path(), "': no checkpoint in '", out, "'");
  const Checkpoint ck = ckpts.load("eval");
  if (models::is_translation_model(ck.config.at("model")))
    return evaluate_translation_checkpoint(ck, data_dir, test_limit, precision);
  return evaluate_image_model(
      ck.config, [&](models::Model& m, const Shape&) { m.load_state_dict(model_tensors(ck.tensors)); }, data_dir,
      test_limit, precision, calibration_batches, per_class);
}

EvalResult evaluate_weights(const std::string& file, const WeightsEval& w, int64_t test_limit,
                            const std::string& precision, int64_t calibration_batches, bool per_class) {
  EG_CHECK(precision == "fp32" || precision == "int8", "eval: unknown precision '", precision, "' (fp32, int8)");
  EG_CHECK(!models::is_translation_model(w.model),
           "eval --init-from: image models only; a Transformer is "
           "evaluated from its run (eval --out DIR)");
  json cfg = {{"model", w.model}, {"dataset", w.dataset}, {"data_dir", w.data_dir}, {"image_size", w.image_size}};
  if (!w.classes.empty()) cfg["select_classes"] = w.classes;
  if (data::dataset_info(w.dataset).kind == data::DataKind::image_folder) {
    EG_CHECK(!w.data_dir.empty(), "eval --dataset imagefolder needs --data-dir DIR (DIR/val/<class>/*)");
    cfg["classes"] = data::scan_image_folder(w.data_dir + "/val").classes;  // sorted, as torchvision's ImageFolder
  }
  const LoadWeights load = [&](models::Model& m, const Shape& shape) {
    const InitFromReport r = init_from(m, file, {{}, shape});
    EG_CHECK(r.missing.empty() && r.mismatched.empty(), "eval --init-from '", file,
             "' does not hold every tensor of this model, for these classes: ", r.text(file));
  };
  return evaluate_image_model(cfg, load, w.data_dir, test_limit, precision, calibration_batches, per_class);
}

namespace {
// The model the benchmark builds: ImageNet's inputs for the ImageNet ResNets, CIFAR's for
// the others, a Transformer's sentences of --seq-len tokens.
models::ModelConfig bench_model_config(const StepBenchOptions& o) {
  models::ModelConfig mc;
  mc.name = o.model;
  const bool imagenet = o.model == "resnet50" || o.model == "resnet18";
  mc.image_size = imagenet ? 224 : 32;
  mc.small_input = !imagenet;
  mc.num_classes = imagenet ? 1000 : 10;
  EG_CHECK(!models::is_translation_model(o.model) || (o.seq_len >= 2 && o.seq_len <= 256),
           "bench step: --seq-len must be in [2, 256], got ", o.seq_len);
  return mc;
}

// The benchmark's batch, made once on the device, each rank its own: images, or a
// Transformer's source, target input and target ids (no padding); `samples` counts the
// images or target tokens.
struct BenchBatch {
  Tensor x, x2, y;
  int64_t samples = 0;
};
BenchBatch bench_batch(const StepBenchOptions& o, const models::ModelConfig& mc, bool transformer, Device dev,
                       int rank) {
  Generator data(uint64_t(1 + rank));
  BenchBatch b;
  b.samples = transformer ? o.batch_size * o.seq_len : o.batch_size;
  auto ids = [&](int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = 4 + int64_t(data.next_u32() % uint32_t(mc.vocab - 4));  // past pad, bos, eos, unk
    return Tensor::from_vector(v, {o.batch_size, n / o.batch_size}, dev);
  };
  b.x = transformer ? ids(b.samples) : Tensor::randn({o.batch_size, 3, mc.image_size, mc.image_size}, data).to(dev);
  if (transformer) b.x2 = ids(b.samples);
  std::vector<int64_t> labels(static_cast<size_t>(b.samples));
  for (int64_t i = 0; i < b.samples; ++i)
    labels[size_t(i)] =
        transformer ? 4 + int64_t(data.next_u32() % uint32_t(mc.vocab - 4)) : (i + rank) % mc.num_classes;
  b.y = Tensor::from_vector(labels, {b.samples}, dev);
  return b;
}
}  // namespace

namespace {
void check_options(const StepBenchOptions& o) {
  EG_CHECK(o.batch_size > 0 && o.iterations > 0, "bench step: batch size and iterations must be positive");
  check_cpu_count("bench step: --threads", o.threads, "0 (all cores)");
  EG_CHECK(o.seq_len > 0, "bench step: --seq-len must be positive, got ", o.seq_len);
  EG_CHECK(std::isfinite(o.bucket_cap_mb) && o.bucket_cap_mb > 0, "bench step: --bucket-cap-mb must be a positive ",
           "number of MiB, got ", o.bucket_cap_mb);
}
}  // namespace

StepBench bench_step(const StepBenchOptions& o, dist::Communicator& comm) {
  using Clock = std::chrono::steady_clock;
  check_options(o);
  set_num_threads(o.threads);
  dist::Strategy dp(comm, o.device, o.sync);
  const Device dev = dp.device();
  EG_CHECK(o.precision != DType::f16 || dev.is_cuda(), "bench step: --precision fp16 on ", dev.str(),
           ": fp16 is for GPUs; the CPU trains in f32 or bf16");
  check_precision_on(dev, o.precision);
  EG_CHECK(!o.cuda_graphs || dev.is_cuda(), "bench step: --cuda-graphs on runs on a GPU (--device cuda); on ",
           dev.str(), " a step has no kernel launches to save");
  EG_CHECK(!o.profile || dev.is_cpu(), "bench step: --profile times ops as the CPU runs them; on ", dev.str(),
           " an op's time would be its launch's (profile a GPU with Nsight Systems or Compute)");
  const models::ModelConfig mc = bench_model_config(o);
  const bool transformer = models::is_translation_model(o.model);
  Generator g(0);
  auto m = models::build_model(mc, g);
  m->to(dev);
  const freeze::Partition part =
      freeze::make_partition(*m, o.unit_per_layer ? freeze::PartitionMode::layers : freeze::PartitionMode::automatic);
  EG_CHECK(o.frozen_units >= 0 && o.frozen_units < int64_t(part.units().size()), "bench step: --frozen-units ",
           o.frozen_units, " of ", o.model, "'s ", part.units().size(),
           " freezing units (the last, the head, never freezes)");
  const int64_t frozen_layers = part.layer_prefix(o.frozen_units);
  freeze::apply_frozen_prefix(*m, frozen_layers);
  optim::SGD opt(m->parameters(), 0.01, {0.9, 0, 5e-4, false});
  opt.set_bucket_caps(size_t(o.bucket_cap_mb * double(1 << 20)),
                      std::min(optim::kDefaultFirstBucketCap, size_t(o.bucket_cap_mb * double(1 << 20))));
  const BenchBatch b = bench_batch(o, mc, transformer, dev, comm.rank());
  const int64_t samples = b.samples;
  auto forward = [&] {
    autograd::Autocast ac(o.precision);  // as the training loop's step (train/run.cpp)
    Tensor logits = m->forward_frozen(b.x, b.x2, frozen_layers);
    return fn::cross_entropy(transformer ? fn::reshape(logits, {samples, logits.size(2)}) : logits, b.y);
  };
  const dist::GradSync* sync = dp.sync();
  std::vector<double> ms, host_ms, wait_ms, comm_ms, syncs;
  Allocator& alloc = dev.is_cuda() ? cuda_allocator(dev.index) : cpu_allocator();
  AllocatorStats timed0;
  const int warmup = 3;
  // --cuda-graphs on: two warm-up steps eager, the third captured and replayed, every
  // timed step a replay (Note [Graphed steps]).
  std::unique_ptr<GraphedStep> graphed;
  if (o.cuda_graphs) graphed = std::make_unique<GraphedStep>(dp, opt, &g, GraphedStep::Options{warmup - 1, 0.0, {}, 1});
  std::unique_ptr<ops::OpProfiler> profiler;
  for (int i = 0; i < warmup + o.iterations; ++i) {
    if (i == warmup) timed0 = alloc.stats();
    if (i == warmup && o.profile) profiler = std::make_unique<ops::OpProfiler>();
    comm.barrier();  // the ranks start each step together
    const auto t0 = Clock::now();
    const double wait0 = sync ? sync->stats().wait_seconds : 0, comm0 = sync ? sync->stats().comm_seconds : 0;
    const int64_t syncs0 = host_syncs();
    Tensor loss;
    dist::StepResult s;
    if (graphed) {
      s = graphed->run({}, forward, samples);  // one batch shape
    } else {
      g.mark_step();  // the model's dropout, as the training loop's step (train/run.cpp)
      loss = forward();
      s = dp.step(loss, samples, opt, i, 0);  // the training loop's step
    }
    const int64_t step_syncs = host_syncs() - syncs0;
    const auto issued = Clock::now();
    // Waits for the device (the benchmark's own wait, not the step's). A step whose loss
    // is not finite is no step to time: a deferring step ran its backward on it, a
    // reading one stopped before it (the figure would be a forward's).
    const double lv = s.deferred ? s.loss_later.value() : s.loss;
    if (!s.deferred && loss.defined()) (void)loss.item();
    EG_CHECK(s.not_finite == dist::StepResult::NotFinite::none && std::isfinite(lv), "bench step: the loss became ", lv,
             " at iteration ", i, " of ", o.model, " (", dtype_name(o.precision), "); no step to time");
    if (i < warmup) continue;
    syncs.push_back(double(step_syncs));
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    host_ms.push_back(std::chrono::duration<double, std::milli>(issued - t0).count());
    if (sync)
      wait_ms.push_back(1000 * (sync->stats().wait_seconds - wait0)),
          comm_ms.push_back(1000 * (sync->stats().comm_seconds - comm0));
  }
  // Rank 0's step times; every rank's steps take as long, as each waits for the others.
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  StepBench r;
  r.iterations = o.iterations;
  r.world_size = dp.size();
  r.median_step_ms = median(ms);
  r.step_ms = ms;
  r.median_host_ms = median(host_ms);
  r.system_allocs = int64_t(alloc.stats().system_allocs - timed0.system_allocs);
  r.system_frees = int64_t(alloc.stats().system_frees - timed0.system_frees);
  r.samples_per_second = double(samples * dp.size()) / (r.median_step_ms / 1000);
  r.frozen_units = o.frozen_units;
  r.parameters = m->num_parameters();
  for (auto& p : m->parameters()) r.frozen_parameters += p.requires_grad() ? 0 : p.numel();
  r.sync_bytes_per_step = sync ? sync->stats().last_step_bytes : 0;
  r.median_sync_wait_ms = median(wait_ms);
  r.median_comm_ms = median(comm_ms);
  r.host_syncs_per_step = std::llround(median(syncs));
  if (graphed) r.graph_replays = graphed->replays() - 1, r.graph_bytes = int64_t(graphed->graph_bytes());
  if (profiler) r.op_times = profiler->times(), r.conversions = profiler->conversions();
  return r;
}

nlohmann::json step_profile_json(const StepBench& r) {
  const double steps = std::max(1, r.iterations);
  double step_ms = 0, ops_ms = 0;
  for (double t : r.step_ms) step_ms += t / steps;
  nlohmann::json ops = nlohmann::json::array();
  for (const ops::OpTime& t : r.op_times) {
    const double ms = 1000 * t.seconds / steps;
    ops_ms += ms;
    ops.push_back({{"op", t.op},
                   {"backend", ops::backend_name(t.backend)},
                   {"calls_per_step", double(t.calls) / steps},
                   {"ms_per_step", ms},
                   {"share_of_step", step_ms > 0 ? ms / step_ms : 0.0}});
  }
  const double conv_ms = 1000 * r.conversions.seconds / steps;
  return {{"steps", r.iterations},
          {"mean_step_ms", step_ms},
          {"ops_ms_per_step", ops_ms},
          {"outside_ops_ms_per_step", step_ms - ops_ms},
          {"layout_conversions_per_step", double(r.conversions.count) / steps},
          {"layout_conversion_mb_per_step", double(r.conversions.bytes) / steps / 1e6},
          {"layout_conversion_ms_per_step", conv_ms},
          {"layout_conversion_share_of_step", step_ms > 0 ? conv_ms / step_ms : 0.0},
          {"ops", ops}};
}

}  // namespace eg::train
