// The syncer's merge of learners' fragments and its outer optimizer (docs/algorithm.md,
// "Syncer, for each fragment round", steps 3-6).
//
// For a fragment with global parameters Θ and contributions θ_m from units m with token
// counts (c_tok, c_steps) since each last received the fragment:
//   outer gradient   Δ_m = A_m − θ_m, anchored at A_m = Θ (the syncer's current fragment,
//                    docs/algorithm.md step 3) or at the Θ version unit m last received
//                    (`outer.anchor: base`: Δ_m is then exactly the unit's own progress, the
//                    pseudo-gradient of asynchronous local SGD, Liu et al. 2024, arXiv 2401.09135)
//   token weight     w_m = c_tok · (c_tok / c_steps)
//   merge, per tensor: embedding tensors → weighted mean  Σ w_m Δ_m / Σ w_m
//                      other tensors     → RDA (radial-directional averaging)
//        RDA = (Σ w_m ‖Δ_m‖ / Σ w_m) · unit(Σ w_m · unit(Δ_m) / Σ w_m),  unit(x) = x/‖x‖, unit(0) = 0
//        (outer gradients of different units are nearly orthogonal, so a plain mean shrinks
//        like 1/√M; RDA keeps the average length and the average direction)
//   outer Nesterov SGD  v ← μ^s·v + s·Δ;  Θ ← Θ − η·s·(Δ + μ·v)
//        with the merge's share s ∈ (0, 1] of a full round (1 unless `outer.share_steps`: the
//        merged units' share of the live units' tokens per step). s = 1 is plain Nesterov; a
//        round merged in pieces of shares summing to 1 moves Θ about as far as one full merge
//        (momentum decays by μ per round either way) instead of once per piece. Shares count
//        tokens per step, not speed: a slow unit's merges come less often, so per unit of time
//        it moves Θ less, as it contributes less.
//   warm-up merge    (`outer.warmup_steps`, post-local SGD: Lin et al., ICLR 2020)
//                    Θ ← Θ − s·Δ, i.e. η = 1 and μ = 0 with v left as it is: a plain
//                    (share-scaled) average of the units' one-step progress, because a
//                    momentum of μ fed every step would multiply the inner learning rate by
//                    about η/(1 − μ).
// All arithmetic is in double; Θ and v are stored in fp32. With one contribution, η = 1 and
// μ = 0 the result is θ_1 exactly (x − (x − y) = y in double for fp32 x, y).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ddiloco/fragments.hpp"

namespace ddiloco::syncer {

/// w = c_tok² / c_steps (tokens² per step); 0 when c_steps or c_tok is 0.
double token_weight(int64_t c_tok, int64_t c_steps);

/// The bound on one unit's influence on a merge (issue 34), part 1: its weight. Steps cannot be
/// checked, and an honest weight c_tok²/c_steps = c_steps·tps² grows with them (tps: the unit's
/// tokens per step, B·T·ranks): so the steps are what is capped. With κ > 0, a unit whose
/// c_steps exceed step_cap() weighs as if it had made that many (w scaled by cap/c_steps);
/// units of more ranks keep their larger weight per step. With equal tps a unit holds at most
/// κ/(κ + n − 1) of a merge of n. `steps` and `w` are the merge's units in order; returns the
/// indices capped.
std::vector<size_t> cap_weights(std::span<const int64_t> steps, std::span<double> w, double kappa);

/// κ × the lower median of the positive steps of the merge's units other than `u`; +∞ when
/// there are none or κ ≤ 0.
double step_cap(std::span<const int64_t> steps, size_t u, double kappa);

/// ‖anchor − θ‖₂ over one fragment (both `numel` fp32), in double. Throws Error for sizes that
/// differ.
double outer_gradient_norm(std::span<const float> theta, std::span<const float> anchor);

/// The bound on one unit's influence on a merge, part 2: the size of its outer gradient,
/// relative to the other units'. Inner steps of AdamW have a size set by the learning rate, not
/// by the gradient, so honest units of one run take outer gradients of about the same size per
/// inner step; a unit that sends values far outside any step it could have taken does not.
///
/// Each contribution has steps s (its c_steps, at least 1) and a per-step norm ρ = ‖Δ‖₂ / s.
/// Every unit that contributed to the fragment has one vote: the median of its last `keep`
/// contributions (this merge's included), as claimed, never scaled. Warm-up merges (rounds of
/// one step) and the others are kept apart. Then:
///   - s is capped at κ_s × max(S, h): S the lower median of the units' steps votes, h the
///     steps of an honest round now (1 in the warm-up, outer.h after), so that no count, too
///     large or too small, moves the allowance below an honest round's;
///   - a contribution whose ρ exceeds κ × ν, ν the lower median of the units' ρ votes (its own
///     unit's included), is scaled down to ρ = κ·ν, Δ keeping its direction.
/// With more honest units than lying ones among those voting, ν and S are honest values: a liar
/// moves Θ at most as κ typical honest steps would, for κ_s rounds' worth of steps, however
/// often it merges alone, and it cannot scale the honest units down. With two voting units
/// (one of them lying) the lower median is the smaller vote: a liar whose Δ is tiny can then
/// scale the honest unit down (slow training), not push Θ. One unit alone is not bounded.
/// The votes live in this process: a restarted syncer starts with none.
class OuterGradientBound {
 public:
  /// One contribution to a merge: its unit, ‖Δ‖₂ (outer_gradient_norm) and claimed c_steps.
  struct Sized {
    int unit = 0;
    double norm = 0;
    int64_t steps = 0;
  };
  /// κ ≥ 0 (`syncer.max_outer_grad_ratio`; 0: no bound), κ_s ≥ 0 (`syncer.max_weight_ratio`;
  /// 0: steps uncapped), `keep` ≥ 1 contributions per unit. Throws Error otherwise.
  OuterGradientBound(int fragments, double kappa, double kappa_steps, size_t keep = 4);

