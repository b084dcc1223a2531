// Every op, declared once. An op is a function signature plus up to three
// implementations: `ref` (plain loops, f32 and f64: the ground truth; bf16 where an op
// says so), `cpu` (the fast CPU path: oneDNN, Eigen or vectorised OpenMP loops; f32, and
// bf16 where the op takes it) and `cuda` (cuDNN, cuBLAS or
// our kernels; f32). kernels/registry.cpp is the only place that wires them.
//
// Kernel contract: outputs are allocated by the caller with the right shape and dtype;
// a kernel writes them (overwrites, never accumulates, unless the op says so), runs on
// the context's stream, does not allocate tensors and does not synchronise. An output
// or optional input passed as an undefined Tensor is skipped / absent: a backward given
// an undefined dx does not compute dx (that is how a frozen conv skips its
// weight-gradient kernel). Shapes are validated by the autograd layer, not here.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace eg::ops {

enum class Backend : uint8_t { ref = 0, cpu = 1, cuda = 2 };
const char* backend_name(Backend b);

// ---------------------------------------------------------------- parameters
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
};
// x [N, C, H, W], w [K, C/groups, R, S] -> [N, K, P, Q]
Shape conv2d_out_shape(const Shape& x, const Shape& w, const Conv2dParams& p);

enum class PoolKind : uint8_t { max, avg };
struct Pool2dParams {
  PoolKind kind = PoolKind::max;
  int64_t kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
  bool count_include_pad = false;  // avg only
};
Shape pool2d_out_shape(const Shape& x, const Pool2dParams& p);

enum class Act : uint8_t { relu, relu6, gelu };  // gelu: exact erf form, as PyTorch's default
// The activation a batch norm runs in its own pass (conv -> BN -> activation is ResNet's
// and MobileNetV2's building block): none, max(v, 0), or ReLU6's clamp to [0, 6] (as
// Act::relu6: a NaN stays NaN).
enum class BnAct : uint8_t { none, relu, relu6 };
// A fused activation's own elementwise op (for relu or relu6).
inline Act unfused(BnAct a) { return a == BnAct::relu6 ? Act::relu6 : Act::relu; }
enum class Binary : uint8_t { add, sub, mul, div };

struct CrossEntropyParams {
  double label_smoothing = 0.0;
  int64_t ignore_index = -100;
};

struct AttentionParams {
  bool causal = false;
  double scale = 0.0;  // 0: 1/sqrt(head_dim)
};

struct SgdParams {
  double lr = 0.1, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // momentum buffer is initialised to the gradient, as PyTorch does
};
struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  int64_t step = 1;  // 1-based, for bias correction
};

// Note [bf16 kernels]
// Mixed precision (--precision bf16) runs convolutions with bf16 activations and
// weights, accumulating in f32, as PyTorch's autocast does. An op that takes bf16 says so
// in its signature's comment; its ref implementation widens the bf16 inputs exactly to
// f64, computes as for f64 and rounds each output once to its own dtype (so a bf16 output
// is the f32 result rounded to nearest even, as oneDNN and cuDNN round their f32
// accumulators); the op is marked bf16 in kernels/registry.cpp, and its cpu and cuda
// implementations then take bf16 too (the cpu one on the fast path when the key tensor
// is bf16; the cuda one in f32 arithmetic, Note [16-bit CUDA kernels]).
// Elementwise ops, batch norm and activations read bf16 and compute in f32; gemm and
// linear take bf16 operands with f32 accumulation (linear's bias, dw and db f32); swap12
// moves bytes of any dtype; dropout scales bf16 as it does f32, with the same mask.
// Parity cases in bf16 allow one bf16 rounding (kBf16Eps, tests/op_cases.h) beyond the
// f32 case's tolerance; gradcheck stays in f64.

// ---------------------------------------------------------------- signatures
// Convolution. bias / db may be undefined. bf16 (Note [bf16 kernels]): x, w and dy bf16
// together; y and dx bf16 or f32; dw f32 (the f32 gradient autocast keeps) or bf16; bias
// and db f32.
// accumulate: the backward adds its result into dx (dw and db) instead of overwriting
// them, for a gradient summed where it lives (Note [Gradient destinations] in
// autograd/node.h). ref and cpu compute the result and add it (the bits of a separate
// add; Note [Computed, then added]); cuda has cuDNN blend it in (beta = 1: one rounding
// of the sum instead of two).
using Conv2dFwd = void(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const Conv2dParams& p);
using Conv2dBwdData = void(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p, bool accumulate);
using Conv2dBwdWeight = void(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const Conv2dParams& p,
                             bool accumulate);

