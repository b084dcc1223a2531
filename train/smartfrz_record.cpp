#include "train/smartfrz_record.h"

#include <algorithm>
#include <chrono>

#include "autograd/node.h"
#include "core/error.h"
#include "train/safetensors.h"

namespace eg::train {

using json = nlohmann::json;

SmartFrzRecorder::SmartFrzRecorder(models::Model& m, const freeze::Partition& units, int64_t tailor, int64_t every,
                                   int64_t probe, uint64_t seed, std::map<std::string, std::string> meta)
    : m_(m),
      part_(units),
      tailored_(m, units, tailor, seed),
      every_(every),
      probe_(probe),
      meta_(std::move(meta)),
      weights_(size_t(std::max<int64_t>(0, units.size() - 1))),
      grams_(weights_.size()) {
  EG_CHECK(every_ >= 1, "--smartfrz-record: records every ", every_, " steps (at least 1)");
  EG_CHECK(probe_ >= 2, "--smartfrz-record-probe must be at least 2 samples, got ", probe_);
}

void SmartFrzRecorder::offer_probe(const Tensor& x, const Tensor& x2) {
  if (has_probe() || !x.defined() || x.size(0) < 2) return;
  const int64_t n = std::min(probe_, x.size(0));
  probe_x_ = x.slice(0, n).clone();
  if (x2.defined()) probe_x2_ = x2.slice(0, n).clone();
}

void SmartFrzRecorder::after_step(int64_t step, double lr) {
  lr_sum_ += lr, ++lr_steps_;
  if (step % every_ != 0 || !has_probe()) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t u = 0; u < weights_.size(); ++u) {
    const std::vector<float> w =
        tailored_.empty(int64_t(u)) ? std::vector<float>(size_t(tailored_.tailor()), 0.0f) : tailored_.read(int64_t(u));
    weights_[u].insert(weights_[u].end(), w.begin(), w.end());
  }
  // Each unit's output on the probe, in eval mode: the network as it would be used.
  const bool was_training = m_.is_training();
  m_.eval();
  {
    autograd::NoGradGuard ng;
    const int64_t layers = int64_t(m_.layer_modules().size());
    Tensor h = probe_x_;
    int64_t next = 0;  // the next layer module a sequential model runs
    for (size_t u = 0; u < weights_.size(); ++u) {
      const int64_t last = part_.units()[u].end - 1;
      Tensor out;
      if (m_.sequential()) {
        for (; next <= last && next < layers; ++next) h = m_.forward_layers(h, next, next + 1, next + 1);
        out = h;
      } else {
        out = m_.layer_output(probe_x_, probe_x2_, last);
      }
      const int64_t n = out.size(0);
      Tensor flat = fn::reshape(out.dtype() == DType::f32 ? out : out.to(DType::f32), {n, -1});
      const std::vector<float> g = fn::matmul(flat, flat, false, true).to_vector<float>();
      grams_[u].insert(grams_[u].end(), g.begin(), g.end());
    }
  }
  m_.train(was_training);
  steps_.push_back(step);
  lrs_.push_back(float(lr_sum_ / double(lr_steps_)));
  lr_sum_ = 0, lr_steps_ = 0;
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void SmartFrzRecorder::save(std::map<std::string, Tensor>& t) const {
  const int64_t r = records(), p = has_probe() ? probe_x_.size(0) : 0;
  if (has_probe()) t["smartfrz_record/probe_x"] = probe_x_.to(Device::cpu());
  if (probe_x2_.defined()) t["smartfrz_record/probe_x2"] = probe_x2_.to(Device::cpu());
  t["smartfrz_record/lr_since"] = Tensor::from_vector(std::vector<double>{lr_sum_, double(lr_steps_)}, {2});
  if (r == 0) return;
  t["smartfrz_record/steps"] = Tensor::from_vector(steps_, {r});
  if (lrs_complete_) t["smartfrz_record/lrs"] = Tensor::from_vector(lrs_, {r});
  for (size_t u = 0; u < weights_.size(); ++u) {
    t["smartfrz_record/weights/" + std::to_string(u)] = Tensor::from_vector(weights_[u], {r, tailored_.tailor()});
    t["smartfrz_record/grams/" + std::to_string(u)] = Tensor::from_vector(grams_[u], {r, p, p});
  }
}

void SmartFrzRecorder::load(const std::map<std::string, Tensor>& t) {
  const Device d = m_.device();
  auto it = t.find("smartfrz_record/probe_x");
  if (it == t.end()) return;  // checkpointed before the first step
  probe_x_ = it->second.to(d);
  if (auto j = t.find("smartfrz_record/probe_x2"); j != t.end()) probe_x2_ = j->second.to(d);
  steps_.clear();
  lrs_.clear();
  lrs_complete_ = true;
  for (auto& w : weights_) w.clear();
  for (auto& g : grams_) g.clear();
  lr_sum_ = 0, lr_steps_ = 0;
  if (auto l = t.find("smartfrz_record/lr_since"); l != t.end()) {
    const std::vector<double> v = l->second.to_vector<double>();
    EG_CHECK(v.size() == 2, "--smartfrz-record: the checkpoint's lr_since is malformed");
    lr_sum_ = v[0], lr_steps_ = int64_t(v[1]);
  }
  auto s = t.find("smartfrz_record/steps");
  if (s == t.end()) return;
  steps_ = s->second.to_vector<int64_t>();
  // A checkpoint of an egeria before the LRs were recorded: the file will have none (and
  // a predictor of input movement-per-lr cannot be trained from it, smartfrz_train.cpp).
  lrs_complete_ = t.count("smartfrz_record/lrs") > 0;
  if (lrs_complete_) {
    lrs_ = t.at("smartfrz_record/lrs").to_vector<float>();
    EG_CHECK(lrs_.size() == steps_.size(), "--smartfrz-record: the checkpoint's records have ", steps_.size(),
             " steps and ", lrs_.size(), " learning rates");
  }
  for (size_t u = 0; u < weights_.size(); ++u) {
    const std::string k = std::to_string(u);
    EG_CHECK(t.count("smartfrz_record/weights/" + k) && t.count("smartfrz_record/grams/" + k),
             "--smartfrz-record: the checkpoint's records lack unit ", u);
    weights_[u] = t.at("smartfrz_record/weights/" + k).to_vector<float>();
    grams_[u] = t.at("smartfrz_record/grams/" + k).to_vector<float>();
  }
}

void SmartFrzRecorder::write(const std::string& path) const {
  std::map<std::string, Tensor> t;
  save(t);
  std::map<std::string, Tensor> out;
  for (auto& [k, v] : t)
    if (k.rfind("smartfrz_record/probe", 0) != 0 && k != "smartfrz_record/lr_since") out[k.substr(16)] = v;
  auto meta = meta_;
  meta["format"] = kSmartFrzRecordsFormat;
  meta["tailor"] = std::to_string(tailored_.tailor());
  meta["probe"] = std::to_string(has_probe() ? probe_x_.size(0) : 0);
  meta["record_every"] = std::to_string(every_);
  json names = json::array();
  for (size_t u = 0; u < weights_.size(); ++u) names.push_back(part_.units()[u].name);
  meta["units"] = names.dump();
  save_safetensors(path, out, meta);
}

}  // namespace eg::train
