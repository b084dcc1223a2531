// Op cases: fused optimizer steps (sgd_step, adamw_step, their multi-tensor forms) and loss scaling's unscale. The forward is one step: it
// clones param and state (the kernels update in place, and the inputs are shared by
// every backend's run) and returns the updated tensors. No backward.
#include <cmath>

#include "tests/op_cases.h"

namespace eg::testing {
namespace {

// Bench cases report traffic including the clones: param and each state tensor are
// read and written once more by clone().
void add_sgd(std::vector<OpCase>& v, const std::string& name, int64_t n, ops::SgdParams p, bool big) {
  OpCase c;
  c.name = "sgd_step/" + name;
  const bool has_buf = p.momentum != 0.0;
  c.make_inputs = [=](DType dt) {
    // first_step must overwrite the buffer without reading it: NaN would show through.
    Tensor buf = !has_buf ? Tensor() : p.first_step ? Tensor::full({n}, NAN, dt) : randn({n}, dt, 63);
    return Tensors{randn({n}, dt, 61), randn({n}, dt, 62, 0.1), buf};
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor w = in[0].clone(), buf = has_buf ? in[2].clone() : Tensor();
    ops::run(ops::sgd_step, b, w, in[1], buf, p);
    return Tensors{w, buf};
  };
  c.uses = {uses(ops::sgd_step)};
  c.fwd_tol = {1e-6, 1e-6};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n) * 4 * (has_buf ? 5 + 4 : 3 + 2);
  v.push_back(c);
}

void add_adamw(std::vector<OpCase>& v, const std::string& name, int64_t n, ops::AdamWParams p, bool big) {
  OpCase c;
  c.name = "adamw_step/" + name;
  c.make_inputs = [=](DType dt) {
    // Step 1 starts from zero moments, as AdamW does; later steps from a plausible state
    // (v >= 0, of the order of g^2).
    Tensor m = p.step == 1 ? Tensor::zeros({n}, dt) : randn({n}, dt, 73, 0.02);
    Tensor vv = p.step == 1 ? Tensor::zeros({n}, dt) : uniform({n}, dt, 74, 0.0, 0.02);
    return Tensors{randn({n}, dt, 71), randn({n}, dt, 72, 0.1), m, vv};
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor w = in[0].clone(), m = in[2].clone(), vv = in[3].clone();
    ops::run(ops::adamw_step, b, w, in[1], m, vv, p);
    return Tensors{w, m, vv};
  };
  c.uses = {uses(ops::adamw_step)};
  c.fwd_tol = {1e-6, 1e-5};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n) * 4 * (7 + 6);
  v.push_back(c);
}

// A multi-tensor case's common end: no gradcheck, benchmarked when `big`, `words` f32
// reads and writes per element of every member (the clones included).
void add_multi_case(std::vector<OpCase>& v, OpCase& c, const std::vector<int64_t>& sizes, int words, bool big) {
  c.gradcheck = false;
  c.bench = big;
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  c.bytes = double(n) * 4 * words;
  v.push_back(c);
}

// Loss scaling's skip flag for a multi-tensor case: -1 none (undefined), 0 clear, 1 set.
Tensor skip_flag(int skip, Device d) { return skip < 0 ? Tensor() : Tensor::full({1}, double(skip), DType::f32, d); }

