// Elementwise and gather/scatter kernels: embeddings, GELU, residual, bias gradient, dtype
// conversions. Memory-bound; 16-byte vector accesses where the length and alignment allow.
#include <algorithm>

#include "common.cuh"

namespace ddiloco::gpu {
namespace {

using detail::Bf16x8;
using detail::load8;
using detail::store8;

constexpr int kThreads = 256;
constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluC = 0.044715f;

// ------------------------------------------------------------------ encoder
// One thread per (b,t,c). Scalar: C need not be a multiple of 8, and this is ~0.1 % of a step.
__global__ void encoder_forward_kernel(bf16* out, const int32_t* tokens, const bf16* wte,
                                       const bf16* wpe, int T, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t bt = i / C;
  const int c = static_cast<int>(i % C), t = static_cast<int>(bt % T);
  const int32_t tok = tokens[bt];
  out[i] = __float2bfloat16_rn(__bfloat162float(wte[static_cast<size_t>(tok) * C + c]) +
                               __bfloat162float(wpe[static_cast<size_t>(t) * C + c]));
}

__global__ void encoder_backward_kernel(float* dwte, float* dwpe, const bf16* dout,
                                        const int32_t* tokens, int T, int C, size_t n) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t bt = i / C;
  const int c = static_cast<int>(i % C), t = static_cast<int>(bt % T);
  const float d = __bfloat162float(dout[i]);
  atomicAdd(dwte + static_cast<size_t>(tokens[bt]) * C + c, d);
  atomicAdd(dwpe + static_cast<size_t>(t) * C + c, d);
}

// ------------------------------------------------------------------ GELU
// tanh(u) = 1 − 2/(e^{2u} + 1) with the fast exponential and division: two MUFU operations
// instead of tanhf's ~20-instruction accurate path, which made the GELU kernels compute
// bound (8 tanhf per 16-byte vector). Absolute error ≤ ~3e-6 (from __expf's relative error,
// which the 2/(e+1) factor only shrinks), far below the bf16 rounding of the stored results;
// saturates correctly (e^{2u} → inf gives 1, → 0 gives −1; __fdividef returns 0 for
// denominators ≥ 2^126) and propagates NaN.
__device__ __forceinline__ float tanh_fast(float u) {
  return 1.0f - __fdividef(2.0f, __expf(2.0f * u) + 1.0f);
}
__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanh_fast(kGeluK * (x + kGeluC * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanh_fast(kGeluK * (x + kGeluC * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

// n8 = number of 8-element groups; the tail (n % 8) is handled by the scalar kernel.
__global__ void gelu_forward_vec(bf16* out, const bf16* inp, size_t n8) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 x = load8(inp + 8 * i);
    Bf16x8 y;
#pragma unroll
    for (int k = 0; k < 8; ++k) y.v[k] = __float2bfloat16_rn(gelu(__bfloat162float(x.v[k])));
    store8(out + 8 * i, y);
  }
}
__global__ void gelu_forward_scalar(bf16* out, const bf16* inp, size_t begin, size_t n) {
  const size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(gelu(__bfloat162float(inp[i])));
}
__global__ void gelu_backward_vec(bf16* dinp, const bf16* inp, const bf16* dout, size_t n8) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 x = load8(inp + 8 * i), d = load8(dout + 8 * i);
    Bf16x8 y;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      y.v[k] = __float2bfloat16_rn(gelu_grad(__bfloat162float(x.v[k])) * __bfloat162float(d.v[k]));
    store8(dinp + 8 * i, y);
  }
}
__global__ void gelu_backward_scalar(bf16* dinp, const bf16* inp, const bf16* dout, size_t begin,
                                     size_t n) {
  const size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    dinp[i] = __float2bfloat16_rn(gelu_grad(__bfloat162float(inp[i])) * __bfloat162float(dout[i]));
}

// ------------------------------------------------------------------ residual
__global__ void residual_vec(bf16* out, const bf16* a, const bf16* b, size_t n8) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 x = load8(a + 8 * i), y = load8(b + 8 * i);
    Bf16x8 z;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      z.v[k] = __float2bfloat16_rn(__bfloat162float(x.v[k]) + __bfloat162float(y.v[k]));
    store8(out + 8 * i, z);
  }
}
__global__ void residual_scalar(bf16* out, const bf16* a, const bf16* b, size_t begin, size_t n) {
  const size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

// ------------------------------------------------------------------ bias gradient
// Block (32, 8): threadIdx.x picks one of 32 adjacent columns (coalesced 64-byte row reads),
// threadIdx.y strides over this block's rows; the 8 partial sums meet in shared memory and
// one fp32 atomic per column and block goes to global memory.
constexpr int kBiasRowsPerBlock = 256;
__global__ void bias_backward_kernel(float* dbias, const bf16* dout, int N, int OUT, int ld) {
  __shared__ float partial[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int row0 = blockIdx.y * kBiasRowsPerBlock;
  const int row1 = min(N, row0 + kBiasRowsPerBlock);
  float s = 0.0f;
  if (col < OUT)
    for (int r = row0 + threadIdx.y; r < row1; r += 8)
      s += __bfloat162float(dout[static_cast<size_t>(r) * ld + col]);
  partial[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < OUT) {
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) total += partial[k][threadIdx.x];
    atomicAdd(dbias + col, total);
  }
}

// The end of the (32, 8)-thread column-sum kernels below: thread (x, y) holds the partial
// sums s[0..8) of columns blockIdx.x·256 + x·8 + k over its rows; they meet in shared memory
// in a fixed order and one fp32 atomic per column and block goes to dbias (length OUT).
// Every thread of the block must call it (it synchronises the block).
__device__ __forceinline__ void flush_column_sums(const float (&s)[8], float* dbias, int OUT) {
  __shared__ float partial[8][32 * 8 + 1];
#pragma unroll
  for (int k = 0; k < 8; ++k) partial[threadIdx.y][threadIdx.x * 8 + k] = s[k];
  __syncthreads();
  // 256 threads, 256 columns of this block: thread j finishes column blockIdx.x·256 + j.
  const int j = threadIdx.y * 32 + threadIdx.x;
  const int c = blockIdx.x * 256 + j;
  if (c < OUT) {
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) total += partial[k][j];
    atomicAdd(dbias + c, total);
  }
}

