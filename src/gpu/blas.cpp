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
  for (auto& [key, plan] : plans_) delete plan;  // null entries: no-op
  if (lt_) cublasLtDestroy(lt_);
  if (cublas_) cublasDestroy(cublas_);
  if (workspace_) cudaFree(workspace_);
}

namespace {

cublasLtEpilogue_t lt_epilogue_of(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The matmul descriptor's transposes, epilogue and epilogue pointers. The heuristic derives
// the bias and aux alignments from the pointers (cublasLt.h), so they are set before it runs;
// calls with the same alignments reuse its algorithm.
void describe_matmul(cublasLtMatmulDesc_t desc, bool ta, bool tb, Epilogue epilogue, int ldd, const void* bias,
              const void* aux) {
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const cublasLtEpilogue_t lt_epilogue = lt_epilogue_of(epilogue);
  DDILOCO_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt_epilogue, sizeof(lt_epilogue)));
  if (bias != nullptr)
    DDILOCO_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (epilogue == Epilogue::gelu_aux_bias || epilogue == Epilogue::dgelu) {
    // The aux matrix has D's shape and leading dimension; its type defaults to D's (bf16).
    const int64_t aux_ld = ldd;
    DDILOCO_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    DDILOCO_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
}

// What the heuristic may use: the workspace and the operands' alignments (bytes).
cublasLtMatmulPreference_t preference(uint64_t workspace, uint32_t align_a, uint32_t align_b, uint32_t align_d) {
  cublasLtMatmulPreference_t pref = nullptr;
  DDILOCO_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  };
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  return pref;
}

}  // namespace

BlasContext::Plan* BlasContext::plan(const Key& key, const void* bias, const void* aux) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  const auto [ta, tb, m, n, k, lda, ldb, ldd, d_fp32, epilogue_code, beta_nonzero, align_a,
              align_b, align_d, align_bias, align_aux] = key;
  (void)beta_nonzero;  // part of the key only: beta ≠ 0 reads C, which may favour other tiles
  // Part of the key only: the heuristic reads the bias and aux pointers themselves.
  (void)align_bias;
  (void)align_aux;
  auto* p = new Plan;
  try {
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    describe_matmul(p->desc, ta, tb, static_cast<Epilogue>(epilogue_code), ldd, bias, aux);
    // Stored shapes: op(A) is (m,k), so A is (k,m) when transposed; likewise B.
    DDILOCO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
    DDILOCO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
    DDILOCO_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, ldd));
    cublasLtMatmulPreference_t pref = preference(workspace_bytes_, align_a, align_b, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((st == CUBLAS_STATUS_SUCCESS && found == 0) || st == CUBLAS_STATUS_NOT_SUPPORTED) {
      // Remembered as "none", so an optional fused GEMM asks the heuristic once, not per call.
      delete p;
      plans_.emplace(key, nullptr);
      return nullptr;
    }
    if (st != CUBLAS_STATUS_SUCCESS)
      fail("cuBLASLt heuristic failed for GEMM m={} n={} k={} transA={} transB={} lda={} "
           "ldb={} ldd={} D={} epilogue={}: {}",
           m, n, k, ta, tb, lda, ldb, ldd, d_fp32 ? "fp32" : "bf16", epilogue_code,
           cublasGetStatusString(st));
    p->algo = result.algo;
  } catch (...) {
    delete p;
    throw;
  }
  plans_.emplace(key, p);
  return p;
}

bool BlasContext::gemm(bool trans_a, bool trans_b, int m, int n, int k, const bf16* A, int lda,
                       const bf16* B, int ldb, void* D, bool d_fp32, int ldd, float beta,
                       Epilogue epilogue, const bf16* bias, const bf16* aux, bool optional) {
  const bool wants_bias = epilogue == Epilogue::bias || epilogue == Epilogue::gelu_aux_bias;
  const bool wants_aux = epilogue == Epilogue::gelu_aux_bias || epilogue == Epilogue::dgelu;
  if (epilogue != Epilogue::none && d_fp32)
    fail("BlasContext::gemm: epilogue {} needs a bf16 output", static_cast<int>(epilogue));
  if (wants_bias != (bias != nullptr))
    fail("BlasContext::gemm: epilogue {} {} a bias", static_cast<int>(epilogue),
         wants_bias ? "needs" : "takes no");
  if (wants_aux != (aux != nullptr))
    fail("BlasContext::gemm: epilogue {} {} an aux matrix", static_cast<int>(epilogue),
         wants_aux ? "needs" : "takes no");
  if (wants_aux && ldd % 8 != 0)
    fail("BlasContext::gemm: the GELU epilogues need a leading dimension divisible by 8, got {}",
         ldd);
  const Key key{trans_a, trans_b, m, n, k, lda, ldb, ldd, d_fp32, static_cast<int>(epilogue),
                beta != 0.0f, alignment_of(A), alignment_of(B), alignment_of(D),
                bias ? alignment_of(bias) : 0, aux ? alignment_of(aux) : 0};
  Plan* p = plan(key, bias, aux);
  if (p == nullptr) {
    if (optional) {
      ++optional_misses_;
      return false;
    }
    fail("cuBLASLt has no algorithm for GEMM m={} n={} k={} transA={} transB={} lda={} ldb={} "
         "ldd={} D={} epilogue={} (alignments {}/{}/{} bytes)",
         m, n, k, trans_a, trans_b, lda, ldb, ldd, d_fp32 ? "fp32" : "bf16",
         static_cast<int>(epilogue), alignment_of(A), alignment_of(B), alignment_of(D));
  }
  // Per-call pointers live in the cached descriptor: set them before every launch.
  if (bias != nullptr)
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (aux != nullptr)
    DDILOCO_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  const float alpha = 1.0f;
  DDILOCO_CUBLAS_CHECK(cublasLtMatmul(lt_, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->d, D,
                                      p->d, &p->algo, workspace_, workspace_bytes_, stream_));
  return true;
}

