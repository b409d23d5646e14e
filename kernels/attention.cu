// Causal multi-head attention (layers::attention_forward/backward) as in llm.c's non-cuDNN
// path: head-major copies of Q, K, V, strided-batched cuBLAS GEMMs for Q·Kᵀ and P·V (bf16 in,
// fp32 accumulate), and our softmax kernels for the scaled, causally masked rows. The T×T
// products are split into ~4 causal blocks (CausalSplit): the staircase right of the block
// diagonal is never computed or touched, the rest (10/16 of T×T at 4 blocks, the masked part
// inside it zeroed by the softmax) runs as plain dense tensor-core GEMMs.
// The *_inplace launchers run the same split, GEMMs and softmax without the head-major
// copies: pointer-array batched GEMMs address the heads inside the (B,T,3C)/(B,T,C) rows.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "common.cuh"
#include "flash_attention.cuh"

namespace ddiloco::gpu {
namespace {

using detail::kWarp;
using detail::load_f;
using detail::store_f;

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;

// Head-major copies. Index i runs over (B,NH,T,hs/VW) groups of VW consecutive elements of
// one head's row (VW = 8: 16-byte moves when hs % 8 == 0, else VW = 1).
struct HeadIndex {
  size_t head;  // element offset in (B,NH,T,hs)
  size_t row;   // element offset of the same (b,t,h,d) in a (B,T,NH·hs) row-major tensor
};
template <int VW>
__device__ __forceinline__ HeadIndex head_index(size_t i, int T, int NH, int hs, size_t row_len) {
  const int groups = hs / VW;
  const int d = static_cast<int>(i % groups) * VW;
  const int t = static_cast<int>((i / groups) % T);
  const int h = static_cast<int>((i / (static_cast<size_t>(groups) * T)) % NH);
  const size_t b = i / (static_cast<size_t>(groups) * T * NH);
  return {((b * NH + h) * T + t) * hs + d, (b * T + t) * row_len + static_cast<size_t>(h) * hs + d};
}

template <int VW>
__device__ __forceinline__ void copy_vec(bf16* dst, const bf16* src) {
  if constexpr (VW == 8)
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  else
    *dst = *src;
}

// qkv (B,T,3,NH,hs) → q, k, v (B,NH,T,hs).
template <int VW>
__global__ void permute_qkv_kernel(bf16* q, bf16* k, bf16* v, const bf16* qkv, size_t n, int T,
                                   int NH, int hs) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t C = static_cast<size_t>(NH) * hs;
  const HeadIndex x = head_index<VW>(i, T, NH, hs, 3 * C);
  copy_vec<VW>(q + x.head, qkv + x.row);
  copy_vec<VW>(k + x.head, qkv + x.row + C);
  copy_vec<VW>(v + x.head, qkv + x.row + 2 * C);
}

// Inverse: dq, dk, dv (B,NH,T,hs) → dqkv (B,T,3C).
template <int VW>
__global__ void unpermute_qkv_kernel(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv,
                                     size_t n, int T, int NH, int hs) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t C = static_cast<size_t>(NH) * hs;
  const HeadIndex x = head_index<VW>(i, T, NH, hs, 3 * C);
  copy_vec<VW>(dqkv + x.row, dq + x.head);
  copy_vec<VW>(dqkv + x.row + C, dk + x.head);
  copy_vec<VW>(dqkv + x.row + 2 * C, dv + x.head);
}

// y (B,NH,T,hs) ↔ out (B,T,C): to_bt = true gathers heads into rows (forward output),
// false scatters rows into heads (the backward's dy).
template <int VW>
__global__ void heads_kernel(bf16* dst, const bf16* src, size_t n, int T, int NH, int hs,
                             bool to_bt) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const HeadIndex x = head_index<VW>(i, T, NH, hs, static_cast<size_t>(NH) * hs);
  if (to_bt)
    copy_vec<VW>(dst + x.row, src + x.head);
  else
    copy_vec<VW>(dst + x.head, src + x.row);
}