// The multi-tensor forms over members of the given sizes (their parameters, gradients,
// state), the learning rate an f64 tensor on the members' device; p.lr is a decoy the op
// must not read. Outputs: every member's updated tensors (with the skip flag set, its
// tensors as they came: ref writes nothing).
void add_sgd_multi(std::vector<OpCase>& v, const std::string& name, std::vector<int64_t> sizes, ops::SgdParams p,
                   double lr, bool big, int skip = -1) {
  OpCase c;
  c.name = "sgd_step_multi/" + name;
  const size_t k = sizes.size();
  const bool has_buf = p.momentum != 0.0;
  c.make_inputs = [=](DType dt) {
    Tensors in{Tensor::full({1}, lr, DType::f64)};
    for (size_t i = 0; i < k; ++i) {
      in.push_back(randn({sizes[i]}, dt, 81 + i));
      in.push_back(randn({sizes[i]}, dt, 181 + i, 0.1));
      in.push_back(has_buf ? randn({sizes[i]}, dt, 281 + i) : Tensor());
    }
    return in;
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    std::vector<Tensor> ps, gs, bs;
    for (size_t i = 0; i < k; ++i) {
      ps.push_back(in[1 + 3 * i].clone());
      gs.push_back(in[2 + 3 * i]);
      bs.push_back(has_buf ? in[3 + 3 * i].clone() : Tensor());
    }
    ops::SgdParams q = p;
    q.lr = 1e3;  // not read
    ops::run(ops::sgd_step_multi, b, in[0], ps, gs, bs, q, skip_flag(skip, in[0].device()));
    Tensors out = ps;
    if (has_buf) out.insert(out.end(), bs.begin(), bs.end());
    return out;
  };
  c.uses = {uses(ops::sgd_step_multi)};
  c.fwd_tol = {1e-6, 1e-6};
  add_multi_case(v, c, sizes, has_buf ? 5 + 4 : 3 + 2, big);
}

void add_adamw_multi(std::vector<OpCase>& v, const std::string& name, std::vector<int64_t> sizes,
                     std::vector<int64_t> steps, ops::AdamWParams p, double lr, bool big, int skip = -1) {
  OpCase c;
  c.name = "adamw_step_multi/" + name;
  const size_t k = sizes.size();
  c.make_inputs = [=](DType dt) {
    Tensors in{Tensor::full({1}, lr, DType::f64)};
    for (size_t i = 0; i < k; ++i) {
      in.push_back(randn({sizes[i]}, dt, 91 + i));
      in.push_back(randn({sizes[i]}, dt, 191 + i, 0.1));
      in.push_back(steps[i] == 1 ? Tensor::zeros({sizes[i]}, dt) : randn({sizes[i]}, dt, 291 + i, 0.02));
      in.push_back(steps[i] == 1 ? Tensor::zeros({sizes[i]}, dt) : uniform({sizes[i]}, dt, 391 + i, 0.0, 0.02));
    }
    for (size_t i = 0; i < k; ++i) in.push_back(Tensor::full({1}, double(steps[i] - 1), DType::f64));  // counts before
    return in;
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    std::vector<Tensor> ps, gs, ms, vs, counts;
    for (size_t i = 0; i < k; ++i) {
      ps.push_back(in[1 + 4 * i].clone());
      gs.push_back(in[2 + 4 * i]);
      ms.push_back(in[3 + 4 * i].clone());
      vs.push_back(in[4 + 4 * i].clone());
      counts.push_back(in[1 + 4 * k + i].clone());
    }
    ops::AdamWParams q = p;
    q.lr = 1e3, q.step = 1000;  // not read
    ops::run(ops::adamw_step_multi, b, in[0], ps, gs, ms, vs, counts, q, skip_flag(skip, in[0].device()));
    Tensors out = ps;
    out.insert(out.end(), ms.begin(), ms.end());
    out.insert(out.end(), vs.begin(), vs.end());
    out.insert(out.end(), counts.begin(), counts.end());  // each advanced by one
    return out;
  };
  c.uses = {uses(ops::adamw_step_multi)};
  c.fwd_tol = {1e-6, 1e-5};
  add_multi_case(v, c, sizes, 7 + 6, big);
}

// found_inf starts 0; `inf_at` >= 0 puts an inf there (and a NaN after it), so the flag
// must be raised. A power-of-two scale, as the loss scaler's, is exact.
void add_unscale(std::vector<OpCase>& v, const std::string& name, int64_t n, int64_t inf_at, bool big) {
  OpCase c;
  c.name = "amp_unscale/" + name;
  c.make_inputs = [=](DType dt) {
    Tensor g = randn({n}, dt, 75, 1e4);
    if (inf_at >= 0) {
      std::vector<double> vals = g.to(DType::f64).to_vector<double>();
      vals[size_t(inf_at)] = INFINITY;
      vals[size_t(std::min(inf_at + 1, n - 1))] = NAN;
      g = Tensor::from_vector(vals, {n}).to(dt);
    }
    return Tensors{g};
  };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor g = in[0].clone(), found = Tensor::zeros({1}, DType::f32, in[0].device());
    ops::run(ops::amp_unscale, b, g, found, Tensor::full({1}, 65536.0, DType::f64, in[0].device()));
    return Tensors{inf_at >= 0 ? Tensor::zeros({1}, in[0].dtype(), in[0].device()) : g, found};
  };
  c.uses = {uses(ops::amp_unscale)};
  c.fwd_tol = {0, 0};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n) * 4 * (2 + 2);
  v.push_back(c);
}

