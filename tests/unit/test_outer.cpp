// The outer loop's math against hand-computed values: fragments and their schedule, token
// weights, RDA and mean merges, outer Nesterov, the grace window.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "ddiloco/error.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/grace.hpp"
#include "ddiloco/merge.hpp"

namespace ddiloco::syncer {
namespace {

TEST(Fragments, GreedyBinPackingLargestFirstIntoSmallest) {
  // Layout of GPT{V=8, T=4, L=1, NH=1, C=2}: sizes in layout order:
  // wte 16, wpe 8, ln_1.w 2, ln_1.b 2, c_attn.w 12, c_attn.b 6, attn.c_proj.w 4, .b 2,
  // ln_2.w 2, ln_2.b 2, c_fc.w 16, c_fc.b 8, mlp.c_proj.w 16, .b 2, ln_f.w 2, ln_f.b 2.
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{8, 4, 1, 1, 2});
  const protocol::FragmentPlan plan(layout, 3, 6);
  // Hand trace (sizes after each placement; ties go to the lowest fragment):
  //   wte 16→F0 16 | c_fc.w 16→F1 16 | mlp.c_proj.w 16→F2 16 | c_attn.w 12→F0 28 |
  //   wpe 8→F1 24 | c_fc.b 8→F2 24 | c_attn.b 6→F1 30 | attn.c_proj.w 4→F2 28 |
  //   then the 2-element tensors in layout order: ln_1.w→F0 30, ln_1.b→F2 30,
  //   attn.c_proj.b→F0 32, ln_2.w→F1 32, ln_2.b→F2 32, mlp.c_proj.b→F0 34, ln_f.w→F1 34,
  //   ln_f.b→F2 34.
  std::vector<size_t> sizes;
  for (const auto& f : plan.fragments()) sizes.push_back(f.numel);
  EXPECT_EQ(sizes, (std::vector<size_t>{34, 34, 34}));
  EXPECT_EQ(plan.fragments()[0].tensors, (std::vector<int>{0, 2, 4, 7, 13}));
  EXPECT_EQ(plan.fragments()[1].tensors, (std::vector<int>{1, 5, 8, 10, 14}));
  EXPECT_EQ(plan.fragments()[2].tensors, (std::vector<int>{3, 6, 9, 11, 12, 15}));
  // Every tensor in exactly one fragment.
  std::vector<int> seen(layout.tensors().size(), 0);
  for (const auto& f : plan.fragments())
    for (int t : f.tensors) ++seen[t];
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_THROW(protocol::FragmentPlan(layout, 0, 6), Error);
  EXPECT_THROW(protocol::FragmentPlan(layout, 17, 6), Error);
  EXPECT_THROW(protocol::FragmentPlan(layout, 2, 0), Error);
}

TEST(Fragments, StaggeredScheduleOffsets) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{8, 4, 1, 1, 2});
  const protocol::FragmentPlan plan(layout, 4, 8);  // offsets ⌊p·8/4⌋ = 0, 2, 4, 6
  std::vector<int> offsets;
  for (const auto& f : plan.fragments()) offsets.push_back(f.offset);
  EXPECT_EQ(offsets, (std::vector<int>{0, 2, 4, 6}));
  // Fragment p is due at offset + k·H for k ≥ 1: 8, 16 / 10, 18 / 12, 20 / 14, 22.
  std::vector<std::vector<int64_t>> due(4);
  for (int64_t t = 1; t <= 24; ++t)
    for (int p : plan.due_after(t)) due[p].push_back(t);
  EXPECT_EQ(due[0], (std::vector<int64_t>{8, 16, 24}));
  EXPECT_EQ(due[1], (std::vector<int64_t>{10, 18}));
  EXPECT_EQ(due[3], (std::vector<int64_t>{14, 22}));
  // P = H: one fragment due at every step once the first round is over.
  const protocol::FragmentPlan every(layout, 4, 4);
  for (int64_t t = 4; t <= 12; ++t) EXPECT_EQ(every.due_after(t).size(), 1u) << t;
  // P = 1 is plain DiLoCo.
  const protocol::FragmentPlan diloco(layout, 1, 5);
  for (int64_t t = 1; t <= 15; ++t) EXPECT_EQ(diloco.due(0, t), t % 5 == 0) << t;
}