// Vector variant (OUT % 8 == 0, ld % 8 == 0, dout 16-byte aligned): threadIdx.x picks one of
// 32 adjacent groups of 8 columns (each warp reads 512 contiguous bytes of a row with 16-byte
// loads, 8× fewer load instructions than the scalar kernel), threadIdx.y strides over the
// block's rows; flush_column_sums adds the partial sums up.
// rows_per_block (a multiple of 8) is chosen by the launcher so that the grid fills the GPU
// even when OUT is only a few blocks of 256 columns wide.
__global__ void bias_backward_vec_kernel(float* dbias, const bf16* dout, int N, int OUT, int ld,
                                         int rows_per_block) {
  const int col = (blockIdx.x * 32 + threadIdx.x) * 8;
  const int row0 = blockIdx.y * rows_per_block;
  const int row1 = min(N, row0 + rows_per_block);
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (col < OUT) {
#pragma unroll 4
    for (int r = row0 + threadIdx.y; r < row1; r += 8) {
      const Bf16x8 x = load8(dout + static_cast<size_t>(r) * ld + col);
#pragma unroll
      for (int k = 0; k < 8; ++k) s[k] += __bfloat162float(x.v[k]);
    }
  }
  flush_column_sums(s, dbias, OUT);
}

// GELU backward fused with the bias gradient of the Linear layer before it (the MLP's fc):
// dinp = bf16(gelu'(inp)·dout) as gelu_backward_vec, and dbias += column sums of those
// bf16-rounded values, exactly what bias_backward would read back — one pass over the
// (N,OUT) gradient instead of two. Same layout and reduction as bias_backward_vec_kernel
// (OUT % 8 == 0, rows of OUT elements, 16-byte aligned pointers; dinp may alias dout).
__global__ void gelu_backward_bias_kernel(bf16* dinp, float* dbias, const bf16* inp,
                                          const bf16* dout, int N, int OUT,
                                          int rows_per_block) {
  const int col = (blockIdx.x * 32 + threadIdx.x) * 8;
  const int row0 = blockIdx.y * rows_per_block;
  const int row1 = min(N, row0 + rows_per_block);
  float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (col < OUT) {
#pragma unroll 2
    for (int r = row0 + threadIdx.y; r < row1; r += 8) {
      const size_t off = static_cast<size_t>(r) * OUT + col;
      const Bf16x8 x = load8(inp + off), d = load8(dout + off);
      Bf16x8 y;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        y.v[k] = __float2bfloat16_rn(gelu_grad(__bfloat162float(x.v[k])) *
                                     __bfloat162float(d.v[k]));
        s[k] += __bfloat162float(y.v[k]);
      }
      store8(dinp + off, y);
    }
  }
  flush_column_sums(s, dbias, OUT);
}

// Grid of the (32, 8)-thread column-sum kernels above: OUT/256 column strips, rows split so
// that there are about 8 blocks per SM in all (grid_stride_blocks of an unbounded n gives
// SMs·8), at least 32 rows per block so the flush (one atomic per column and block) stays
// small. Sets rows_per_block.
dim3 column_sum_grid(int N, int OUT, int& rows_per_block) {
  const unsigned col_blocks = (OUT + 255) / 256;
  const unsigned target = detail::grid_stride_blocks(static_cast<size_t>(1) << 40, 1);
  const unsigned want_rows = (target + col_blocks - 1) / col_blocks;
  int rows = static_cast<int>((static_cast<unsigned>(N) + want_rows - 1) / want_rows);
  rows_per_block = std::max(32, (rows + 7) / 8 * 8);
  return dim3(col_blocks, static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block));
}

