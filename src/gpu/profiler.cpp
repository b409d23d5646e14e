// OpProfiler: pooled CUDA events, two per range, read back in collect().
#include "ddiloco/gpu/profiler.hpp"

#include <cuda_runtime.h>

#include <unordered_map>

#include "ddiloco/error.hpp"
#include "ddiloco/gpu/check.hpp"

namespace ddiloco::gpu {

struct OpProfiler::Impl {
  struct Pending {
    int row;
    cudaEvent_t start, stop;
  };
  cudaStream_t stream;
  std::vector<cudaEvent_t> pool;
  size_t used = 0;
  std::vector<Pending> pending;
  std::vector<size_t> open;  // indices into pending
  std::vector<Row> rows;
  std::unordered_map<std::string, int> index;
  cudaError_t error = cudaSuccess;  // first failure of a record in end() (no throw there)
  int steps = 0;

  cudaEvent_t take() {
    if (used == pool.size()) {
      cudaEvent_t e = nullptr;
      DDILOCO_CUDA_CHECK(cudaEventCreate(&e));
      pool.push_back(e);
    }
    return pool[used++];
  }
};

OpProfiler::OpProfiler(void* stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = static_cast<cudaStream_t>(stream);
}

OpProfiler::~OpProfiler() {
  for (cudaEvent_t e : impl_->pool) cudaEventDestroy(e);
}

void OpProfiler::begin(const char* name, double flops) {
  Impl& s = *impl_;
  std::string full;
  if (!s.open.empty()) {
    Row& parent = s.rows[static_cast<size_t>(s.pending[s.open.back()].row)];
    parent.group = true;
    full = parent.name + " / " + name;
  } else {
    full = name;
  }
  auto [it, inserted] = s.index.try_emplace(full, static_cast<int>(s.rows.size()));
  if (inserted) {
    Row row;
    row.name = full;
    row.depth = static_cast<int>(s.open.size());
    s.rows.push_back(std::move(row));
  }
  Row& row = s.rows[static_cast<size_t>(it->second)];
  row.flops += flops;
  ++row.count;
  cudaEvent_t start = s.take();
  DDILOCO_CUDA_CHECK(cudaEventRecord(start, s.stream));
  s.open.push_back(s.pending.size());
  s.pending.push_back({it->second, start, nullptr});
}

void OpProfiler::end() {
  Impl& s = *impl_;
  if (s.open.empty()) return;
  cudaEvent_t stop = nullptr;
  try {
    stop = s.take();
  } catch (...) {
    if (s.error == cudaSuccess) s.error = cudaErrorMemoryAllocation;
  }
  if (stop != nullptr) {
    const cudaError_t st = cudaEventRecord(stop, s.stream);
    if (st != cudaSuccess && s.error == cudaSuccess) s.error = st;
  }
  s.pending[s.open.back()].stop = stop;
  s.open.pop_back();
}

void OpProfiler::collect() {
  Impl& s = *impl_;
  if (!s.open.empty()) fail("OpProfiler::collect: {} range(s) still open", s.open.size());
  if (s.error != cudaSuccess)
    fail("OpProfiler: recording an event failed ({})", cudaGetErrorString(s.error));
  DDILOCO_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  for (const auto& p : s.pending) {
    if (p.stop == nullptr) continue;
    float ms = 0;
    DDILOCO_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
    s.rows[static_cast<size_t>(p.row)].ms += ms;
  }
  if (!s.pending.empty()) ++s.steps;
  s.pending.clear();
  s.used = 0;
}

const std::vector<OpProfiler::Row>& OpProfiler::rows() const { return impl_->rows; }
int OpProfiler::steps() const { return impl_->steps; }

}  // namespace ddiloco::gpu