// Batch norm over (N, H, W) per channel C of x [N, C, H, W]. Training forward writes
// save_mean and save_invstd [C] (biased variance) and, when running_mean/var are
// defined, updates them in place: r = (1 - momentum) r + momentum * batch (unbiased var).
// act: y = act(batch_norm(x)) in the same pass (fusing saves a pass over the activation
// each way, and the backward keeps one activation instead of two).
// residual (undefined: none), shaped like x: y = act(batch_norm(x) + residual), the end
// of a residual block in one pass instead of three.
using BatchNormFwdTrain = void(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                               Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum,
                               double eps, BnAct act, const Tensor& residual);
using BatchNormFwdInfer = void(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, Tensor& y, double eps, BnAct act, const Tensor& residual);
// training=true: batch statistics (mean/invstd are the saved ones, dx includes the
// statistics' gradient). training=false: mean/invstd are constants (from running stats).
// act, act_y: the forward's activation and its output y (undefined when act is none):
// the gradient flows back only where act_y > 0 (and, for relu6, act_y < 6), which is
// where the activation's input was inside (0, 6): act(v) takes both ends exactly.
// dresidual (undefined: not wanted): the gradient of the forward's residual, i.e. that
// masked dy. accumulate: dgamma and dbeta are added into (a parameter's .grad where it
// lives, as the convolutions' accumulate; dx and dresidual are written).
using BatchNormBwd = void(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, BnAct act,
                          const Tensor& act_y, Tensor& dresidual, bool accumulate);

// Activations, elementwise. Backward reads the forward input x.
using ActFwd = void(Act act, const Tensor& x, Tensor& y);
using ActBwd = void(Act act, const Tensor& dy, const Tensor& x, Tensor& dx);

// Pooling. Max pooling writes argmax indices (s32, flat index h*W+w within the input
// plane) to `indices`; avg pooling leaves it undefined. bf16 (Note [bf16 kernels]): x and
// y (dy and dx) of one dtype, as PyTorch pools under autocast; on CUDA NHWC x gives NHWC
// y and indices.
using Pool2dFwd = void(const Tensor& x, Tensor& y, Tensor& indices, const Pool2dParams& p);
using Pool2dBwd = void(const Tensor& dy, const Tensor& indices, Tensor& dx, const Pool2dParams& p);
// Global average pooling x [N, C, H, W] -> y [N, C].
using GlobalAvgPoolFwd = void(const Tensor& x, Tensor& y);
using GlobalAvgPoolBwd = void(const Tensor& dy, Tensor& dx);

// c = alpha * op(a) @ op(b) + beta * c; a, b, c 2-D, or 3-D with the same batch size
// (batched matmul). op(t) = t^T over the last two dims when trans is set.
using Gemm = void(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, double alpha, double beta);
// Linear: x [M, K], w [N, K], bias [N] (may be undefined) -> y [M, N] = x w^T + b.
// accumulate_dx: dx is added into; accumulate: dw and db are, as the convolutions'.
using LinearFwd = void(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y);
using LinearBwd = void(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                       bool accumulate_dx, bool accumulate);

// Elementwise with numpy broadcasting of a and b to c's shape (same rank after
// left-padding with 1s).
using BinaryFwd = void(Binary op, const Tensor& a, const Tensor& b, Tensor& c);
using Scale = void(const Tensor& x, Tensor& y, double alpha);  // y = alpha * x (y may be x)
// y += alpha * x, same shapes (gradient accumulation).
using Axpy = void(const Tensor& x, Tensor& y, double alpha);
// y = sum of x over the dims where y has size 1 (y has x's rank): sum/mean and the
// backward of broadcasting. broadcast_to is its adjoint: y[i] = x[broadcast index].
using SumTo = void(const Tensor& x, Tensor& y);
using BroadcastTo = void(const Tensor& x, Tensor& y);

// Softmax / log-softmax over the last dim.
using SoftmaxFwd = void(const Tensor& x, Tensor& y, bool log);
using SoftmaxBwd = void(const Tensor& dy, const Tensor& y, Tensor& dx, bool log);

