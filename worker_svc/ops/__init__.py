"""The operators the model modules call: plain torch or Triton kernels, the FP8 linear layer and its GEMM."""