TEST(Fragments, WarmUpSynchronisesEveryStepThenTheScheduleStartsOver) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{8, 4, 1, 1, 2});
  // P = 2, H = 4 (offsets 0, 2), a warm-up of W = 3 steps: both fragments after steps 1, 2, 3,
  // then the schedule on t − 3: fragment 0 at 3 + 4k (7, 11), fragment 1 at 3 + 2 + 4k (9, 13).
  const protocol::FragmentPlan plan(layout, 2, 4, 3);
  std::vector<std::vector<int64_t>> due(2);
  for (int64_t t = 1; t <= 13; ++t) {
    EXPECT_EQ(plan.warm(t), t <= 3) << t;
    for (int p : plan.due_after(t)) due[p].push_back(t);
  }
  EXPECT_EQ(due[0], (std::vector<int64_t>{1, 2, 3, 7, 11}));
  EXPECT_EQ(due[1], (std::vector<int64_t>{1, 2, 3, 9, 13}));
  // step_of_sync names the step of each fragment's k-th synchronisation: the same list.
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(plan.step_of_sync(p, 0), 0);
    for (size_t k = 1; k <= due[p].size(); ++k) EXPECT_EQ(plan.step_of_sync(p, k), due[p][k - 1]) << p << " " << k;
  }
  // Without a warm-up: step_of_sync of plain DiLoCo is k·H.
  const protocol::FragmentPlan diloco(layout, 1, 5);
  EXPECT_EQ(diloco.step_of_sync(0, 3), 15);
  EXPECT_FALSE(diloco.warm(1));
  EXPECT_THROW(protocol::FragmentPlan(layout, 2, 4, -1), Error);
}

TEST(Fragments, PackUnpackRoundTrip) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{8, 4, 1, 1, 2});
  const protocol::FragmentPlan plan(layout, 3, 6);
  std::vector<float> flat(layout.size()), back(layout.size(), -1.0f);
  std::iota(flat.begin(), flat.end(), 0.0f);
  for (int p = 0; p < 3; ++p) {
    std::vector<float> packed(plan.fragments()[p].numel);
    plan.pack(p, flat, packed);
    plan.unpack(p, packed, back);
  }
  EXPECT_EQ(flat, back);
}

TEST(Merge, TokenWeights) {
  EXPECT_DOUBLE_EQ(token_weight(1000, 10), 1000.0 * 100.0);  // tokens × tokens per step
  EXPECT_DOUBLE_EQ(token_weight(2048, 1), 2048.0 * 2048.0);
  EXPECT_DOUBLE_EQ(token_weight(0, 5), 0.0);
  EXPECT_DOUBLE_EQ(token_weight(100, 0), 0.0);
  // A unit twice as large (tokens per step) over the same steps weighs 4×.
  EXPECT_DOUBLE_EQ(token_weight(2 * 512 * 10, 10) / token_weight(512 * 10, 10), 4.0);
}

TEST(Merge, CapWeightsCapsStepsAtKappaTimesTheOthersLowerMedian) {
  // Weights of c_steps·tps²: units 0 and 1 at tps 10, unit 2 at tps 30 (three times the ranks).
  std::vector<int64_t> steps = {4, 8, 4};
  std::vector<double> w = {400, 800, 3600};
  EXPECT_TRUE(cap_weights(steps, w, 4).empty()) << "more ranks weigh more per step: not capped";
  std::vector<int64_t> liar = {4, 8, int64_t{1} << 40};
  std::vector<double> wl = {400, 800, 100.0 * static_cast<double>(int64_t{1} << 40)};
  EXPECT_EQ(cap_weights(liar, wl, 4), (std::vector<size_t>{2}));
  EXPECT_DOUBLE_EQ(wl[2], 100.0 * 16) << "as if it had made 4 × 4 steps (median of {4, 8} taken low)";
  // Others with no steps give no median: a unit beside a zero-step one is never capped to 0.
  std::vector<int64_t> zero = {0, 4};
  std::vector<double> wz = {0, 400};
  EXPECT_TRUE(cap_weights(zero, wz, 4).empty());
  EXPECT_EQ(wz, (std::vector<double>{0, 400}));
  std::vector<int64_t> one = {int64_t{1} << 62};
  std::vector<double> w1 = {1e300};
  EXPECT_TRUE(cap_weights(one, w1, 4).empty()) << "a merge of one: its share is 1 whatever its weight";
  std::vector<int64_t> off = {1, int64_t{1} << 62};
  std::vector<double> woff = {1, 1e300};
  EXPECT_TRUE(cap_weights(off, woff, 0).empty());
  // The stated bound at equal tps: a capped unit's share of n is at most κ/(κ + n − 1).
  std::vector<int64_t> many = {4, 4, 4, 4, int64_t{1} << 50};
  std::vector<double> wm = {4, 4, 4, 4, static_cast<double>(int64_t{1} << 50)};
  cap_weights(many, wm, 4);
  EXPECT_NEAR(wm[4] / (wm[0] + wm[1] + wm[2] + wm[3] + wm[4]), 4.0 / 8.0, 1e-12);
}

using Sized = OuterGradientBound::Sized;

