// Fused causal attention for head size 64 (FlashAttention-2's algorithm: Dao 2023, "Faster
// Attention with Better Parallelism and Work Partitioning"), on bf16 tensor cores through WMMA
// (16×16×16 bf16 tiles, fp32 accumulators). Unlike attention.cu it never materialises the
// (B,NH,T,T) probabilities: the forward pass keeps a running max and sum per query row and
// saves only logsumexp (B,NH,T); the backward pass recomputes P from it. Blocks above the
// causal diagonal are skipped entirely, so the work is the causal half of the dense products.
//
// Tiles: 64 queries × 64 keys per block iteration, 4 warps of 16 rows each. Softmax and the
// masks run on fp32 tiles in shared memory (two lanes per row, interleaved columns).
// Backward: one kernel for dK, dV (a block owns 64 keys and walks the query blocks at or below
// the diagonal), one for dQ (a block owns 64 queries and walks the key blocks); the products
// S = Q·Kᵀ and dP = dO·Vᵀ are computed in both, which costs ~40 % more backward FLOPs than
// FA2's single kernel but needs no atomics and is deterministic.
#include <mma.h>

#include <cmath>
#include <initializer_list>

#include "common.cuh"
#include "flash_attention.cuh"

namespace ddiloco::gpu {
namespace {

namespace wmma = nvcuda::wmma;
using detail::kWarp;

constexpr int kHS = 64;          // head size this kernel is written for
constexpr int kBlk = 64;         // queries / keys per tile
constexpr int kWarps = kBlk / 16;
constexpr int kThreads = kWarps * kWarp;
constexpr int kLd = kHS + 8;     // bf16 tile row stride (elements): 144 B rows, fewer conflicts
constexpr int kLdS = kBlk + 4;   // fp32 tile row stride

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr size_t kTileBytes = sizeof(bf16) * kBlk * kLd;        // one 64×64 bf16 tile
constexpr size_t kWarpF32Bytes = sizeof(float) * 16 * kLdS;     // one warp's 16×64 fp32
constexpr size_t kWarpBf16Bytes = sizeof(bf16) * 16 * kLd;      // one warp's 16×64 bf16

// 64 rows × 64 bf16 (row stride kHS in global memory) into a shared tile of stride kLd,
// 16 bytes per thread per iteration.
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src) {
  for (int i = threadIdx.x; i < kBlk * kHS / 8; i += kThreads) {
    const int row = i / (kHS / 8), col = (i % (kHS / 8)) * 8;
    *reinterpret_cast<uint4*>(dst + row * kLd + col) =
        *reinterpret_cast<const uint4*>(src + static_cast<size_t>(row) * kHS + col);
  }
}

// A warp's 16 rows × 64 of a tile as four matrix_a fragments (16×16 each, along the 64). The
// operand that stays fixed across a kernel's loop (Q in the forward and dQ kernels, K and V in
// the dK/dV kernel) is loaded into registers once instead of once per tile product.
__device__ __forceinline__ void load_rows(FragA (&fa)[kHS / 16], const bf16* a) {
#pragma unroll
  for (int kk = 0; kk < kHS / 16; ++kk) wmma::load_matrix_sync(fa[kk], a + kk * 16, kLd);
}

// out (16×64 fp32, stride kLdS) = A · Bᵀ with A given as fragments (load_rows) and B 64 rows
// of 64 (stride kLd): out[r][c] = Σ_d A[r][d]·B[c][d].
__device__ __forceinline__ void mm_abt(float* out, const FragA (&fa)[kHS / 16], const bf16* b) {
#pragma unroll
  for (int n = 0; n < kBlk / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < kHS / 16; ++kk) {
      FragBT fb;
      wmma::load_matrix_sync(fb, b + n * 16 * kLd + kk * 16, kLd);
      wmma::mma_sync(acc, fa[kk], fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kLdS, wmma::mem_row_major);
  }
}

// acc[n] += A (16×64 bf16, stride kLd) · B (64×64 bf16 tile, stride kLd), n over 16-column
// slices of the result; each A fragment is loaded once.
__device__ __forceinline__ void mm_ab_acc(FragC* acc, const bf16* a, const bf16* b) {
#pragma unroll
  for (int kk = 0; kk < kBlk / 16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, kLd);
#pragma unroll
    for (int n = 0; n < kHS / 16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * kLd + n * 16, kLd);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// One warp writes its 16×64 fp32 accumulators as bf16 rows of a (T,kHS) head tensor, through
// the warp's fp32 scratch tile.
__device__ __forceinline__ void store_rows(bf16* dst, FragC* acc, float* scratch, int lane) {
#pragma unroll
  for (int n = 0; n < kHS / 16; ++n)
    wmma::store_matrix_sync(scratch + n * 16, acc[n], kLdS, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * kHS; i += kWarp) {
    const int r = i / kHS, c = i % kHS;
    dst[static_cast<size_t>(r) * kHS + c] = __float2bfloat16_rn(scratch[r * kLdS + c]);
  }
}

// ------------------------------------------------------------------------------ forward
constexpr size_t kFwdSmem = 3 * kTileBytes + kWarps * (2 * kWarpF32Bytes + kWarpBf16Bytes);

__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const bf16* q, const bf16* k, const bf16* v, bf16* y, float* lse, int T,
                         float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kBlk * kLd;
  bf16* Vs = Ks + kBlk * kLd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* Sw = reinterpret_cast<float*>(Vs + kBlk * kLd) + warp * 16 * kLdS;
  float* Ow = reinterpret_cast<float*>(Vs + kBlk * kLd) + (kWarps + warp) * 16 * kLdS;
  bf16* Pw = reinterpret_cast<bf16*>(reinterpret_cast<float*>(Vs + kBlk * kLd) +
                                     2 * kWarps * 16 * kLdS) + warp * 16 * kLd;

  const int nblk = T / kBlk;
  const int qb = nblk - 1 - static_cast<int>(blockIdx.x);  // longest rows first
  const size_t head = static_cast<size_t>(blockIdx.y) * T * kHS;
  load_tile(Qs, q + head + static_cast<size_t>(qb) * kBlk * kHS);
  for (int i = lane; i < 16 * kLdS; i += kWarp) Ow[i] = 0.0f;
  __syncthreads();
  FragA qf[kHS / 16];
  load_rows(qf, Qs + warp * 16 * kLd);

  // Lane → row r of the warp's 16, columns h, h+2, ..., h+62 (2-way bank conflicts at most).
  const int r = lane & 15, h = lane >> 4;
  const int qrow = qb * kBlk + warp * 16 + r;
  float m = -INFINITY, l = 0.0f;
  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();  // every warp is done with the previous K, V tiles
    load_tile(Ks, k + head + static_cast<size_t>(kb) * kBlk * kHS);
    load_tile(Vs, v + head + static_cast<size_t>(kb) * kBlk * kHS);
    __syncthreads();
    mm_abt(Sw, qf, Ks);
    __syncwarp();
    float mx = -INFINITY;
    for (int j = 0; j < kBlk / 2; ++j) {
      const int c = h + 2 * j;
      if (kb * kBlk + c <= qrow) mx = fmaxf(mx, Sw[r * kLdS + c] * scale);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m, mx);  // finite: column kb·64 ≤ qrow is always visible
    const float alpha = __expf(m - m_new);
    float sum = 0.0f;
    for (int j = 0; j < kBlk / 2; ++j) {
      const int c = h + 2 * j;
      const float p =
          kb * kBlk + c <= qrow ? __expf(Sw[r * kLdS + c] * scale - m_new) : 0.0f;
      Pw[r * kLd + c] = __float2bfloat16_rn(p);
      sum += p;
      Ow[r * kLdS + c] *= alpha;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();
    // Sw ← P·V (16×64), then O += it.
    {
      FragC pv[kHS / 16];
      for (auto& a : pv) wmma::fill_fragment(a, 0.0f);
      mm_ab_acc(pv, Pw, Vs);
#pragma unroll
      for (int n = 0; n < kHS / 16; ++n)
        wmma::store_matrix_sync(Sw + n * 16, pv[n], kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    for (int j = 0; j < kHS / 2; ++j) {
      const int c = h + 2 * j;
      Ow[r * kLdS + c] += Sw[r * kLdS + c];
    }
    __syncwarp();
  }
  const float inv = 1.0f / l;
  bf16* yrow = y + head + static_cast<size_t>(qrow) * kHS;
  for (int j = 0; j < kHS / 2; ++j) {
    const int c = h + 2 * j;
    yrow[c] = __float2bfloat16_rn(Ow[r * kLdS + c] * inv);
  }
  if (h == 0) lse[static_cast<size_t>(blockIdx.y) * T + qrow] = m + logf(l);
}

// ------------------------------------------------------------------------------ backward
// D[bh,t] = Σ_d dO·O over the head's 64 channels = rowsum(P ⊙ dP) (FA2's "delta"). Reads the
// (B,T,C) output and its gradient directly; one warp per (b,t,h).
__global__ void flash_delta_kernel(float* delta, const bf16* dout, const bf16* out, int B, int T,
                                   int NH) {
  const size_t w = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (w >= static_cast<size_t>(B) * T * NH) return;
  const int hh = static_cast<int>(w % NH);
  const size_t bt = w / NH;
  const size_t b = bt / T, t = bt % T;
  const size_t off = bt * NH * kHS + static_cast<size_t>(hh) * kHS;
  float s = 0.0f;
  for (int d = lane; d < kHS; d += kWarp)
    s += __bfloat162float(dout[off + d]) * __bfloat162float(out[off + d]);
  s = detail::warp_sum(s);
  if (lane == 0) delta[(b * NH + hh) * T + t] = s;
}

constexpr size_t kDqSmem = 4 * kTileBytes + kWarps * (2 * kWarpF32Bytes + kWarpBf16Bytes);

// dQ for 64 queries: Σ over key blocks kb ≤ qb of dS·K, dS = P ⊙ (dP − D)·scale.
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(const bf16* q, const bf16* k, const bf16* v, const bf16* dy,
                             const float* lse, const float* delta, bf16* dq, int T, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* dOs = Qs + kBlk * kLd;
  bf16* Ks = dOs + kBlk * kLd;
  bf16* Vs = Ks + kBlk * kLd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* f32 = reinterpret_cast<float*>(Vs + kBlk * kLd);
  float* Sw = f32 + warp * 16 * kLdS;
  float* dPw = f32 + (kWarps + warp) * 16 * kLdS;
  bf16* dSw = reinterpret_cast<bf16*>(f32 + 2 * kWarps * 16 * kLdS) + warp * 16 * kLd;

  const int nblk = T / kBlk;
  const int qb = nblk - 1 - static_cast<int>(blockIdx.x);
  const size_t bh = blockIdx.y;
  const size_t head = bh * T * kHS;
  load_tile(Qs, q + head + static_cast<size_t>(qb) * kBlk * kHS);
  load_tile(dOs, dy + head + static_cast<size_t>(qb) * kBlk * kHS);
  __syncthreads();
  FragA qf[kHS / 16], dof[kHS / 16];
  load_rows(qf, Qs + warp * 16 * kLd);
  load_rows(dof, dOs + warp * 16 * kLd);
  const int r = lane & 15, h = lane >> 4;
  const int qrow = qb * kBlk + warp * 16 + r;
  const float L = lse[bh * T + qrow], D = delta[bh * T + qrow];
  FragC acc[kHS / 16];
  for (auto& a : acc) wmma::fill_fragment(a, 0.0f);
  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();
    load_tile(Ks, k + head + static_cast<size_t>(kb) * kBlk * kHS);
    load_tile(Vs, v + head + static_cast<size_t>(kb) * kBlk * kHS);
    __syncthreads();
    mm_abt(Sw, qf, Ks);    // S = Q·Kᵀ
    mm_abt(dPw, dof, Vs);  // dP = dO·Vᵀ
    __syncwarp();
    for (int j = 0; j < kBlk / 2; ++j) {
      const int c = h + 2 * j;
      const float p = kb * kBlk + c <= qrow ? __expf(Sw[r * kLdS + c] * scale - L) : 0.0f;
      dSw[r * kLd + c] = __float2bfloat16_rn(p * (dPw[r * kLdS + c] - D) * scale);
    }
    __syncwarp();
    mm_ab_acc(acc, dSw, Ks);  // dQ += dS·K
  }
  store_rows(dq + head + static_cast<size_t>(qb * kBlk + warp * 16) * kHS, acc, Sw, lane);
}

constexpr size_t kDkvSmem =
    4 * kTileBytes + kWarps * (2 * kWarpF32Bytes + 2 * kWarpBf16Bytes) + 2 * kBlk * sizeof(float);

// dK, dV for 64 keys: Σ over query blocks qb ≥ kb of dSᵀ·Q and Pᵀ·dO, computed transposed
// (rows = this warp's 16 keys, columns = the block's 64 queries).
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(const bf16* q, const bf16* k, const bf16* v, const bf16* dy,
                               const float* lse, const float* delta, bf16* dk, bf16* dv, int T,
                               float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + kBlk * kLd;
  bf16* Qs = Vs + kBlk * kLd;
  bf16* dOs = Qs + kBlk * kLd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* f32 = reinterpret_cast<float*>(dOs + kBlk * kLd);
  float* STw = f32 + warp * 16 * kLdS;
  float* dPTw = f32 + (kWarps + warp) * 16 * kLdS;
  bf16* b16 = reinterpret_cast<bf16*>(f32 + 2 * kWarps * 16 * kLdS);
  bf16* PTw = b16 + warp * 16 * kLd;
  bf16* dSTw = b16 + (kWarps + warp) * 16 * kLd;
  float* Ls = reinterpret_cast<float*>(b16 + 2 * kWarps * 16 * kLd);
  float* Ds = Ls + kBlk;

  const int nblk = T / kBlk;
  const int kb = static_cast<int>(blockIdx.x);  // small kb has the most query blocks: first
  const size_t bh = blockIdx.y;
  const size_t head = bh * T * kHS;
  load_tile(Ks, k + head + static_cast<size_t>(kb) * kBlk * kHS);
  load_tile(Vs, v + head + static_cast<size_t>(kb) * kBlk * kHS);
  __syncthreads();
  FragA kf[kHS / 16], vf[kHS / 16];
  load_rows(kf, Ks + warp * 16 * kLd);
  load_rows(vf, Vs + warp * 16 * kLd);
  const int r = lane & 15, h = lane >> 4;
  const int krow = kb * kBlk + warp * 16 + r;
  FragC dk_acc[kHS / 16], dv_acc[kHS / 16];
  for (auto& a : dk_acc) wmma::fill_fragment(a, 0.0f);
  for (auto& a : dv_acc) wmma::fill_fragment(a, 0.0f);
  for (int qb = kb; qb < nblk; ++qb) {
    __syncthreads();
    load_tile(Qs, q + head + static_cast<size_t>(qb) * kBlk * kHS);
    load_tile(dOs, dy + head + static_cast<size_t>(qb) * kBlk * kHS);
    for (int i = threadIdx.x; i < kBlk; i += kThreads) {
      Ls[i] = lse[bh * T + qb * kBlk + i];
      Ds[i] = delta[bh * T + qb * kBlk + i];
    }
    __syncthreads();
    mm_abt(STw, kf, Qs);    // Sᵀ = K·Qᵀ
    mm_abt(dPTw, vf, dOs);  // dPᵀ = V·dOᵀ
    __syncwarp();
    for (int j = 0; j < kBlk / 2; ++j) {
      const int c = h + 2 * j;  // query column
      const float p =
          krow <= qb * kBlk + c ? __expf(STw[r * kLdS + c] * scale - Ls[c]) : 0.0f;
      PTw[r * kLd + c] = __float2bfloat16_rn(p);
      dSTw[r * kLd + c] = __float2bfloat16_rn(p * (dPTw[r * kLdS + c] - Ds[c]) * scale);
    }
    __syncwarp();
    mm_ab_acc(dv_acc, PTw, dOs);  // dV += Pᵀ·dO
    mm_ab_acc(dk_acc, dSTw, Qs);  // dK += dSᵀ·Q
  }
  const size_t row0 = head + static_cast<size_t>(kb * kBlk + warp * 16) * kHS;
  store_rows(dk + row0, dk_acc, STw, lane);
  __syncwarp();
  store_rows(dv + row0, dv_acc, STw, lane);
}

// Dynamic shared memory above 48 KiB must be opted into once per kernel and device.
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  DDILOCO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
}

}  // namespace

