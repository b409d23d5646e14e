// The CPU library's side of the GPU unit backend (include/ddiloco/unit_backend.hpp): the
// registered factory, the refusal where none is installed (a binary built without CUDA), and
// the run.device: cuda checks that config validation makes once one is.
#include "ddiloco/unit_backend.hpp"

#include "ddiloco/error.hpp"
#include "ddiloco/sdpa_shape.hpp"

namespace ddiloco::gpu {

namespace {
// Set once at start-up by install_cuda_unit_backend (before any thread starts), read after.
UnitBackendFactory g_factory = nullptr;
long g_cudnn_version = 0;

void validate_cudnn(const Config& c) {
  if (g_cudnn_version == 0)
    fail("run.gpu_attention: cudnn needs a ddiloco built with cuDNN 9 (CMake found none, or "
         "DDILOCO_CUDNN=OFF; docs/gpu.md, Learner units on GPUs); this build offers auto, cublas "
         "and flash");
  const SdpaLayout layout =
      sdpa_layout(c.train.batch_size, c.model.seq_len, c.model.n_embd, c.model.n_head);
  const std::string why = sdpa_unsupported(layout, SdpaDtype::bfloat16, true, g_cudnn_version);
  if (!why.empty())
    fail("run.gpu_attention: cudnn cannot run this model: {} (use auto, cublas or flash)", why);
}
}  // namespace

void register_unit_backend(UnitBackendFactory factory, long cudnn_version) {
  g_factory = factory;
  g_cudnn_version = factory != nullptr ? cudnn_version : 0;
  set_cuda_check(factory != nullptr ? &validate : nullptr);
}

bool unit_backend_available() { return g_factory != nullptr; }

long unit_backend_cudnn_version() { return g_cudnn_version; }

std::unique_ptr<UnitBackend> make_unit_backend(const Config& config, MPI_Comm unit_comm,
                                               MPI_Comm device_comm,
                                               std::span<const float> initial) {
  if (g_factory == nullptr)
    fail("run.device: cuda needs a ddiloco built with CUDA; build the cuda preset "
         "(cmake --preset cuda && cmake --build --preset cuda)");
  return g_factory(config, unit_comm, device_comm, initial);
}

void validate(const Config& c) {
  if (mode_traits(c.mode).gradient_ring)
    fail("run.device: cuda is not supported in mode ddp (its gradient ring across units "
         "runs on host buffers); use mode single, diloco, streaming or decoupled, or "
         "run.device: cpu");
  if (c.run.gpu_attention == "flash" &&
      (c.model.n_embd / c.model.n_head != 64 || c.model.seq_len % 64 != 0))
    fail("run.gpu_attention: flash needs head size model.n_embd/model.n_head = 64 and "
         "model.seq_len a multiple of 64, got head size {} and seq_len {} (use auto or "
         "cublas)",
         c.model.n_embd / c.model.n_head, c.model.seq_len);
  if (c.run.gpu_attention == "cudnn") validate_cudnn(c);
}

std::string resolve_attention(const Config& config) {
  // auto = cublas: measured on an H200 (GPT-2 124M, B=16, T=1024, bench gpu --profile), a
  // training step took 46.2 ms with cublas attention and 55.7 ms with the flash kernels
  // (fwd 6.9 ms, bwd 16.4 ms per step against cublas's 6.7 + 9.7 ms). flash saves the
  // (B,NH,T,T) probabilities (0.4 GB per layer there) and stays available by name. cudnn
  // (cuDNN's fused SDPA) has not run on a device yet: by name only until it is measured.
  if (config.run.gpu_attention != "auto") return config.run.gpu_attention;
  return "cublas";
}

}  // namespace ddiloco::gpu
