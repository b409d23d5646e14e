// ranks: 2
// Data parallelism inside a learner unit: R ranks with batch B each equal one rank with
// batch R·B (within fp32 tolerance), and the ranks stay bit-identical.
#include <cmath>

#include "ddiloco/config.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/trainer.hpp"
#include "mpi_test_main.hpp"

namespace ddiloco {
namespace {

Config tiny_config(int batch) {
  Config c;
  c.model = GptConfig{64, 16, 2, 2, 16};
  c.train.batch_size = batch;
  c.train.steps = 10;
  c.train.warmup_steps = 2;
  c.train.lr = 3e-3;
  return c;
}

std::vector<int32_t> random_tokens(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(64));
  return t;
}

TEST(UnitDataParallel, EqualsOneRankWithTheWholeBatch) {
  const int ranks = mpi::size(MPI_COMM_WORLD), rank = mpi::rank(MPI_COMM_WORLD);
  const int B = 3, T = 16;
  UnitTrainer unit(tiny_config(B), MPI_COMM_WORLD);
  UnitTrainer single(tiny_config(B * ranks), MPI_COMM_SELF);
  for (int step = 0; step < 4; ++step) {
    // The whole batch of the step: rows [r·B, (r+1)·B) belong to rank r.
    const auto inputs = random_tokens(static_cast<size_t>(ranks) * B * T, 100 + step);
    const auto targets = random_tokens(inputs.size(), 200 + step);
    const size_t mine = static_cast<size_t>(rank) * B * T;
    const StepStats s = unit.step_on(inputs.data() + mine, targets.data() + mine);
    const StepStats ref = single.step_on(inputs.data(), targets.data());
    EXPECT_NEAR(s.loss, ref.loss, 1e-5 * ref.loss) << "step " << step;
    EXPECT_NEAR(s.grad_norm, ref.grad_norm, 1e-4 * ref.grad_norm) << "step " << step;
    EXPECT_EQ(s.tokens, static_cast<int64_t>(ranks) * B * T);
  }
  const auto p = unit.model().parameters();
  const auto q = single.model().parameters();
  double worst = 0;
  for (size_t i = 0; i < p.size(); ++i) worst = std::max(worst, double(std::abs(p[i] - q[i])));
  EXPECT_LT(worst, 2e-5) << "max |θ_dp − θ_single| after 4 AdamW steps";

  // Every rank holds exactly the same parameters (bit for bit).
  std::vector<float> root(p.begin(), p.end());
  mpi::broadcast(root, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(std::equal(root.begin(), root.end(), p.begin()));
}

TEST(UnitDataParallel, ValidationLossDoesNotDependOnRankCount) {
  Config c = tiny_config(2);
  UnitTrainer unit(c, MPI_COMM_WORLD);
  UnitTrainer single(c, MPI_COMM_SELF);
  // 7 sequences: uneven over 2 ranks and over batches of 2.
  std::vector<std::filesystem::path> none;
  const auto tokens = random_tokens(7 * 16 + 1, 5);
  std::vector<uint16_t> t16(tokens.begin(), tokens.end());
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ddiloco-val-" + std::to_string(::getpid()));
  write_shard(dir / "val.bin", t16);
  const ValidationSet val({dir / "val.bin"}, 64, 16, 1000);
  ASSERT_EQ(val.sequences(), 7);
  const double a = unit.validation_loss(val);
  const double b = single.validation_loss(val);
  EXPECT_NEAR(a, b, 1e-6);
  MPI_Barrier(MPI_COMM_WORLD);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddiloco
