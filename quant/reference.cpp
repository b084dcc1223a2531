#include "quant/reference.h"

#include <cmath>

#include "autograd/node.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "layers/layers.h"
#include "quant/int8.h"

namespace eg::quant {

namespace {

class Fp32Reference : public ReferenceModel {
 public:
  Fp32Reference(const ModelFactory& make, const std::map<std::string, Tensor>& snap, ReferenceBn bn,
                Device dev = Device::cpu()) {
    load(make, snap, bn, dev);
  }
  Tensor activation(const Tensor& x, int64_t module, const Tensor& x2) override {
    const int64_t n = int64_t(model_->layer_modules().size());
    EG_CHECK(module >= 0 && module < n, "reference model: no layer module ", module, " (it has ", n, ")");
    EG_CHECK(x.device().is_cpu() && (!x2.defined() || x2.device().is_cpu()),
             "reference model: the input must be on the CPU");
    if (dev_.is_cpu()) return model_->layer_output(x, x2, module);
    return model_->layer_output(x.to(dev_), x2.defined() ? x2.to(dev_) : x2, module);
  }
  Tensor activation_from(const Tensor& h, int64_t begin, int64_t module) override {
    EG_CHECK(begin >= 0 && begin <= module, "reference model: layer modules ", begin, "..", module, " are no range");
    autograd::NoGradGuard ng;
    return model_->forward_layers(h.device() == dev_ ? h : h.to(dev_), begin, module + 1, module + 1);
  }
  std::string precision() const override { return dev_.is_cpu() ? "fp32" : "fp32-gpu"; }

 protected:
  Fp32Reference() = default;
  void load(const ModelFactory& make, const std::map<std::string, Tensor>& snap, ReferenceBn bn,
            Device dev = Device::cpu()) {
    dev_ = dev;
    model_ = make();
    // The copy is folded, converted and put in eval mode in place: a factory that hands
    // out a model someone else holds (the training one) would have it changed under them.
    EG_CHECK(model_ && model_.use_count() == 1, "reference model: the factory must build a new model for it ",
             model_ ? "(it returned one that is also held elsewhere)" : "(it returned none)");
    model_->load_state_dict(snap);
    model_->to(dev);
    model_->eval();
    if (bn == ReferenceBn::batch)  // before any conversion: these are not folded
      for (auto& [name, mod] : model_->named_modules())
        if (auto* b = dynamic_cast<nn::BatchNorm2d*>(mod)) b->eval_batch_stats = true;
  }
  models::ModelPtr model_;
  Device dev_ = Device::cpu();
};

// int8: batch norm folded, every convolution run by ConvInt8 (s8 weights per output
// channel, u8/s8 activations with static scales; Note [Static activation scales]) and
// every Linear by LinearInt8 (dynamic quantisation, as the paper's Transformers). Other
// layers (ReLU, residual adds, pooling, layer norm, softmax, attention's batched
// products) stay f32: they are a small share of the FLOPs.
class Int8Reference : public Fp32Reference {
 public:
  Int8Reference(const ModelFactory& make, const std::map<std::string, Tensor>& snap, int64_t calibration_batches,
                ReferenceBn bn) {
    load(make, snap, bn);
    convert_to_int8(*model_, calibration_batches, &observers_);
  }
  std::string precision() const override { return "int8"; }
  Calibration calibration() const override {
    Calibration c;
    for (auto& [name, o] : observers_)
      if (o->range().batches > 0) c[name] = o->range();
    return c;
  }
  void set_calibration(const Calibration& c) override {
    for (auto& [name, r] : c) {
      auto it = observers_.find(name);
      EG_CHECK(it != observers_.end(), "int8 reference: the checkpoint's calibration names a convolution '", name,
               "' that the model does not have (a checkpoint of another model?)");
      it->second->set_range(r);
    }
  }

