#include "ddiloco/mpi_memory.hpp"

#include <cstring>
#include <exception>
#include <vector>

#include "ddiloco/mpi.hpp"

namespace ddiloco::comm {

namespace {
// An RMA transfer of `bytes` as an MPI count and type: counts are int, so whole floats where
// the size allows (up to 8 GiB), bytes otherwise (an odd-sized int4 encoding).
struct RmaCount {
  int count;
  MPI_Datatype type;
};
RmaCount rma_count(size_t bytes) {
  if (bytes % sizeof(float) == 0) return {static_cast<int>(bytes / sizeof(float)), MPI_FLOAT};
  return {static_cast<int>(bytes), MPI_BYTE};
}

// Freeing a window is collective: while an error unwinds the stack on this rank alone, the
// others would never join, and the job would hang instead of reporting it (main aborts).
bool may_free_in_destructor() {
  if (std::uncaught_exceptions() != 0) return false;
  int finalized = 0;
  MPI_Finalized(&finalized);
  return !finalized;
}
}  // namespace

MpiExposedMemory::MpiExposedMemory(MPI_Comm sync_comm, size_t bytes) : bytes_(bytes) {
  char* base = nullptr;
  mpi::check(MPI_Win_allocate(static_cast<MPI_Aint>(bytes), 1, MPI_INFO_NULL, sync_comm, &base, &win_),
             "Win_allocate(learner)");
  base_ = reinterpret_cast<std::byte*>(base);
  std::memset(base_, 0, bytes);
  mpi::check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "Win_lock_all(learner)");
  MPI_Win_sync(win_);
  // Every window is initialised before the syncer's first read.
  mpi::check(MPI_Barrier(sync_comm), "Barrier(window ready)");
}

MpiExposedMemory::~MpiExposedMemory() {
  if (win_ != MPI_WIN_NULL && may_free_in_destructor()) close();
}

void MpiExposedMemory::sync() { MPI_Win_sync(win_); }

void MpiExposedMemory::close() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
}

MpiRemoteMemory::MpiRemoteMemory(MPI_Comm sync_comm, int units) : units_(units) {
  char* base = nullptr;
  mpi::check(MPI_Win_allocate(0, 1, MPI_INFO_NULL, sync_comm, &base, &win_), "Win_allocate(syncer)");
  mpi::check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "Win_lock_all(syncer)");
  mpi::check(MPI_Barrier(sync_comm), "Barrier(window ready)");
}

MpiRemoteMemory::~MpiRemoteMemory() {
  if (win_ != MPI_WIN_NULL && may_free_in_destructor()) close();
}

void MpiRemoteMemory::close() {
  if (win_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
}

void MpiRemoteMemory::get_all(std::span<Read> reads) {
  std::vector<MPI_Request> requests(reads.size());
  for (size_t i = 0; i < reads.size(); ++i) {
    const auto [count, type] = rma_count(reads[i].dst.size());
    mpi::check(MPI_Rget(reads[i].dst.data(), count, type, reads[i].unit + 1,
                        static_cast<MPI_Aint>(reads[i].offset), count, type, win_, &requests[i]),
               "Rget");
  }
  mpi::check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
             "Waitall(Rget)");
  for (Read& r : reads) r.ok = true;
}

bool MpiRemoteMemory::get(int u, size_t offset, std::span<std::byte> dst) {
  Read r{u, offset, dst};
  get_all(std::span<Read>(&r, 1));
  return true;
}

bool MpiRemoteMemory::put(int u, size_t offset, std::span<const std::byte> src) {
  MPI_Request request;
  const auto [count, type] = rma_count(src.size());
  mpi::check(MPI_Rput(src.data(), count, type, u + 1, static_cast<MPI_Aint>(offset), count, type,
                      win_, &request),
             "Rput");
  mpi::check(MPI_Wait(&request, MPI_STATUS_IGNORE), "Wait(Rput)");
  // Complete at the target before any word that announces it.
  mpi::check(MPI_Win_flush(u + 1, win_), "Win_flush");
  return true;
}

bool MpiRemoteMemory::put_word(int u, size_t offset, int64_t value) {
  mpi::check(MPI_Accumulate(&value, 1, MPI_INT64_T, u + 1, static_cast<MPI_Aint>(offset), 1,
                            MPI_INT64_T, MPI_REPLACE, win_),
             "Accumulate");
  mpi::check(MPI_Win_flush(u + 1, win_), "Win_flush");
  return true;
}

bool MpiRemoteMemory::fetch_word(int u, size_t offset, int64_t& value) {
  int64_t dummy = 0;
  mpi::check(MPI_Fetch_and_op(&dummy, &value, MPI_INT64_T, u + 1, static_cast<MPI_Aint>(offset),
                              MPI_NO_OP, win_),
             "Fetch_and_op");
  mpi::check(MPI_Win_flush(u + 1, win_), "Win_flush");
  return true;
}

}  // namespace ddiloco::comm