// ‖Δ‖₂ of values near FLT_MAX (a lying unit) stays finite: it is computed scaled.
TEST(Merge, OuterGradientNormOfHugeValuesDoesNotOverflow) {
  const std::vector<float> anchor(1000, 0.0f), theta(1000, 3e38f);
  EXPECT_NEAR(outer_gradient_norm(theta, anchor) / (static_cast<double>(3e38f) * std::sqrt(1000.0)), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(outer_gradient_norm(std::vector<float>{3, 0}, std::vector<float>{0, 4}), 5.0);
  EXPECT_THROW(outer_gradient_norm(theta, std::vector<float>(3)), Error);
}

// The rule (merge.hpp): ρ = ‖Δ‖/s above κ × the lower median of the units' votes is scaled down
// to it; honest units within κ of each other are untouched; a unit alone is not bounded.
TEST(Merge, AnOuterGradientFarAboveTheOthersIsScaledToKappaTimesTheirMedian) {
  OuterGradientBound bound(1, 8.0, 4.0);
  EXPECT_EQ(bound.clip(0, false, 4, std::vector<Sized>{{0, 1e6, 4}}), std::vector<double>{1.0}) << "alone";
  OuterGradientBound b2(1, 8.0, 4.0);
  const std::vector<double> s = b2.clip(0, false, 4, std::vector<Sized>{{0, 1.0, 4}, {1, 3.0, 4}, {2, 1e6, 4}});
  EXPECT_DOUBLE_EQ(s[0], 1.0);
  EXPECT_DOUBLE_EQ(s[1], 1.0) << "3× the other honest unit: within κ = 8";
  // ν = lower median of the votes {0.25, 0.75, 250000} per step = 0.75; bound 8 · 0.75 = 6.
  EXPECT_DOUBLE_EQ(s[2], 8.0 * 0.75 / (1e6 / 4));
}

// Review of issue 34: a liar whose Δ is tiny (one ulp) once set ν for every honest unit of a
// three-unit merge (the lower median of the two others is their minimum). With one vote per unit,
// its own included, the median of three is an honest value.
TEST(Merge, ATinyOuterGradientCannotScaleTheHonestUnitsDown) {
  OuterGradientBound bound(1, 8.0, 4.0);
  for (int v = 0; v < 10; ++v) {
    const std::vector<double> s = bound.clip(0, false, 4, std::vector<Sized>{{0, 1.0, 4}, {1, 1.2, 4}, {2, 1e-30, 4}});
    ASSERT_EQ(s, std::vector<double>(3, 1.0)) << "merge " << v;
  }
  // A liar claiming one step cannot pull the step allowance below an honest round (h = 500).
  OuterGradientBound b2(1, 8.0, 4.0);
  const std::vector<double> s = b2.clip(0, false, 500, std::vector<Sized>{{0, 100.0, 500}, {1, 100.0, 500}, {2, 0.0, 1}});
  EXPECT_EQ(s, std::vector<double>(3, 1.0));
}

// The record: a liar alone in later merges is measured against the honest units' votes, however
// often it merges alone (votes never age out); claiming more steps does not raise its allowance
// past κ_s × the units' steps.
TEST(Merge, ALiarAloneIsBoundedByTheRecordHoweverOftenItMerges) {
  OuterGradientBound bound(2, 8.0, 4.0, 4);
  bound.clip(1, false, 4, std::vector<Sized>{{0, 1.0, 4}, {1, 1.0, 4}});  // ρ 0.25 each, fragment 1
  for (int round = 0; round < 200; ++round) {
    const std::vector<double> s = bound.clip(1, false, 4, std::vector<Sized>{{2, 1e30, int64_t{1} << 62}});
    // steps capped at 4 × max(median{4, 4, 2^62} = 4, h = 4) = 16; ν = 0.25 → ‖Δ‖ ≤ 8 · 0.25 · 16 = 32.
    ASSERT_NEAR(s[0] * 1e30, 32.0, 1e-9) << "round " << round;
  }
  // The fragments keep separate records: fragment 0 knows nothing yet.
  EXPECT_EQ(bound.clip(0, false, 4, std::vector<Sized>{{2, 1e30, 4}}), std::vector<double>{1.0});
  OuterGradientBound off(1, 0.0, 4.0);
  off.clip(0, false, 4, std::vector<Sized>{{0, 1.0, 4}, {1, 1.0, 4}});
  EXPECT_EQ(off.clip(0, false, 4, std::vector<Sized>{{2, 1e30, 4}}), std::vector<double>{1.0}) << "κ = 0: no bound";
  EXPECT_THROW(OuterGradientBound(1, -1.0, 4.0), Error);
  EXPECT_THROW(OuterGradientBound(1, 8.0, 4.0, 0), Error);
}

// Review of issue 34: warm-up merges (rounds of one step) are kept apart, so the first rounds
// of H = 500 steps after them are not measured against one-step norms.
TEST(Merge, TheFirstRoundsAfterAWarmUpAreNotScaledDown) {
  OuterGradientBound bound(1, 8.0, 4.0);
  for (int v = 1; v <= 20; ++v) bound.clip(0, true, 1, std::vector<Sized>{{0, 1.0, 1}, {1, 1.0, 1}, {2, 1.0, 1}});
  const std::vector<double> s =
      bound.clip(0, false, 500, std::vector<Sized>{{0, 100.0, 500}, {1, 100.0, 500}, {2, 100.0, 500}});
  EXPECT_EQ(s, std::vector<double>(3, 1.0));
}

TEST(Merge, WeightedMeanAndRdaByHand) {
  // Θ = 0; θ_1 = −(3, 0), θ_2 = −(0, 4): Δ_1 = (3, 0), Δ_2 = (0, 4); weights 1 and 3.
  const std::vector<float> global = {0, 0};
  const std::vector<float> t1 = {-3, 0}, t2 = {0, -4};
  const std::vector<Contribution> c = {{t1, 1.0}, {t2, 3.0}};
  std::vector<double> out(2);
  ASSERT_TRUE(merge_segment(global, c, 0, 2, /*rda=*/false, out));
  EXPECT_DOUBLE_EQ(out[0], 0.75);  // (1·3 + 3·0)/4
  EXPECT_DOUBLE_EQ(out[1], 3.0);   // (1·0 + 3·4)/4
  // RDA: radial = (1·3 + 3·4)/4 = 3.75; direction = unit((1·(1,0) + 3·(0,1))/4) = (1,3)/√10.
  ASSERT_TRUE(merge_segment(global, c, 0, 2, /*rda=*/true, out));
  EXPECT_NEAR(out[0], 3.75 / std::sqrt(10.0), 1e-12);
  EXPECT_NEAR(out[1], 3.75 * 3 / std::sqrt(10.0), 1e-12);
  // RDA keeps the average length where the mean shrinks it (orthogonal outer gradients).
  const double mean_len = std::hypot(0.75, 3.0), rda_len = std::hypot(out[0], out[1]);
  EXPECT_NEAR(rda_len, 3.75, 1e-12);
  EXPECT_LT(mean_len, rda_len);
}

TEST(Merge, RdaWithZeroVectors) {
  const std::vector<float> global = {1, 1, 1};
  const std::vector<float> same = {1, 1, 1};  // Δ = 0
  const std::vector<float> moved = {1, -1, 1};  // Δ = (0, 2, 0)
  std::vector<double> out(3, 9.0);
  // unit(0) = 0: the zero contribution adds no direction, but counts in the radial mean.
  ASSERT_TRUE(merge_segment(global, {{same, 1.0}, {moved, 1.0}}, 0, 3, true, out));
  EXPECT_NEAR(out[0], 0.0, 1e-15);
  EXPECT_NEAR(out[1], 1.0, 1e-12);  // radial (0 + 2)/2 = 1 along (0, 1, 0)
  // All zero: Δ = 0, no NaN.
  ASSERT_TRUE(merge_segment(global, {{same, 1.0}, {same, 2.0}}, 0, 3, true, out));
  for (double x : out) EXPECT_EQ(x, 0.0);
  // Opposite directions cancel: Δ = 0.
  const std::vector<float> up = {2, 1, 1}, down = {0, 1, 1};
  ASSERT_TRUE(merge_segment(global, {{up, 1.0}, {down, 1.0}}, 0, 3, true, out));
  for (double x : out) EXPECT_NEAR(x, 0.0, 1e-15);
  // No weight at all: nothing to merge.
  EXPECT_FALSE(merge_segment(global, {{moved, 0.0}}, 0, 3, true, out));
}

TEST(Merge, OuterNesterovByHand) {
  // One tensor fragment (ln_f.bias of a tiny model is not embedding → RDA path; use mean rule
  // to get exact numbers), η = 0.5, μ = 0.9.
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{2, 1, 1, 1, 1});
  const protocol::FragmentPlan plan(layout, 1, 1);
  OuterOptimizer outer(plan, 0.5, 0.9, MergeRule::mean);
  const size_t n = plan.fragments()[0].numel;
  std::vector<float> theta(n, 1.0f), unit(n, 0.0f);  // Δ = Θ − θ_unit = 1
  ASSERT_TRUE(outer.step(0, theta, {{unit, 1.0}}));
  // v = 0.9·0 + 1 = 1; Θ = 1 − 0.5·(1 + 0.9·1) = 0.05
  for (float x : theta) EXPECT_NEAR(x, 0.05f, 1e-7);
  for (float v : outer.momentum(0)) EXPECT_FLOAT_EQ(v, 1.0f);
  // Second step with the unit at 0.05 − 0.5 (Δ = 0.5): v = 0.9 + 0.5 = 1.4,
  // Θ = 0.05 − 0.5·(0.5 + 0.9·1.4) = 0.05 − 0.88 = −0.83
  std::vector<float> unit2(n, 0.05f - 0.5f);
  ASSERT_TRUE(outer.step(0, theta, {{unit2, 2.0}}));
  for (float x : theta) EXPECT_NEAR(x, -0.83f, 1e-6);
  // Zero weight changes nothing.
  const std::vector<float> before = theta;
  EXPECT_FALSE(outer.step(0, theta, {{unit2, 0.0}}));
  EXPECT_EQ(theta, before);
  EXPECT_THROW(outer.step(0, theta, {{std::vector<float>(n + 1), 1.0}}), Error);
}

