#include "ddiloco/fpu.hpp"

#include <omp.h>

#if defined(__SSE__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

namespace ddiloco {

namespace {
void set_this_thread() {
#if defined(__SSE__)
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#endif
}
}  // namespace

void flush_denormals_to_zero() {
  set_this_thread();
#pragma omp parallel
  set_this_thread();
}

}  // namespace ddiloco