// Launches the three permutes for (B,T,C) activations and hs-wide heads, with VW = 8 when
// every row segment of `ptrs` (all the buffers involved) is 16-byte aligned.
struct Permute {
  bool vec;
  size_t n;
  unsigned grid;
  int T, NH, hs;
  cudaStream_t stream;
  Permute(int B, int T_, int C, int NH_, int hs_, std::initializer_list<const void*> ptrs,
          cudaStream_t stream_)
      : T(T_), NH(NH_), hs(hs_), stream(stream_) {
    vec = hs % 8 == 0;
    for (const void* p : ptrs) vec = vec && detail::aligned16(p);
    n = static_cast<size_t>(B) * T * C / (vec ? 8 : 1);
    grid = detail::blocks_for(n, kThreads);
  }
  // qkv (B,T,3C) → q, k, v (B,NH,T,hs).
  void split_qkv(bf16* q, bf16* k, bf16* v, const bf16* qkv) const {
    if (vec)
      permute_qkv_kernel<8><<<grid, kThreads, 0, stream>>>(q, k, v, qkv, n, T, NH, hs);
    else
      permute_qkv_kernel<1><<<grid, kThreads, 0, stream>>>(q, k, v, qkv, n, T, NH, hs);
    DDILOCO_CUDA_CHECK_LAUNCH();
  }
  // dq, dk, dv (B,NH,T,hs) → dqkv (B,T,3C).
  void join_qkv(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv) const {
    if (vec)
      unpermute_qkv_kernel<8><<<grid, kThreads, 0, stream>>>(dqkv, dq, dk, dv, n, T, NH, hs);
    else
      unpermute_qkv_kernel<1><<<grid, kThreads, 0, stream>>>(dqkv, dq, dk, dv, n, T, NH, hs);
    DDILOCO_CUDA_CHECK_LAUNCH();
  }
  // heads_kernel: to_bt = true (B,NH,T,hs) → (B,T,C), false the other way.
  void heads(bf16* dst, const bf16* src, bool to_bt) const {
    if (vec)
      heads_kernel<8><<<grid, kThreads, 0, stream>>>(dst, src, n, T, NH, hs, to_bt);
    else
      heads_kernel<1><<<grid, kThreads, 0, stream>>>(dst, src, n, T, NH, hs, to_bt);
    DDILOCO_CUDA_CHECK_LAUNCH();
  }
};

// One warp per row r of (B·NH·T, T); the row's query position is t = r % T and it sees
// columns 0..t. Online max/sum in one read, then one read + write of the whole row (zeros
// above the diagonal so P·V can use full rows). The online update is per chunk of VW
// elements, not per element: the chunk's max first (masked columns as −∞), then one rescale
// of the running sum and VW exponentials, so the loop has no data-dependent branch (the
// per-element `if (x > mx)` rescale diverged across lanes and cost up to two exponentials per
// element; 2.79 ms per step on the H200 for 603 MB per layer, ~2.6 TB/s).
// Row t ends at column causal_width(t, blk, last) (the causal split below never computes
// or reads the columns beyond): blk (a multiple of VW) is the split's block size, last the
// start of its last block; blk = 0: every row is written in full.
__device__ __forceinline__ int causal_width(int t, int T, int blk, int last) {
  return blk > 0 && t < last ? (t / blk + 1) * blk : T;
}

template <int VW>
__global__ void softmax_forward_kernel(bf16* att, int rows, int T, int blk, int last,
                                       float scale) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int t = row % T;
  bf16* p = att + static_cast<size_t>(row) * T;
  float buf[VW];
  float mx = -INFINITY, sum = 0.0f;
  for (int c = lane * VW; c <= t; c += kWarp * VW) {
    load_f<VW>(p + c, buf);
    float cm = -INFINITY;
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      buf[k] = c + k <= t ? buf[k] * scale : -INFINITY;
      cm = fmaxf(cm, buf[k]);
    }
    // Column c ≤ t is unmasked, so cm and nm are finite; exp(−∞) = 0 covers the first chunk
    // (mx = −∞, sum = 0) and the masked columns.
    const float nm = fmaxf(mx, cm);
    sum *= __expf(mx - nm);
#pragma unroll
    for (int k = 0; k < VW; ++k) sum += __expf(buf[k] - nm);
    mx = nm;
  }
  const float row_max = detail::warp_max(mx);
  sum = mx == -INFINITY ? 0.0f : sum * __expf(mx - row_max);
  const float inv = 1.0f / detail::warp_sum(sum);
  const int width = causal_width(t, T, blk, last);
  for (int c = lane * VW; c < width; c += kWarp * VW) {
    // Chunks wholly above the diagonal are written as zeros without being read.
    if (c <= t) load_f<VW>(p + c, buf);
#pragma unroll
    for (int k = 0; k < VW; ++k) buf[k] = c + k <= t ? __expf(buf[k] * scale - row_max) * inv : 0.0f;
    store_f<VW>(p + c, buf);
  }
}

