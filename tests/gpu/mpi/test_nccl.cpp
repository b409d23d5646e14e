// ranks: 2
// NCCL inside a unit (include/ddiloco/gpu/nccl.hpp), under mpirun: device choice by node-local
// rank, the communicator built over an MPI communicator, all-reduce (sum, avg; fp32, bf16) and
// broadcast on the communicator's stream ordered against a compute stream, and the refusal of
// two ranks on one GPU.
//
// NCCL refuses two ranks of one communicator on one GPU, so the NCCL communicator holds the
// ranks that got a GPU of their own (node-local rank < device count): with one GPU a 1-rank
// communicator (which still runs every call path), with two or more a real 2-rank one. The
// duplicate-GPU check uses both ranks on device 0. Without a device the GPU tests skip on every
// rank and the program exits 77 (ctest: skipped).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/nccl.hpp"
#include "gpu_test.hpp"
#include "mpi/mpi_test_main.hpp"

namespace ddiloco::gpu {
namespace {

// The ranks of MPI_COMM_WORLD with a GPU of their own (collective over the world; the others
// get MPI_COMM_NULL), with each rank's device made current.
struct Unit {
  DeviceChoice choice;
  MPI_Comm comm = MPI_COMM_NULL;
  Unit() {
    choice = select_device(MPI_COMM_WORLD);
    const bool own_gpu = choice.local_rank < choice.device_count;
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_split(MPI_COMM_WORLD, own_gpu ? 0 : MPI_UNDEFINED, world_rank, &comm);
  }
  ~Unit() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

// Pinned host memory, so that cudaMemcpyAsync is truly asynchronous (a pageable copy would
// synchronise and hide an ordering bug).
template <typename T>
struct Pinned {
  T* p = nullptr;
  size_t n;
  explicit Pinned(size_t count) : n(count) {
    DDILOCO_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), n * sizeof(T)));
  }
  ~Pinned() { cudaFreeHost(p); }
  T& operator[](size_t i) { return p[i]; }
};

struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) { DDILOCO_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Device() { cudaFree(p); }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { DDILOCO_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// bf16 bit pattern of a float that bf16 holds exactly (small integers): its upper 16 bits.
uint16_t to_bf16(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Gradients of rank r: (r + 1)·(i mod 97) — integers, exact in fp32 sums.
float grad(int r, size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 97)); }

constexpr size_t kCount = (size_t{1} << 20) + 3;  // odd: no chunk divides it

TEST(Nccl, DeviceChoiceFollowsTheNodeLocalRank) {
  DDILOCO_REQUIRE_GPU();
  const DeviceChoice c = select_device(MPI_COMM_WORLD);
  int current = -1;
  DDILOCO_CUDA_CHECK(cudaGetDevice(&current));
  EXPECT_EQ(current, c.device);
  EXPECT_EQ(c.device, c.local_rank % c.device_count);
  EXPECT_EQ(c.local_size, 2);  // both ranks on this node
  EXPECT_EQ(c.shared, c.device_count < 2);
}

TEST(Nccl, AllReduceSumAndAvgInFp32AfterTheComputeStreamsWork) {
  DDILOCO_REQUIRE_GPU();
  Unit unit;
  if (unit.comm == MPI_COMM_NULL) return;  // this rank has no GPU of its own
  NcclComm nccl(unit.comm);
  const int n = nccl.size();
  EXPECT_EQ(nccl.device(), unit.choice.device);
  Stream compute;
  Pinned<float> host(kCount);
  Device dev(kCount * sizeof(float));
  auto* d = static_cast<float*>(dev.p);

  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    for (size_t i = 0; i < kCount; ++i) host[i] = grad(nccl.rank(), i);
    // The input arrives on the compute stream, asynchronously: the all-reduce must wait for it.
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(d, host.p, kCount * sizeof(float), cudaMemcpyHostToDevice,
                                       compute.s));
    nccl.allreduce(d, kCount, op, compute.s);
    nccl.join(compute.s);  // the optimizer (here: the copy back) must see the result
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(host.p, d, kCount * sizeof(float), cudaMemcpyDeviceToHost,
                                       compute.s));
    DDILOCO_CUDA_CHECK(cudaStreamSynchronize(compute.s));
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += grad(r, i);
      if (op == ReduceOp::avg) want /= static_cast<float>(n);
      // NCCL may scale by 1/n before or after summing: exact for n = 1, 2, 4, rounded else.
      wrong += std::fabs(host[i] - want) > 1e-6f * std::fabs(want);
    }
    EXPECT_EQ(wrong, 0u) << (op == ReduceOp::sum ? "sum" : "avg") << " over " << n << " ranks";
  }
  nccl.check_async();
}

