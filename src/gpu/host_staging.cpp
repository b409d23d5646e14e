// Device ↔ pinned host staging of fragments for the unit leader
// (include/ddiloco/gpu/host_staging.hpp).
#include "ddiloco/gpu/host_staging.hpp"

#include <utility>

#include "ddiloco/error.hpp"

namespace ddiloco::gpu {

HostStaging::FragmentRanges HostStaging::ranges(const protocol::FragmentPlan& plan,
                                                const ParameterLayout& layout) {
  FragmentRanges out(static_cast<size_t>(plan.size()));
  const auto& tensors = layout.tensors();
  for (const protocol::Fragment& f : plan.fragments())
    for (int t : f.tensors) out[f.index].push_back({tensors[t].offset, tensors[t].numel});
  return out;
}

HostStaging::HostStaging(float* params, size_t numel, FragmentRanges fragments)
    : params_(params), numel_(numel) {
  if (params == nullptr) fail("HostStaging: no parameter buffer");
  fragments_.resize(fragments.size());
  for (size_t p = 0; p < fragments.size(); ++p) {
    Slot& f = fragments_[p];
    f.ranges = std::move(fragments[p]);
    for (const Range& r : f.ranges) {
      if (r.numel == 0 || r.offset > numel || r.numel > numel - r.offset)
        fail("HostStaging: fragment {} range [{}, {}) outside the {} parameters", p, r.offset,
             r.offset + r.numel, numel);
      f.numel += r.numel;
    }
    if (f.numel == 0) fail("HostStaging: fragment {} is empty", p);
  }
  try {
    DDILOCO_CUDA_CHECK(cudaGetDevice(&device_));
    int least = 0, greatest = 0;
    DDILOCO_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DDILOCO_CUDA_CHECK(cudaStreamCreateWithPriority(&copy_, cudaStreamNonBlocking, least));
    for (Slot& f : fragments_) {
      const size_t bytes = f.numel * sizeof(float);
      DDILOCO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&f.h_snapshot), bytes,
                                       cudaHostAllocDefault));
      DDILOCO_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&f.h_merged), bytes,
                                       cudaHostAllocDefault));
      DDILOCO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&f.d_gather), bytes));
      DDILOCO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&f.d_merged), bytes));
      for (cudaEvent_t* e : {&f.gathered, &f.snapshotted, &f.uploaded, &f.applied})
        DDILOCO_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
  } catch (...) {
    release();
    throw;
  }
}

HostStaging::~HostStaging() { release(); }

void HostStaging::release() noexcept {
  // Buffers may still be the target of a copy in flight: wait for the copy stream first (a
  // device-wide sync would also wait for unrelated compute). Errors are ignored: nothing can
  // be reported from here, and the process may be unwinding a CUDA failure already.
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  for (Slot& f : fragments_) {
    // The compute stream may still gather into d_gather or scatter from d_merged.
    if (f.gathered != nullptr) cudaEventSynchronize(f.gathered);
    if (f.applied != nullptr) cudaEventSynchronize(f.applied);
    for (cudaEvent_t e : {f.gathered, f.snapshotted, f.uploaded, f.applied})
      if (e != nullptr) cudaEventDestroy(e);
    if (f.d_gather != nullptr) cudaFree(f.d_gather);
    if (f.d_merged != nullptr) cudaFree(f.d_merged);
    if (f.h_snapshot != nullptr) cudaFreeHost(f.h_snapshot);
    if (f.h_merged != nullptr) cudaFreeHost(f.h_merged);
    f = Slot{};
  }
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  copy_ = nullptr;
}

const HostStaging::Slot& HostStaging::frag(int p) const {
  if (p < 0 || p >= fragments()) fail("HostStaging: no fragment {} (there are {})", p, fragments());
  return fragments_[static_cast<size_t>(p)];
}

HostStaging::Slot& HostStaging::frag(int p) {
  return const_cast<Slot&>(std::as_const(*this).frag(p));
}

namespace {
// cudaEventQuery as a yes/no; errors (a fault in earlier work) throw.
bool event_done(cudaEvent_t e) {
  const cudaError_t status = cudaEventQuery(e);
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) return false;
  DDILOCO_CUDA_CHECK(status);
  return false;
}
}  // namespace

void HostStaging::start_snapshot(int p, cudaStream_t compute) {
  Slot& f = frag(p);
  if (f.snap == State::busy)
    fail("HostStaging: snapshot of fragment {} started while the previous one is in flight "
         "(poll snapshot_ready first)", p);
  // Gather on the compute stream: ordered after the step that wrote the parameters and before
  // the next one changes them. The previous D2H out of d_gather is complete (state ready/idle).
  size_t off = 0;
  for (const Range& r : f.ranges) {
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(f.d_gather + off, params_ + r.offset,
                                       r.numel * sizeof(float), cudaMemcpyDeviceToDevice,
                                       compute));
    off += r.numel;
  }
  DDILOCO_CUDA_CHECK(cudaEventRecord(f.gathered, compute));
  DDILOCO_CUDA_CHECK(cudaStreamWaitEvent(copy_, f.gathered, 0));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(f.h_snapshot, f.d_gather, f.numel * sizeof(float),
                                     cudaMemcpyDeviceToHost, copy_));
  DDILOCO_CUDA_CHECK(cudaEventRecord(f.snapshotted, copy_));
  f.snap = State::busy;
}

bool HostStaging::snapshot_ready(int p) {
  Slot& f = frag(p);
  if (f.snap == State::idle) fail("HostStaging: no snapshot of fragment {} was started", p);
  if (f.snap == State::busy && event_done(f.snapshotted)) f.snap = State::ready;
  return f.snap == State::ready;
}

std::span<const float> HostStaging::snapshot(int p) const {
  const Slot& f = frag(p);
  if (f.snap != State::ready)
    fail("HostStaging: snapshot of fragment {} read before snapshot_ready returned true", p);
  return {f.h_snapshot, f.numel};
}

std::span<float> HostStaging::merged_host(int p) {
  Slot& f = frag(p);
  if (f.up != State::idle)
    fail("HostStaging: merged buffer of fragment {} written while its upload is in flight "
         "(apply it first)", p);
  return {f.h_merged, f.numel};
}

void HostStaging::start_upload(int p) {
  Slot& f = frag(p);
  if (f.up != State::idle)
    fail("HostStaging: upload of fragment {} started while the previous one is not applied", p);
  // The staging buffer may still be read by the previous apply on the compute stream.
  DDILOCO_CUDA_CHECK(cudaStreamWaitEvent(copy_, f.applied, 0));
  DDILOCO_CUDA_CHECK(cudaMemcpyAsync(f.d_merged, f.h_merged, f.numel * sizeof(float),
                                     cudaMemcpyHostToDevice, copy_));
  DDILOCO_CUDA_CHECK(cudaEventRecord(f.uploaded, copy_));
  f.up = State::busy;
}

bool HostStaging::upload_ready(int p) {
  Slot& f = frag(p);
  if (f.up == State::idle) fail("HostStaging: no upload of fragment {} is in flight", p);
  if (f.up == State::busy && event_done(f.uploaded)) f.up = State::ready;
  return f.up == State::ready;
}

void HostStaging::wait_upload(int p, cudaStream_t compute) {
  Slot& f = frag(p);
  if (f.up == State::idle) fail("HostStaging: no upload of fragment {} is in flight", p);
  DDILOCO_CUDA_CHECK(cudaStreamWaitEvent(compute, f.uploaded, 0));
}

void HostStaging::finish_upload(int p, cudaStream_t compute) {
  Slot& f = frag(p);
  if (f.up == State::idle) fail("HostStaging: no upload of fragment {} is in flight", p);
  DDILOCO_CUDA_CHECK(cudaEventRecord(f.applied, compute));
  f.up = State::idle;
}

void HostStaging::apply(int p, cudaStream_t compute) {
  wait_upload(p, compute);
  Slot& f = frag(p);
  size_t off = 0;
  for (const Range& r : f.ranges) {
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(params_ + r.offset, f.d_merged + off,
                                       r.numel * sizeof(float), cudaMemcpyDeviceToDevice,
                                       compute));
    off += r.numel;
  }
  finish_upload(p, compute);
}

}  // namespace ddiloco::gpu