// Rows of T ≤ 32·8·NCH columns (16-byte rows): the lane's NCH chunks of 8 are loaded into
// registers once (all loads issued before any arithmetic, so a warp has up to NCH 16-byte
// loads in flight instead of one per dependent online-softmax step), max and sum from the
// registers, then one write pass: one read and one write per element instead of two reads.
// Same values as softmax_forward_kernel: e = __expf(x·scale − row max), stored bf16(e·inv).
template <int NCH>
__global__ void softmax_forward_regs_kernel(bf16* att, int rows, int T, int blk, int last,
                                            float scale) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int t = row % T;
  bf16* p = att + static_cast<size_t>(row) * T;
  float buf[NCH][8];
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kWarp + lane) * 8;
    if (c <= t) load_f<8>(p + c, buf[j]);
  }
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kWarp + lane) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      // Chunks with c > t were not loaded: every one of their columns is masked here.
      buf[j][k] = c + k <= t ? buf[j][k] * scale : -INFINITY;
      mx = fmaxf(mx, buf[j][k]);
    }
  }
  const float row_max = detail::warp_max(mx);  // finite: column 0 ≤ t
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < NCH; ++j)
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      buf[j][k] = __expf(buf[j][k] - row_max);  // masked: exp(−∞) = 0
      sum += buf[j][k];
    }
  const float inv = 1.0f / detail::warp_sum(sum);
  const int width = causal_width(t, T, blk, last);
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kWarp + lane) * 8;
    if (c < width) {
#pragma unroll
      for (int k = 0; k < 8; ++k) buf[j][k] *= inv;  // masked entries are 0 already
      store_f<8>(p + c, buf[j]);
    }
  }
}
constexpr int kSoftmaxRegChunks = 4;  // rows up to 1024 columns

template <int VW>
__global__ void softmax_backward_kernel(bf16* datt, const bf16* att, int rows, int T, int blk,
                                        int last, float scale) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int t = row % T;
  const size_t off = static_cast<size_t>(row) * T;
  float pv[VW], dv[VW];
  float s = 0.0f;
  for (int c = lane * VW; c <= t; c += kWarp * VW) {
    load_f<VW>(att + off + c, pv);
    load_f<VW>(datt + off + c, dv);
#pragma unroll
    for (int k = 0; k < VW; ++k)
      if (c + k <= t) s += pv[k] * dv[k];
  }
  s = detail::warp_sum(s);
  const int width = causal_width(t, T, blk, last);  // as in the forward kernel
  for (int c = lane * VW; c < width; c += kWarp * VW) {
    if (c <= t) {  // above the diagonal: zeros, nothing to read
      load_f<VW>(att + off + c, pv);
      load_f<VW>(datt + off + c, dv);
    }
#pragma unroll
    for (int k = 0; k < VW; ++k) dv[k] = c + k <= t ? scale * pv[k] * (dv[k] - s) : 0.0f;
    store_f<VW>(datt + off + c, dv);
  }
}

// One operand of attention's batched products, in llm.c's column-major view: for head
// (b, h), b < B, h < NH, a column-major matrix whose column j starts at
//   base + b·sb + h·sh + j·ld   (elements).
// The per-head (T, hs) vectors (q, k, v, y and their gradients) are (hs, T) column-major
// matrices: column j = position j's hs values. The (T,T) scores S are (T, T) with ld T:
// column j = score row j, element (i, j) = S[j][i].
//   head-major (B,NH,T,hs):      ld = hs, sh = T·hs, sb = NH·T·hs   (heads_operand)
//   in place in (B,T,R) rows,    ld = R,  sh = hs,   sb = T·R       (rows_operand)
//     head h at columns [h·hs, (h+1)·hs) of a row of R (R = 3C for qkv/dqkv, C for y/dy)
//   scores (B,NH,T,T):           ld = T,  sh = T·T,  sb = NH·T·T    (scores_operand)
// The column block [lo, …) of an operand starts lo·ld elements further (col(lo)): lo·hs in
// the head-major layout, lo·R in place, lo·T for the scores.
struct HeadOperand {
  const bf16* base;  // the output's (C's) base comes from a non-const pointer
  int ld;
  long long sb, sh;
  HeadOperand at(size_t elems) const { return {base + elems, ld, sb, sh}; }
  HeadOperand col(int j) const { return at(static_cast<size_t>(j) * ld); }
  // Head i = b·NH + h starts at base + i·sh: one stride covers the batch (always so for
  // B = 1, where i = h; in place too, at sh = hs).
  bool strided(int B, int NH) const { return B == 1 || sb == static_cast<long long>(NH) * sh; }
  BatchedOperand batched() const {
    return {base, sb * static_cast<long long>(sizeof(bf16)),
            sh * static_cast<long long>(sizeof(bf16))};
  }
};

HeadOperand heads_operand(const bf16* p, int T, int hs, int NH) {
  const long long sh = static_cast<long long>(T) * hs;
  return {p, hs, NH * sh, sh};
}
HeadOperand rows_operand(const bf16* p, int T, int row_len, int hs) {
  return {p, row_len, static_cast<long long>(T) * row_len, hs};
}
HeadOperand scores_operand(const bf16* p, int T, int NH) {
  const long long sh = static_cast<long long>(T) * T;
  return {p, T, NH * sh, sh};
}