TEST(Merge, AnchoredAtTheBaseVersionMeasuresOnlyTheUnitsProgress) {
  // Θ moved from (1, 1) to (0, 0) since the unit received it; the unit trained (1, 1) → (1, 3).
  const std::vector<float> global = {0, 0}, base = {1, 1}, unit = {1, 3};
  std::vector<double> out(2);
  // Anchored at the current Θ: Δ = Θ − θ = (−1, −3), which pulls Θ back towards the base.
  ASSERT_TRUE(merge_segment(global, {{unit, 1.0}}, 0, 2, false, out));
  EXPECT_DOUBLE_EQ(out[0], -1.0);
  EXPECT_DOUBLE_EQ(out[1], -3.0);
  // Anchored at the base: Δ = base − θ = (0, −2), the unit's own progress only.
  ASSERT_TRUE(merge_segment(global, {{unit, 1.0, base}}, 0, 2, false, out));
  EXPECT_DOUBLE_EQ(out[0], 0.0);
  EXPECT_DOUBLE_EQ(out[1], -2.0);
  // Mixed: one unit anchored at the base, one at Θ; mean of (0, −2) and (0, 4) = (0, 1).
  const std::vector<float> other = {0, -4};
  ASSERT_TRUE(merge_segment(global, {{unit, 1.0, base}, {other, 1.0}}, 0, 2, false, out));
  EXPECT_DOUBLE_EQ(out[0], 0.0);
  EXPECT_DOUBLE_EQ(out[1], 1.0);
}

