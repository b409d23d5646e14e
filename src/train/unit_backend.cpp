// The CPU library's side of the GPU unit backend (include/ddiloco/gpu/unit_backend.hpp): the
// registered factory, and the refusal where none is installed (a binary built without CUDA).
#include "ddiloco/gpu/unit_backend.hpp"

#include "ddiloco/error.hpp"

namespace ddiloco::gpu {

namespace {
// Set once at start-up by install_cuda_unit_backend (before any thread starts), read after.
UnitBackendFactory g_factory = nullptr;
}  // namespace

void register_unit_backend(UnitBackendFactory factory) { g_factory = factory; }

bool unit_backend_available() { return g_factory != nullptr; }

std::unique_ptr<UnitBackend> make_unit_backend(const Config& config, MPI_Comm unit_comm,
                                               MPI_Comm device_comm,
                                               std::span<const float> initial) {
  if (g_factory == nullptr)
    fail("run.device: cuda needs a ddiloco built with CUDA; build the cuda preset "
         "(cmake --preset cuda && cmake --build --preset cuda)");
  return g_factory(config, unit_comm, device_comm, initial);
}

std::string resolve_attention(const Config& config) {
  if (config.run.gpu_attention != "auto") return config.run.gpu_attention;
  const bool flash = config.model.n_embd / config.model.n_head == 64 &&
                     config.model.seq_len % 64 == 0;
  return flash ? "flash" : "cublas";
}

}  // namespace ddiloco::gpu