// Cross-entropy, mean over non-ignored rows: logits [N, C], target s64 [N].
// loss [1]; lse [N] saved log-sum-exp. Backward scales by dloss [1].
using CrossEntropyFwd = void(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& lse,
                             const CrossEntropyParams& p);
using CrossEntropyBwd = void(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse,
                             Tensor& dlogits, const CrossEntropyParams& p);

// Layer norm over the last dim D: x [M, D], gamma/beta [D]; mean/rstd [M] saved.
using LayerNormFwd = void(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& mean,
                          Tensor& rstd, double eps);
// accumulate: dgamma and dbeta are added into (dx is written).
using LayerNormBwd = void(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                          const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate);

// Embedding: ids s64 [...], table [V, D] -> y [..., D]. Backward overwrites dtable
// with the scattered sum (accumulate: adds it). Out-of-range ids are the caller's to check.
using EmbeddingFwd = void(const Tensor& ids, const Tensor& table, Tensor& y);
using EmbeddingBwd = void(const Tensor& dy, const Tensor& ids, Tensor& dtable, bool accumulate);
// Token mask: mask (u8, ids' shape) is 1 where (ids (s64) == value) == equal, else 0: the
// Transformer's padding mask (equal) and its real tokens (not equal), made where the ids
// are (no host round trip on a GPU).
using TokenMask = void(const Tensor& ids, Tensor& mask, int64_t value, bool equal);

// Dropout: element i is kept when philox_uniform(seed, base + offset, i) >= p, and scaled
// by 1/(1-p), where {seed, base} = rng (s64 [2] on x's device, read there: Note [Random
// state on the device] in core/rng.h) and `offset` counts from the base. mask (u8)
// records kept elements. Same mask on every device. bf16 (Note [bf16 kernels]): x, y
// (dy, dx) bf16 together.
using DropoutFwd = void(const Tensor& x, Tensor& y, Tensor& mask, double p, const Tensor& rng, uint64_t offset);
using DropoutBwd = void(const Tensor& dy, const Tensor& mask, Tensor& dx, double p);

// Scaled dot-product attention: q [B, H, T, D], k/v [B, H, S, D] -> out [B, H, T, D];
// key_padding_mask u8 [B, S] (1 = padding, masked out; may be undefined); lse [B, H, T]
// saved. A fully masked row yields zeros.
using AttentionFwd = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                          Tensor& out, Tensor& lse, const AttentionParams& p);
using AttentionBwd = void(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& key_padding_mask, const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk,
                          Tensor& dv, const AttentionParams& p);

// Fused optimizer updates over flat tensors (a gradient bucket or one parameter).
// SGD, PyTorch semantics: g += wd p; buf = first ? g : momentum buf + (1-dampening) g;
// g = nesterov ? g + momentum buf : buf; p -= lr g.
using SgdStep = void(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p);
// AdamW (decoupled weight decay): p -= lr wd p; m, v moments; bias-corrected step.
using AdamWStep = void(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p);

// Their multi-tensor forms (PyTorch's foreach/fused optimizers): every member i of
// params is updated with grads[i] and its state as the ops above update one parameter,
// with one launch per up to 32 members on CUDA, the learning rate read from `lr` (f64 [1]
// on the parameters' device; p.lr is not read), so their launches carry no value the
// schedule changes (Note [Op records]). sgd: no member is on its first step (those take
// sgd_step); bufs undefined without momentum. adamw: steps[i] is member i's count of
// steps taken, f64 [1] on the device, which the op advances by one and bias-corrects
// with (PyTorch's capturable AdamW; p.step is not read). `skip_if` (f32 [1] on the device,
// loss scaling's found-inf flag; undefined: none): where it is set, nothing is written
// (no update, no count advanced), as GradScaler skips optimizer.step(). f32 (f64 on ref).
using SgdStepMulti = void(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          std::vector<Tensor>& bufs, const SgdParams& p, const Tensor& skip_if);
using AdamWStepMulti = void(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                            std::vector<Tensor>& m, std::vector<Tensor>& v, std::vector<Tensor>& steps,
                            const AdamWParams& p, const Tensor& skip_if);

