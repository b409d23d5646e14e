// Floating-point environment of the compute threads.
#pragma once

namespace ddiloco {

/// Makes the calling thread and every thread of its OpenMP team treat subnormal floats as
/// zero, both as results (FTZ) and as inputs (DAZ), on x86 (MXCSR); a no-op elsewhere.
///
/// Why: once a model sharpens, softmax probabilities and their gradients fall below
/// FLT_MIN (1.2e-38) and every operation on them takes a microcode assist, ~100× slower than
/// a normal one. Measured here: a unit whose weights grew under outer Nesterov steps slowed
/// from 220 to 800 ms per inner step. Training does not need subnormals (PyTorch offers the
/// same switch, torch.set_flush_denormal). Call it on every thread that computes, after
/// omp_set_num_threads: the OpenMP team of a thread is reused by its later parallel regions.
void flush_denormals_to_zero();

}  // namespace ddiloco
