// The MPI RMA transport of remote_memory.hpp: the one-job deployment, where the syncer and the
// unit leaders share a communicator (rank 0 the syncer, rank u+1 the leader of unit u).
// Every leader exposes one MPI_Win_allocate window; the syncer reads and writes them with
// passive-target RMA inside one MPI_Win_lock_all epoch per side held for the whole run
// (docs/architecture.md, "Learner ↔ syncer over one-sided windows"). Windows are in MPI's
// unified memory model on every transport we use (osc/sm, osc/rdma). No peer can fail alone:
// a dead rank ends the MPI job, so connected() is always true.
#pragma once

#include <mpi.h>

#include "ddiloco/remote_memory.hpp"

namespace ddiloco::comm {

/// A leader's window. Construction and close() are collective over `sync_comm` (with the
/// syncer's MpiRemoteMemory): construction returns once every window is initialised.
/// Throws ddiloco::Error when MPI fails.
class MpiExposedMemory final : public ExposedMemory {
 public:
  MpiExposedMemory(MPI_Comm sync_comm, size_t bytes);
  ~MpiExposedMemory() override;
  MpiExposedMemory(const MpiExposedMemory&) = delete;
  MpiExposedMemory& operator=(const MpiExposedMemory&) = delete;
  std::byte* base() override { return base_; }
  size_t bytes() const override { return bytes_; }
  void sync() override;
  void close() override;

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  std::byte* base_ = nullptr;
  size_t bytes_ = 0;
};

/// The syncer's access to the `units` leaders' windows of `sync_comm` (it exposes none).
/// Construction and close() are collective over `sync_comm`.
class MpiRemoteMemory final : public RemoteMemory {
 public:
  MpiRemoteMemory(MPI_Comm sync_comm, int units);
  ~MpiRemoteMemory() override;
  MpiRemoteMemory(const MpiRemoteMemory&) = delete;
  MpiRemoteMemory& operator=(const MpiRemoteMemory&) = delete;
  int units() const override { return units_; }
  bool connected(int) const override { return true; }
  void get_all(std::span<Read> reads) override;
  bool get(int u, size_t offset, std::span<std::byte> dst) override;
  bool put(int u, size_t offset, std::span<const std::byte> src) override;
  bool put_word(int u, size_t offset, int64_t value) override;
  bool fetch_word(int u, size_t offset, int64_t& value) override;
  void close() override;

 private:
  MPI_Win win_ = MPI_WIN_NULL;
  int units_;
};

}  // namespace ddiloco::comm
