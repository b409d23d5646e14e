// Device pointer arrays for cuBLAS's pointer-array batched GEMMs (cublasGemmBatchedEx),
// cached per (operands, B, NH) so that a training step whose activation buffers stay put
// uploads each array once, in its first step, and never again: a host→device copy from
// pageable memory is synchronous, and attention issues ~24 such products per layer.
#include <cstdint>
#include <vector>

#include "ddiloco/gpu/check.hpp"
#include "ddiloco/gpu/kernels.hpp"

namespace ddiloco::gpu {

BatchedPointerCache::~BatchedPointerCache() {
  // GEMMs still queued may read the arrays: wait for them (errors ignored in a destructor;
  // stream_ may be the legacy default stream, nullptr, which is waited for just the same).
  if (!arrays_.empty()) cudaStreamSynchronize(stream_);
  for (auto& [key, p] : arrays_) cudaFree(p);
}

void BatchedPointerCache::clear() {
  DDILOCO_CUDA_CHECK(cudaStreamSynchronize(stream_));  // nothing queued reads them any more
  for (auto& [key, p] : arrays_) DDILOCO_CUDA_CHECK(cudaFree(p));
  arrays_.clear();
}

void* const* BatchedPointerCache::get(cudaStream_t stream, const BatchedOperand& a,
                                      const BatchedOperand& b, const BatchedOperand& c, int B,
                                      int NH) {
  const Key key{reinterpret_cast<uintptr_t>(a.base), a.b_stride, a.h_stride,
                reinterpret_cast<uintptr_t>(b.base), b.b_stride, b.h_stride,
                reinterpret_cast<uintptr_t>(c.base), c.b_stride, c.h_stride,
                B, NH};
  if (arrays_.empty()) stream_ = stream;
  if (stream != stream_) {
    // Arrays are only ever freed after synchronising the stream of their GEMMs: one stream.
    clear();
    stream_ = stream;
  }
  if (auto it = arrays_.find(key); it != arrays_.end()) return it->second;
  if (arrays_.size() >= kMaxEntries) clear();  // e.g. buffers reallocated again and again

  // Host copy: [0, n) = a's pointers, [n, 2n) = b's, [2n, 3n) = c's; problem i = b·NH + h.
  const size_t n = static_cast<size_t>(B) * NH;
  std::vector<void*> host(3 * n);
  const BatchedOperand* ops[3] = {&a, &b, &c};
  for (int o = 0; o < 3; ++o) {
    const char* base = static_cast<const char*>(ops[o]->base);
    for (int bi = 0; bi < B; ++bi)
      for (int h = 0; h < NH; ++h)
        host[o * n + static_cast<size_t>(bi) * NH + h] = const_cast<char*>(
            base + bi * ops[o]->b_stride + h * ops[o]->h_stride);
  }
  void** dev = nullptr;
  DDILOCO_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), host.size() * sizeof(void*)));
  try {
    DDILOCO_CUDA_CHECK(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(void*),
                                       cudaMemcpyHostToDevice, stream));
    DDILOCO_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` dies on return
  } catch (...) {
    cudaFree(dev);
    throw;
  }
  arrays_.emplace(key, dev);
  return dev;
}

}  // namespace ddiloco::gpu