void matmul_forward(BlasContext& blas, bf16* out, const bf16* inp, const bf16* w,
                    const bf16* bias, int N, int IN, int OUT, int ld_out, bf16* pre_gelu) {
  if (ld_out == 0) ld_out = OUT;
  if (ld_out < OUT) fail("matmul_forward: row stride {} < OUT = {}", ld_out, OUT);
  // Column-major view: outᵀ(OUT,N) = w(IN,OUT col-major)ᵀ · inpᵀ(IN,N).
  if (pre_gelu == nullptr) {
    blas.gemm(true, false, OUT, N, IN, w, IN, inp, IN, out, false, ld_out, 0.0f,
              bias ? Epilogue::bias : Epilogue::none, bias);
    return;
  }
  if (bias == nullptr || ld_out != OUT)
    fail("matmul_forward: the fused GELU needs a bias and dense rows (ld_out {} vs OUT {})",
         ld_out, OUT);
  // The aux matrix needs a leading dimension divisible by 8; other widths run unfused.
  if (OUT % 8 == 0 && blas.gemm(true, false, OUT, N, IN, w, IN, inp, IN, out, false, OUT, 0.0f,
                                Epilogue::gelu_aux_bias, bias, pre_gelu, /*optional=*/true))
    return;
  blas.gemm(true, false, OUT, N, IN, w, IN, inp, IN, pre_gelu, false, OUT, 0.0f, Epilogue::bias,
            bias);
  gelu_forward(out, pre_gelu, static_cast<long>(N) * OUT, blas.stream());
}

void matmul_backward(BlasContext& blas, bf16* dinp, float* dw, float* dbias, const bf16* dout,
                     const bf16* inp, const bf16* w, int N, int IN, int OUT, int ld_dout,
                     const bf16* pre_gelu) {
  if (ld_dout == 0) ld_dout = OUT;
  if (ld_dout < OUT) fail("matmul_backward: row stride {} < OUT = {}", ld_dout, OUT);
  if (pre_gelu != nullptr && dinp == nullptr)
    fail("matmul_backward: a GELU input without an input gradient to apply it to");
  OpProfiler* prof = blas.profiler();
  const double flops = 2.0 * N * IN * OUT;  // each of the two GEMMs
  if (dinp != nullptr) {
    // dinpᵀ(IN,N) = w(IN,OUT col-major) · doutᵀ(OUT,N)
    ProfileScope ps(prof, pre_gelu ? "dgrad (+dgelu)" : "dgrad", flops);
    const bool fused =
        pre_gelu != nullptr && IN % 8 == 0 &&
        blas.gemm(false, false, IN, N, OUT, w, IN, dout, ld_dout, dinp,
                                         false, IN, 0.0f, Epilogue::dgelu, nullptr, pre_gelu,
                                         /*optional=*/true);
    if (!fused) {
      blas.gemm(false, false, IN, N, OUT, w, IN, dout, ld_dout, dinp, false, IN, 0.0f);
      if (pre_gelu != nullptr)
        gelu_backward(dinp, pre_gelu, dinp, static_cast<long>(N) * IN, blas.stream());
    }
  }
  {
    // dwᵀ(IN,OUT) += inpᵀ(IN,N) · dout(N,OUT), fp32 output accumulated in place (beta = 1).
    ProfileScope ps(prof, "wgrad", flops);
    blas.gemm(false, true, IN, OUT, N, inp, IN, dout, ld_dout, dw, true, IN, 1.0f);
  }
  if (dbias != nullptr) {
    ProfileScope ps(prof, "bias grad");
    bias_backward(dbias, dout, N, OUT, ld_dout, blas.stream());
  }
}

}  // namespace ddiloco::gpu
