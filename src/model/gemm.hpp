// Row-major GEMM through CBLAS for float and double, so the layer code is written once.
//
// Results independent of the thread count. OpenBLAS's threaded GEMM splits C among as many
// threads as it is given, and its result depends on that split: the same product differed in
// the last bits between 1, 2 and 3 threads (on the AVX2 "Haswell" kernels for every shape
// it threads, on the SSE3 ones for sizes that are not multiples of their blocking), so the
// ranks of a unit drifted apart when their run.threads differed (3.9e-6 after 25 steps in
// tests/e2e/runtime_identity.sh with OPENBLAS_CORETYPE=Haswell). gemm() therefore cuts the
// product into units fixed by the shape alone (tiles of C, and for a small C chunks of K
// whose partial products are added in a fixed order), hands the units to the OpenMP threads,
// and computes each with one single-threaded OpenBLAS call: every element comes from the
// same calls and additions whatever the number of threads. OpenBLAS's OpenMP build
// runs single-threaded inside an active parallel region (omp_in_parallel()) and in a team of
// one (omp_get_max_threads() == 1), so it never picks a thread count of its own here.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <vector>

namespace ddiloco::detail {

/// One CBLAS call: C(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · C, row-major, leading
/// dimensions given. For use inside a parallel region, where OpenBLAS runs single-threaded
/// (the attention's per-head products); elsewhere use gemm().
inline void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float* A, int lda, const float* B, int ldb, float beta, float* C,
                        int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
inline void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, double alpha,
                        const double* A, int lda, const double* B, int ldb, double beta,
                        double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/// How gemm() cuts a product into work units, from the shape alone (never the thread
/// count): C in near-equal tiles of at most kTileMax × kTileMax (multiples of 16), and, when
/// that gives fewer than kMinUnits tiles and K is long (the weight gradients: a small C
/// summed over all B·T rows), K in chunks of at least kChunkMin whose partial products are
/// added in chunk order; only then smaller tiles, down to kTileMin. Each tile re-packs its
/// rows of op(A) and columns of op(B), so tiles are kept large: with 128 × 128 tiles, or
/// splitting the weight gradients' C instead of K, the AVX2 kernels did 6–40 % more work per
/// product than one untiled call; with this plan the demo model's products cost 5 % more
/// on one thread (AVX2; 1 % on SSE3), and at 2 threads they run as fast as OpenBLAS's own
/// threading within this machine's noise.
struct GemmPlan {
  static constexpr int kTileMax = 256;
  static constexpr int kTileMin = 64;
  static constexpr int kMinUnits = 8;
  static constexpr int kChunkMin = 256;
  int rows, cols;            ///< tile size (the last tile along each side may be smaller)
  int row_tiles, col_tiles;  ///< tiles along M and N
  int chunk, chunks;         ///< K-chunk length, chunk count (1: no split)

  GemmPlan(int M, int N, int K) {
    if (M <= 0 || N <= 0) {  // nothing to compute
      rows = cols = chunk = chunks = 1;
      row_tiles = col_tiles = 0;
      return;
    }
    // n split in `parts` near-equal pieces, a multiple of 16 long except a short last one.
    auto piece = [](int n, int parts) {
      return std::max(1, std::min(n, ((n + parts - 1) / parts + 15) / 16 * 16));
    };
    auto count = [](int n, int size) { return size > 0 ? (n + size - 1) / size : 0; };
    rows = piece(M, count(M, kTileMax));
    cols = piece(N, count(N, kTileMax));
    row_tiles = count(M, rows);
    col_tiles = count(N, cols);
    const int tiles = row_tiles * col_tiles;
    chunks = 1;
    if (tiles < kMinUnits)
      chunks = std::max(1, std::min((kMinUnits + tiles - 1) / tiles, K / kChunkMin));
    chunk = piece(K, chunks);
    chunks = K > 0 ? count(K, chunk) : 1;
    while (row_tiles * col_tiles * chunks < kMinUnits) {
      const bool split_rows = rows / 2 >= kTileMin, split_cols = cols / 2 >= kTileMin;
      if (split_rows && (rows >= cols || !split_cols))
        rows = piece(M, 2 * row_tiles);
      else if (split_cols)
        cols = piece(N, 2 * col_tiles);
      else
        break;
      row_tiles = count(M, rows);
      col_tiles = count(N, cols);
    }
  }
};

/// C(M,N) = alpha · op(A)(M,K) · op(B)(K,N) + beta · C, row-major, on the OpenMP threads,
/// bit-identical for any number of them (see the top of this file). Meant for calls outside
/// a parallel region; inside one (nested regions inactive) the units run on the calling
/// thread, with the same result.
template <typename S>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, S alpha, const S* A, int lda,
          const S* B, int ldb, S beta, S* C, int ldc) {
  const GemmPlan p(M, N, K);
  const int tiles = p.row_tiles * p.col_tiles;
  if (tiles == 0) return;
  // K-chunk 0 goes straight into C with the caller's beta; chunk c ≥ 1 into its own (M,N)
  // scratch, added to C in order c = 1, 2, ... once all are done.
  thread_local std::vector<S> partial;
  if (p.chunks > 1) partial.resize(static_cast<size_t>(p.chunks - 1) * M * N);
  S* const P = partial.data();
  // Always a parallel region, even for one unit: outside one, OpenBLAS would thread the call.
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int u = 0; u < tiles * p.chunks; ++u) {
      // Chunk-major, so that consecutive units (one thread's static share) span the tiles.
      const int c = u / tiles, i = u % tiles;
      const int r0 = (i / p.col_tiles) * p.rows, c0 = (i % p.col_tiles) * p.cols;
      const int m = std::min(p.rows, M - r0), n = std::min(p.cols, N - c0);
      const int k0 = c * p.chunk, k = std::min(p.chunk, K - k0);
      // Rows r0.. and inner indices k0.. of op(A), inner k0.. and columns c0.. of op(B).
      const S* a = trans_a ? A + static_cast<long>(k0) * lda + r0
                           : A + static_cast<long>(r0) * lda + k0;
      const S* b = trans_b ? B + static_cast<long>(c0) * ldb + k0
                           : B + static_cast<long>(k0) * ldb + c0;
      if (c == 0)
        gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                    C + static_cast<long>(r0) * ldc + c0, ldc);
      else
        gemm_serial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, S(0),
                    P + (static_cast<long>(c - 1) * M + r0) * N + c0, N);
    }
    if (p.chunks > 1) {
#pragma omp for schedule(static)
      for (int r = 0; r < M; ++r) {
        S* out = C + static_cast<long>(r) * ldc;
        for (int c = 1; c < p.chunks; ++c) {
          const S* add = P + (static_cast<long>(c - 1) * M + r) * N;
          for (int j = 0; j < N; ++j) out[j] += add[j];
        }
      }
    }
  }
}

}  // namespace ddiloco::detail