  /// The scale (0, 1] of each contribution to a merge of fragment p, in order (1: untouched),
  /// and records them. `warm`: a warm-up merge; `h` ≥ 1: the steps of an honest round now.
  std::vector<double> clip(int p, bool warm, int64_t h, std::span<const Sized> merge);

 private:
  struct Votes {
    std::vector<double> steps, per_step;  // the unit's last `keep` contributions, oldest first
  };
  double kappa_, kappa_steps_;
  size_t keep_;
  std::vector<std::map<int, Votes>> record_;  // per fragment × {not warm, warm}: by unit
};

enum class MergeRule { rda, mean };
/// "rda" or "mean"; throws Error otherwise.
MergeRule parse_merge_rule(const std::string& name);

/// One unit's contribution to a fragment merge.
struct Contribution {
  std::span<const float> theta;   ///< the unit's packed fragment (numel elements)
  double weight = 0;              ///< token weight (need not be normalised)
  std::span<const float> anchor = {};  ///< what Δ is measured from (numel); empty: current Θ
};

/// Merged outer gradient of one tensor (segment) into `out` (double, n elements):
/// weighted mean, or RDA when `rda`, of Δ_m = anchor_m − θ_m (anchor_m = `global` when the
/// contribution has none). Contributions with weight 0 are ignored.
/// Returns false (out untouched) when the total weight is 0.
bool merge_segment(std::span<const float> global, const std::vector<Contribution>& contributions,
                   size_t offset, size_t n, bool rda, std::span<double> out);

/// Outer Nesterov SGD over one fragment's packed Θ, with its own fp32 momentum buffer.
class OuterOptimizer {
 public:
  /// lr η > 0, momentum μ in [0, 1).
  OuterOptimizer(const protocol::FragmentPlan& plan, double lr, double momentum, MergeRule rule);

  /// Merges the contributions into fragment p's Θ (packed, in place) and updates its momentum.
  /// Each segment (tensor) uses the mean (embeddings, or every tensor with MergeRule::mean)
  /// or RDA. `share` ∈ (0, 1] scales the step (see the header comment; 1 = plain Nesterov).
  /// `warm`: a warm-up merge, η = 1 and μ = 0 whatever the optimizer's, the momentum untouched.
  /// Returns false and changes nothing when every weight is 0. Throws Error when a
  /// contribution's (or its anchor's) size is not the fragment's, or share is outside (0, 1].
  bool step(int p, std::span<float> theta, const std::vector<Contribution>& contributions,
            double share = 1.0, bool warm = false);

  std::span<float> momentum(int p) { return momentum_[p]; }

 private:
  const protocol::FragmentPlan* plan_;
  double lr_, mu_;
  MergeRule rule_;
  std::vector<std::vector<float>> momentum_;
  std::vector<double> scratch_;
};

}  // namespace ddiloco::syncer
