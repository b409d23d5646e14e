// Inside a learner unit on GPUs (docs/architecture.md, "Inside a unit"): one rank per GPU, the
// device chosen by the node-local rank; one NCCL communicator per unit, its unique id
// broadcast over the unit's MPI communicator; the gradient all-reduce and the leader's
// broadcast of merged fragments run on the communicator's own stream, ordered against the
// compute stream with CUDA events, so that the host never waits for them.
//
// Errors: every failing CUDA, NCCL or MPI call throws ddiloco::Error naming the call, the
// library's message and file:line (NCCL: also ncclGetLastError's detail).
//
// Sources: NCCL user guide, "Creating a communicator" (ncclGetUniqueId on one rank, broadcast
// out of band, ncclCommInitRank on every rank), "Using NCCL with MPI", "CUDA stream semantics"
// and "Fault tolerance" (ncclCommGetAsyncError, ncclCommAbort);
// https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <span>

#include "ddiloco/gpu/check.hpp"

namespace ddiloco::gpu {

/// Throws ddiloco::Error("NCCL error <string> (<detail>) in <call> at <file>:<line>"); detail
/// is ncclGetLastError(comm) where comm is known (nullptr: the last error of any).
[[noreturn]] void throw_nccl_error(ncclResult_t status, ncclComm_t comm, const char* call,
                                   const char* file, int line);

/// Which GPU this rank took (select_device).
struct DeviceChoice {
  int device = -1;        ///< CUDA device index (within CUDA_VISIBLE_DEVICES), now current
  int local_rank = 0;     ///< rank among `comm`'s ranks on this node
  int local_size = 1;     ///< `comm`'s ranks on this node
  int device_count = 0;   ///< devices this process sees
  /// More ranks on this node than devices: some ranks share one (allowed, e.g. several
  /// one-rank units on one GPU; never two ranks of one NCCL communicator, see NcclComm).
  bool shared = false;
};

/// Node-local rank of this process among the ranks of `comm` (MPI_Comm_split_type
/// MPI_COMM_TYPE_SHARED, ordered by rank in `comm`), and how many there are. Collective.
void node_local_rank(MPI_Comm comm, int& local_rank, int& local_size);

/// One GPU per rank: device = node-local rank mod device count, made current (cudaSetDevice).
/// `comm`: every rank on the node that uses a GPU, e.g. all learner ranks of the job (not the
/// syncer, which is CPU only, or it would take device 0's turn; and not one unit's
/// communicator, or two units on one node would both start at device 0). Collective over
/// `comm`. Throws Error when this process sees no CUDA device.
DeviceChoice select_device(MPI_Comm comm);

/// NCCL element types we reduce: fp32 parameters/gradients, bf16 (2 bytes) gradients and
/// parameter copies, and float64 partial sums (the sharded gradient norm).
enum class DType { f32, bf16, f64 };
/// Sum, or the mean over the communicator's ranks (ncclAvg, NCCL ≥ 2.10).
enum class ReduceOp { sum, avg };

/// Bytes of one element of `type`.
constexpr size_t dtype_bytes(DType type) { return type == DType::f64 ? 8 : type == DType::f32 ? 4 : 2; }

/// A device buffer: `count` elements at device pointer `data` (e.g. one tensor of a fragment,
/// or one gradient bucket).
struct DeviceBuffer {
  void* data = nullptr;
  size_t count = 0;
};

/// An NCCL communicator over the ranks of an MPI communicator (normally a unit's), with a
/// stream of its own for the collectives.
///
/// Ordering (no host waits): every collective first makes the communicator's stream wait for
/// an event recorded on the caller's compute stream (so it sees everything enqueued there
/// before, e.g. the backward pass that wrote the gradients), then runs, then records a
/// completion event. join(compute) makes the compute stream wait for that event on the GPU
/// (before the optimizer reads the reduced gradients), while kernels enqueued on `compute` in
/// between (e.g. the next layer's backward) overlap the collective. Collectives issued one
/// after another run in issue order on the stream; join covers all of them.
///
/// Buffers are device pointers on this rank's current device; every rank of the communicator
/// must issue the same collectives in the same order with the same counts (NCCL's rule).
///
/// Lifetime: the constructor is collective over `comm` (like MPI_Comm_dup); so is normal
/// destruction (ncclCommFinalize, then ncclCommDestroy). While an exception unwinds the stack
/// the destructor calls ncclCommAbort instead, which returns without waiting for the other
/// ranks (the repo's MPI wrappers likewise skip collective frees then; main aborts the job).
class NcclComm {
 public:
  /// Collective over `comm`: rank 0 of `comm` gets an ncclUniqueId, MPI_Bcast sends it to the
  /// others, each calls ncclCommInitRank on its current CUDA device (select_device first).
  /// NCCL rank = rank in `comm`. Throws Error when two ranks of `comm` use the same GPU
  /// (checked by PCI bus id before NCCL sees it, which would only report "Duplicate GPU
  /// detected" in its log), or when any NCCL/CUDA/MPI call fails. A failure of rank 0's
  /// ncclGetUniqueId is reported on every rank (agreed over `comm`), not as a hang.
  explicit NcclComm(MPI_Comm comm);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  ncclComm_t handle() const { return comm_; }
  /// The communicator's own stream (non-blocking with respect to the legacy default stream).
  cudaStream_t stream() const { return stream_; }