 private:
  std::map<std::string, std::shared_ptr<ActObserver>> observers_;
};

// fp16 on the GPU: batch norm folded, every convolution and linear layer in f16 on
// tensor cores with f32 accumulation, the other layers (ReLU, residual adds, pooling,
// layer norm, softmax, attention's batched products) in f32: what torch.autocast runs
// in f16 for inference, and the same split as the int8 reference.
class Fp16GpuReference : public Fp32Reference {
 public:
  Fp16GpuReference(const ModelFactory& make, const std::map<std::string, Tensor>& snap, ReferenceBn bn, Device gpu) {
    load(make, snap, bn, gpu);
    convert_to_fp16(*model_, gpu);
  }
  std::string precision() const override { return "fp16-gpu"; }
};

// A converting copy on x's device (ops::cast; Tensor::to(DType) goes through the host).
Tensor cast_on_device(const Tensor& x, DType t) {
  Tensor y = Tensor::empty(x.shape(), t, x.device());
  ops::call(ops::cast, x, y);
  return y;
}

void fold_into(nn::Conv2d& conv, nn::BatchNorm2d& bn) {
  const int64_t k = conv.out_channels;
  EG_CHECK(bn.weight.numel() == k, "batch-norm folding: ", bn.weight.numel(), " channels after a convolution with ", k);
  Tensor w = conv.weight.to(Device::cpu()).clone(), b = Tensor::zeros({k});
  const Tensor gamma = bn.weight.to(Device::cpu()), beta = bn.bias.to(Device::cpu()),
               mean = bn.running_mean.to(Device::cpu()), var = bn.running_var.to(Device::cpu());
  const Tensor old_b = conv.bias.defined() ? conv.bias.to(Device::cpu()) : Tensor();
  const int64_t per = w.numel() / k;
  float* wp = w.data<float>();
  for (int64_t o = 0; o < k; ++o) {
    const double inv = double(gamma.data<float>()[o]) / std::sqrt(double(var.data<float>()[o]) + bn.eps);
    for (int64_t i = 0; i < per; ++i) wp[o * per + i] = float(double(wp[o * per + i]) * inv);
    const double b0 = old_b.defined() ? double(old_b.data<float>()[o]) : 0.0;
    b.data<float>()[o] = float((b0 - double(mean.data<float>()[o])) * inv + double(beta.data<float>()[o]));
  }
  conv.weight = w;
  conv.bias = b;
  bn.folded = true;
}

// The activations that folded batch norms apply after their convolutions (fused_act),
// moved into those convolutions (the batch norm then passes its input through): for the
// int8 convolution's epilogue, a pass over each such activation fewer, the same values.
void take_folded_activations(nn::Module& m, std::map<const nn::Conv2d*, ops::BnAct>& acts) {
  const auto& ch = m.children();
  for (size_t i = 0; i + 1 < ch.size(); ++i) {
    auto* conv = dynamic_cast<nn::Conv2d*>(ch[i].second.get());
    auto* bn = dynamic_cast<nn::BatchNorm2d*>(ch[i + 1].second.get());
    if (conv && bn && bn->folded && bn->fused_act != ops::BnAct::none) {
      acts[conv] = bn->fused_act;
      bn->fused_act = ops::BnAct::none;
    }
  }
  for (auto& c : ch) take_folded_activations(*c.second, acts);
}

}  // namespace

int64_t convert_to_int8(nn::Module& m, int64_t calibration_batches,
                        std::map<std::string, std::shared_ptr<ActObserver>>* observers) {
  EG_CHECK(calibration_batches >= 0, "int8 reference: calibration batches must be >= 0 (0: every batch its own ",
           "scales), got ", calibration_batches);
  m.eval();
  fold_batchnorm(m);
  std::map<const nn::Conv2d*, ops::BnAct> acts;
  take_folded_activations(m, acts);
  int64_t n = 0;
  for (auto& [name, mod] : m.named_modules()) {
    auto* conv = dynamic_cast<nn::Conv2d*>(mod);
    if (conv) {
      const auto act = acts.find(conv);
      auto q = std::make_shared<ConvInt8>(conv->weight.to(Device::cpu()), conv->bias, conv->params,
                                          act == acts.end() ? ops::BnAct::none : act->second);
      auto obs = std::make_shared<ActObserver>(calibration_batches);
      if (observers) (*observers)[name] = obs;
      conv->forward_override = [q, obs](const Tensor& x) { return q->forward(x, obs->quant(x)); };
      ++n;
    } else if (auto* lin = dynamic_cast<nn::Linear*>(mod)) {
      auto q = std::make_shared<LinearInt8>(lin->weight.to(Device::cpu()), lin->bias);
      lin->forward_override = [q](const Tensor& x) { return q->forward(x); };
      ++n;
    }
  }
  return n;
}

int64_t convert_to_fp16(nn::Module& m, Device gpu) {
  EG_CHECK(gpu.is_cuda() && cuda_available(), "the fp16 reference model needs a CUDA GPU (",
           built_with_cuda() ? "none is visible" : "this build has no CUDA support", ")");
  m.eval();
  fold_batchnorm(m);
  int64_t n = 0;
  for (auto& [name, mod] : m.named_modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(mod)) {
      const Tensor w = conv->weight.to(DType::f16).to(gpu);
      const Tensor b = conv->bias.defined() ? conv->bias.to(DType::f16).to(gpu) : Tensor();
      conv->forward_override = [w, b, p = conv->params](const Tensor& x) {
        EG_CHECK(x.is_cuda(), "fp16 reference: the input of a convolution must be on the GPU");
        const Tensor xh = cast_on_device(x, DType::f16);
        Tensor y = Tensor::empty(ops::conv2d_out_shape(x.shape(), w.shape(), p), DType::f16, x.device());
        ops::call(ops::conv2d_fwd, xh, w, b, y, p);
        return cast_on_device(y, DType::f32);
      };
      ++n;
    } else if (auto* lin = dynamic_cast<nn::Linear*>(mod)) {
      const Tensor w = lin->weight.to(DType::f16).to(gpu);
      const Tensor b = lin->bias.defined() ? lin->bias.to(gpu) : Tensor();  // added in f32
      lin->forward_override = [w, b](const Tensor& x) {
        const int64_t k = w.size(1);
        EG_CHECK(x.is_cuda() && x.dim() >= 1 && x.size(x.dim() - 1) == k, "fp16 reference: a linear layer of ", k,
                 " inputs got ", shape_str(x.shape()), x.is_cuda() ? "" : " on the CPU");
        const Tensor xh = cast_on_device(x.reshape({-1, k}), DType::f16);
        Tensor y = Tensor::empty({xh.size(0), w.size(0)}, DType::f32, x.device());
        ops::call(ops::linear_fwd, xh, w, b, y);
        Shape s = x.shape();
        s.back() = w.size(0);
        return y.reshape(s);
      };
      ++n;
    }
  }
  return n;
}