bool aligned16_elems(long long elems) {
  return elems * static_cast<long long>(sizeof(bf16)) % 16 == 0;
}

// C = op(A)·op(B) for the B·NH column-major problems of the heads, bf16, fp32 accumulate.
// When every operand's heads sit at one stride (head-major layouts) this is one strided-batched
// GEMM, exactly as before the in-place path existed; otherwise a pointer-array batched GEMM
// whose arrays come from the context's cache (uploaded once per distinct operand set).
void head_gemm(BlasContext& blas, int B, int NH, cublasOperation_t ta, cublasOperation_t tb,
               int m, int n, int k, const HeadOperand& a, const HeadOperand& b,
               const HeadOperand& c) {
  const float one = 1.0f, zero = 0.0f;
  const int batch = B * NH;
  bf16* c_base = const_cast<bf16*>(c.base);
  if (a.strided(B, NH) && b.strided(B, NH) && c.strided(B, NH)) {
    DDILOCO_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas.cublas(), ta, tb, m, n, k, &one, a.base, CUDA_R_16BF, a.ld, a.sh, b.base,
        CUDA_R_16BF, b.ld, b.sh, &zero, c_base, CUDA_R_16BF, c.ld, c.sh, batch,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  // cuBLAS cannot see pointers that live in device memory, so its kernels may assume they
  // are 16-byte aligned: make sure every one is, i.e. the (column-offset) base and both head
  // strides (the callers guarantee it, attention_inplace_supported). The leading dimensions
  // need no check here: cuBLAS sees them (the scores' ld = T is only a multiple of 4).
  for (const HeadOperand* o : {&a, &b, &c})
    if (!detail::aligned16(o->base) || !aligned16_elems(o->sb) || !aligned16_elems(o->sh))
      throw_error("attention: pointer-array GEMM operands must be 16-byte aligned");
  void* const* p = blas.batched_pointers(a.batched(), b.batched(), c.batched(), B, NH);
  DDILOCO_CUBLAS_CHECK(cublasGemmBatchedEx(
      blas.cublas(), ta, tb, m, n, k, &one, const_cast<const void* const*>(p), CUDA_R_16BF,
      a.ld, const_cast<const void* const*>(p + batch), CUDA_R_16BF, b.ld, &zero, p + 2 * batch,
      CUDA_R_16BF, c.ld, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool rows_vectorisable(int T, const void* a, const void* b) {
  return T % 8 == 0 && detail::aligned16(a) && detail::aligned16(b);
}

}  // namespace

size_t attention_forward_scratch_elems(int B, int T, int C) {
  return 4 * static_cast<size_t>(B) * T * C;
}

size_t attention_backward_scratch_elems(int B, int T, int C, int NH) {
  return 7 * static_cast<size_t>(B) * T * C + static_cast<size_t>(B) * NH * T * T;
}

namespace {

// Backward for rows ≤ 32·8·NCH columns (16-byte rows): P and dP chunks loaded once into
// registers (kept as bf16, 8 registers per chunk pair), all loads issued up front; the dot
// product, then one write pass from the registers: two reads + one write per element instead
// of four reads + one write. Same arithmetic and summation order as softmax_backward_kernel.
template <int NCH>
__global__ void softmax_backward_regs_kernel(bf16* datt, const bf16* att, int rows, int T,
                                             int blk, int last, float scale) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int t = row % T;
  const size_t off = static_cast<size_t>(row) * T;
  detail::Bf16x8 pr[NCH], dr[NCH];
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kWarp + lane) * 8;
    if (c <= t) {
      pr[j] = detail::load8(att + off + c);
      dr[j] = detail::load8(datt + off + c);
    }
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kWarp + lane) * 8;
    if (c <= t) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (c + k <= t) s += __bfloat162float(pr[j].v[k]) * __bfloat162float(dr[j].v[k]);
    }
  }
  s = detail::warp_sum(s);
  const int width = causal_width(t, T, blk, last);
#pragma unroll
  for (int j = 0; j < NCH; ++j) {
    const int c = (j * kWarp + lane) * 8;
    if (c < width) {
      float dv[8];
#pragma unroll
      for (int k = 0; k < 8; ++k)
        dv[k] = c + k <= t ? scale * __bfloat162float(pr[j].v[k]) *
                                 (__bfloat162float(dr[j].v[k]) - s)
                           : 0.0f;
      store_f<8>(datt + off + c, dv);
    }
  }
}

