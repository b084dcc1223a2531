// GEMM and linear layers on CUDA through cuBLAS, f32 (exact FP32 math unless
// eg::set_allow_tf32(true)), or 16-bit: a and b both bf16 or both f16 (mixed precision's
// operands; f16 also the fp16 reference model's) with an output of their dtype or f32,
// accumulated in f32 on tensor cores (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F).
// Linear's bias and bias gradient are f32 beside 16-bit activations (Note [bf16
// kernels] in kernels/ops.h), its weight gradient f32 (autocast's master weights); a
// biased 16-bit output is computed in f32 and rounded once (Note [One rounding with a
// bias] in conv2d.cu).
// Row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T, so
// the operands are passed swapped with their own leading dimensions.
// Napkin math: 4096x512x2048 is 8.6 GFLOP -> ~0.2 ms at ~50 TFLOP/s FP32 (H100).
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

namespace {
__global__ void add_bias_kernel(float* y, const float* b, int64_t m, int64_t n) {
  EG_CUDA_LOOP(i, m * n) y[i] += b[i % n];
}
// The bias gradient's term (Note [Column sums]): dy of row r, column j.
struct BiasTerm {
  const void* dy;
  int t;
  int64_t n;
  __device__ void operator()(int64_t r, int64_t j, float (&acc)[1]) const { acc[0] += ld(dy, t, r * n + j); }
};
cudaDataType_t cublas_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool ta, bool tb, double alpha, double beta) {
  const DType t = a.dtype();
  const bool half = t == DType::f16 || t == DType::bf16;
  if (half)
    EG_CHECK(b.dtype() == t && (c.dtype() == DType::f32 || c.dtype() == t), "gemm on CUDA: operands of one dtype ",
             "(f32, bf16 or f16) and an output of theirs or f32, got ", dtype_name(t), " and ", dtype_name(b.dtype()),
             " into ", dtype_name(c.dtype()));
  else
    EG_CHECK(t == DType::f32 && b.dtype() == DType::f32 && c.dtype() == DType::f32, "gemm on CUDA: operands of one ",
             "dtype (f32, bf16 or f16) and an output of theirs or f32, got ", dtype_name(t), " and ",
             dtype_name(b.dtype()), " into ", dtype_name(c.dtype()));
  const int r = a.dim();
  const int64_t batch = r == 3 ? a.size(0) : 1;
  const int64_t m = c.size(r - 2), n = c.size(r - 1), k = ta ? a.size(r - 2) : a.size(r - 1);
  const int64_t lda = a.size(r - 1), ldb = b.size(r - 1), ldc = n;
  const float al = float(alpha), be = float(beta);
  cublasHandle_t h = cuda::cublas_handle();
  EG_CUBLAS_CHECK(cublasSetMathMode(h, allow_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum: C = beta C (beta 0 overwrites even NaN)
    if (beta == 0) EG_CUDA_CHECK(cudaMemsetAsync(c.raw(), 0, c.nbytes(), stream()));
    else scale(c, c, beta);
    return;
  }
  if (half) {
    EG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &al, b.raw(),
        cublas_type(t), int(ldb), b.numel() / batch, a.raw(), cublas_type(t), int(lda), a.numel() / batch, &be, c.raw(),
        cublas_type(c.dtype()), int(ldc), c.numel() / batch, int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  EG_CUBLAS_CHECK(cublasSgemmStridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(n),
                                            int(m), int(k), &al, b.data<float>(), int(ldb), b.numel() / batch,
                                            a.data<float>(), int(lda), a.numel() / batch, &be, c.data<float>(),
                                            int(ldc), c.numel() / batch, int(batch)));
}

void linear_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  EG_CHECK(!bias.defined() || bias.dtype() == DType::f32, "linear on CUDA: the bias is f32 (beside 16-bit ",
           "activations too), got ", dtype_name(bias.dtype()));
  if (bias.defined() && y.dtype() != DType::f32) {  // Note [One rounding with a bias]
    Tensor y32 = Tensor::empty(y.shape(), DType::f32, y.device());
    linear_fwd(x, w, bias, y32);
    return cast(y32, y);
  }
  gemm(x, w, y, false, true, 1.0, 0.0);
  if (bias.defined() && y.numel()) {
    add_bias_kernel<<<blocks_for(y.numel()), kThreads, 0, stream()>>>(y.data<float>(), bias.data<float>(), y.size(0),
                                                                      y.size(1));
    cuda::after_launch("linear bias");
  }
}

void linear_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                bool accumulate_dx, bool accumulate) {
  if (dx.defined()) gemm(dy, w, dx, false, false, 1.0, accumulate_dx ? 1.0 : 0.0);
  if (dw.defined()) gemm(dy, x, dw, true, false, 1.0, accumulate ? 1.0 : 0.0);  // beta = 1 adds into dw
  if (db.defined() && db.numel()) {
    require_f32(db, "linear's bias gradient");
    column_sums<1>(dy.size(0), dy.size(1), BiasTerm{dy.raw(), dt_code(dy, "linear backward"), dy.size(1)},
                   ColumnOuts<1>{{db.data<float>()}, accumulate}, dy.device());
    cuda::after_launch("linear bias gradient");
  }
}

}  // namespace eg::cudak