// ------------------------------------------------------------------ conversions
__global__ void fp32_to_bf16_kernel(bf16* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}
__global__ void bf16_to_fp32_kernel(float* dst, const bf16* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

// Vector body over the first n/8·8 elements when every pointer is 16-byte aligned, scalar
// kernel for the rest (or for everything when unaligned).
bool all_aligned(const void* a, const void* b, const void* c = nullptr) {
  return detail::aligned16(a) && detail::aligned16(b) && (c == nullptr || detail::aligned16(c));
}

}  // namespace

void encoder_forward(bf16* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B,
                     int T, int C, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  encoder_forward_kernel<<<detail::blocks_for(n, kThreads), kThreads, 0, stream>>>(
      out, tokens, wte, wpe, T, C, n);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const int32_t* tokens, int B,
                      int T, int C, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(B) * T * C;
  encoder_backward_kernel<<<detail::blocks_for(n, kThreads), kThreads, 0, stream>>>(
      dwte, dwpe, dout, tokens, T, C, n);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void gelu_forward(bf16* out, const bf16* inp, long n, cudaStream_t stream) {
  const size_t un = static_cast<size_t>(n);
  const size_t n8 = all_aligned(out, inp) ? un / 8 : 0;
  if (n8 > 0)
    gelu_forward_vec<<<detail::grid_stride_blocks(n8, kThreads), kThreads, 0, stream>>>(out, inp,
                                                                                       n8);
  if (8 * n8 < un)
    gelu_forward_scalar<<<detail::blocks_for(un - 8 * n8, kThreads), kThreads, 0, stream>>>(
        out, inp, 8 * n8, un);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, long n, cudaStream_t stream) {
  const size_t un = static_cast<size_t>(n);
  const size_t n8 = all_aligned(dinp, inp, dout) ? un / 8 : 0;
  if (n8 > 0)
    gelu_backward_vec<<<detail::grid_stride_blocks(n8, kThreads), kThreads, 0, stream>>>(
        dinp, inp, dout, n8);
  if (8 * n8 < un)
    gelu_backward_scalar<<<detail::blocks_for(un - 8 * n8, kThreads), kThreads, 0, stream>>>(
        dinp, inp, dout, 8 * n8, un);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream) {
  const size_t un = static_cast<size_t>(n);
  const size_t n8 = all_aligned(out, a, b) ? un / 8 : 0;
  if (n8 > 0)
    residual_vec<<<detail::grid_stride_blocks(n8, kThreads), kThreads, 0, stream>>>(out, a, b,
                                                                                   n8);
  if (8 * n8 < un)
    residual_scalar<<<detail::blocks_for(un - 8 * n8, kThreads), kThreads, 0, stream>>>(
        out, a, b, 8 * n8, un);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void bias_backward(float* dbias, const bf16* dout, int N, int OUT, int ld, cudaStream_t stream) {
  if (N <= 0 || OUT <= 0) return;
  const dim3 block(32, 8);
  if (OUT % 8 == 0 && ld % 8 == 0 && detail::aligned16(dout)) {
    int rows = 0;
    const dim3 grid = column_sum_grid(N, OUT, rows);
    bias_backward_vec_kernel<<<grid, block, 0, stream>>>(dbias, dout, N, OUT, ld, rows);
  } else {
    const dim3 grid((OUT + 31) / 32, (N + kBiasRowsPerBlock - 1) / kBiasRowsPerBlock);
    bias_backward_kernel<<<grid, block, 0, stream>>>(dbias, dout, N, OUT, ld);
  }
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void gelu_backward_bias(bf16* dinp, float* dbias, const bf16* inp, const bf16* dout, int N,
                        int OUT, cudaStream_t stream) {
  if (N <= 0 || OUT <= 0) return;
  if (OUT % 8 == 0 && all_aligned(dinp, inp, dout)) {
    int rows = 0;
    const dim3 grid = column_sum_grid(N, OUT, rows);
    gelu_backward_bias_kernel<<<grid, dim3(32, 8), 0, stream>>>(dinp, dbias, inp, dout, N, OUT,
                                                               rows);
    DDILOCO_CUDA_CHECK_LAUNCH();
  } else {
    gelu_backward(dinp, inp, dout, static_cast<long>(N) * OUT, stream);
    bias_backward(dbias, dinp, N, OUT, OUT, stream);
  }
}

void fp32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  fp32_to_bf16_kernel<<<detail::grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(dst, src,
                                                                                       n);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void bf16_to_fp32(float* dst, const bf16* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_fp32_kernel<<<detail::grid_stride_blocks(n, kThreads), kThreads, 0, stream>>>(dst, src,
                                                                                       n);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

}  // namespace ddiloco::gpu