TEST(Nccl, AllReduceInBf16) {
  DDILOCO_REQUIRE_GPU();
  Unit unit;
  if (unit.comm == MPI_COMM_NULL) return;
  NcclComm nccl(unit.comm);
  const int n = nccl.size();
  Stream compute;
  Pinned<uint16_t> host(kCount);
  Device dev(kCount * 2);
  // Small integers (≤ 8 · ranks): exact in bf16's 8-bit significand, so the sum is exact.
  auto value = [](int r, size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 8)); };
  for (size_t i = 0; i < kCount; ++i) host[i] = to_bf16(value(nccl.rank(), i));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(dev.p, host.p, kCount * 2, cudaMemcpyHostToDevice, compute.s));
  nccl.allreduce_bf16(dev.p, kCount, ReduceOp::sum, compute.s);
  nccl.synchronize();  // the host wait (polls, checks NCCL's async errors)
  DDILOCO_CUDA_CHECK(cudaMemcpy(host.p, dev.p, kCount * 2, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += value(r, i);
    wrong += from_bf16(host[i]) != want;
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(Nccl, BroadcastFromTheLeader) {
  DDILOCO_REQUIRE_GPU();
  Unit unit;
  if (unit.comm == MPI_COMM_NULL) return;
  NcclComm nccl(unit.comm);
  Stream compute;
  Pinned<float> host(kCount);
  Device dev(kCount * sizeof(float));
  for (size_t i = 0; i < kCount; ++i)
    host[i] = nccl.rank() == 0 ? static_cast<float>(i % 4093) * 0.25f : -1.0f;
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(dev.p, host.p, kCount * sizeof(float),
                                     cudaMemcpyHostToDevice, compute.s));
  nccl.broadcast(dev.p, kCount, DType::f32, 0, compute.s);
  nccl.join(compute.s);
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(host.p, dev.p, kCount * sizeof(float),
                                     cudaMemcpyDeviceToHost, compute.s));
  DDILOCO_CUDA_CHECK(cudaStreamSynchronize(compute.s));
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += host[i] != static_cast<float>(i % 4093) * 0.25f;
  EXPECT_EQ(wrong, 0u);
  EXPECT_THROW(nccl.broadcast(dev.p, 1, DType::f32, nccl.size(), compute.s), Error);
}

TEST(Nccl, GroupedBroadcastAndAllReduceOfSeveralBuffers) {
  DDILOCO_REQUIRE_GPU();
  Unit unit;
  if (unit.comm == MPI_COMM_NULL) return;
  NcclComm nccl(unit.comm);
  const int n = nccl.size();
  Stream compute;
  constexpr size_t kN = 100'000;
  Pinned<float> host(kN);
  Device dev(kN * sizeof(float));
  auto* d = static_cast<float*>(dev.p);
  // Two "tensors" of a fragment, [10, 30010) and [50000, 50777), with gaps left alone.
  const DeviceBuffer parts[] = {{d + 10, 30'000}, {d + 50'000, 777}};
  auto inside = [](size_t i) { return (i >= 10 && i < 30'010) || (i >= 50'000 && i < 50'777); };

  for (size_t i = 0; i < kN; ++i) host[i] = nccl.rank() == 0 ? static_cast<float>(i) : -1.0f;
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(d, host.p, kN * sizeof(float), cudaMemcpyHostToDevice,
                                     compute.s));
  nccl.broadcast(parts, DType::f32, 0, compute.s);
  nccl.join(compute.s);
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(host.p, d, kN * sizeof(float), cudaMemcpyDeviceToHost,
                                     compute.s));
  DDILOCO_CUDA_CHECK(cudaStreamSynchronize(compute.s));
  size_t wrong = 0;
  for (size_t i = 0; i < kN; ++i) {
    const float want = nccl.rank() == 0 || inside(i) ? static_cast<float>(i) : -1.0f;
    wrong += host[i] != want;
  }
  EXPECT_EQ(wrong, 0u) << "broadcast";

  for (size_t i = 0; i < kN; ++i) host[i] = grad(nccl.rank(), i);
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(d, host.p, kN * sizeof(float), cudaMemcpyHostToDevice,
                                     compute.s));
  nccl.allreduce(parts, DType::f32, ReduceOp::sum, compute.s);
  nccl.synchronize();
  DDILOCO_CUDA_CHECK(cudaMemcpy(host.p, d, kN * sizeof(float), cudaMemcpyDeviceToHost));
  wrong = 0;
  for (size_t i = 0; i < kN; ++i) {
    float want = grad(nccl.rank(), i);
    if (inside(i)) {
      want = 0;
      for (int r = 0; r < n; ++r) want += grad(r, i);
    }
    wrong += host[i] != want;
  }
  EXPECT_EQ(wrong, 0u) << "all-reduce";
}

TEST(Nccl, TwoRanksOnOneGpuAreRefusedOnEveryRank) {
  DDILOCO_REQUIRE_GPU();
  DDILOCO_CUDA_CHECK(cudaSetDevice(0));  // both ranks on device 0
  std::string message;
  try {
    NcclComm nccl(MPI_COMM_WORLD);
    ADD_FAILURE() << "two ranks on one GPU were accepted";
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("ranks 0 and 1 of one NCCL communicator use the same GPU"),
            std::string::npos)
      << message;
  select_device(MPI_COMM_WORLD);  // back to this rank's own device
}

TEST(Nccl, SelectDeviceFindsTheDeviceOrSaysThereIsNone) {
  // Without a GPU select_device must say so (the trainer asked for the GPU path); with one it
  // returns one of the devices. (Not a skip either way: a skipped test makes the whole
  // program count as skipped, mpi_test_main.hpp.)
  if (cuda_device_available()) {
    const DeviceChoice c = select_device(MPI_COMM_WORLD);
    EXPECT_GE(c.device, 0);
    EXPECT_LT(c.device, c.device_count);
    return;
  }
  try {
    select_device(MPI_COMM_WORLD);
    ADD_FAILURE() << "select_device found a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device: cudaGetDeviceCount found none"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddiloco::gpu
