#include "quant/reference.h"

#include "autograd/node.h"
#include "core/error.h"

namespace eg::quant {

namespace {

class Fp32Reference : public ReferenceModel {
 public:
  Fp32Reference(const models::ModelConfig& mc, const std::map<std::string, Tensor>& snap) {
    Generator g(0);
    model_ = models::build_model(mc, g);
    EG_CHECK(model_->sequential(), "model '", mc.name, "' is not a sequence of layer modules; "
             "the Egeria reference model supports sequential models only");
    std::map<std::string, Tensor> cpu;
    for (auto& [k, t] : snap) cpu[k] = t.to(Device::cpu());
    model_->load_state_dict(cpu);
    model_->eval();
    units_ = model_->layer_modules();
  }
  Tensor activation(const Tensor& x, int64_t module) override {
    EG_CHECK(module >= 0 && module < int64_t(units_.size()), "reference model: no layer module ", module, " (it has ",
             units_.size(), ")");
    autograd::NoGradGuard ng;
    Tensor h = x;
    for (int64_t i = 0; i <= module; ++i) h = units_[size_t(i)].second->forward(h);
    return h;
  }
  std::string precision() const override { return "fp32"; }

 private:
  models::ModelPtr model_;
  std::vector<std::pair<std::string, nn::ModulePtr>> units_;
};

}  // namespace

std::unique_ptr<ReferenceModel> make_reference(const std::string& precision, const models::ModelConfig& mc,
                                               const std::map<std::string, Tensor>& snapshot) {
  if (precision == "fp32") return std::make_unique<Fp32Reference>(mc, snapshot);
  EG_CHECK(precision != "int8", "the int8 reference model is not implemented yet; use --reference fp32");
  EG_THROW("unknown reference precision '", precision, "' (fp32)");
}

}  // namespace eg::quant
