// NCCL inside a learner unit: device choice, the communicator's life cycle, collectives on
// their own stream (include/ddiloco/gpu/nccl.hpp).
#include "ddiloco/gpu/nccl.hpp"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/mpi.hpp"

namespace ddiloco::gpu {

void throw_nccl_error(ncclResult_t status, ncclComm_t comm, const char* call, const char* file,
                      int line) {
  // ncclGetLastError holds the why (e.g. which peer, which transport) that the status string
  // ("unhandled system error") lacks.
  const char* detail = ncclGetLastError(comm);
  fail("NCCL error {} ({}) in {} at {}:{}", ncclGetErrorString(status),
       detail != nullptr && detail[0] != '\0' ? detail : "no detail", call, file, line);
}

void node_local_rank(MPI_Comm comm, int& local_rank, int& local_size) {
  MPI_Comm node = MPI_COMM_NULL;
  mpi::check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
             "Comm_split_type(SHARED)");
  local_rank = mpi::rank(node);
  local_size = mpi::size(node);
  MPI_Comm_free(&node);
}

DeviceChoice select_device(MPI_Comm comm) {
  DeviceChoice c;
  node_local_rank(comm, c.local_rank, c.local_size);
  // No device is an error here (the caller asked for the GPU path); the tests ask
  // cuda_device_available() first and skip.
  const cudaError_t status = cudaGetDeviceCount(&c.device_count);
  if (status != cudaSuccess || c.device_count == 0) {
    (void)cudaGetLastError();
    fail("no CUDA device: cudaGetDeviceCount found none ({}; CUDA_VISIBLE_DEVICES={})",
         status == cudaSuccess ? "0 devices" : cudaGetErrorString(status),
         std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "unset");
  }
  c.device = c.local_rank % c.device_count;
  c.shared = c.local_size > c.device_count;
  // A host wait (the step's read of loss and norm, stream synchronisations) sleeps on an
  // interrupt instead of spinning a core: learner ranks often outnumber cores, and the
  // project does not busy-spin. The flag must be set before the device's context exists;
  // if something already created it, its flags stay as they are.
  const cudaError_t init = cudaInitDevice(c.device, cudaDeviceScheduleBlockingSync, 0);
  if (init == cudaErrorSetOnActiveProcess)
    (void)cudaGetLastError();
  else
    DDILOCO_CUDA_CHECK(init);
  DDILOCO_CUDA_CHECK(cudaSetDevice(c.device));
  return c;
}

namespace {

// What identifies a GPU across the whole job: its UUID (PCI bus ids repeat across nodes).
struct DeviceId {
  unsigned char uuid[16];
  char bus_id[32];  // for the message
};

DeviceId device_id(int device) {
  DeviceId id{};
  cudaDeviceProp prop{};
  DDILOCO_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  static_assert(sizeof(prop.uuid.bytes) == sizeof(id.uuid));
  std::memcpy(id.uuid, prop.uuid.bytes, sizeof(id.uuid));
  DDILOCO_CUDA_CHECK(cudaDeviceGetPCIBusId(id.bus_id, sizeof(id.bus_id), device));
  return id;
}

ncclDataType_t nccl_type(DType type) {
  switch (type) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f64: return ncclFloat64;
  }
  fail("NCCL: unknown element type {}", static_cast<int>(type));
}

// Rank r's piece of a buffer of `count`-element pieces.
void* piece(void* data, int r, size_t count, DType type) {
  return static_cast<char*>(data) + static_cast<size_t>(r) * count * dtype_bytes(type);
}

}  // namespace

