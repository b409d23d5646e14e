// HostStaging (include/ddiloco/gpu/host_staging.hpp): fragment snapshots device → pinned host
// and merged fragments host → device on the copy stream, while the compute stream is busy.
// Skipped where there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/gpu/host_staging.hpp"
#include "ddiloco/model.hpp"
#include "gpu_test.hpp"

namespace ddiloco::gpu {
namespace {

// Keeps the compute stream busy for kBusyMs: a host function that sleeps blocks everything
// enqueued after it on that stream, which is what a long forward/backward looks like to the
// copy stream (and needs no kernel, so this file builds with the host compiler).
void CUDART_CB sleep_on_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

int kBusyMs = 300;  // far longer than the copies (a few MB)

// Polls `ready` with short sleeps (never a busy spin), at most `limit`.
template <typename F>
bool poll(F&& ready, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

bool done(cudaEvent_t e) {
  const cudaError_t s = cudaEventQuery(e);
  if (s == cudaErrorNotReady) return false;
  DDILOCO_CUDA_CHECK(s);
  return true;
}

struct Fixture {
  size_t n = 0;
  float* d = nullptr;
  cudaStream_t compute = nullptr;
  cudaEvent_t marker = nullptr;
  float* ones = nullptr;
  cublasHandle_t blas = nullptr;
  explicit Fixture(const std::vector<float>& init) : n(init.size()) {
    DDILOCO_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
    DDILOCO_CUDA_CHECK(cudaMalloc(&ones, n * sizeof(float)));
    const std::vector<float> h_ones(n, 1.0f);
    DDILOCO_CUDA_CHECK(cudaMemcpy(ones, h_ones.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    DDILOCO_CUDA_CHECK(cudaMemcpy(d, init.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    DDILOCO_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    DDILOCO_CUDA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
    DDILOCO_CUBLAS_CHECK(cublasCreate(&blas));
    DDILOCO_CUBLAS_CHECK(cublasSetStream(blas, compute));
  }
  ~Fixture() {
    cudaStreamSynchronize(compute);
    cublasDestroy(blas);
    cudaFree(ones);
    cudaEventDestroy(marker);
    cudaStreamDestroy(compute);
    cudaFree(d);
  }
  // One "inner step" stand-in, a kernel on the compute stream: every parameter + 1 (exact in
  // fp32 for the small values here).
  void step() {
    const float one = 1.0f;
    DDILOCO_CUBLAS_CHECK(cublasSaxpy(blas, static_cast<int>(n), &one, ones, 1, d, 1));
  }
  void busy() {
    DDILOCO_CUDA_CHECK(cudaLaunchHostFunc(compute, sleep_on_stream, &kBusyMs));
    DDILOCO_CUDA_CHECK(cudaEventRecord(marker, compute));
  }
  std::vector<float> host() {
    DDILOCO_CUDA_CHECK(cudaStreamSynchronize(compute));
    std::vector<float> h(n);
    DDILOCO_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Three fragments over 1M + 37 parameters, ranges out of order and leaving gaps, as whole
// tensors of a real model do.
HostStaging::FragmentRanges test_ranges() {
  return {{{500'000, 300'000}, {10, 5}},
          {{0, 10}, {800'000, 200'037}},
          {{15, 499'985}}};
}

TEST(HostStaging, SnapshotIsFixedAtTheStepBoundaryAndLandsWhileComputeIsBusy) {
  DDILOCO_REQUIRE_GPU();
  std::vector<float> init(1'000'037);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i % 1000);
  Fixture fx(init);
  HostStaging staging(fx.d, fx.n, test_ranges());
  ASSERT_EQ(staging.fragments(), 3);
  EXPECT_EQ(staging.numel(0), 300'005u);
  EXPECT_EQ(staging.numel(1), 200'047u);

  fx.step();                          // parameters = init + 1
  staging.start_snapshot(0, fx.compute);
  staging.start_snapshot(1, fx.compute);
  fx.busy();                          // the next forward/backward ...
  for (int s = 0; s < 3; ++s) fx.step();  // ... and steps change the parameters meanwhile

  ASSERT_TRUE(poll([&] { return staging.snapshot_ready(0) && staging.snapshot_ready(1); }));
  // The copies overlapped the compute stream: it is still inside the busy work.
  EXPECT_FALSE(done(fx.marker)) << "snapshot became ready only after the compute work";

  const auto ranges = test_ranges();
  for (int p : {0, 1}) {
    auto snap = staging.snapshot(p);
    size_t off = 0, wrong = 0;
    for (const auto& r : ranges[p])
      for (size_t i = 0; i < r.numel; ++i, ++off)
        wrong += snap[off] != init[r.offset + i] + 1.0f;
    EXPECT_EQ(wrong, 0u) << "fragment " << p;
  }
  // The steps after the snapshot did run.
  EXPECT_EQ(fx.host()[12345], init[12345] + 4.0f);
  // A second round of the same fragment.
  staging.start_snapshot(0, fx.compute);
  ASSERT_TRUE(poll([&] { return staging.snapshot_ready(0); }));
  EXPECT_EQ(staging.snapshot(0)[0], init[500'000] + 4.0f);
}

TEST(HostStaging, UploadLandsWhileComputeIsBusyAndAppliesAtTheStepBoundary) {
  DDILOCO_REQUIRE_GPU();
  std::vector<float> init(1'000'037);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i % 777);
  Fixture fx(init);
  HostStaging staging(fx.d, fx.n, test_ranges());

  auto merged = staging.merged_host(1);
  for (size_t i = 0; i < merged.size(); ++i) merged[i] = -static_cast<float>(i % 501);
  fx.busy();
  staging.start_upload(1);
  ASSERT_TRUE(poll([&] { return staging.upload_ready(1); }));
  EXPECT_FALSE(done(fx.marker)) << "upload became ready only after the compute work";
  staging.apply(1, fx.compute);  // queued behind the busy work: the step boundary
  fx.step();                     // the next step sees the merged values

  const auto h = fx.host();
  const auto ranges = test_ranges();
  std::vector<char> in_fragment(h.size(), 0);
  size_t off = 0, wrong = 0;
  for (const auto& r : ranges[1])
    for (size_t i = 0; i < r.numel; ++i, ++off) {
      wrong += h[r.offset + i] != -static_cast<float>(off % 501) + 1.0f;
      in_fragment[r.offset + i] = 1;
    }
  EXPECT_EQ(wrong, 0u);
  size_t touched = 0;
  for (size_t i = 0; i < h.size(); ++i)
    if (!in_fragment[i]) touched += h[i] != init[i] + 1.0f;
  EXPECT_EQ(touched, 0u) << "apply wrote outside fragment 1";

  // The buffers are reusable: a second merge of the same fragment, applied with no busy work.
  auto again = staging.merged_host(1);
  for (float& v : again) v = 7.0f;
  staging.start_upload(1);
  ASSERT_TRUE(poll([&] { return staging.upload_ready(1); }));
  staging.apply(1, fx.compute);
  EXPECT_EQ(fx.host()[800'000], 7.0f);
}

TEST(HostStaging, SnapshotMatchesFragmentPlanPacking) {
  DDILOCO_REQUIRE_GPU();
  GptConfig cfg;
  cfg.vocab_size = 64;
  cfg.seq_len = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 32;
  const ParameterLayout layout = ParameterLayout::gpt2(cfg);
  const protocol::FragmentPlan plan(layout, 3, 6);
  std::vector<float> params(layout.size());
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i) * 0.5f;
  Fixture fx(params);
  HostStaging staging(fx.d, fx.n, HostStaging::ranges(plan, layout));
  for (int p = 0; p < plan.size(); ++p) {
    ASSERT_EQ(staging.numel(p), plan.fragments()[p].numel);
    staging.start_snapshot(p, fx.compute);
  }
  for (int p = 0; p < plan.size(); ++p) {
    ASSERT_TRUE(poll([&] { return staging.snapshot_ready(p); }));
    std::vector<float> packed(plan.fragments()[p].numel);
    plan.pack(p, params, packed);
    auto snap = staging.snapshot(p);
    EXPECT_TRUE(std::equal(packed.begin(), packed.end(), snap.begin())) << "fragment " << p;
  }
}

TEST(HostStaging, CallsOutOfTurnAreRefused) {
  DDILOCO_REQUIRE_GPU();
  std::vector<float> init(1'000'037, 1.0f);
  Fixture fx(init);
  EXPECT_THROW(HostStaging(fx.d, fx.n, {{{999'000, 2'000}}}), Error);  // past the end
  EXPECT_THROW(HostStaging(fx.d, fx.n, {{}}), Error);                  // empty fragment
  HostStaging staging(fx.d, fx.n, test_ranges());
  EXPECT_THROW(staging.snapshot_ready(0), Error);  // nothing started
  EXPECT_THROW(staging.upload_ready(0), Error);
  EXPECT_THROW(staging.apply(0, fx.compute), Error);
  EXPECT_THROW(staging.start_snapshot(3, fx.compute), Error);  // no such fragment

  fx.busy();  // the gather waits behind it, so the snapshot stays in flight
  staging.start_snapshot(2, fx.compute);
  EXPECT_THROW(staging.snapshot(2), Error);
  EXPECT_THROW(staging.start_snapshot(2, fx.compute), Error);
  staging.start_upload(2);
  EXPECT_THROW(staging.merged_host(2), Error);
  EXPECT_THROW(staging.start_upload(2), Error);
  ASSERT_TRUE(poll([&] { return staging.snapshot_ready(2) && staging.upload_ready(2); }));
  staging.apply(2, fx.compute);
  EXPECT_NO_THROW(staging.merged_host(2));
}

}  // namespace
}  // namespace ddiloco::gpu
