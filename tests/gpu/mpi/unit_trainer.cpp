// ranks: 1
// UnitTrainer with run.device: cuda (src/gpu/gpu_unit.cpp) against the CPU UnitTrainer: the
// same initial weights, steps that track the CPU's within bf16 tolerance, the host mirror's
// download/upload of parameters and AdamW state, the leader's fragment snapshots and staged
// merges, and the GPU validation loss. One rank (a unit of one); skipped without a device.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <vector>

#include "ddiloco/config.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/unit_backend.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/shard.hpp"
#include "ddiloco/trainer.hpp"
#include "gpu_test.hpp"
#include "unit_config.hpp"
#include "mpi/mpi_test_main.hpp"

namespace ddiloco {
namespace {

using gpu::test::random_tokens;

Config small_config(const char* device, const char* attention = "auto") {
  return gpu::test::small_unit_config(device, attention);
}

class GpuUnitTrainer : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    DDILOCO_REQUIRE_GPU();
    gpu::install_cuda_unit_backend();
  }
};

TEST_P(GpuUnitTrainer, StartsFromTheCpuWeightsAndTracksItsSteps) {
  UnitTrainer cpu(small_config("cpu"), MPI_COMM_WORLD);
  UnitTrainer dev(small_config("cuda", GetParam()), MPI_COMM_WORLD);
  ASSERT_NE(dev.gpu(), nullptr);
  EXPECT_EQ(cpu.gpu(), nullptr);
  std::vector<float> start(cpu.model().parameters().size());
  dev.gpu()->download_parameters(start);
  const auto ref = cpu.model().parameters();
  EXPECT_TRUE(std::equal(start.begin(), start.end(), ref.begin())) << "initial weights differ";

  const size_t n = 4 * 64;
  for (int step = 0; step < 8; ++step) {
    const auto in = random_tokens(n, 100 + step), tgt = random_tokens(n, 200 + step);
    const StepStats a = cpu.step_on(in.data(), tgt.data());
    const StepStats b = dev.step_on(in.data(), tgt.data());
    EXPECT_NEAR(b.loss, a.loss, 0.02 * a.loss) << "step " << step;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 0.1 * a.grad_norm + 1e-3) << "step " << step;
    EXPECT_DOUBLE_EQ(b.lr, a.lr);
    EXPECT_EQ(b.tokens, a.tokens);
  }
  // The host mirror: parameters and AdamW state come down on request.
  dev.download_state();
  EXPECT_EQ(dev.optimizer().step_count(), 8);
  // The 8 steps' update θ₈ − θ₀ on the GPU against the CPU's (θ₀ = `start`, the CPU's θ₈ =
  // `ref`): mean |Δ_gpu − Δ_cpu| ≤ 0.35 · mean |Δ_cpu|. (The old bound, max |θ_gpu − θ_cpu| <
  // 0.05 · max |θ|, passed a trainer that never updates: 8 steps move no element 0.05.)
  // Measured with two CPU trainers: mean |Δ_cpu| = 8.0e-3 (2.7 lr); one that never updates is
  // 1.0 of it apart, one at half the learning rate 0.57. Elements whose gradient is within bf16
  // noise of zero may move ≈ 2·lr apart per step (Adam's first updates are ≈ lr·sign(g)), as
  // in test_gpu_parity.cpp, whose mean over all elements after 3 steps is ≤ 0.25·lr.
  const auto theta = dev.model().parameters();
  double apart = 0, moved = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    apart += std::abs(static_cast<double>(theta[i]) - ref[i]);
    moved += std::abs(static_cast<double>(ref[i]) - start[i]);
  }
  apart /= static_cast<double>(ref.size());
  moved /= static_cast<double>(ref.size());
  std::printf("gpu unit trainer (%s): mean |Δθ| after 8 steps: cpu %.3g, gpu - cpu %.3g (%.2f of it)\n",
              GetParam(), moved, apart, apart / moved);
  EXPECT_GT(moved, 0.5 * 3e-3) << "the CPU trainer hardly moved: the comparison means nothing";
  EXPECT_LE(apart, 0.35 * moved) << "the GPU's update θ₈ − θ₀ is not the CPU's";
  const auto m = dev.optimizer().first_moment();
  EXPECT_TRUE(std::any_of(m.begin(), m.end(), [](float x) { return x != 0; }));
}