// Loss scaling's update on the device: state {scale, clean, skipped} = {2^15, clean, 3}
// with the flag `found`; a growth interval of 5, so a clean count of 4 doubles the scale.
void add_update_scale(std::vector<OpCase>& v, int found, double clean) {
  OpCase c;
  c.name = "amp_update_scale/found_" + std::to_string(found) + "_clean_" + std::to_string(int(clean));
  c.make_inputs = [=](DType) {
    return Tensors{Tensor::from_vector(std::vector<double>{32768, clean, 3}, {3}),
                   Tensor::full({1}, double(found), DType::f32)};
  };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor state = in[0].clone();
    ops::run(ops::amp_update_scale, b, state, in[1], int64_t(5));
    return Tensors{state};
  };
  c.uses = {uses(ops::amp_update_scale)};
  c.fwd_tol = {0, 0};
  c.gradcheck = false;
  c.bench = false;
  v.push_back(c);
}

// Gradient clipping without a host read (Note [Deferred reads]): the norm and coefficient
// from the buckets' sums of squares, and the buckets scaled by it.
void add_clip_coef(std::vector<OpCase>& v, const std::string& name, std::vector<float> sums, double max_norm) {
  OpCase c;
  c.name = "clip_coef/" + name;
  c.make_inputs = [=](DType) { return Tensors{Tensor::from_vector(sums, {int64_t(sums.size())})}; };
  c.forward = [=](ops::Backend b, const Tensors& in) {
    Tensor out = Tensor::zeros({2}, DType::f64, in[0].device());
    ops::run(ops::clip_coef, b, in[0], out, max_norm);
    return Tensors{out};
  };
  c.uses = {uses(ops::clip_coef)};
  c.fwd_tol = {0, 1e-15};  // the same f64 operations in the same order
  c.gradcheck = false;
  v.push_back(c);
}

void add_scale_by(std::vector<OpCase>& v, const std::string& name, int64_t n, double coef, bool big) {
  OpCase c;
  c.name = "scale_by/" + name;
  c.make_inputs = [=](DType dt) { return Tensors{randn({n}, dt, 77), Tensor::full({1}, coef, DType::f64)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor y = empty_like(in[0]);
    ops::run(ops::scale_by, b, in[0], y, in[1]);
    return Tensors{y};
  };
  c.uses = {uses(ops::scale_by)};
  c.fwd_tol = {1e-7, 2e-7};  // the ref's f64 product against an f32 coefficient's
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n) * 8;
  v.push_back(c);
}

ops::SgdParams sgd(double lr, double momentum, double dampening, double wd, bool nesterov, bool first) {
  ops::SgdParams p;
  p.lr = lr;
  p.momentum = momentum;
  p.dampening = dampening;
  p.weight_decay = wd;
  p.nesterov = nesterov;
  p.first_step = first;
  return p;
}

ops::AdamWParams adamw(double lr, double wd, int64_t step) {
  ops::AdamWParams p;
  p.lr = lr;
  p.weight_decay = wd;
  p.step = step;
  return p;
}