// Sum of squares of x into out [1] (f32 or f64 accumulator; for gradient clipping).
using SumSquares = void(const Tensor& x, Tensor& out);
// Gradient clipping without a host read (Note [Deferred reads] in core/deferred_read.h):
// from the buckets' sums of squares (f32 [k]) into out (f64 [2]): the norm, the square
// root of their sum taken in f64 in order, and the coefficient max_norm / (norm + 1e-6)
// where the norm is finite and above max_norm, else 1 (Optimizer::clip_grad_norm's).
using ClipCoef = void(const Tensor& sums, Tensor& out, double max_norm);
// y = x times the one element of coef (f64, on x's device), rounded to f32 as scale rounds
// its alpha. x, y f32 (f64 on ref).
using ScaleBy = void(const Tensor& x, Tensor& y, const Tensor& coef);
// Loss scaling's unscale (optim/loss_scaler.h), torch's
// _amp_foreach_non_finite_check_and_unscale_: grad *= 1 / scale in place (the scale, f64
// [1] on grad's device, read there; a power of two, so exact in f32), and found_inf (f32
// [1]) set to 1 when an element of grad is inf or NaN, else left as it is, so one flag
// gathers every bucket's. grad f32 (f64 on ref).
using AmpUnscale = void(Tensor& grad, Tensor& found_inf, const Tensor& scale);
// Its scale's update, torch's _amp_update_scale_, on the device: state (f64 [3]) = {scale,
// clean steps in a row, skipped steps}; with found_inf set the scale halves, the count
// restarts and a skip is counted, else the count grows and at growth_interval the scale
// doubles and the count restarts.
using AmpUpdateScale = void(Tensor& state, const Tensor& found_inf, int64_t growth_interval);
// Layout: x [A, B, C, D] -> y [A, C, B, D] (splitting heads out of [B, T, H, Dh] and
// back). Its own adjoint: the backward is the same op on the gradient.
using Swap12 = void(const Tensor& x, Tensor& y);
// Similarity-preserving (SP) loss pieces (Tung & Mori 2019; Egeria's plasticity):
// x [B, F] (an activation flattened per sample) -> g [B, B] = X X^T with every row
// divided by its L2 norm (max(norm, 1e-12)). sp_loss: out [1] = ||ga - gb||_F^2 / B^2.
// No backward: plasticity is a measurement, not a training loss.
using SpGram = void(const Tensor& x, Tensor& g);
using SpLoss = void(const Tensor& ga, const Tensor& gb, Tensor& out);
// Converting copy between dtypes (f32 <-> f64/bf16/f16, u8/s8 -> f32), same shape.
using Cast = void(const Tensor& x, Tensor& y);
// Images from 8-bit pixels: y [N, C, H, W] f32 = float(x) * scale[c] + zero[c] for x u8
// [N, C, H, W] and f32 scale, zero [C]: the loader's normalisation (scale = 1 / (255 std),
// zero = -mean / std), done where the batch is used, so a batch travels to a GPU as
// pixels, a quarter of its f32 bytes.
using ImageNormalize = void(const Tensor& x, const Tensor& scale, const Tensor& zero, Tensor& y);
// Index of the largest value of each row (last dim): x [..., C] (f32, f64 on ref) ->
// idx s64 [...]. The first maximum on ties, as torch.argmax; a NaN never wins (a row of
// NaNs gives 0). Classification accuracy and greedy decoding.
using ArgmaxRows = void(const Tensor& x, Tensor& idx);

// Note [Computed, then added]
// An op with an `accumulate` flag (the backwards above that take one) adds into its
// outputs where a backend can blend as it writes (cuDNN's and cuBLAS's beta = 1). ref and
// cpu cannot (oneDNN 2.6's backward primitives have no sum post-op), so they implement
// the op without its flags, always overwriting: the signatures below (ops::Overwriting).
// kernels/registry.cpp gives them the op's own signature, once for every such op: an
// accumulating call computes into new tensors, then adds each with the backend's axpy,
// the bits of a separate add.
using Conv2dBwdDataOverwrite = void(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p);
using Conv2dBwdWeightOverwrite = void(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const Conv2dParams& p);
using BatchNormBwdOverwrite = void(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                   const Tensor& invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training,
                                   BnAct act, const Tensor& act_y, Tensor& dresidual);
