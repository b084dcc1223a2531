// What conv2d.cu and batchnorm.cu share: cuDNN tensor descriptors (NCHW or NHWC, of f32,
// bf16 or f16 data).
#pragma once
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

inline cudnnDataType_t cudnn_type(DType t) {
  EG_CHECK(t == DType::f32 || t == DType::f16 || t == DType::bf16, "internal: cuDNN descriptor for ", dtype_name(t));
  return t == DType::f16 ? CUDNN_DATA_HALF : t == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  explicit TensorDesc(const Shape& s, DType t = DType::f32, bool nhwc = false) {
    EG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    EG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, cudnn_type(t), int(s[0]),
                                              int(s[1]), int(s[2]), int(s[3])));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

}  // namespace eg::cudak