TEST_P(GpuUnitTrainer, UploadAndDownloadRoundTrip) {
  UnitTrainer dev(small_config("cuda", GetParam()), MPI_COMM_WORLD);
  auto params = dev.model().parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 97) * 1e-3f;
  auto m = dev.optimizer().first_moment(), v = dev.optimizer().second_moment();
  std::fill(m.begin(), m.end(), 0.25f);
  std::fill(v.begin(), v.end(), 0.5f);
  dev.optimizer().set_step_count(41);
  dev.upload_state();
  const std::vector<float> sent(params.begin(), params.end());
  std::fill(params.begin(), params.end(), 0.0f);
  std::fill(m.begin(), m.end(), 0.0f);
  dev.optimizer().set_step_count(0);
  dev.download_state();
  EXPECT_TRUE(std::equal(sent.begin(), sent.end(), params.begin()));
  EXPECT_EQ(m[0], 0.25f);
  EXPECT_EQ(v[v.size() - 1], 0.5f);
  EXPECT_EQ(dev.optimizer().step_count(), 41);
}

TEST_P(GpuUnitTrainer, SnapshotsAndStagedMergesMoveFragments) {
  UnitTrainer dev(small_config("cuda", GetParam()), MPI_COMM_WORLD);
  gpu::UnitBackend& g = *dev.gpu();
  const protocol::FragmentPlan plan(dev.model().layout(), 3, 6);
  g.attach_fragments(plan, /*leader=*/true);
  const auto in = random_tokens(4 * 64, 7), tgt = random_tokens(4 * 64, 8);
  dev.step_on(in.data(), tgt.data());
  dev.download_state(false);
  for (int p = 0; p < plan.size(); ++p) {
    const size_t numel = plan.fragments()[p].numel;
    // Snapshot = the fragment as it is at the boundary, packed as protocol::FragmentPlan::pack packs it.
    g.start_snapshot(p);
    g.wait_snapshot(p);
    std::vector<float> packed(numel);
    plan.pack(p, dev.model().parameters(), packed);
    const auto snap = g.snapshot(p);
    ASSERT_EQ(snap.size(), numel);
    EXPECT_TRUE(std::equal(snap.begin(), snap.end(), packed.begin())) << "fragment " << p;
    // Two merges staged before the boundary: the newer is applied (overwrite).
    std::vector<float> older(numel, -1.0f), newer(numel);
    for (size_t i = 0; i < numel; ++i) newer[i] = 0.001f * static_cast<float>(i % 113) + p;
    g.stage_merge(p, older);
    g.stage_merge(p, newer);
    g.apply_merge(p);
    std::vector<float> back(numel);
    g.download_fragment(p, back);
    EXPECT_EQ(back, newer) << "fragment " << p;
    // The host path (blend, carry, rejoin) round-trips too.
    g.upload_fragment(p, older);
    g.download_fragment(p, back);
    EXPECT_EQ(back, older);
    g.upload_fragment(p, packed);  // trained weights back for the step below
  }
  // Training goes on after the merges (the bf16 copy was refreshed; the loss stays finite).
  const StepStats s = dev.step_on(in.data(), tgt.data());
  EXPECT_TRUE(std::isfinite(s.loss));
}

TEST_P(GpuUnitTrainer, ValidationLossMatchesTheCpu) {
  UnitTrainer cpu(small_config("cpu"), MPI_COMM_WORLD);
  UnitTrainer dev(small_config("cuda", GetParam()), MPI_COMM_WORLD);
  // 10 sequences of 64 + 1 tokens: two full batches of 4 and a partial one of 2.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("ddiloco_gpu_val_{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::vector<uint16_t> tokens(10 * 65);
  Rng rng(5);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng.next_u64() % 256);
  write_shard(dir / "val_0.bin", tokens);
  const ValidationSet val({dir / "val_0.bin"}, 256, 64, 10 * 65);
  const double a = cpu.validation_loss(val), b = dev.validation_loss(val);
  std::filesystem::remove_all(dir);
  EXPECT_NEAR(b, a, 0.01 * a);
  EXPECT_GT(a, 4.0);  // about ln 256 = 5.55 for the initial weights
}

INSTANTIATE_TEST_SUITE_P(Attention, GpuUnitTrainer, ::testing::Values("flash", "cublas"));

}  // namespace
}  // namespace ddiloco
