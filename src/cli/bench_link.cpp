// `ddiloco bench link`: get and put throughput between two processes on 127.0.0.1 over the
// UCX link (ucx_link.hpp: the syncer's gets/puts into a unit leader's memory) beside MPI
// passive-target RMA (MPI_Win_allocate + MPI_Rget/MPI_Rput + MPI_Win_flush, 2 ranks), the
// transport the one-job deployment uses for the same protocol.
//
// One invocation runs both halves: this process is the UCX syncer and starts the unit as a
// child (`bench link --serve <addr>`, hidden), then starts `mpirun -np 2 ddiloco bench link
// --mpi` (hidden) for the MPI half and reads its figures from the job's stdout.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "cli/commands.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/ucx_link.hpp"
#include "util/child_process.hpp"

#ifndef DDILOCO_MPIEXEC
#define DDILOCO_MPIEXEC "mpirun"
#endif

namespace ddiloco::cli {

namespace {

std::string self_exe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail("bench link: cannot find this executable (/proc/self/exe): {}", ec.message());
  return p.string();
}

// The configured mpirun, else the first one on PATH.
std::string find_mpirun() {
  if (std::filesystem::exists(DDILOCO_MPIEXEC)) return DDILOCO_MPIEXEC;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string d; std::getline(dirs, d, ':');) {
    const auto p = std::filesystem::path(d) / "mpirun";
    if (!d.empty() && ::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

std::string size_name(size_t b) {
  if (b >= (size_t{1} << 20) && b % (size_t{1} << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

// Repeats op() for about `seconds` (at least 3 times, after one untimed call); MB/s.
template <typename Op>
double rate(size_t bytes, double seconds, Op&& op) {
  op();
  Stopwatch t;
  int n = 0;
  while (n < 3 || t.seconds() < seconds) {
    op();
    ++n;
  }
  return static_cast<double>(bytes) * n / t.seconds() / 1e6;
}
template <typename Op>
double latency_us(double seconds, Op&& op) {
  op();
  Stopwatch t;
  int n = 0;
  while (n < 10 || t.seconds() < seconds) {
    op();
    ++n;
  }
  return t.seconds() / n * 1e6;
}

struct Figures {
  std::vector<double> get, put;  // MB/s per size
  double word_us = 0;            // fetch_word / MPI_Fetch_and_op latency
};

// The unit process of the UCX half: exposes `bytes`, connects, serves until stdin closes.
int serve_unit(const std::string& addr, size_t bytes) {
  comm::UcxUnitLink link(bytes);
  link.connect(addr, "bench link", 10);
  std::puts("connected");
  std::fflush(stdout);
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  link.close();
  return 0;
}

Figures ucx_half(const BenchLinkOptions& o, std::string& transport) {
  const size_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
  comm::UcxSyncerLink syncer("127.0.0.1", 0, 1);
  std::vector<std::string> env;
  if (std::getenv("UCX_LOG_FILE") == nullptr) env.push_back("UCX_LOG_FILE=stderr");
  util::ChildProcess unit({self_exe(), "bench", "link", "--serve", syncer.address(), "--bytes",
                           std::to_string(max_size)},
                          env);
  std::vector<comm::UcxSyncerLink::Pending> pending;
  Stopwatch wait;
  while (pending.empty() && wait.seconds() < 20) {
    pending = syncer.accept_pending();
    if (pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (pending.empty()) fail("bench link: the UCX unit process did not connect within 20 s");
  syncer.admit(pending[0].id, 0);
  const auto hello = unit.read_line(20);
  if (!hello || *hello != "connected")
    fail("bench link: the UCX unit process said '{}'", hello.value_or("nothing"));
  const char* tls = std::getenv("UCX_TLS");
  const char* devices = std::getenv("UCX_NET_DEVICES");
  transport = fmt::format("UCX_TLS={} UCX_NET_DEVICES={}", tls != nullptr ? tls : "(UCX's choice)",
                          devices != nullptr ? devices : "(all)");

  Figures f;
  std::vector<std::byte> buf(max_size, std::byte{1});
  for (size_t size : o.sizes) {
    const std::span<std::byte> b(buf.data(), size);
    f.get.push_back(rate(size, o.seconds, [&] {
      if (!syncer.get(0, 0, b)) fail("bench link: UCX get failed");
    }));
    f.put.push_back(rate(size, o.seconds, [&] {
      if (!syncer.put(0, 0, b)) fail("bench link: UCX put failed");
    }));
  }
  int64_t w = 0;
  f.word_us = latency_us(o.seconds / 2, [&] {
    if (!syncer.fetch_word(0, 0, w)) fail("bench link: UCX fetch_word failed");
  });
  unit.close_stdin();
  syncer.close();
  unit.wait(10);
  return f;
}

// The MPI half, on every rank of `mpirun -np 2`: rank 1 exposes the window and sleeps in a
// barrier; rank 0 reads and writes it and prints "mpi <op> <size> <value>" lines.
int mpi_half(const BenchLinkOptions& o) {
  if (mpi::size(MPI_COMM_WORLD) != 2) fail("bench link --mpi: run with exactly 2 ranks");
  const int rank = mpi::rank(MPI_COMM_WORLD);
  const size_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
  std::byte* mem = nullptr;
  MPI_Win win;
  mpi::check(MPI_Win_allocate(static_cast<MPI_Aint>(rank == 1 ? max_size : 8), 1, MPI_INFO_NULL,
                              MPI_COMM_WORLD, &mem, &win),
             "Win_allocate");
  mpi::check(MPI_Win_lock_all(0, win), "Win_lock_all");
  if (rank == 0) {
    std::vector<std::byte> buf(max_size, std::byte{1});
    for (size_t size : o.sizes) {
      const int n = static_cast<int>(size);
      auto transfer = [&](bool get) {
        MPI_Request r;
        if (get) {
          MPI_Rget(buf.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win, &r);
        } else {
          MPI_Rput(buf.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win, &r);
        }
        MPI_Win_flush(1, win);  // complete at the target, as the UCX put's flush
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      };
      std::printf("mpi get %zu %.6g\n", size, rate(size, o.seconds, [&] { transfer(true); }));
      std::printf("mpi put %zu %.6g\n", size, rate(size, o.seconds, [&] { transfer(false); }));
      std::fflush(stdout);
    }
    const int64_t zero = 0;
    int64_t out = 0;
    std::printf("mpi word 8 %.6g\n", latency_us(o.seconds / 2, [&] {
                  MPI_Fetch_and_op(&zero, &out, MPI_INT64_T, 1, 0, MPI_SUM, win);
                  MPI_Win_flush(1, win);
                }));
    std::fflush(stdout);
  }
  mpi::barrier_patient(MPI_COMM_WORLD);  // the target sleeps here meanwhile
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  return 0;
}

Figures run_mpi_half(const BenchLinkOptions& o, std::string& how) {
  const std::string mpirun = find_mpirun();
  if (mpirun.empty()) fail("bench link: no mpirun found (Debian: openmpi-bin); or use --no-mpi");
  std::vector<std::string> argv = {mpirun, "-q", "--oversubscribe", "--bind-to", "none", "-np",
                                   "2", self_exe(), "bench", "link", "--mpi", "--seconds",
                                   fmt::format("{}", o.seconds)};
  for (size_t s : o.sizes) {
    argv.push_back("--size");
    argv.push_back(std::to_string(s));
  }
  // Our MPI settings (scripts/mpi_env.sh): ob1 over shared memory/TCP, UCX kept out of MPI;
  // whatever the environment sets wins.
  std::vector<std::string> env;
  auto dflt = [&](const char* name, const char* value) {
    if (std::getenv(name) == nullptr) env.push_back(fmt::format("{}={}", name, value));
  };
  dflt("OMPI_MCA_pml", "ob1");
  dflt("OMPI_MCA_btl", "self,vader,tcp");
  dflt("OMP_NUM_THREADS", "1");
  if (::geteuid() == 0) {
    dflt("OMPI_ALLOW_RUN_AS_ROOT", "1");
    dflt("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  auto var = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? v : fallback;
  };
  how = fmt::format("mpirun -np 2, pml {}, btl {}", var("OMPI_MCA_pml", "ob1"),
                    var("OMPI_MCA_btl", "self,vader,tcp"));
  util::ChildProcess job(argv, env);
  job.close_stdin();
  Figures f;
  f.get.assign(o.sizes.size(), 0);
  f.put.assign(o.sizes.size(), 0);
  std::string transcript;
  while (auto line = job.read_line(60)) {
    std::istringstream in(*line);
    std::string tag, op;
    size_t size = 0;
    double v = 0;
    if (!(in >> tag >> op >> size >> v) || tag != "mpi") {
      transcript += *line + "\n";
      continue;
    }
    const auto i = static_cast<size_t>(
        std::find(o.sizes.begin(), o.sizes.end(), size) - o.sizes.begin());
    if (op == "word") f.word_us = v;
    if (i >= o.sizes.size()) continue;
    (op == "get" ? f.get : f.put)[i] = v;
  }
  const auto status = job.wait(30);
  if (status.value_or(-1) != 0)
    fail("bench link: the MPI half ({}) ended with status {}:\n{}", mpirun,
         status ? std::to_string(*status) : "(still running)", transcript);
  return f;
}

}  // namespace

int bench_link(const BenchLinkOptions& o) {
  if (o.sizes.empty()) fail("bench link: no sizes");
  for (size_t s : o.sizes)
    if (s == 0 || s > (size_t{1} << 30)) fail("bench link: size {} out of range 1..1 GiB", s);
  if (!o.serve.empty()) return serve_unit(o.serve, o.bytes);
  if (o.mpi) return mpi_half(o);
  // UCX reads these when a context is created; the unit process inherits them. Loopback
  // only: without UCX_NET_DEVICES, UCX would open the host's other interfaces too.
  if (!o.tls.empty()) {
    ::setenv("UCX_TLS", o.tls.c_str(), 1);
  } else {
    ::setenv("UCX_TLS", "tcp", 0);
  }
  ::setenv("UCX_NET_DEVICES", "lo", 0);

  std::string transport, how = "not run (--no-mpi)";
  const Figures u = ucx_half(o, transport);
  Figures m;
  if (!o.no_mpi) m = run_mpi_half(o, how);
  auto cell = [](double v) { return v > 0 ? fmt::format("{:10.1f}", v) : fmt::format("{:>10}", "-"); };
  auto ratio = [](double a, double b) {
    return a > 0 && b > 0 ? fmt::format("{:9.3f}", a / b) : fmt::format("{:>9}", "-");
  };
  std::printf("link throughput, two processes on 127.0.0.1, ~%.2g s per cell\n", o.seconds);
  std::printf("  UCX: the syncer's get / put+flush into a unit's memory (%s)\n", transport.c_str());
  std::printf("  MPI: MPI_Rget / MPI_Rput + MPI_Win_flush, passive target (%s)\n", how.c_str());
  std::printf("%-4s %8s %10s %10s %9s\n", "op", "size", "UCX MB/s", "MPI MB/s", "UCX/MPI");
  for (size_t i = 0; i < o.sizes.size(); ++i) {
    const double mg = m.get.empty() ? 0 : m.get[i], mp = m.put.empty() ? 0 : m.put[i];
    std::printf("%-4s %8s %s %s %s\n", "get", size_name(o.sizes[i]).c_str(), cell(u.get[i]).c_str(),
                cell(mg).c_str(), ratio(u.get[i], mg).c_str());
    std::printf("%-4s %8s %s %s %s\n", "put", size_name(o.sizes[i]).c_str(), cell(u.put[i]).c_str(),
                cell(mp).c_str(), ratio(u.put[i], mp).c_str());
  }
  std::printf("%-4s %8s %10s %10s %9s\n", "op", "", "UCX µs", "MPI µs", "UCX/MPI");
  std::printf("%-4s %8s %s %s %s\n", "word", "8 B", cell(u.word_us).c_str(), cell(m.word_us).c_str(),
              ratio(u.word_us, m.word_us).c_str());
  return 0;
}

}  // namespace ddiloco::cli