  /// In-place all-reduce of `count` elements of `type` at device pointer `data`, after the work
  /// enqueued on `compute` so far. Returns at once; join() before reading the result.
  void allreduce(void* data, size_t count, DType type, ReduceOp op, cudaStream_t compute);
  /// Typed forms: fp32, and bf16 given as its 16-bit pattern (uint16_t, what __nv_bfloat16
  /// stores; the header stays free of cuda_bf16.h).
  void allreduce(float* data, size_t count, ReduceOp op, cudaStream_t compute) {
    allreduce(data, count, DType::f32, op, compute);
  }
  void allreduce_bf16(void* data, size_t count, ReduceOp op, cudaStream_t compute) {
    allreduce(data, count, DType::bf16, op, compute);
  }
  /// In-place broadcast of `count` elements from NCCL rank `root` (the unit leader, 0, for
  /// merged fragments), after the work enqueued on `compute` so far.
  void broadcast(void* data, size_t count, DType type, int root, cudaStream_t compute);
  /// Several buffers in one NCCL group (ncclGroupStart/End: one launch, not one per buffer):
  /// the tensors of a fragment the leader applied (HostStaging::ranges), or gradient buckets.
  /// Elements of `type`; in place, as above.
  void broadcast(std::span<const DeviceBuffer> buffers, DType type, int root,
                 cudaStream_t compute);
  void allreduce(std::span<const DeviceBuffer> buffers, DType type, ReduceOp op,
                 cudaStream_t compute);

  /// ZeRO-1 (units.zero = 1), in place on a buffer of size() · `count` elements of `type` at
  /// `data`: reduce_scatter leaves rank r's piece [r·count, (r+1)·count) holding the reduction of
  /// every rank's piece r (ncclReduceScatter, recvbuff = sendbuff + r·count); all_gather copies
  /// every rank's piece r into piece r of every rank's buffer (ncclAllGather, sendbuff =
  /// recvbuff + r·count). After the work enqueued on `compute` so far; join() before reading.
  void reduce_scatter(void* data, size_t count, DType type, ReduceOp op, cudaStream_t compute);
  void all_gather(void* data, size_t count, DType type, cudaStream_t compute);

  /// Makes `compute` wait (on the GPU, not the host) for every collective issued so far.
  void join(cudaStream_t compute);
  /// Host wait for every collective issued so far, polling with back-off (never a busy spin;
  /// docs/architecture.md) and checking ncclCommGetAsyncError between polls, so that a peer that
  /// failed surfaces as an Error instead of a hang.
  void synchronize();
  /// Throws Error when NCCL reports an asynchronous error on this communicator.
  void check_async() const;

 private:
  void before(cudaStream_t compute);  // stream_ waits for compute's work so far
  void after();                       // records done_ on stream_
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream before a collective
  cudaEvent_t done_ = nullptr;   // recorded on stream_ after it
  int rank_ = 0, size_ = 0, device_ = -1;
};

}  // namespace ddiloco::gpu

#define DDILOCO_NCCL_CHECK(comm, call)                                                    \
  do {                                                                                    \
    const ncclResult_t ddiloco_nccl_status_ = (call);                                     \
    if (ddiloco_nccl_status_ != ncclSuccess)                                              \
      ::ddiloco::gpu::throw_nccl_error(ddiloco_nccl_status_, (comm), #call, __FILE__, __LINE__); \
  } while (0)