RegisterCases reg([](std::vector<OpCase>& v) {
  add_clip_coef(v, "above_the_bound", {3.5f, 120.25f, 0.125f}, 1.0);
  add_clip_coef(v, "below_the_bound", {0.25f, 0.5f}, 5.0);
  add_clip_coef(v, "not_finite", {1.f, INFINITY, 2.f}, 1.0);
  add_scale_by(v, "small", 1037, 0.3017, false);
  add_scale_by(v, "resnet56_grads_853018", 853018, 0.125, true);
  const int64_t n = 1037;  // not a multiple of any vector width or chunk
  add_sgd(v, "plain", n, sgd(0.1, 0, 0, 0, false, false), false);
  add_sgd(v, "weight_decay", n, sgd(0.1, 0, 0, 5e-4, false, false), false);
  add_sgd(v, "momentum", n, sgd(0.1, 0.9, 0, 0, false, false), false);
  add_sgd(v, "momentum_dampening_wd", n, sgd(0.05, 0.9, 0.1, 1e-2, false, false), false);
  add_sgd(v, "nesterov_wd", n, sgd(0.1, 0.9, 0, 5e-4, true, false), false);
  add_sgd(v, "momentum_first_step", n, sgd(0.1, 0.9, 0.1, 5e-4, false, true), false);
  add_sgd(v, "nesterov_first_step", n, sgd(0.1, 0.9, 0, 5e-4, true, true), false);
  add_sgd(v, "nesterov_wd_n850k", 850000, sgd(0.1, 0.9, 0, 5e-4, true, false), true);
  add_sgd(v, "nesterov_wd_n25600k", 25600000, sgd(0.1, 0.9, 0, 5e-4, true, false), true);

  // More members than one CUDA launch takes (32), of sizes from 1 to a few thousand.
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < 37; ++i) sizes.push_back(1 + (i * 977) % 3001);
  add_sgd_multi(v, "nesterov_wd_37_members", sizes, sgd(0, 0.9, 0, 5e-4, true, false), 0.1, false);
  add_sgd_multi(v, "momentum_dampening_3_members", {5, 1037, 33}, sgd(0, 0.9, 0.1, 1e-2, false, false), 0.05, false);
  add_sgd_multi(v, "plain_3_members", {5, 1037, 33}, sgd(0, 0, 0, 0, false, false), 0.1, false);
  // ResNet-56's 170 parameters: 110 of 16 to 64 (batch norm), 57 of 432 to 36,864, one of 640.
  std::vector<int64_t> r56;
  for (int i = 0; i < 170; ++i)
    r56.push_back(i % 3 == 2 ? 16 * 16 * 9 * (1 << (i / 57)) * (1 << (i / 57)) : 16 << (i / 57));
  add_sgd_multi(v, "resnet56_like_170_members", r56, sgd(0, 0.9, 0, 5e-4, true, false), 0.1, true);
  add_adamw_multi(v, "steps_1_3_7", {5, 1037, 33}, {1, 3, 7}, adamw(0, 0.01, 1), 1e-3, false);
  add_adamw_multi(v, "37_members", sizes, std::vector<int64_t>(37, 12), adamw(0, 0.01, 1), 3e-4, false);
  add_adamw_multi(v, "resnet56_like_170_members", r56, std::vector<int64_t>(170, 100), adamw(0, 0.01, 1), 1e-3, true);
  // Loss scaling's flag: clear (the step as without it), set over more members than one
  // launch (nothing written, no count advanced).
  add_sgd_multi(v, "skip_flag_clear", {5, 1037, 33}, sgd(0, 0.9, 0, 5e-4, true, false), 0.1, false, 0);
  add_sgd_multi(v, "skip_flag_set_37_members", sizes, sgd(0, 0.9, 0, 5e-4, true, false), 0.1, false, 1);
  add_adamw_multi(v, "skip_flag_clear", {5, 1037, 33}, {1, 3, 7}, adamw(0, 0.01, 1), 1e-3, false, 0);
  add_adamw_multi(v, "skip_flag_set_37_members", sizes, std::vector<int64_t>(37, 12), adamw(0, 0.01, 1), 3e-4, false,
                  1);
  for (int found : {0, 1})
    for (double clean : {0.0, 4.0}) add_update_scale(v, found, clean);

  add_unscale(v, "finite", n, -1, false);
  add_unscale(v, "inf_and_nan", n, 700, false);
  add_unscale(v, "inf_last", n, n - 1, false);
  add_unscale(v, "n850k", 850000, -1, true);

  add_adamw(v, "step1", n, adamw(1e-3, 0.01, 1), false);
  add_adamw(v, "step10", n, adamw(1e-3, 0.01, 10), false);
  add_adamw(v, "step10_lr_wd", 3 * 2048 + 5, adamw(3e-2, 0.1, 10), false);
  add_adamw(v, "step10_n850k", 850000, adamw(1e-3, 0.01, 10), true);
  add_adamw(v, "step10_n25600k", 25600000, adamw(1e-3, 0.01, 10), true);
});

}  // namespace
}  // namespace eg::testing