TEST(Merge, ShareScaledNesterovByHand) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{2, 1, 1, 1, 1});
  const protocol::FragmentPlan plan(layout, 1, 1);
  const size_t n = plan.fragments()[0].numel;
  {
    // η = 0.5, μ = 0.81, share 0.5, Δ = 1: v = 0.5; Θ = 1 − 0.25·(1 + 0.81·0.5) = 0.64875.
    OuterOptimizer outer(plan, 0.5, 0.81, MergeRule::mean);
    std::vector<float> theta(n, 1.0f), unit(n, 0.0f);
    ASSERT_TRUE(outer.step(0, theta, {{unit, 1.0}}, 0.5));
    for (float x : theta) EXPECT_NEAR(x, 0.64875f, 1e-7);
    for (float v : outer.momentum(0)) EXPECT_FLOAT_EQ(v, 0.5f);
    // Second half step with Δ = 1 (anchored at 1): v = √0.81·0.5 + 0.5 = 0.95;
    // Θ = 0.64875 − 0.25·(1 + 0.81·0.95) = 0.206375.
    const std::vector<float> anchor(n, 1.0f);
    ASSERT_TRUE(outer.step(0, theta, {{unit, 1.0, anchor}}, 0.5));
    for (float x : theta) EXPECT_NEAR(x, 0.206375f, 1e-6);
    for (float v : outer.momentum(0)) EXPECT_NEAR(v, 0.95f, 1e-7);
  }
  {
    // Without momentum, two merges of half the units, both measured from the same base,
    // move Θ exactly as far as one merge of all of them.
    OuterOptimizer halves(plan, 0.7, 0.0, MergeRule::mean), whole(plan, 0.7, 0.0, MergeRule::mean);
    const std::vector<float> base(n, 2.0f), a(n, 1.0f), b(n, 0.0f);  // Δ_a = 1, Δ_b = 2
    std::vector<float> split = base, full = base;
    ASSERT_TRUE(halves.step(0, split, {{a, 1.0, base}}, 0.5));
    ASSERT_TRUE(halves.step(0, split, {{b, 1.0, base}}, 0.5));
    ASSERT_TRUE(whole.step(0, full, {{a, 1.0}, {b, 1.0}}));
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(split[i], full[i], 1e-6);  // 2 − 0.7·1.5 = 0.95
    EXPECT_NEAR(full[0], 0.95f, 1e-6);
  }
  OuterOptimizer outer(plan, 0.5, 0.9, MergeRule::mean);
  std::vector<float> theta(n, 1.0f), unit(n, 0.0f);
  EXPECT_THROW(outer.step(0, theta, {{unit, 1.0}}, 0.0), Error);
  EXPECT_THROW(outer.step(0, theta, {{unit, 1.0}}, 1.5), Error);
  EXPECT_THROW(outer.step(0, theta, {{unit, 1.0, std::vector<float>(n + 1)}}), Error);
}

