// The op table (ggml's test-backend-ops, our way). Each OpCase names an op
// configuration, makes its inputs, and runs its forward (and backward) kernels on a
// chosen backend. The same table drives:
//   tests/test_ops.cpp   parity of every registered backend against ref (f32), and
//                        finite-difference gradcheck of the ref backward in f64;
//   bench/bench_ops.cpp  Google Benchmark cases reporting GFLOP/s or GB/s.
// Adding an op means adding cases here (one file per op group: op_cases_<group>.cpp);
// it is then tested and benchmarked for free. Tolerances live in the cases:
// |got - ref| <= atol + rtol * |ref|.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace eg::testing {

using Tensors = std::vector<Tensor>;

struct Tolerance {
  double atol = 1e-5, rtol = 1e-4;
};

// bf16's machine epsilon, 2^-7: the largest relative gap between neighbouring bf16
// values, so a bound on the difference of two roundings of nearly the same number.
constexpr double kBf16Eps = 0.0078125;
// A bf16 case's tolerance: its f32 case's (the accumulation) and one bf16 rounding more.
inline Tolerance bf16_tolerance(const Tolerance& f32) { return {f32.atol, f32.rtol + kBf16Eps}; }
// f16's, 2^-10, and its cases' tolerance the same way.
constexpr double kF16Eps = 0.0009765625;
inline Tolerance f16_tolerance(const Tolerance& f32) { return {f32.atol, f32.rtol + kF16Eps}; }
// The dtype of parameters, statistics and their gradients beside activations of `dt`:
// f32 under bf16 or f16 activations (autocast's master weights), else `dt` itself.
inline DType param_dtype(DType dt) { return is_half(dt) ? DType::f32 : dt; }

struct OpCase {
  std::string name;  // "<op>/<variant>", unique; [a-z0-9_/] only
  // The dtype its parity and benchmark run in: f32, or bf16 for the ops that take it
  // (Note [bf16 kernels] in kernels/ops.h; gradcheck then runs the f32 case's twin), or
  // f16 on CUDA (every bf16 case's f16 twin, Note [16-bit CUDA kernels]).
  DType dtype = DType::f32;
  // Inputs for floating dtype `dt` (f32, f64 or the case's dtype) on the CPU,
  // deterministic. Integer inputs (ids, targets, masks) keep their own dtype.
  std::function<Tensors(DType dt)> make_inputs;
  // Forward outputs from inputs already on the backend's device.
  std::function<Tensors(ops::Backend b, const Tensors& in)> forward;
  // Optional backward: input gradients (undefined where an input is not
  // differentiable) from inputs, forward outputs and output gradients.
  std::function<Tensors(ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout)> backward;
  // Which ops the case calls: a backend is tested only when all of them have it.
  struct Use {
    const char* op;
    std::function<bool(ops::Backend)> has;
    std::function<bool(ops::Backend)> has_bf16;  // the implementation takes bf16 tensors
  };
  std::vector<Use> uses;
  std::vector<int> diff_outputs = {0};  // outputs that carry gradient (dout given for these)
  Tolerance fwd_tol, bwd_tol{1e-4, 1e-3};
  Tolerance grad_tol{1e-6, 1e-4};  // gradcheck, f64
  bool gradcheck = true;  // small cases only: gradcheck costs 2 forwards per element
  // The backward adds into gradients already holding values (gradient_start): a 16-bit
  // twin's tolerance then allows one 16-bit rounding of the terms (add_bf16_twin).
  bool accumulates = false;
  bool bench = false;  // realistic sizes: benchmarked
  double flops = 0;  // per forward (+ backward when bench_backward) call
  double bytes = 0;  // memory traffic, for bandwidth-bound ops
  bool bench_backward = false;
  bool cuda_only = false;  // a layout only CUDA kernels take (NHWC)
  // An NHWC twin's inputs (and, with nhwc_douts, output gradients) that CUDA takes in
  // NHWC: its forward and backward convert them (a no-op for tensors already NHWC), and
  // a benchmark converts them once, outside the timed loop.
  std::vector<int> nhwc_inputs;
  bool nhwc_douts = false;

  bool supports(ops::Backend b) const;
};

std::vector<OpCase>& op_cases();

// Makes case `c` feed its f32 inputs `which` (and, when douts is set, its output
// gradients) in the blocked nChw16c layout (Note [Blocked activations]). ref and cuda
// get plain copies through ops::run, so parity compares the cpu kernels' blocked paths
// (and the conversions around them) with the plain ground truth; f64 gradcheck inputs
// stay plain.
void block_inputs(OpCase& c, std::vector<int> which, bool douts);

// Appends the bf16 twin of v.back() (Note [bf16 kernels]): the same case made with
// make_inputs(bf16), named "<op>/bf16_<variant>", within bf16_tolerance of ref, not
// gradchecked (the f32 case is), its `bytes` halved (they count activations). The
// case's functions must give parameters param_dtype(dt).
void add_bf16_twin(std::vector<OpCase>& v);
// Appends the last case that is not such a twin again as "<name><suffix>", run on CUDA
// alone with its inputs `which` (and, when douts is set, its output gradients) in NHWC
// (Note [Channels-last activations on CUDA] in core/tensor.h), against the same plain ref;
// benchmarked where that case is.
void add_nhwc_twin(std::vector<OpCase>& v, std::vector<int> which, bool douts, const std::string& suffix = "_nhwc");

// Registration from each op_cases_<group>.cpp: static RegisterCases r([](auto& v){...}).
// Every bf16 case the group adds gets an f16 twin, "<op>/f16_<variant>", run on CUDA
// alone (the CPU kernels take bf16, not f16) against the ref's f64 path rounded to f16.
void add_f16_twins(std::vector<OpCase>& v, size_t from);
struct RegisterCases {
  explicit RegisterCases(const std::function<void(std::vector<OpCase>&)>& add) {
    const size_t from = op_cases().size();
    add(op_cases());
    add_f16_twins(op_cases(), from);
  }
};

template <class Fn>
OpCase::Use uses(const ops::Op<Fn>& op) {
  return {op.name, [&op](ops::Backend b) { return op.has(b); }, [&op](ops::Backend) { return op.bf16; }};
}

// Deterministic inputs: a seed per (case, input) keeps cases independent.
Tensor randn(const Shape& s, DType dt, uint64_t seed, double scale = 1.0);
Tensor uniform(const Shape& s, DType dt, uint64_t seed, double lo, double hi);
Tensor randint(const Shape& s, int64_t lo, int64_t hi, uint64_t seed, DType dt = DType::s64);
// Output allocated like `like`'s device, with the given shape/dtype.
Tensor empty_on(const Tensor& like, const Shape& s, DType dt);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
// A gradient's tensor for a backward to write (empty_on), or, accumulating (Note
// [Gradient destinations]), to add into: then holding values of its own (from seed).
Tensor gradient_start(const Tensor& like, const Shape& s, DType dt, bool accumulate, uint64_t seed);

// Largest violation of |a - b| <= atol + rtol |b| (as a ratio; <= 1 passes) and a
// message describing the worst element.
struct Compare {
  double worst_ratio = 0;
  std::string detail;
};
Compare compare(const Tensor& got, const Tensor& ref, const Tolerance& tol);

}  // namespace eg::testing