// blk: the causal split's block size (0 = full rows); last = (T / blk − 1)·blk.
void softmax_forward(bf16* att, int BNH, int T, int blk, float scale, cudaStream_t stream) {
  const int rows = BNH * T;
  const int last = blk > 0 ? (T / blk - 1) * blk : 0;
  const unsigned grid = detail::blocks_for(static_cast<size_t>(rows), kRowsPerBlock);
  if (rows_vectorisable(T, att, att) && blk % 8 == 0 && T <= kWarp * 8 * kSoftmaxRegChunks)
    softmax_forward_regs_kernel<kSoftmaxRegChunks>
        <<<grid, kThreads, 0, stream>>>(att, rows, T, blk, last, scale);
  else if (rows_vectorisable(T, att, att) && blk % 8 == 0)
    softmax_forward_kernel<8><<<grid, kThreads, 0, stream>>>(att, rows, T, blk, last, scale);
  else
    softmax_forward_kernel<1><<<grid, kThreads, 0, stream>>>(att, rows, T, blk, last, scale);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void softmax_backward(bf16* datt, const bf16* att, int BNH, int T, int blk, float scale,
                      cudaStream_t stream) {
  const int rows = BNH * T;
  const int last = blk > 0 ? (T / blk - 1) * blk : 0;
  const unsigned grid = detail::blocks_for(static_cast<size_t>(rows), kRowsPerBlock);
  if (rows_vectorisable(T, att, datt) && blk % 8 == 0 && T <= kWarp * 8 * kSoftmaxRegChunks)
    softmax_backward_regs_kernel<kSoftmaxRegChunks>
        <<<grid, kThreads, 0, stream>>>(datt, att, rows, T, blk, last, scale);
  else if (rows_vectorisable(T, att, datt) && blk % 8 == 0)
    softmax_backward_kernel<8><<<grid, kThreads, 0, stream>>>(datt, att, rows, T, blk, last,
                                                              scale);
  else
    softmax_backward_kernel<1><<<grid, kThreads, 0, stream>>>(datt, att, rows, T, blk, last,
                                                              scale);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

// Causal split of the (T,T) score matrices into P row/column blocks of blk rows
// (blk = attention_causal_split(T), a multiple of 8; P = ⌊T/blk⌋, the last block takes the
// remainder; boundaries b_0 = 0 < b_1 < … < b_P = T): rows of block r only see keys < b_{r+1},
// so everything right of that staircase is never computed, written or read — at P = 4 the
// GEMMs touch 10/16 of T×T instead of all of it. Each T×T product becomes P batched GEMMs
// (blk = 0, for T < 16: one, the full product):
//   scores  S[j][i] = x_j·y_i:       rows j of block r, columns i < b_{r+1};
//   rows    o[j] = Σ_i S[j][i]·z_i:  j in block r over i < b_{r+1};
//   columns o[i] = Σ_j S[j][i]·z_j:  i in block c over j ≥ b_c (S[j][i] = 0 for j < i, so
//           no accumulation across GEMMs is needed and every output is rounded once).
// All in llm.c's column-major view (HeadOperand): S is (T,T) with ld T, element (i, j) =
// S[j][i]; x, y, z, o are (hs, T), column j = position j. Positions [lo, hi) of a vector
// operand start at col(lo) = lo·ld elements in (lo·hs head-major, lo·3C or lo·C in place);
// rows [lo, hi) of S at col(lo) = lo·T, and S's sub-block (i ≥ lo, j ≥ lo) at lo·T + lo.
// The operands say where each head lives, so the same split runs on head-major copies
// (strided-batched GEMMs) and in place in the (B,T,3C)/(B,T,C) activations (pointer arrays).
struct CausalSplit {
  int T, hs, blk, parts, B, NH;
  CausalSplit(int T_, int hs_, int B_, int NH_)
      : T(T_), hs(hs_), blk(attention_causal_split(T_)),
        parts(blk > 0 ? T_ / blk : 1), B(B_), NH(NH_) {}
  int lo(int r) const { return r * blk; }                      // b_r
  int hi(int r) const { return r + 1 == parts ? T : (r + 1) * blk; }  // b_{r+1}
  // FLOPs of one product: 2·hs·Σ_r b_{r+1}·(b_{r+1} − b_r) per head.
  double flops() const {
    double f = 0.0;
    for (int r = 0; r < parts; ++r) f += static_cast<double>(hi(r)) * (hi(r) - lo(r));
    return 2.0 * hs * f * B * NH;
  }
  // S = x·yᵀ (S[j][i] = x_j·y_i, x the queries' side): for block r,
  //   S(:hi, lo:hi) (hi × (hi−lo), ld T) = y(:, :hi)ᵀ · x(:, lo:hi),  k = hs.
  void scores(BlasContext& blas, const HeadOperand& S, const HeadOperand& x,
              const HeadOperand& y) const {
    for (int r = 0; r < parts; ++r)
      head_gemm(blas, B, NH, CUBLAS_OP_T, CUBLAS_OP_N, hi(r), hi(r) - lo(r), hs, y,
                x.col(lo(r)), S.col(lo(r)));
  }
  // o[j] = Σ_i S[j][i]·z_i: for block r,
  //   o(:, lo:hi) (hs × (hi−lo)) = z(:, :hi) · S(:hi, lo:hi),  k = hi.
  void rows(BlasContext& blas, const HeadOperand& o, const HeadOperand& S,
            const HeadOperand& z) const {
    for (int r = 0; r < parts; ++r)
      head_gemm(blas, B, NH, CUBLAS_OP_N, CUBLAS_OP_N, hs, hi(r) - lo(r), hi(r), z,
                S.col(lo(r)), o.col(lo(r)));
  }
  // o[i] = Σ_j S[j][i]·z_j: for block c (lo = b_c, hi = b_{c+1}),
  //   o(:, lo:hi) (hs × (hi−lo)) = z(:, lo:T) · S(lo:hi, lo:T)ᵀ,  k = T − lo,
  // where S(lo:hi, lo:T) (stored (hi−lo) × (T−lo), ld T) starts at lo·T + lo.
  void columns(BlasContext& blas, const HeadOperand& o, const HeadOperand& S,
               const HeadOperand& z) const {
    for (int c = 0; c < parts; ++c)
      head_gemm(blas, B, NH, CUBLAS_OP_N, CUBLAS_OP_T, hs, hi(c) - lo(c), T - lo(c),
                z.col(lo(c)), S.col(lo(c)).at(lo(c)), o.col(lo(c)));
  }
};

// The products and softmax of one attention call on heads wherever they live (head-major
// copies or in place in the activations; HeadOperand says where), in the order and with the
// profile names both paths share. att, datt: (B,NH,T,T).
//   forward:  att = softmax(q·kᵀ/√hs) (causal), y = att·v
void attention_products_forward(BlasContext& blas, const CausalSplit& cs, bf16* att,
                                const HeadOperand& q, const HeadOperand& k, const HeadOperand& v,
                                const HeadOperand& y) {
  OpProfiler* prof = blas.profiler();
  const HeadOperand P = scores_operand(att, cs.T, cs.NH);
  const double gemm_flops = cs.flops();  // each product: the split's blocks
  {
    // att[j][i] = q_j·k_i (row-major (T,T) per head; see the derivation in llm.c).
    ProfileScope ps(prof, "QK^T gemm", gemm_flops);
    cs.scores(blas, P, q, k);
  }
  {
    ProfileScope ps(prof, "softmax");
    softmax_forward(att, cs.B * cs.NH, cs.T, cs.blk,
                    1.0f / std::sqrt(static_cast<float>(cs.hs)), blas.stream());
  }
  // y[j][d] = Σ_i att[j][i]·v[i][d].
  ProfileScope ps(prof, "PV gemm", gemm_flops);
  cs.rows(blas, y, P, v);
}

//   backward: dq, dk, dv from dy and the saved att; datt is scratch.
void attention_products_backward(BlasContext& blas, const CausalSplit& cs, const bf16* att,
                                 bf16* datt, const HeadOperand& q, const HeadOperand& k,
                                 const HeadOperand& v, const HeadOperand& dy,
                                 const HeadOperand& dq, const HeadOperand& dk,
                                 const HeadOperand& dv) {
  OpProfiler* prof = blas.profiler();
  const HeadOperand P = scores_operand(att, cs.T, cs.NH), dS = scores_operand(datt, cs.T, cs.NH);
  const double gemm_flops = cs.flops();  // each product
  {
    // dP[j][i] = dy_j·v_i
    ProfileScope ps(prof, "dP = dY V^T gemm", gemm_flops);
    cs.scores(blas, dS, dy, v);
  }
  {
    // dV[j][d] = Σ_i P[i][j]·dy[i][d]
    ProfileScope ps(prof, "dV = P^T dY gemm", gemm_flops);
    cs.columns(blas, dv, P, dy);
  }
  {
    // dS = P ⊙ (dP − rowsum(P ⊙ dP)) / √hs, in place
    ProfileScope ps(prof, "softmax bwd");
    softmax_backward(datt, att, cs.B * cs.NH, cs.T, cs.blk,
                     1.0f / std::sqrt(static_cast<float>(cs.hs)), blas.stream());
  }
  {
    // dQ[j][d] = Σ_i dS[j][i]·k[i][d]
    ProfileScope ps(prof, "dQ = dS K gemm", gemm_flops);
    cs.rows(blas, dq, dS, k);
  }
  // dK[j][d] = Σ_i dS[i][j]·q[i][d]
  ProfileScope ps(prof, "dK = dS^T Q gemm", gemm_flops);
  cs.columns(blas, dk, dS, q);
}

}  // namespace

int attention_causal_split(int T) { return T >= 16 ? std::max(8, (T / 4) / 8 * 8) : 0; }

void attention_softmax_forward(bf16* att, int BNH, int T, float scale, cudaStream_t stream) {
  softmax_forward(att, BNH, T, 0, scale, stream);
}

void attention_softmax_backward(bf16* datt, const bf16* att, int BNH, int T, float scale,
                                cudaStream_t stream) {
  softmax_backward(datt, att, BNH, T, 0, scale, stream);
}

void attention_forward(BlasContext& blas, bf16* out, bf16* att, const bf16* qkv, bf16* scratch,
                       int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t NC = static_cast<size_t>(B) * T * C;
  bf16 *q = scratch, *k = q + NC, *v = k + NC, *y = v + NC;
  cudaStream_t stream = blas.stream();
  OpProfiler* prof = blas.profiler();
  const CausalSplit cs(T, hs, B, NH);
  auto heads = [&](const bf16* p) { return heads_operand(p, T, hs, NH); };
  const Permute pm(B, T, C, NH, hs, {scratch, qkv, out}, stream);
  {
    ProfileScope ps(prof, "permute qkv");
    pm.split_qkv(q, k, v, qkv);
  }
  attention_products_forward(blas, cs, att, heads(q), heads(k), heads(v), heads(y));
  ProfileScope ps(prof, "unpermute y");
  pm.heads(out, y, true);
}

void attention_backward(BlasContext& blas, bf16* dqkv, const bf16* dout, const bf16* qkv,
                        const bf16* att, bf16* scratch, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t NC = static_cast<size_t>(B) * T * C;
  bf16 *q = scratch, *k = q + NC, *v = k + NC, *dy = v + NC, *dq = dy + NC, *dk = dq + NC,
       *dv = dk + NC, *datt = dv + NC;
  cudaStream_t stream = blas.stream();
  OpProfiler* prof = blas.profiler();
  const CausalSplit cs(T, hs, B, NH);
  auto heads = [&](const bf16* p) { return heads_operand(p, T, hs, NH); };
  const Permute pm(B, T, C, NH, hs, {scratch, qkv, dout, dqkv}, stream);
  {
    // Q, K, V again from the saved qkv: cheaper than keeping three more (N,C) per layer.
    ProfileScope ps(prof, "permute qkv + dy");
    pm.split_qkv(q, k, v, qkv);
    pm.heads(dy, dout, false);
  }
  attention_products_backward(blas, cs, att, datt, heads(q), heads(k), heads(v), heads(dy),
                              heads(dq), heads(dk), heads(dv));
  ProfileScope ps(prof, "unpermute dqkv");
  pm.join_qkv(dqkv, dq, dk, dv);
}

bool attention_inplace_supported(int T, int C, int NH) {
  // Every pointer of the arrays 16-byte aligned (8 bf16), given 16-byte aligned buffers:
  //   qkv/dqkv heads: b·T·3C + h·hs + j·3C;  out/dout heads: b·T·C + h·hs + j·C
  //     → hs % 8 == 0 (then C = NH·hs is a multiple of 8 too; j = block starts);
  //   att/datt heads: (b·NH + h)·T·T + j·T + i with j, i block starts (multiples of 8)
  //     → T·T % 8 == 0, i.e. T % 4 == 0.
  return NH > 0 && C % NH == 0 && (C / NH) % 8 == 0 && T > 0 && T % 4 == 0;
}

size_t attention_forward_inplace_scratch_elems(int B, int T, int C, int NH) {
  return attention_inplace_supported(T, C, NH) ? 0 : attention_forward_scratch_elems(B, T, C);
}

size_t attention_backward_inplace_scratch_elems(int B, int T, int C, int NH) {
  return attention_inplace_supported(T, C, NH)
             ? static_cast<size_t>(B) * NH * T * T
             : attention_backward_scratch_elems(B, T, C, NH);
}

namespace {

void require_aligned(std::initializer_list<const void*> ptrs, const char* what) {
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) throw_error(what);
}

}  // namespace