TEST(Merge, AWarmUpMergeIsAPlainAverageAndLeavesTheMomentumAlone) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{2, 1, 1, 1, 1});
  const protocol::FragmentPlan plan(layout, 1, 1);
  const size_t n = plan.fragments()[0].numel;
  OuterOptimizer outer(plan, 0.5, 0.9, MergeRule::mean);
  std::vector<float> theta(n, 1.0f), unit(n, 0.0f);
  ASSERT_TRUE(outer.step(0, theta, {{unit, 1.0}}));  // v = 1, Θ = 0.05 (OuterNesterovByHand)
  // Warm: units at −0.95 and −0.55 (Δ = 1 and 0.6, mean 0.8), whatever η and μ:
  // Θ = 0.05 − 0.8 = −0.75, v still 1.
  std::vector<float> a(n, -0.95f), b(n, -0.55f);
  ASSERT_TRUE(outer.step(0, theta, {{a, 1.0}, {b, 1.0}}, 1.0, true));
  for (float x : theta) EXPECT_NEAR(x, -0.75f, 1e-6);
  for (float v : outer.momentum(0)) EXPECT_FLOAT_EQ(v, 1.0f);
  // Share-scaled as any merge: half of the way to the unit at −1.75 (Δ = 1): Θ = −1.25.
  std::vector<float> c(n, -1.75f);
  ASSERT_TRUE(outer.step(0, theta, {{c, 1.0}}, 0.5, true));
  for (float x : theta) EXPECT_NEAR(x, -1.25f, 1e-6);
  for (float v : outer.momentum(0)) EXPECT_FLOAT_EQ(v, 1.0f);
}

TEST(Merge, SingleUnitWithUnitLrAndNoMomentumReturnsItsParametersExactly) {
  const ParameterLayout layout = ParameterLayout::gpt2(GptConfig{16, 4, 1, 2, 4});
  const protocol::FragmentPlan plan(layout, 1, 1);
  for (MergeRule rule : {MergeRule::rda, MergeRule::mean}) {
    OuterOptimizer outer(plan, 1.0, 0.0, rule);
    const size_t n = plan.fragments()[0].numel;
    std::vector<float> theta(n), unit(n);
    for (size_t i = 0; i < n; ++i) {
      theta[i] = std::sin(0.37f * i);
      unit[i] = theta[i] - 1e-3f * std::cos(1.3f * i) + (i % 7 == 0 ? 0.5f : 0.0f);
    }
    ASSERT_TRUE(outer.step(0, theta, {{unit, 12345.0}}));
    EXPECT_EQ(theta, unit);  // bit for bit
  }
}

TEST(Grace, WindowFormulaAndClamp) {
  GraceWindow g(0.5, 1.0, /*overlap=*/2);
  EXPECT_EQ(g.seconds(), 0.0);  // nothing observed yet
  g.observe_steps(/*slowest=*/1.0, /*median=*/0.8);
  g.observe_quorum(0.3);
  g.observe_sync(0.1);
  // γ(τ·ξ_step − ξ_quorum − ξ_sync) = 0.5·(2 − 0.3 − 0.1) = 0.8, cap 1.0·0.8 = 0.8
  EXPECT_NEAR(g.seconds(), 0.8, 1e-12);
  g.observe_quorum(5.0);  // ema: 0.8·0.3 + 0.2·5 = 1.24 → slack 2 − 1.24 − 0.1 < 1 → 0.33
  EXPECT_NEAR(g.seconds(), 0.5 * (2 - 1.24 - 0.1), 1e-12);
  for (int i = 0; i < 50; ++i) g.observe_quorum(10.0);
  EXPECT_EQ(g.seconds(), 0.0);  // no slack left: merge at the quorum
  GraceWindow capped(1.0, 0.5, 10);
  capped.observe_steps(2.0, 1.0);
  EXPECT_NEAR(capped.seconds(), 0.5, 1e-12);  // cap: 0.5 median steps
}

}  // namespace
}  // namespace ddiloco::syncer
