// The unit leader's copies between its GPU and the syncer's side (docs/architecture.md, "Learner ↔
// syncer"): fragment snapshots device → pinned host memory, merged fragments host → device,
// on a copy stream of their own, so that the inner loop never waits for PCIe.
//
// The window (sync_window.hpp) holds the wire encoding of a fragment (a bf16/int8/int4
// difference against a reference, with error feedback), which the CPU computes from fp32
// values: so the D2H target is an fp32 host buffer of our own, pinned (cudaHostAlloc, which
// the copy engine reads and writes directly), that LearnerWindow::publish(p, snapshot(p), …)
// then encodes. A merged fragment is decoded by the learner into its own buffer and copied
// into merged_host(p), the pinned buffer the upload reads (one host copy of the fragment per
// merge taken).
//
// Why a device-side copy first: the parameters keep changing on the compute stream while a
// slow D2H copy runs. start_snapshot therefore gathers the fragment's tensors into a device
// buffer ON THE COMPUTE STREAM (device-to-device: 124M fp32 parameters / P fragments is
// ~0.5 GB / P, ~0.1 ms per 0.5 GB at the H200's ~4 TB/s copy rate), which fixes the snapshot
// at the step boundary; the D2H copy of that buffer then runs on the copy stream while the
// next steps compute. Symmetrically, start_upload copies H2D into a device staging buffer on
// the copy stream, and apply() scatters it into the parameters on the compute stream at a step
// boundary (device-to-device), after a GPU-side wait for the upload.
//
// Per fragment p, the life cycles (each call checks its state and throws Error out of turn):
//   snapshot: start_snapshot(p) → snapshot_ready(p) polls (cudaEventQuery, never blocks) →
//             true: snapshot(p) is valid until the next start_snapshot(p)
//   merge:    write merged_host(p) → start_upload(p) → upload_ready(p) polls → apply(p, compute)
//             (merged_host(p) must not be written between start_upload and upload_ready)
// Fragments are independent; all copies share one copy stream, in issue order.
//
// Memory: pinned host 2 × Σ numel(p) × 4 bytes (snapshot + merged), device 2 × Σ numel(p) × 4
// bytes (gather + staging). Not thread-safe; one per leader, on the device that holds the
// parameters (current at construction).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <vector>

#include "ddiloco/fragments.hpp"
#include "ddiloco/gpu/check.hpp"
#include "ddiloco/model.hpp"

namespace ddiloco::gpu {

class HostStaging {
 public:
  /// A run of a fragment inside the flat fp32 parameter buffer: elements, not bytes.
  struct Range {
    size_t offset = 0;  ///< first element in the flat parameter buffer
    size_t numel = 0;   ///< elements
  };
  /// Per fragment: its ranges, in the order they are packed (protocol::FragmentPlan::pack's order).
  using FragmentRanges = std::vector<std::vector<Range>>;
  /// The ranges of every fragment of `plan` over `layout` (the layout the plan was made from):
  /// one range per tensor, in the fragment's tensor order, so the packed buffers here equal
  /// protocol::FragmentPlan::pack's.
  static FragmentRanges ranges(const protocol::FragmentPlan& plan, const ParameterLayout& layout);

  /// `params`: the flat fp32 parameter buffer on the current device, `numel` elements.
  /// Allocates the buffers above and creates the copy stream. Throws Error when a range lies
  /// outside [0, numel) or a fragment is empty, or on a CUDA failure (out of memory, …).
  HostStaging(float* params, size_t numel, FragmentRanges fragments);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  int fragments() const { return static_cast<int>(fragments_.size()); }
  /// Elements of fragment p (packed).
  size_t numel(int p) const { return frag(p).numel; }
  /// The copy stream (non-blocking, lowest priority: copies give way to compute and NCCL).
  cudaStream_t copy_stream() const { return copy_; }

  // ------------------------------------------------------------ device → host (snapshots)
  /// Snapshot of fragment p as the parameters are after everything enqueued on `compute` so
  /// far: gathers it on `compute` into the device buffer (device-to-device, a few µs per
  /// tensor), then copies it to pinned host memory on the copy stream. Returns at once.
  /// Throws Error while the previous snapshot of p is not yet ready (snapshot_ready false).
  void start_snapshot(int p, cudaStream_t compute);
  /// Has the snapshot of p reached host memory? cudaEventQuery: never blocks. Throws Error on a
  /// CUDA error or when no snapshot of p was started.
  bool snapshot_ready(int p);
  /// The snapshot of p: numel(p) fp32 values, packed. Throws Error unless snapshot_ready(p)
  /// has returned true since the last start_snapshot(p).
  std::span<const float> snapshot(int p) const;

  // ------------------------------------------------------------ host → device (merges)
  /// Pinned host buffer for merged Θ_p, numel(p) fp32 values, packed: the caller writes it
  /// (e.g. LearnerWindow::take_inbox(p, merged_host(p))). Throws Error while an upload of p is
  /// in flight (started, not yet applied).
  std::span<float> merged_host(int p);
  /// Copies merged_host(p) to the device staging buffer on the copy stream. Returns at once.
  /// Throws Error when an upload of p is already in flight.
  void start_upload(int p);
  /// Has the upload of p reached the device? Never blocks. Throws Error on a CUDA error or
  /// when no upload of p is in flight.
  bool upload_ready(int p);
  /// At a step boundary: θ_p ← Θ_p (overwrite; the trainer's blend/carry rules can read
  /// device_merged(p) instead and then call finish_upload). Enqueues on `compute` a GPU-side
  /// wait for the upload and the scatter into the parameters; returns at once. Call after
  /// upload_ready(p), or `compute` stalls on the GPU until the copy lands. Throws Error when no
  /// upload of p is in flight.
  void apply(int p, cudaStream_t compute);
  /// The device staging buffer of p (numel(p) fp32, packed), complete for work enqueued on
  /// `compute` after wait_upload(p, compute).
  const float* device_merged(int p) const { return frag(p).d_merged; }
  /// Enqueues on `compute` the GPU-side wait for the upload of p (for a custom apply).
  void wait_upload(int p, cudaStream_t compute);
  /// Ends an upload applied by the caller's own kernels on `compute` (after wait_upload): the
  /// staging buffer is reused only after the work enqueued on `compute` so far.
  void finish_upload(int p, cudaStream_t compute);

 private:
  enum class State { idle, busy, ready };
  struct Slot {
    std::vector<Range> ranges;
    size_t numel = 0;
    float* h_snapshot = nullptr;  // pinned
    float* h_merged = nullptr;    // pinned
    float* d_gather = nullptr;    // device: the snapshot fixed at the step boundary
    float* d_merged = nullptr;    // device: the upload's target
    cudaEvent_t gathered = nullptr;   // compute stream: gather done (D2H may start)
    cudaEvent_t snapshotted = nullptr;  // copy stream: D2H done
    cudaEvent_t uploaded = nullptr;   // copy stream: H2D done
    cudaEvent_t applied = nullptr;    // compute stream: staging buffer read (reusable)
    State snap = State::idle;
    State up = State::idle;
  };
  const Slot& frag(int p) const;
  Slot& frag(int p);
  void release() noexcept;

  float* params_;
  size_t numel_;
  std::vector<Slot> fragments_;
  cudaStream_t copy_ = nullptr;
  int device_ = -1;
};

}  // namespace ddiloco::gpu