int64_t fold_batchnorm(nn::Module& m) {
  m.eval();  // an inference copy: its convolutions now hold new tensors (Module::check_registered)
  int64_t folded = 0;
  const auto& ch = m.children();
  for (size_t i = 0; i + 1 < ch.size(); ++i) {
    auto* conv = dynamic_cast<nn::Conv2d*>(ch[i].second.get());
    auto* bn = dynamic_cast<nn::BatchNorm2d*>(ch[i + 1].second.get());
    if (conv && bn && !bn->folded && !bn->eval_batch_stats && bn->weight.numel() == conv->out_channels) {
      fold_into(*conv, *bn);
      ++folded;
    }
  }
  for (auto& c : ch) folded += fold_batchnorm(*c.second);
  return folded;
}

ModelFactory model_factory(const models::ModelConfig& mc) {
  return [mc] {
    Generator g(0);
    return models::build_model(mc, g);
  };
}

std::vector<std::string> reference_precisions() { return {"int8", "fp32", "fp32-gpu", "fp16-gpu"}; }

std::unique_ptr<ReferenceModel> make_reference(const std::string& precision, const ModelFactory& make,
                                               const std::map<std::string, Tensor>& snapshot, Device gpu,
                                               int64_t calibration_batches, ReferenceBn bn) {
  if (precision == "fp32") return std::make_unique<Fp32Reference>(make, snapshot, bn);
  if (precision == "int8") return std::make_unique<Int8Reference>(make, snapshot, calibration_batches, bn);
  if (precision == "fp32-gpu" || precision == "fp16-gpu") {
    EG_CHECK(gpu.is_cuda() && cuda_available(), "the ", precision, " reference model needs a CUDA GPU (",
             built_with_cuda() ? "none is visible" : "this build has no CUDA support", "); use int8 or fp32");
    if (precision == "fp32-gpu") return std::make_unique<Fp32Reference>(make, snapshot, bn, gpu);
    return std::make_unique<Fp16GpuReference>(make, snapshot, bn, gpu);
  }
  EG_THROW("unknown reference precision '", precision, "' (int8, fp32, fp32-gpu, fp16-gpu)");
}

std::unique_ptr<ReferenceModel> make_reference(const std::string& precision, const models::ModelConfig& mc,
                                               const std::map<std::string, Tensor>& snapshot) {
  return make_reference(precision, model_factory(mc), snapshot);
}

}  // namespace eg::quant