NcclComm::NcclComm(MPI_Comm comm) {
  rank_ = mpi::rank(comm);
  size_ = mpi::size(comm);
  DDILOCO_CUDA_CHECK(cudaGetDevice(&device_));

  // Two ranks of one communicator on one GPU: NCCL (≥ 2.x) refuses it deep inside init with
  // "Duplicate GPU detected" in its debug log and a bare "invalid usage" status. Every rank
  // gathers every rank's device and reaches the same verdict, so all of them throw together.
  const DeviceId mine = device_id(device_);
  std::vector<DeviceId> all(static_cast<size_t>(size_));
  mpi::check(MPI_Allgather(&mine, sizeof(DeviceId), MPI_BYTE, all.data(), sizeof(DeviceId),
                           MPI_BYTE, comm),
             "Allgather(device ids)");
  for (int a = 0; a < size_; ++a)
    for (int b = a + 1; b < size_; ++b)
      if (std::memcmp(all[a].uuid, all[b].uuid, sizeof(mine.uuid)) == 0)
        fail("ranks {} and {} of one NCCL communicator use the same GPU (PCI {}): NCCL needs one "
             "GPU per rank; start at most as many ranks per unit and node as GPUs, or set "
             "CUDA_VISIBLE_DEVICES",
             a, b, all[a].bus_id);

  // Rank 0's ncclGetUniqueId can fail (no usable network interface for the bootstrap): agree
  // on it first, so that the others throw too instead of waiting in MPI_Bcast forever.
  ncclUniqueId id{};
  mpi::agree(comm, [&] {
    if (rank_ == 0) DDILOCO_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
  });
  mpi::check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm), "Bcast(ncclUniqueId)");

  try {
    // The collectives get the highest stream priority: their kernels then start as soon as an
    // SM frees up, instead of queueing behind the compute kernels they are meant to overlap.
    int least = 0, greatest = 0;
    DDILOCO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DDILOCO_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    DDILOCO_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    DDILOCO_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    // Collective; a rank that fails here leaves the others blocked in NCCL's bootstrap (NCCL
    // has no timeout there), which is why everything that can be checked beforehand is.
    DDILOCO_NCCL_CHECK(nullptr, ncclCommInitRank(&comm_, size_, id, rank_));
  } catch (...) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    throw;
  }
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) {
    // NCCL's calls act on the communicator's device; the caller's current device is restored.
    int current = -1;
    cudaGetDevice(&current);
    cudaSetDevice(device_);
    // Finalize waits for the other ranks (the communicator becomes globally quiescent); while
    // an error unwinds this rank alone they may never come, so abort, which never waits.
    if (std::uncaught_exceptions() > 0 || ncclCommFinalize(comm_) != ncclSuccess)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
    if (current >= 0) cudaSetDevice(current);
  }
  // Destroying a stream or event with work pending is allowed: CUDA releases it afterwards.
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclComm::before(cudaStream_t compute) {
  DDILOCO_CUDA_CHECK(cudaEventRecord(ready_, compute));
  DDILOCO_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

void NcclComm::after() { DDILOCO_CUDA_CHECK(cudaEventRecord(done_, stream_)); }

void NcclComm::allreduce(void* data, size_t count, DType type, ReduceOp op,
                         cudaStream_t compute) {
  before(compute);
  DDILOCO_NCCL_CHECK(comm_, ncclAllReduce(data, data, count, nccl_type(type),
                                          op == ReduceOp::sum ? ncclSum : ncclAvg, comm_,
                                          stream_));
  after();
}

void NcclComm::broadcast(void* data, size_t count, DType type, int root, cudaStream_t compute) {
  if (root < 0 || root >= size_)
    fail("NCCL broadcast root {} is not a rank of this communicator (size {})", root, size_);
  before(compute);
  DDILOCO_NCCL_CHECK(comm_,
                     ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_));
  after();
}

void NcclComm::broadcast(std::span<const DeviceBuffer> buffers, DType type, int root,
                         cudaStream_t compute) {
  if (root < 0 || root >= size_)
    fail("NCCL broadcast root {} is not a rank of this communicator (size {})", root, size_);
  before(compute);
  DDILOCO_NCCL_CHECK(comm_, ncclGroupStart());
  // ncclGroupEnd must follow ncclGroupStart even when a call inside fails, or NCCL stays in
  // group mode on this thread.
  ncclResult_t status = ncclSuccess;
  for (const DeviceBuffer& b : buffers) {
    status = ncclBroadcast(b.data, b.data, b.count, nccl_type(type), root, comm_, stream_);
    if (status != ncclSuccess) break;
  }
  const ncclResult_t end = ncclGroupEnd();
  DDILOCO_NCCL_CHECK(comm_, status);
  DDILOCO_NCCL_CHECK(comm_, end);
  after();
}

void NcclComm::allreduce(std::span<const DeviceBuffer> buffers, DType type, ReduceOp op,
                         cudaStream_t compute) {
  before(compute);
  DDILOCO_NCCL_CHECK(comm_, ncclGroupStart());
  ncclResult_t status = ncclSuccess;
  for (const DeviceBuffer& b : buffers) {
    status = ncclAllReduce(b.data, b.data, b.count, nccl_type(type),
                           op == ReduceOp::sum ? ncclSum : ncclAvg, comm_, stream_);
    if (status != ncclSuccess) break;
  }
  const ncclResult_t end = ncclGroupEnd();
  DDILOCO_NCCL_CHECK(comm_, status);
  DDILOCO_NCCL_CHECK(comm_, end);
  after();
}

void NcclComm::reduce_scatter(void* data, size_t count, DType type, ReduceOp op, cudaStream_t compute) {
  before(compute);
  DDILOCO_NCCL_CHECK(comm_, ncclReduceScatter(data, piece(data, rank_, count, type), count, nccl_type(type),
                                              op == ReduceOp::sum ? ncclSum : ncclAvg, comm_, stream_));
  after();
}

void NcclComm::all_gather(void* data, size_t count, DType type, cudaStream_t compute) {
  before(compute);
  DDILOCO_NCCL_CHECK(comm_, ncclAllGather(piece(data, rank_, count, type), data, count, nccl_type(type), comm_,
                                          stream_));
  after();
}

void NcclComm::join(cudaStream_t compute) {
  DDILOCO_CUDA_CHECK(cudaStreamWaitEvent(compute, done_, 0));
}

void NcclComm::check_async() const {
  ncclResult_t async = ncclSuccess;
  DDILOCO_NCCL_CHECK(comm_, ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess && async != ncclInProgress)
    throw_nccl_error(async, comm_, "ncclCommGetAsyncError", __FILE__, __LINE__);
}

void NcclComm::synchronize() {
  mpi::Backoff backoff(200);
  for (;;) {
    const cudaError_t status = cudaEventQuery(done_);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) DDILOCO_CUDA_CHECK(status);
    check_async();
    backoff.idle();
  }
}

}  // namespace ddiloco::gpu