namespace detail {

void flash_forward(const bf16* q, const bf16* k, const bf16* v, bf16* y, float* lse, int BNH,
                   int T, float scale, cudaStream_t stream) {
  static const bool once = (allow_smem(flash_forward_kernel, kFwdSmem), true);
  (void)once;
  const dim3 grid(T / kBlk, BNH);
  flash_forward_kernel<<<grid, kThreads, kFwdSmem, stream>>>(q, k, v, y, lse, T, scale);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void flash_backward(const bf16* q, const bf16* k, const bf16* v, const bf16* dy,
                    const float* lse, const float* delta, bf16* dq, bf16* dk, bf16* dv, int BNH,
                    int T, float scale, cudaStream_t stream, OpProfiler* prof) {
  static const bool once = (allow_smem(flash_backward_dq_kernel, kDqSmem),
                            allow_smem(flash_backward_dkdv_kernel, kDkvSmem), true);
  (void)once;
  const dim3 grid(T / kBlk, BNH);
  // FLOPs of the tiles on or below the diagonal (the ones computed): per (64×64) tile pair,
  // 2·64·64·64 per product; dK/dV recomputes S, dP and forms dV, dK (4 products), dQ
  // recomputes S, dP and forms dQ (3).
  const double nb = T / kBlk;
  const double tile = 2.0 * kBlk * kBlk * 64 * BNH * nb * (nb + 1) / 2;
  {
    ProfileScope ps(prof, "dK,dV kernel", prof ? 4 * tile : 0);
    flash_backward_dkdv_kernel<<<grid, kThreads, kDkvSmem, stream>>>(q, k, v, dy, lse, delta,
                                                                     dk, dv, T, scale);
    DDILOCO_CUDA_CHECK_LAUNCH();
  }
  ProfileScope ps(prof, "dQ kernel", prof ? 3 * tile : 0);
  flash_backward_dq_kernel<<<grid, kThreads, kDqSmem, stream>>>(q, k, v, dy, lse, delta, dq, T,
                                                                scale);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

void flash_delta(float* delta, const bf16* dout, const bf16* out, int B, int T, int NH,
                 cudaStream_t stream) {
  const size_t warps = static_cast<size_t>(B) * T * NH;
  flash_delta_kernel<<<blocks_for(warps * kWarp, 256), 256, 0, stream>>>(delta, dout, out, B, T,
                                                                        NH);
  DDILOCO_CUDA_CHECK_LAUNCH();
}

}  // namespace detail
}  // namespace ddiloco::gpu
