// GEMMs on cuBLASLt: bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F), bf16 or fp32
// output, bias in the epilogue. Plans (descriptors + the heuristic's algorithm) are cached
// per shape so the step's ~100 GEMMs do not each pay for a heuristic query.
#include <cstdint>

#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/kernels.hpp"
#include "ddiloco/error.hpp"

namespace ddiloco::gpu {

struct BlasContext::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// Largest power of two (≤ 256) dividing the address: the heuristic must only return
// algorithms whose vector loads this pointer can serve.
int alignment_of(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  int a = 1;
  while (a < 256 && (x % (2 * a)) == 0) a *= 2;
  return a;
}

}  // namespace

BlasContext::BlasContext(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_bytes_(workspace_bytes) {
  DDILOCO_CUBLAS_CHECK(cublasCreate(&cublas_));
  DDILOCO_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  DDILOCO_CUBLAS_CHECK(cublasLtCreate(&lt_));
  DDILOCO_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  // One workspace for both libraries: everything runs in order on the one stream.
  DDILOCO_CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_, workspace_bytes_));
}

BlasContext::~BlasContext() {
  for (auto& [key, plan] : plans_) delete plan;
  if (lt_) cublasLtDestroy(lt_);
  if (cublas_) cublasDestroy(cublas_);
  if (workspace_) cudaFree(workspace_);
}

BlasContext::Plan& BlasContext::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  const auto [ta, tb, m, n, k, lda, ldb, ldd, d_fp32, has_bias, beta_nonzero, align_a, align_b,
              align_d] = key;
  (void)beta_nonzero;  // part of the key only: beta ≠ 0 reads C, which may favour other tiles
  auto* p = new Plan;
  try {
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &opa, sizeof(opa)));
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &opb, sizeof(opb)));
    const cublasLtEpilogue_t epilogue =
        has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof(epilogue)));
    // Stored shapes: op(A) is (m,k), so A is (k,m) when transposed; likewise B.
    DDILOCO_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
    DDILOCO_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
    DDILOCO_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&p->d, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const uint32_t aa = align_a, ab = align_b, ad = align_d;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                         sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                         sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad,
                                         sizeof(ad));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad,
                                         sizeof(ad));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->d,
                                                             p->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cuBLASLt has no algorithm for GEMM m={} n={} k={} transA={} transB={} lda={} "
           "ldb={} ldd={} D={} bias={} (alignments {}/{}/{} bytes): {}",
           m, n, k, ta, tb, lda, ldb, ldd, d_fp32 ? "fp32" : "bf16", has_bias, align_a, align_b,
           align_d, cublasGetStatusString(st));
    p->algo = result.algo;
  } catch (...) {
    delete p;
    throw;
  }
  plans_.emplace(key, p);
  return *p;
}

void BlasContext::gemm(bool trans_a, bool trans_b, int m, int n, int k, const bf16* A, int lda,
                       const bf16* B, int ldb, void* D, bool d_fp32, int ldd, float beta,
                       const bf16* bias) {
  if (bias != nullptr && d_fp32) fail("BlasContext::gemm: a bias needs a bf16 output");
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldd, d_fp32, bias != nullptr, beta != 0.0f,
                alignment_of(A), alignment_of(B), alignment_of(D)};
  Plan& p = plan(key);
  if (bias != nullptr)
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f;
  DDILOCO_CUBLAS_CHECK(cublasLtMatmul(lt_, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.d, D, p.d,
                                      &p.algo, workspace_, workspace_bytes_, stream_));
}

void matmul_forward(BlasContext& blas, bf16* out, const bf16* inp, const bf16* w,
                    const bf16* bias, int N, int IN, int OUT, int ld_out) {
  if (ld_out == 0) ld_out = OUT;
  if (ld_out < OUT) fail("matmul_forward: row stride {} < OUT = {}", ld_out, OUT);
  // Column-major view: outᵀ(OUT,N) = w(IN,OUT col-major)ᵀ · inpᵀ(IN,N).
  blas.gemm(true, false, OUT, N, IN, w, IN, inp, IN, out, false, ld_out, 0.0f, bias);
}

void matmul_backward(BlasContext& blas, bf16* dinp, float* dw, float* dbias, const bf16* dout,
                     const bf16* inp, const bf16* w, int N, int IN, int OUT, int ld_dout) {
  if (ld_dout == 0) ld_dout = OUT;
  if (ld_dout < OUT) fail("matmul_backward: row stride {} < OUT = {}", ld_dout, OUT);
  OpProfiler* prof = blas.profiler();
  const double flops = 2.0 * N * IN * OUT;  // each of the two GEMMs
  if (dinp != nullptr) {
    // dinpᵀ(IN,N) = w(IN,OUT col-major) · doutᵀ(OUT,N)
    ProfileScope ps(prof, "dgrad", flops);
    blas.gemm(false, false, IN, N, OUT, w, IN, dout, ld_dout, dinp, false, IN, 0.0f, nullptr);
  }
  {
    // dwᵀ(IN,OUT) += inpᵀ(IN,N) · dout(N,OUT), fp32 output accumulated in place (beta = 1).
    ProfileScope ps(prof, "wgrad", flops);
    blas.gemm(false, true, IN, OUT, N, inp, IN, dout, ld_dout, dw, true, IN, 1.0f, nullptr);
  }
  if (dbias != nullptr) {
    ProfileScope ps(prof, "bias grad");
    bias_backward(dbias, dout, N, OUT, ld_dout, blas.stream());
  }
}

}  // namespace ddiloco::gpu
