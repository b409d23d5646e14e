// The GPU side of a learner unit (run.device: cuda), as the CPU library sees it: an interface
// free of CUDA types, so that ddiloco_core (the same in both builds) and UnitTrainer compile
// without the toolkit's headers.
//
// Why an interface with a registered factory rather than #ifdef: ddiloco_core is compiled
// identically with and without CUDA, and ddiloco_cuda links against it, not the reverse. The
// implementation (src/gpu/gpu_unit.cpp, in ddiloco_cuda) is installed by the programs that link
// ddiloco_cuda (the ddiloco binary of the cuda build, the GPU tests) with
// install_cuda_unit_backend() before they load a configuration. "Built with CUDA" is thereby a
// property of the binary: registering the backend also installs its configuration checks
// (validate below) as config's DeviceCheck, and without a registered backend run.device: cuda
// is refused at config validation (src/config/config.cpp).
//
// What the backend holds (one per learner rank, on the GPU select_device picks by node-local
// rank): the GPU model (GptCuda: fp32 master weights, bf16 working copy, fp32 gradients and
// AdamW moments), an NCCL communicator over the unit when it has more than one rank, and on
// the unit leader the pinned host staging of fragments (HostStaging). The host Gpt<float> and
// AdamW<float> of UnitTrainer stay as a mirror that UnitTrainer::download_state/upload_state
// synchronise explicitly where host code reads or writes them (checkpoints, samples, saving).
//
// Errors: ddiloco::Error for CUDA/NCCL/MPI failures (call, message, file:line) and misuse.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ddiloco/config.hpp"
#include "ddiloco/data_loader.hpp"

namespace ddiloco {
// The protocol layer's fragment plan (fragments.hpp), by reference only: this header, and through
// trainer.hpp the training loop, do not depend on the protocol. The CUDA side includes it.
namespace protocol {
class FragmentPlan;
}
}  // namespace ddiloco

namespace ddiloco::gpu {

/// One training step's results, averaged over the unit (every rank gets the same values).
struct GpuStepResult {
  double loss = 0;       ///< mean training loss over the unit's batch, nats/token
  double grad_norm = 0;  ///< global gradient norm before clipping
};

class UnitBackend {
 public:
  virtual ~UnitBackend() = default;

  /// One inner step: forward/backward on this rank's batch (inputs, targets: host int32
  /// (batch_size, seq_len), values < vocab_size, checked by the data loader), mean of the
  /// gradients and losses over the unit (NCCL ncclAvg on its own stream, ordered by events),
  /// clipping by global norm (train.grad_clip) and AdamW with learning rate lr, all enqueued
  /// without host waits; then one small device→host read of loss and norm. Collective over
  /// the unit.
  virtual GpuStepResult step(const int32_t* inputs, const int32_t* targets, double lr) = 0;

  /// Mean loss (nats/token) of the device parameters on `val`, sequences split over the
  /// unit's ranks (i ≡ rank mod size) and sums all-reduced over MPI, as the CPU
  /// validation_loss does; forward passes in batches of `batch` on the GPU. Collective.
  virtual double validation_loss(const ValidationSet& val, int batch) = 0;

  /// host ← device fp32 parameters [offset, offset + host.size()). Synchronises.
  virtual void download_parameters(std::span<float> host, size_t offset = 0) = 0;
  /// device fp32 parameters [offset, ...) ← host, the bf16 copy refreshed. Synchronises.
  virtual void upload_parameters(std::span<const float> host, size_t offset = 0) = 0;
  /// host ← AdamW moments (num_parameters() each); returns the AdamW step count.
  virtual int64_t download_optimizer(std::span<float> m, std::span<float> v) = 0;
  /// AdamW moments and step count ← host.
  virtual void upload_optimizer(std::span<const float> m, std::span<const float> v,
                                int64_t step) = 0;

  // ---------------------------------------------------------------- fragments (outer modes)
  /// Prepares the fragment exchange for `plan` (made from this model's layout): every rank
  /// learns the fragments' ranges; `leader` also allocates the pinned host staging (2 × the
  /// parameters in pinned host memory and on the device). Once, before the calls below.
  virtual void attach_fragments(const protocol::FragmentPlan& plan, bool leader) = 0;