using LinearBwdOverwrite = void(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db);
using LayerNormBwdOverwrite = void(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                   const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
using EmbeddingBwdOverwrite = void(const Tensor& dy, const Tensor& ids, Tensor& dtable);
// For a backward that computes its result before adding it: a tensor shaped like `out`
// for the result; `out` itself when not accumulating (undefined stays undefined).
inline Tensor result_for(const Tensor& out, bool accumulate) {
  return accumulate && out.defined() ? Tensor::empty(out.shape(), out.dtype(), out.device()) : out;
}

// ---------------------------------------------------------------- registry
template <class Fn>
struct Op {
  const char* name;
  Fn* impl[3];
  // The cpu implementation reads and writes nChw16c tensors (Note [Blocked activations]).
  bool cpu_any_format = false;
  // The cuda implementation reads and writes NHWC tensors (Note [Channels-last
  // activations on CUDA] in core/tensor.h).
  bool cuda_any_format = false;
  // Every implementation also takes bf16 tensors (Note [bf16 kernels]; on CUDA f16 too,
  // Note [16-bit CUDA kernels]); a bf16 tensor given to another op's CPU implementation
  // is an error, not a misread buffer.
  bool bf16 = false;
  // The cpu implementation also takes NHWC tensors as they come (the int8 reference's,
  // Note [int8 convolution pipeline] in quant/int8.cpp); the other cpu_any_format ops get
  // plain copies of them.
  bool cpu_nhwc = false;
  bool has(Backend b) const { return impl[int(b)] != nullptr; }
};

#define EG_OP_LIST(X)                                                                                                  \
  X(conv2d_fwd, Conv2dFwd)                                                                                             \
  X(conv2d_bwd_data, Conv2dBwdData)                                                                                    \
  X(conv2d_bwd_weight, Conv2dBwdWeight)                                                                                \
  X(batchnorm_fwd_train, BatchNormFwdTrain)                                                                            \
  X(batchnorm_fwd_infer, BatchNormFwdInfer)                                                                            \
  X(batchnorm_bwd, BatchNormBwd) X(act_fwd, ActFwd) X(act_bwd, ActBwd) X(pool2d_fwd, Pool2dFwd)                        \
      X(pool2d_bwd, Pool2dBwd) X(global_avgpool_fwd, GlobalAvgPoolFwd) X(global_avgpool_bwd, GlobalAvgPoolBwd)         \
          X(gemm, Gemm) X(linear_fwd, LinearFwd) X(linear_bwd, LinearBwd) X(binary_fwd, BinaryFwd) X(scale, Scale)     \
              X(axpy, Axpy) X(sum_to, SumTo) X(broadcast_to, BroadcastTo) X(softmax_fwd, SoftmaxFwd)                   \
                  X(softmax_bwd, SoftmaxBwd) X(cross_entropy_fwd, CrossEntropyFwd)                                     \
                      X(cross_entropy_bwd, CrossEntropyBwd) X(layernorm_fwd, LayerNormFwd)                             \
                          X(layernorm_bwd, LayerNormBwd) X(embedding_fwd, EmbeddingFwd) X(embedding_bwd, EmbeddingBwd) \
                              X(token_mask, TokenMask) X(dropout_fwd, DropoutFwd) X(dropout_bwd, DropoutBwd)           \
                                  X(attention_fwd, AttentionFwd) X(attention_bwd, AttentionBwd) X(sgd_step, SgdStep)   \
                                      X(adamw_step, AdamWStep) X(sgd_step_multi, SgdStepMulti)                         \
                                          X(adamw_step_multi, AdamWStepMulti) X(sum_squares, SumSquares)               \
                                              X(amp_unscale, AmpUnscale) X(amp_update_scale, AmpUpdateScale)          \
                                          X(clip_coef, ClipCoef) X(scale_by, ScaleBy)                                  \
                                          X(cast, Cast) X(image_normalize, ImageNormalize) X(swap12, Swap12)           \
                                              X(sp_gram, SpGram) X(sp_loss, SpLoss) X(argmax_rows, ArgmaxRows)

// Each op as a type, tag::name (two ops can share a signature), and the signature of its
// ref and cpu implementations: Overwriting<tag::name> (Note [Computed, then added]).
namespace tag {
#define EG_OP_TAG(name, Fn) \
  struct name {             \
    using fn = Fn;          \
  };
EG_OP_LIST(EG_OP_TAG)
#undef EG_OP_TAG
}  // namespace tag
namespace detail {
template <class Tag>
struct OverwritingOf {
  using type = typename Tag::fn;  // an op without an accumulate flag: its own signature
};
#define EG_OVERWRITING(name, Fn)    \
  template <>                       \
  struct OverwritingOf<tag::name> { \
    using type = Fn;                \
  };
EG_OVERWRITING(conv2d_bwd_data, Conv2dBwdDataOverwrite)
EG_OVERWRITING(conv2d_bwd_weight, Conv2dBwdWeightOverwrite)
EG_OVERWRITING(batchnorm_bwd, BatchNormBwdOverwrite)
EG_OVERWRITING(linear_bwd, LinearBwdOverwrite)
EG_OVERWRITING(layernorm_bwd, LayerNormBwdOverwrite)
EG_OVERWRITING(embedding_bwd, EmbeddingBwdOverwrite)
#undef EG_OVERWRITING
}  // namespace detail
template <class Tag>
using Overwriting = typename detail::OverwritingOf<Tag>::type;

#define EG_DECLARE_OP(name, Fn) extern const Op<Fn> name;
EG_OP_LIST(EG_DECLARE_OP)
#undef EG_DECLARE_OP

// The backend an op runs on for this tensor: cuda for CUDA tensors; on the CPU the
// fast path when registered and the tensor is f32 (or bf16, where the op takes bf16),
// else ref.
// Override for tests with force_backend (thread-local; Backend::ref forces the reference
// everywhere on CPU).
Backend pick_backend(bool has_cpu, const Tensor& key, bool bf16 = false);
void set_forced_cpu_backend(int b);  // -1: none
int forced_cpu_backend();

namespace detail {
// Arguments for an implementation that only knows plain tensors: blocked inputs become
// plain copies; a blocked output or in-out tensor is a bug in the kernel that chose it.
inline bool blocked(const Tensor& t) { return t.is_blocked(); }
template <class T>
bool blocked(const T&) {
  return false;
}
inline bool nhwc(const Tensor& t) { return t.defined() && t.format() == Format::nhwc; }
template <class T>
bool nhwc(const T&) {
  return false;
}
inline bool is_bf16(const Tensor& t) { return t.defined() && t.dtype() == DType::bf16; }
template <class T>
bool is_bf16(const T&) {
  return false;
}
inline Tensor plain_arg(const Tensor& t) { return t.to_plain(); }
inline Tensor plain_arg(Tensor&& t) { return t.to_plain(); }
inline Tensor plain_arg(const Tensor&& t) { return t.to_plain(); }  // else the template below wins
Tensor& plain_arg(Tensor& t);
template <class T>
T&& plain_arg(T&& x) {
  return std::forward<T>(x);
}

template <class T, class... R>
const Tensor& first_tensor(const T& t, const R&... r) {
  if constexpr (std::is_same_v<std::decay_t<T>, Tensor>) {
    return t;
  } else {
    static_assert(sizeof...(R) > 0, "op called without a tensor argument");
    return first_tensor(r...);
  }
}
}  // namespace detail

// Note [Op records]
// A CUDA graph replays the kernels a step launched when it was captured, with the
// arguments they had then: a step can be captured only if every steady-state step runs
// the same ops on the same shapes, dtypes and layouts, with no host read and no new
// allocation from the system inside it. An OpRecorder lists the ops its thread runs while
// it lives: op, backend, and each argument (a tensor as Tensor::str() gives it, "-" when
// undefined; a number as written; a list element by element; the optimizers' parameter
// structs field by field, record_str; other parameter structs, a layer's fixed
// configuration, as "{}"), so a test holds a step's list identical between steps without
// a GPU (tests/test_host_syncs.cpp).
struct OpRecord {
  std::string op;
  Backend backend = Backend::ref;
  std::vector<std::string> args;
  bool operator==(const OpRecord& o) const { return op == o.op && backend == o.backend && args == o.args; }
  bool operator!=(const OpRecord& o) const { return !(*this == o); }
  std::string str() const;  // "conv2d_fwd on cpu(f32[8, 3, 32, 32] on cpu, ...)"
};
class OpRecorder {
 public:
  OpRecorder();  // records this thread's ops until destroyed (an inner recorder takes them meanwhile)
  ~OpRecorder();
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;
  const std::vector<OpRecord>& records() const { return records_; }
  void add(OpRecord r) { records_.push_back(std::move(r)); }

 private:
  std::vector<OpRecord> records_;
  OpRecorder* prev_ = nullptr;
};

// Note [Op profiles]
// Where a step's time goes on the CPU. An OpProfiler, while it lives, sums the wall time
// of each op its thread runs, by op and backend, and counts the layout conversions made
// meanwhile (LayoutConversions in core/tensor.h: the plain copies ops::run hands an op
// that does not take a layout, a kernel's in_format, a reorder before a global pool).
// Only top-level ops are timed: an op whose implementation calls others counts them in
// its own time, so the ops' times add up to at most the step's, and what the step took
// beyond them is the host's own (autograd, allocation, the loop). Conversions happen
// inside ops or between them, so they are a share of that total, not an addition to it.
// On the CPU kernels run as they are issued, so an op's wall time is its cost; on a GPU
// it would be its launch's (bench step refuses --profile there). Without a profiler an
// op pays one thread-local read.
struct OpTime {
  std::string op;
  Backend backend = Backend::ref;
  int64_t calls = 0;
  double seconds = 0;
};
class OpProfiler {
 public:
  OpProfiler();  // profiles this thread's ops until destroyed (an inner profiler takes them meanwhile)
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  std::vector<OpTime> times() const;  // the slowest first
  const LayoutConversions& conversions() const { return conversions_; }
  void add(const char* op, Backend b, double seconds);
  int depth = 0;  // ops::run's nesting: only depth 0 is timed

 private:
  std::vector<OpTime> times_;
  LayoutConversions conversions_;
  OpProfiler* prev_ = nullptr;
  LayoutConversions* prev_conversions_ = nullptr;
};

// The optimizer parameters' fields, as records show them (the values a schedule changes
// between steps live there).
std::string record_str(const SgdParams& p);
std::string record_str(const AdamWParams& p);

namespace detail {
OpRecorder* current_recorder();  // this thread's, or nullptr
OpProfiler* current_profiler();  // this thread's, or nullptr

// Times the op it lives through where a profiler listens (Note [Op profiles]).
class OpTimer {
 public:
  OpTimer(const char* op, Backend b) : p_(current_profiler()), op_(op), b_(b) {
    if (p_ && p_->depth++ == 0) t0_ = std::chrono::steady_clock::now(), timing_ = true;
  }
  ~OpTimer() {
    if (!p_) return;
    --p_->depth;
    if (timing_) p_->add(op_, b_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpProfiler* p_;
  const char* op_;
  Backend b_;
  bool timing_ = false;
  std::chrono::steady_clock::time_point t0_;
};
std::string number_str(double v);  // every digit it takes to tell two values apart
template <class T, class = void>
struct has_record_str : std::false_type {};
template <class T>
struct has_record_str<T, std::void_t<decltype(record_str(std::declval<const T&>()))>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
std::string describe(const T& x) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Tensor>) {
    return x.defined() ? x.str() : "-";
  } else if constexpr (std::is_arithmetic_v<D> || std::is_enum_v<D>) {
    return number_str(static_cast<double>(x));
  } else if constexpr (is_vector<D>::value) {
    std::string s = "[";
    for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + describe(x[i]);
    return s + "]";
  } else if constexpr (has_record_str<D>::value) {
    return record_str(x);
  } else {
    return "{}";
  }
}
}  // namespace detail

// Runs one implementation explicitly (tests, benchmarks).
template <class Fn, class... A>
void run(const Op<Fn>& op, Backend b, A&&... a) {
  EG_CHECK(op.has(b), "op ", op.name, " has no ", backend_name(b), " implementation");
  if (OpRecorder* r = detail::current_recorder()) r->add({op.name, b, {detail::describe(a)...}});
  EG_CHECK(op.bf16 || b == Backend::cuda || !(detail::is_bf16(a) || ...), "op ", op.name,
           " has no bf16 implementation on the CPU (Note [bf16 kernels])");
  const detail::OpTimer timer(op.name, b);
  if ((b == Backend::cpu && op.cpu_any_format && (op.cpu_nhwc || !(detail::nhwc(a) || ...))) ||
      (b == Backend::cuda && op.cuda_any_format) || !(detail::blocked(a) || ...))
    op.impl[int(b)](std::forward<A>(a)...);
  else op.impl[int(b)](detail::plain_arg(std::forward<A>(a))...);
}

// Runs the op on the backend chosen for its first tensor argument.
template <class Fn, class... A>
void call(const Op<Fn>& op, A&&... a) {
  const Tensor& key = detail::first_tensor(a...);
  run(op, pick_backend(op.has(Backend::cpu), key, op.bf16), std::forward<A>(a)...);
}

}  // namespace eg::ops