void attention_forward_inplace(BlasContext& blas, bf16* out, bf16* att, const bf16* qkv,
                               bf16* scratch, int B, int T, int C, int NH) {
  if (!attention_inplace_supported(T, C, NH)) {
    attention_forward(blas, out, att, qkv, scratch, B, T, C, NH);
    return;
  }
  require_aligned({out, att, qkv}, "attention_forward_inplace: buffers must be 16-byte aligned");
  const int hs = C / NH;
  const size_t Cs = static_cast<size_t>(C);
  // Head (b, h) of Q at qkv + b·T·3C + h·hs, column (position) j at + j·3C; K at + C, V at
  // + 2C; y at out + b·T·C + h·hs, column j at + j·C: written straight into out's rows.
  attention_products_forward(blas, CausalSplit(T, hs, B, NH), att,
                             rows_operand(qkv, T, 3 * C, hs), rows_operand(qkv + Cs, T, 3 * C, hs),
                             rows_operand(qkv + 2 * Cs, T, 3 * C, hs),
                             rows_operand(out, T, C, hs));
}

void attention_backward_inplace(BlasContext& blas, bf16* dqkv, const bf16* dout, const bf16* qkv,
                                const bf16* att, bf16* scratch, int B, int T, int C, int NH) {
  if (!attention_inplace_supported(T, C, NH)) {
    attention_backward(blas, dqkv, dout, qkv, att, scratch, B, T, C, NH);
    return;
  }
  require_aligned({dqkv, dout, qkv, att, scratch},
                  "attention_backward_inplace: buffers must be 16-byte aligned");
  const int hs = C / NH;
  const size_t Cs = static_cast<size_t>(C);
  // As in the forward: Q, K, V and dQ, dK, dV in (B,T,3C) rows (ld 3C), dY in (B,T,C) (ld C);
  // the scratch holds datt (B,NH,T,T).
  auto rows3 = [&](const bf16* p) { return rows_operand(p, T, 3 * C, hs); };
  attention_products_backward(blas, CausalSplit(T, hs, B, NH), att, scratch, rows3(qkv),
                              rows3(qkv + Cs), rows3(qkv + 2 * Cs), rows_operand(dout, T, C, hs),
                              rows3(dqkv), rows3(dqkv + Cs), rows3(dqkv + 2 * Cs));
}

