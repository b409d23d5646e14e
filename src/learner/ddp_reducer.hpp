// ddp's gradient averaging across units (docs/training.md "Learner units and the syncer"): the unit's
// gradients are summed to its leader, summed across leaders over the WAN links (the leaders'
// ring, wan.hpp), averaged over every learner rank, and broadcast in the unit.
#pragma once

#include <memory>

#include "ddiloco/topology.hpp"
#include "ddiloco/trainer.hpp"
#include "ddiloco/wan.hpp"

namespace ddiloco::learner {

// ddp's stop and checkpoints must be agreed: units in lock-step that stopped at different
// steps would leave one waiting in the ring forever, and a checkpoint whose unit files are of
// different steps cannot be resumed. Each leader votes (told to stop, by the syncer or a
// signal; asked for checkpoint N by the syncer) with its step's loss; every unit stops, or
// writes its file of checkpoint N, after the step in which any leader voted. The syncer asks
// every unit for the same N and for N + 1 only once N is complete, so the leaders that vote
// for a checkpoint vote for one id.
struct StopVote {
  bool vote = false;    // leader: this unit wants to stop
  bool agreed = false;  // leader: some unit wanted to, at the step just made
  int64_t want = 0;          // leader: the checkpoint this unit is asked for (0: none)
  int64_t agreed_want = 0;   // leader: the checkpoint some unit was asked for, at the step just made
};

/// The trainer's gradient reducer for ddp. `total_ranks`: every learner rank of the job;
/// `ring`: the leaders' ring (null on other ranks); `stop`: read and written at every step.
UnitTrainer::GradientReducer hierarchical_reducer(const Topology& topo, int total_ranks,
                                                  std::shared_ptr<wan::WanRing> ring,
                                                  std::shared_ptr<StopVote> stop);

}  // namespace ddiloco::learner