  /// Leader: snapshot of fragment p as the parameters are now (after the last step's update),
  /// gathered on the compute stream and copied to pinned host memory on the copy stream;
  /// returns at once. A previous snapshot of p still in flight is waited for first (polled
  /// with back-off; it is normally long done).
  virtual void start_snapshot(int p) = 0;
  /// Leader: has the snapshot of p reached host memory? Never blocks.
  virtual bool snapshot_ready(int p) = 0;
  /// Leader: waits (polling with back-off, never spinning) until snapshot_ready(p).
  virtual void wait_snapshot(int p) = 0;
  /// Leader: the snapshot of p, packed in protocol::FragmentPlan::pack's order (valid after
  /// snapshot_ready(p), until the next start_snapshot(p)).
  virtual std::span<const float> snapshot(int p) = 0;

  /// Leader: merged Θ_p (packed, numel(p) values) is copied to pinned memory and its upload
  /// to the device starts on the copy stream. An upload of p not yet applied is superseded
  /// (the newest merge is the one applied).
  virtual void stage_merge(int p, std::span<const float> merged) = 0;
  /// θ_p ← the staged Θ_p (overwrite), at a step boundary, collective over the unit: the
  /// leader scatters the staged upload into its parameters on the compute stream (after a
  /// GPU-side wait for the copy, normally long done); with > 1 rank the leader then
  /// NCCL-broadcasts the fragment's tensors to the unit's other ranks. bf16 copies refreshed.
  /// Error on the leader when nothing is staged for p.
  virtual void apply_merge(int p) = 0;

  /// Fragment p of the device parameters ↔ packed host values (the host path of
  /// outer.apply blend and carry, and of a rejoin). Synchronise.
  virtual void download_fragment(int p, std::span<float> packed) = 0;
  virtual void upload_fragment(int p, std::span<const float> packed) = 0;

  /// Which GPU and attention path this rank uses, for the start event/console ("cuda:0 (NVIDIA
  /// H200), attention cublas").
  virtual std::string describe() const = 0;
};

/// Builds the backend for one learner rank: selects the GPU by this rank's node-local rank
/// among `device_comm` (every learner rank of the job; collective over it), uploads `initial`
/// (the host model's initialised parameters, layout order) so that CPU and GPU start from the
/// same weights, and creates the unit's NCCL communicator over `unit_comm` when it has more
/// than one rank (collective over it).
using UnitBackendFactory = std::unique_ptr<UnitBackend> (*)(const Config& config,
                                                            MPI_Comm unit_comm,
                                                            MPI_Comm device_comm,
                                                            std::span<const float> initial);

/// Installs the CUDA backend's factory (src/gpu/gpu_unit.cpp, ddiloco_cuda only).
void install_cuda_unit_backend();
/// Sets the factory (nullptr: none); the CPU library's hook that install_cuda_unit_backend uses.
/// With a factory, validate below becomes config's run.device: cuda check (set_cuda_check,
/// config.hpp); without, that check is removed (run.device: cuda refused). cudnn_version:
/// the runtime version of the cuDNN the backend was built with (cudnnGetVersion(), 91900 =
/// 9.19.0), 0 for a build without cuDNN, where run.gpu_attention: cudnn is refused.
void register_unit_backend(UnitBackendFactory factory, long cudnn_version = 0);
/// Is a GPU backend installed in this binary?
bool unit_backend_available();
/// The installed backend's cuDNN version (0: none installed, or built without cuDNN).
long unit_backend_cudnn_version();
/// The installed factory's backend. Throws Error when none is installed.
std::unique_ptr<UnitBackend> make_unit_backend(const Config& config, MPI_Comm unit_comm,
                                               MPI_Comm device_comm,
                                               std::span<const float> initial);

/// What a GPU learner unit cannot run, checked by config's validate() at load time when
/// run.device is cuda and a backend is registered: mode ddp (its gradient ring across units
/// runs on host buffers), run.gpu_attention: flash without head size 64 and seq_len a multiple
/// of 64, run.gpu_attention: cudnn in a build without cuDNN or for a shape cuDNN's fused
/// attention refuses (sdpa_shape.hpp, sdpa_unsupported, with train.batch_size and the
/// backend's cuDNN version). Throws Error (unprefixed: validate() names the source).
void validate(const Config& config);

/// Which attention path run.gpu_attention selects for a model ("flash", "cublas" or
/// "cudnn"): auto → cublas, the faster of our own kernels measured on an H200 (docs/gpu.md, "Speed
/// on an H200"); cudnn is chosen by name only until a device run has measured it.
std::string resolve_attention(const Config& config);

}  // namespace ddiloco::gpu