bool attention_flash_supported(int T, int C, int NH) {
  return NH > 0 && C % NH == 0 && C / NH == 64 && T % 64 == 0 && T > 0;
}

void attention_forward_flash(bf16* out, float* lse, const bf16* qkv, bf16* scratch, int B, int T,
                             int C, int NH, cudaStream_t stream, OpProfiler* prof) {
  if (!attention_flash_supported(T, C, NH))
    throw_error("attention_forward_flash: needs head size 64 and T a multiple of 64");
  const int hs = C / NH;
  const size_t NC = static_cast<size_t>(B) * T * C;
  bf16 *q = scratch, *k = q + NC, *v = k + NC, *y = v + NC;
  const Permute pm(B, T, C, NH, hs, {scratch, qkv, out}, stream);
  {
    ProfileScope ps(prof, "permute qkv");
    pm.split_qkv(q, k, v, qkv);
  }
  {
    // FLOPs of the computed (causal) 64×64 tiles: S = QKᵀ and O = PV, 2·64³ each per tile.
    const double nb = T / 64;
    ProfileScope ps(prof, "flash fwd kernel",
                    2 * 2.0 * 64 * 64 * 64 * B * NH * nb * (nb + 1) / 2);
    detail::flash_forward(q, k, v, y, lse, B * NH, T, 1.0f / std::sqrt(static_cast<float>(hs)),
                          stream);
  }
  ProfileScope ps(prof, "unpermute y");
  pm.heads(out, y, true);
}

