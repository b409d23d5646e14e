// Per-operation GPU timing for `ddiloco bench gpu --profile`: CUDA events recorded around
// every operation the model enqueues, summed by category over layers and steps.
//
// Zero cost when off: GptCuda, BlasContext and the attention/optimizer launchers hold a
// nullable OpProfiler*; every ProfileScope on a null profiler is a pointer test and nothing
// else (no events, no host synchronisation). When on, each scope records two events on the
// profiled stream, so the timed operations are serialised exactly as in a normal step; the
// events are read only in collect(), which synchronises.
//
// Scopes nest: a scope opened inside another is named "<outer> / <inner>" and the outer one
// becomes a group (its own range is kept, flagged, and left out of leaf sums so nothing is
// counted twice). Header free of CUDA types.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace ddiloco::gpu {

class OpProfiler {
 public:
  /// Events are recorded on `stream` (a cudaStream_t).
  explicit OpProfiler(void* stream);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  /// Opens a range named `name` (nested under the open ones); flops: the arithmetic it does
  /// (2·M·N·K for a GEMM), 0 for none. Records an event.
  void begin(const char* name, double flops = 0);
  /// Closes the innermost open range. Records an event.
  void end();

  struct Row {
    std::string name;  // full name, "outer / inner" for nested ranges
    int depth = 0;     // nesting depth (0 = top level)
    bool group = false;  // had nested ranges: its time is the sum of theirs plus gaps
    double ms = 0;       // summed over every occurrence and collect()ed step
    double flops = 0;    // likewise
    long count = 0;      // occurrences
  };
  /// Waits for the stream, adds the elapsed time of every range recorded since the last
  /// collect() to its row, and recycles the events. Call once per profiled step (a step
  /// holds a few hundred ranges; events are pooled and reused).
  void collect();
  /// Rows in order of first appearance (a group precedes its members).
  const std::vector<Row>& rows() const;
  /// Steps collected so far (collect() calls that found ranges).
  int steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// RAII range on a nullable profiler: does nothing when `p` is null.
class ProfileScope {
 public:
  ProfileScope(OpProfiler* p, const char* name, double flops = 0) : p_(p) {
    if (p_) p_->begin(name, flops);
  }
  ~ProfileScope() {
    if (p_) p_->end();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  OpProfiler* p_;
};

}  // namespace ddiloco::gpu
