// Op cases: layer norm, embedding, dropout, sum of squares, casts.
#include <cstring>

#include "tests/op_cases.h"

namespace eg::testing {
namespace {

// accumulate: dgamma and dbeta added into values already there (Note [Gradient destinations]).
void add_layernorm(std::vector<OpCase>& v, const std::string& variant, int64_t m, int64_t d, bool big,
                   bool accumulate = false) {
  OpCase c;
  c.name = "layernorm/" + variant;
  c.make_inputs = [m, d](DType dt) {
    return Tensors{randn({m, d}, dt, 61, 2.0), uniform({d}, dt, 62, 0.5, 1.5), randn({d}, dt, 63)};
  };
  c.forward = [m](ops::Backend b, const Tensors& in) {
    Tensor y = empty_like(in[0]), mean = empty_on(in[0], {m}, in[0].dtype()),
           rstd = empty_on(in[0], {m}, in[0].dtype());
    ops::run(ops::layernorm_fwd, b, in[0], in[1], in[2], y, mean, rstd, 1e-5);
    return Tensors{y, mean, rstd};
  };
  c.backward = [accumulate](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    Tensor dx = empty_like(in[0]), dg = gradient_start(in[1], in[1].shape(), in[1].dtype(), accumulate, 64);
    Tensor db = gradient_start(in[2], in[2].shape(), in[2].dtype(), accumulate, 65);
    ops::run(ops::layernorm_bwd, b, dout[0], in[0], in[1], out[1], out[2], dx, dg, db, accumulate);
    return Tensors{dx, dg, db};
  };
  c.uses = {uses(ops::layernorm_fwd), uses(ops::layernorm_bwd)};
  c.bwd_tol = {2e-4, 2e-3};
  c.gradcheck = !big && !accumulate;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(m * d) * 4 * 5;
  v.push_back(c);
}

// A batch of 8-bit pixels made images with per-channel scale and zero (ImageNet's
// normalisation); one rounding each in f32, as the loader's.
void add_image_normalize(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big) {
  OpCase c;
  c.name = "image_normalize/" + variant;
  c.make_inputs = [s](DType) {
    const int64_t ch = s[1];
    std::vector<float> scale, zero;
    for (int64_t i = 0; i < ch; ++i) {
      const float mean = 0.4f + 0.03f * float(i), sd = 0.22f + 0.01f * float(i);
      scale.push_back(1.f / (255.f * sd)), zero.push_back(-mean / sd);
    }
    return Tensors{randint(s, 0, 256, 75, DType::u8), Tensor::from_vector(scale, {ch}),
                   Tensor::from_vector(zero, {ch})};
  };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor y = empty_on(in[0], in[0].shape(), DType::f32);
    ops::run(ops::image_normalize, b, in[0], in[1], in[2], y);
    return Tensors{y};
  };
  c.uses = {uses(ops::image_normalize)};
  c.fwd_tol = {1e-6, 1e-6};  // an FMA or a multiply and an add: one f32 rounding apart at most
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(shape_numel(s)) * 5;
  v.push_back(c);
}

// The padding mask of a batch of ids, about a third of them the pad id (0), and its
// complement; exact.
void add_token_mask(std::vector<OpCase>& v, const std::string& variant, Shape ids, bool big) {
  OpCase c;
  c.name = "token_mask/" + variant;
  c.make_inputs = [ids](DType) { return Tensors{randint(ids, 0, 3, 74)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor pad = empty_on(in[0], in[0].shape(), DType::u8), real = empty_on(in[0], in[0].shape(), DType::u8);
    ops::run(ops::token_mask, b, in[0], pad, int64_t(0), true);
    ops::run(ops::token_mask, b, in[0], real, int64_t(0), false);
    return Tensors{pad, real};
  };
  c.uses = {uses(ops::token_mask)};
  c.fwd_tol = {0, 0};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(shape_numel(ids)) * 9;
  v.push_back(c);
}

// accumulate: the table's gradient added into values already there (Note [Gradient destinations]).
void add_embedding(std::vector<OpCase>& v, const std::string& variant, Shape ids, int64_t vocab, int64_t d, bool big,
                   bool accumulate = false) {
  OpCase c;
  c.name = "embedding/" + variant;
  c.make_inputs = [ids, vocab, d](DType dt) {
    Tensor t = randint(ids, 0, vocab, 71);
    t.data<int64_t>()[0] = t.data<int64_t>()[t.numel() - 1];  // a repeated id: gradients accumulate
    return Tensors{t, randn({vocab, d}, dt, 72)};
  };
  c.forward = [d](ops::Backend b, const Tensors& in) {
    Shape s = in[0].shape();
    s.push_back(d);
    Tensor y = empty_on(in[1], s, in[1].dtype());
    ops::run(ops::embedding_fwd, b, in[0], in[1], y);
    return Tensors{y};
  };
  c.backward = [accumulate](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor dt = gradient_start(in[1], in[1].shape(), in[1].dtype(), accumulate, 73);
    ops::run(ops::embedding_bwd, b, dout[0], in[0], dt, accumulate);
    return Tensors{Tensor(), dt};
  };
  c.uses = {uses(ops::embedding_fwd), uses(ops::embedding_bwd)};
  c.gradcheck = !big && !accumulate;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(shape_numel(ids) * d) * 4 * 4;
  v.push_back(c);
}

void add_dropout(std::vector<OpCase>& v, const std::string& variant, Shape s, double p, bool big) {
  OpCase c;
  c.name = "dropout/" + variant;
  c.make_inputs = [s](DType dt) { return Tensors{randn(s, dt, 81)}; };
  c.forward = [p](ops::Backend b, const Tensors& in) {
    Tensor y = empty_like(in[0]), mask = Tensor::empty(in[0].shape(), DType::u8, in[0].device());
    // Counter 99: a base of 90 on the device, 9 past it.
    const Tensor rng = Tensor::from_vector(std::vector<int64_t>{1234, 90}, {2}, in[0].device());
    ops::run(ops::dropout_fwd, b, in[0], y, mask, p, rng, 9);
    return Tensors{y, mask};
  };
  c.backward = [p](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    Tensor dx = empty_like(in[0]);
    ops::run(ops::dropout_bwd, b, dout[0], out[1], dx, p);
    return Tensors{dx};
  };
  c.uses = {uses(ops::dropout_fwd), uses(ops::dropout_bwd)};
  c.fwd_tol = {1e-6, 1e-6};  // the mask must match exactly on every backend
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(shape_numel(s)) * (4 * 4 + 2);
  v.push_back(c);
}

void add_reductions(std::vector<OpCase>& v, const std::string& variant, int64_t n, bool big) {
  OpCase c;
  c.name = "sum_squares/" + variant;
  c.make_inputs = [n](DType dt) { return Tensors{randn({n}, dt, 91)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor out = empty_on(in[0], {1}, in[0].dtype());
    ops::run(ops::sum_squares, b, in[0], out);
    return Tensors{out};
  };
  c.uses = {uses(ops::sum_squares)};
  c.fwd_tol = {1e-4, 1e-5};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n) * 4;
  v.push_back(c);
}

void add_cast(std::vector<OpCase>& v, const std::string& variant, DType from, DType to, int64_t n, bool big) {
  OpCase c;
  c.name = "cast/" + variant;
  const bool special = variant.find("special") != std::string::npos;
  c.make_inputs = [from, n, special](DType) {
    if (from == DType::u8) return Tensors{randint({n}, 0, 256, 95, DType::u8)};
    if (special) {  // what rounding to 16 bits must get right: ties, NaN, infinities, zeros, denormals, overflow
      std::vector<float> vals = randn({n}, DType::f32, 97, 100.0).to_vector<float>();
      const uint32_t bits[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7fc00001u, 0x7f800001u, 0xff800000u,
                               0x7f800000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7fffffu,
                               0x00008000u, 0x00018000u, 0x3effff80u, 0xbf7f8000u};
      for (size_t k = 0; k < vals.size(); ++k)
        if (k % 3 == 0) std::memcpy(&vals[k], &bits[(k / 3) % 16], 4);
      return Tensors{Tensor::from_vector(vals, {n}).to(from)};
    }
    return Tensors{randn({n}, DType::f32, 96, 100.0).to(from)};
  };
  c.forward = [to](ops::Backend b, const Tensors& in) {
    Tensor y = empty_on(in[0], in[0].shape(), to);
    ops::run(ops::cast, b, in[0], y);
    return Tensors{y};
  };
  c.uses = {uses(ops::cast)};
  c.fwd_tol = {0, 0};  // conversions are exact functions
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n) * double(dtype_size(from) + dtype_size(to));
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  add_layernorm(v, "small", 6, 8, false);
  add_layernorm(v, "rows_1000x50", 1000, 50, false);  // rows in slices (Note [Column sums] on CUDA)
  v.back().gradcheck = false;  // the small case's gradcheck covers the math
  add_layernorm(v, "rows_1000x50_accumulate", 1000, 50, false, true);  // into .grad (Note [Gradient destinations])
  add_layernorm(v, "transformer_4096x512", 4096, 512, true);
  add_embedding(v, "small", {3, 4}, 7, 5, false);
  add_embedding(v, "small_accumulate", {3, 4}, 7, 5, false, true);
  add_embedding(v, "tokens_64x128_vocab32000", {64, 128}, 32000, 512, true);
  add_image_normalize(v, "small", {2, 3, 5, 7}, false);
  add_image_normalize(v, "grey_odd", {3, 1, 3, 3}, false);
  add_image_normalize(v, "imagenet_b128", {128, 3, 224, 224}, true);
  add_token_mask(v, "small", {3, 5}, false);
  add_token_mask(v, "batch_128x32", {128, 32}, true);
  add_dropout(v, "p01", {4, 50}, 0.1, false);
  add_dropout(v, "p05", {4, 50}, 0.5, false);
  add_bf16_twin(v);
  add_dropout(v, "ffn_128x512x512", {128, 512, 512}, 0.1, true);
  add_bf16_twin(v);
  add_reductions(v, "small", 1000, false);
  add_reductions(v, "resnet56_params", 853018, true);
  add_cast(v, "f32_to_bf16", DType::f32, DType::bf16, 1000, false);
  add_cast(v, "f32_to_bf16_special_values", DType::f32, DType::bf16, 1003, false);
  add_cast(v, "f32_to_bf16_4096x512", DType::f32, DType::bf16, 4096 * 512, true);
  add_cast(v, "bf16_to_f32", DType::bf16, DType::f32, 1000, false);
  add_cast(v, "f32_to_f16", DType::f32, DType::f16, 1000, false);
  add_cast(v, "u8_to_f32_images", DType::u8, DType::f32, 128 * 3 * 32 * 32, true);
});

}  // namespace
}  // namespace eg::testing