void attention_backward_flash(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, bf16* scratch, float* delta, int B, int T, int C,
                              int NH, cudaStream_t stream, OpProfiler* prof) {
  if (!attention_flash_supported(T, C, NH))
    throw_error("attention_backward_flash: needs head size 64 and T a multiple of 64");
  const int hs = C / NH;
  const size_t NC = static_cast<size_t>(B) * T * C;
  bf16 *q = scratch, *k = q + NC, *v = k + NC, *dy = v + NC, *dq = dy + NC, *dk = dq + NC,
       *dv = dk + NC;
  const Permute pm(B, T, C, NH, hs, {scratch, qkv, dout, dqkv}, stream);
  {
    ProfileScope ps(prof, "permute qkv + dy");
    pm.split_qkv(q, k, v, qkv);
    pm.heads(dy, dout, false);
  }
  {
    ProfileScope ps(prof, "delta = rowsum(dO*O)");
    detail::flash_delta(delta, dout, out, B, T, NH, stream);
  }
  detail::flash_backward(q, k, v, dy, lse, delta, dq, dk, dv, B * NH, T,
                         1.0f / std::sqrt(static_cast<float>(hs)), stream, prof);
  ProfileScope ps(prof, "unpermute dqkv");
  pm.join_qkv(dqkv, dq, dk, dv);
}

}  // namespace ddiloco::gpu
