// Recovery of Θ by a restarted syncer (recovery.hpp): which copy of each fragment is taken,
// and when the syncer has heard enough to go on.
#include <gtest/gtest.h>

#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/recovery.hpp"

namespace ddiloco::syncer {
namespace {

Offer copy(int unit, int64_t version, std::vector<float> values) { return Offer{unit, version, std::move(values)}; }

TEST(ChooseCopy, TheNewestVersionIsTakenAndItsHoldersNamed) {
  const std::vector<Offer> offers = {copy(2, 7, {1, 2}), copy(0, 9, {3, 4}), copy(1, 9, {3, 4}), copy(3, 8, {5, 6})};
  const Recovered r = choose_copy(offers, /*exact=*/true);
  EXPECT_EQ(r.version, 9);
  EXPECT_EQ(r.values, (std::vector<float>{3, 4}));
  EXPECT_EQ(r.from, (std::vector<int>{0, 1}));
  EXPECT_TRUE(r.outvoted.empty());
  EXPECT_EQ(r.max_diff, 0.0);
}

TEST(ChooseCopy, NothingOfferedIsVersionZero) {
  EXPECT_EQ(choose_copy({}, true).version, 0);
  const Recovered r = choose_copy(std::vector<Offer>{copy(0, 0, {1})}, true);
  EXPECT_EQ(r.version, 0);
  EXPECT_TRUE(r.values.empty());
  EXPECT_TRUE(r.from.empty());
}

// fp32: every unit decoded the same raw values, so copies of one version must be identical; a
// copy that differs (a unit's memory gone bad, or a lie) is outvoted by the identical others.
TEST(ChooseCopy, AnExactCopyThatDiffersIsOutvotedByTheIdenticalOthers) {
  const std::vector<Offer> offers = {copy(0, 5, {9, 9}), copy(1, 5, {1, 2}), copy(2, 5, {1, 2})};
  const Recovered r = choose_copy(offers, true);
  EXPECT_EQ(r.values, (std::vector<float>{1, 2}));
  EXPECT_EQ(r.outvoted, (std::vector<int>{0}));
  EXPECT_EQ(r.from, (std::vector<int>{0, 1, 2}));
  EXPECT_DOUBLE_EQ(r.max_diff, 8.0);
}

TEST(ChooseCopy, ATieBetweenExactCopiesGoesToTheLowestUnit) {
  const std::vector<Offer> offers = {copy(3, 5, {2}), copy(1, 5, {1})};
  const Recovered r = choose_copy(offers, true);
  EXPECT_EQ(r.values, (std::vector<float>{1}));
  EXPECT_EQ(r.outvoted, (std::vector<int>{3}));
}

// bf16/int8/int4: each unit holds its reconstruction of Θ_p, off by the rounding of its own
// last delivery: their mean is taken.
TEST(ChooseCopy, LossyCopiesAreAveraged) {
  const std::vector<Offer> offers = {copy(0, 4, {1.0f, 2.0f}), copy(1, 4, {1.5f, 2.0f}), copy(2, 3, {100, 100})};
  const Recovered r = choose_copy(offers, /*exact=*/false);
  EXPECT_EQ(r.version, 4);
  EXPECT_EQ(r.values, (std::vector<float>{1.25f, 2.0f}));
  EXPECT_TRUE(r.outvoted.empty());
  EXPECT_DOUBLE_EQ(r.max_diff, 0.5);
}

TEST(ChooseCopy, CopiesOfOneVersionWithDifferentSizesAreAnError) {
  const std::vector<Offer> offers = {copy(0, 4, {1, 2}), copy(1, 4, {1})};
  EXPECT_THROW(choose_copy(offers, true), Error);
}

TEST(Recovery, CompleteOnceEveryUnitHasOffered) {
  Recovery r(3, 2, /*started_s=*/0, /*timeout_s=*/60, /*patience_s=*/5);
  r.offered(0, 1.0, true);
  EXPECT_FALSE(r.complete(1.0));
  r.offered(2, 1.5, true);
  r.offered(2, 1.6, true);  // a second read of the same unit counts once
  EXPECT_EQ(r.offers(), 2);
  EXPECT_FALSE(r.complete(2.0)) << "K have offered: the third gets its patience";
  r.offered(1, 2.0, true);
  EXPECT_TRUE(r.complete(2.0));
  EXPECT_FALSE(r.timed_out(2.0));
}

TEST(Recovery, AfterTheQuorumTheOthersHaveAPatienceThenCountAsLost) {
  Recovery r(5, 3, 0, 60, 5);
  r.offered(0, 1, true);
  r.offered(1, 2, true);
  r.offered(2, 3, false);  // a new process holding nothing: not one of K
  EXPECT_FALSE(r.complete(30)) << "fewer than K copies wait for the timeout";
  r.offered(3, 10, true);
  EXPECT_FALSE(r.complete(14.9));
  EXPECT_TRUE(r.complete(15.0));
  EXPECT_FALSE(r.timed_out(15.0));
}

TEST(Recovery, FewerThanKGoOnAtTheTimeout) {
  Recovery r(4, 3, 10, 60, 5);
  r.offered(2, 11, true);
  EXPECT_FALSE(r.complete(69.9));
  EXPECT_TRUE(r.complete(70));
  EXPECT_TRUE(r.timed_out(70));
  Recovery none(2, 1, 0, 30, 5);
  EXPECT_TRUE(none.complete(30)) << "no unit came back: the syncer goes on with what it has";
  EXPECT_TRUE(none.timed_out(30));
}

TEST(Recovery, AQuorumAboveTheUnitsIsAllOfThem) {
  Recovery r(2, 5, 0, 60, 5);
  r.offered(0, 1, true);
  r.offered(1, 1, false);
  EXPECT_TRUE(r.complete(1)) << "every unit has offered";
  EXPECT_FALSE(r.timed_out(100));
  EXPECT_EQ(r.holders(), 1);
  EXPECT_THROW(Recovery(0, 1, 0, 1, 1), Error);
  EXPECT_THROW(Recovery(2, 1, 0, -1, 1), Error);
}

}  // namespace
}  // namespace ddiloco::syncer
