#include "learner/ddp_reducer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ddiloco/mpi.hpp"

namespace ddiloco::learner {

UnitTrainer::GradientReducer hierarchical_reducer(const Topology& topo, int total_ranks,
                                                  std::shared_ptr<wan::WanRing> ring,
                                                  std::shared_ptr<StopVote> stop) {
  return [&topo, total_ranks, ring, stop](std::span<float> grads, double loss) {
    mpi::reduce_sum(grads, 0, topo.unit_comm);
    double loss_sum = loss;
    if (topo.unit_size > 1)
      mpi::check(MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, topo.unit_comm),
                 "Allreduce(loss)");
    if (topo.leader) {
      // The loss first, NaN from a leader whose gradients are not finite: every leader then
      // knows whether the gradients can travel in the wire format (which refuses non-finite
      // values) or must go raw, and the step fails as diverged on every unit.
      const bool finite = std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); });
      // Checkpoint ids are below 2^53: exact in a double, and so is their sum over the leaders.
      double words[4] = {finite ? loss_sum : std::numeric_limits<double>::quiet_NaN(), stop->vote ? 1.0 : 0.0,
                         stop->want > 0 ? 1.0 : 0.0, static_cast<double>(stop->want)};
      mpi::allreduce_sum_patient(std::span<double>(words), topo.leaders_comm);
      loss_sum = words[0];
      stop->agreed = words[1] > 0;
      stop->agreed_want = words[2] > 0 ? static_cast<int64_t>(words[3] / words[2]) : 0;
      ring->allreduce_sum(grads, !std::isfinite(loss_sum));
      const float inv = 1.0f / static_cast<float>(total_ranks);
      const long n = static_cast<long>(grads.size());
#pragma omp parallel for schedule(static)
      for (long i = 0; i < n; ++i) grads[i] *= inv;
    }
    if (topo.unit_size > 1) {
      mpi::broadcast(grads, 0, topo.unit_comm);
      mpi::check(MPI_Bcast(&loss_sum, 1, MPI_DOUBLE, 0, topo.unit_comm), "Bcast(loss)");
    }
    return loss_sum / total_ranks;
  };
}

}  // namespace ddiloco::learner
