// `ddiloco bench link`: the link between a unit leader and the syncer of the isolated
// deployment in each of its modes (link.hpp: trusted = UCX one-sided, authenticated = requests
// over TCP, encrypted = the same inside TLS 1.3), between two processes on 127.0.0.1, beside MPI
// passive-target RMA (MPI_Win_allocate + MPI_Rget/MPI_Rput + MPI_Win_flush, 2 ranks), the
// transport the one-job deployment uses for the same protocol. For each: get and put throughput,
// the round trip of an 8-byte fetch (median), and a merge's transfers: the syncer's get of one
// fragment from the unit and its put back (median).
//
// One invocation runs every half: for each mode this process is the syncer
// (comm::listen_for_units) and starts the unit as a child (`bench link --serve <addr>
// --security <mode>`, hidden; comm::expose_to_syncer), with a fresh random secret in its
// environment; then it starts `mpirun -np 2 ddiloco bench link --mpi` (hidden) for the MPI half
// and reads its figures from the job's stdout.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "cli/commands.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/link.hpp"
#include "ddiloco/membership.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/mpi.hpp"
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
// Times op() one call at a time (after one untimed call) for about `seconds`, at least `min_n`
// calls; the median, in seconds.
template <typename Op>
double median_s(double seconds, int min_n, Op&& op) {
  op();
  std::vector<double> times;
  Stopwatch all;
  while (static_cast<int>(times.size()) < min_n || all.seconds() < seconds) {
    Stopwatch one;
    op();
    times.push_back(one.seconds());
  }
  const auto mid = times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2);
  std::nth_element(times.begin(), mid, times.end());
  return *mid;
}

constexpr const char* kSecretVar = "DDILOCO_BENCH_LINK_SECRET";

size_t largest(const BenchLinkOptions& o) {
  size_t n = *std::max_element(o.sizes.begin(), o.sizes.end());
  for (size_t m : o.merge_sizes) n = std::max(n, m);
  return n;
}

struct Figures {
  std::vector<double> get, put;  // MB/s per size
  double word_us = 0;            // fetch_word / MPI_Fetch_and_op round trip, median
  std::vector<double> merge_ms;  // get + put of a fragment, median, per merge size
};

// The unit process of a mode: exposes `bytes`, connects with the secret of its environment,
// serves until stdin closes.
int serve_unit(const BenchLinkOptions& o) {
  if (o.modes.size() != 1) fail("bench link --serve: name exactly one --security");
  const char* secret = std::getenv(kSecretVar);
  if (secret == nullptr || *secret == '\0') fail("bench link --serve: {} is not set", kSecretVar);
  const std::unique_ptr<comm::UnitEnd> link =
      comm::expose_to_syncer(comm::resolve_link_mode(o.modes[0], o.serve), o.bytes);
  link->connect(o.serve, secret, "bench link", 10);
  std::puts("connected");
  std::fflush(stdout);
  char c;
  while (::read(STDIN_FILENO, &c, 1) > 0) {
  }
  link->close();
  return 0;
}

// Admits the unit process's connection as unit 0, once it says it is in.
void admit_unit(comm::SyncerEnd& syncer, util::ChildProcess& unit, const char* mode) {
  std::vector<comm::UnitListener::Pending> pending;
  Stopwatch wait;
  while (pending.empty() && wait.seconds() < 20) {
    pending = syncer.accept_pending();
    if (pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (pending.empty()) fail("bench link: the {} unit process did not connect within 20 s", mode);
  syncer.admit(pending[0].id, 0);
  const auto hello = unit.read_line(20);
  if (!hello || *hello != "connected")
    fail("bench link: the {} unit process said '{}'", mode, hello.value_or("nothing"));
}

// Every figure of one mode, the syncer's operations on unit 0.
Figures measure(const BenchLinkOptions& o, comm::RemoteMemory& link, const char* mode) {
  auto check = [&](bool ok, const char* op) {
    if (!ok) fail("bench link: {} {} failed", mode, op);
  };
  Figures f;
  std::vector<std::byte> buf(largest(o), std::byte{1});
  for (size_t size : o.sizes) {
    const std::span<std::byte> b(buf.data(), size);
    f.get.push_back(rate(size, o.seconds, [&] { check(link.get(0, 0, b), "get"); }));
    f.put.push_back(rate(size, o.seconds, [&] { check(link.put(0, 0, b), "put"); }));
  }
  int64_t w = 0;
  f.word_us = 1e6 * median_s(o.seconds / 2, 10, [&] {
    check(link.fetch_word(0, 0, w), "fetch_word");
  });
  for (size_t size : o.merge_sizes) {
    const std::span<std::byte> b(buf.data(), size);
    f.merge_ms.push_back(1e3 * median_s(o.seconds, 5, [&] {
      check(link.get(0, 0, b), "merge get");
      check(link.put(0, 0, b), "merge put");
    }));
  }
  return f;
}

// One mode's half: this process the syncer, a child process the unit, a fresh secret.
Figures link_half(const BenchLinkOptions& o, const std::string& mode_name) {
  const comm::LinkMode mode = comm::resolve_link_mode(mode_name, "127.0.0.1:0");
  const std::string secret = protocol::Rendezvous::random_token();
  const std::unique_ptr<comm::SyncerEnd> syncer =
      comm::listen_for_units(mode, secret, "127.0.0.1", 0, 1);
  std::vector<std::string> env = {fmt::format("{}={}", kSecretVar, secret)};
  if (std::getenv("UCX_LOG_FILE") == nullptr) env.push_back("UCX_LOG_FILE=stderr");
  util::ChildProcess unit({self_exe(), "bench", "link", "--serve", syncer->address(), "--security",
                           mode_name, "--bytes", std::to_string(largest(o))},
                          env);
  admit_unit(*syncer, unit, mode_name.c_str());
  const Figures f = measure(o, *syncer, mode_name.c_str());
  unit.close_stdin();
  syncer->close();
  unit.wait(10);
  return f;
}

// The MPI half, on every rank of `mpirun -np 2`: rank 1 exposes the window and sleeps in a
// barrier; rank 0 reads and writes it and prints "mpi <op> <size> <value>" lines.
int mpi_half(const BenchLinkOptions& o) {
  if (mpi::size(MPI_COMM_WORLD) != 2) fail("bench link --mpi: run with exactly 2 ranks");
  const int rank = mpi::rank(MPI_COMM_WORLD);
  const size_t max_size = largest(o);
  std::byte* mem = nullptr;
  MPI_Win win;
  mpi::check(MPI_Win_allocate(static_cast<MPI_Aint>(rank == 1 ? max_size : 8), 1, MPI_INFO_NULL,
                              MPI_COMM_WORLD, &mem, &win),
             "Win_allocate");
  mpi::check(MPI_Win_lock_all(0, win), "Win_lock_all");
  if (rank == 0) {
    std::vector<std::byte> buf(max_size, std::byte{1});
    auto transfer = [&](bool get, size_t size) {
      const int n = static_cast<int>(size);
      MPI_Request r;
      if (get) {
        MPI_Rget(buf.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win, &r);
      } else {
        MPI_Rput(buf.data(), n, MPI_BYTE, 1, 0, n, MPI_BYTE, win, &r);
      }
      MPI_Win_flush(1, win);  // complete at the target, as the link's put
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    };
    for (size_t size : o.sizes) {
      for (const bool get : {true, false})
        std::printf("mpi %s %zu %.6g\n", get ? "get" : "put", size,
                    rate(size, o.seconds, [&] { transfer(get, size); }));
      std::fflush(stdout);
    }
    const int64_t zero = 0;
    int64_t out = 0;
    std::printf("mpi word 8 %.6g\n", 1e6 * median_s(o.seconds / 2, 10, [&] {
                  MPI_Fetch_and_op(&zero, &out, MPI_INT64_T, 1, 0, MPI_SUM, win);
                  MPI_Win_flush(1, win);
                }));
    for (size_t size : o.merge_sizes)
      std::printf("mpi merge %zu %.6g\n", size, 1e3 * median_s(o.seconds, 5, [&] {
                    transfer(true, size);
                    transfer(false, size);
                  }));
    std::fflush(stdout);
  }
  mpi::barrier_patient(MPI_COMM_WORLD);  // the target sleeps here meanwhile
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  return 0;
}

// to[i] = v where sizes[i] == size.
void set_at(const std::vector<size_t>& sizes, size_t size, double v, std::vector<double>& to) {
  const auto i = static_cast<size_t>(std::find(sizes.begin(), sizes.end(), size) - sizes.begin());
  if (i < sizes.size()) to[i] = v;
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
  for (size_t s : o.merge_sizes) {
    argv.push_back("--merge-size");
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
  f.merge_ms.assign(o.merge_sizes.size(), 0);
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
    if (op == "word") {
      f.word_us = v;
    } else if (op == "merge") {
      set_at(o.merge_sizes, size, v, f.merge_ms);
    } else {
      set_at(o.sizes, size, v, op == "get" ? f.get : f.put);
    }
  }
  const auto status = job.wait(30);
  if (status.value_or(-1) != 0)
    fail("bench link: the MPI half ({}) ended with status {}:\n{}", mpirun,
         status ? std::to_string(*status) : "(still running)", transcript);
  return f;
}

struct Column {
  std::string name;  // "MPI" or a mode
  Figures f;
};

// The figures of `cols` side by side, one row per operation and size, then ratios: each mode
// but trusted ÷ trusted, and trusted ÷ MPI.
void print_table(const BenchLinkOptions& o, const std::vector<Column>& cols) {
  struct Row {
    std::string op, size, unit;
    std::function<double(const Figures&)> value;
  };
  auto at = [](const std::vector<double>& v, size_t i) { return i < v.size() ? v[i] : 0.0; };
  std::vector<Row> rows;
  for (const bool get : {true, false})
    for (size_t i = 0; i < o.sizes.size(); ++i)
      rows.push_back({get ? "get" : "put", size_name(o.sizes[i]), "MB/s",
                      [=](const Figures& f) { return at(get ? f.get : f.put, i); }});
  rows.push_back({"word", "8 B", "µs", [](const Figures& f) { return f.word_us; }});
  for (size_t i = 0; i < o.merge_sizes.size(); ++i)
    rows.push_back({"merge", size_name(o.merge_sizes[i]), "ms",
                    [=](const Figures& f) { return at(f.merge_ms, i); }});
  auto find = [&](const std::string& name) -> const Column* {
    for (const Column& c : cols)
      if (c.name == name) return &c;
    return nullptr;
  };
  const Column* trusted = find("trusted");
  const Column* mpi = find("MPI");
  std::vector<std::tuple<std::string, const Column*, const Column*>> ratios;  // name, a, b: a ÷ b
  for (const Column& c : cols)
    if (trusted != nullptr && c.name != "MPI" && c.name != "trusted")
      ratios.emplace_back(fmt::format("{}÷trusted", c.name.substr(0, 4)), &c, trusted);
  if (trusted != nullptr && mpi != nullptr) ratios.emplace_back("trusted÷MPI", trusted, mpi);

  std::string line = fmt::format("{:<5} {:>8} {:<4}", "op", "size", "unit");
  for (const Column& c : cols) line += fmt::format(" {:>13}", c.name);
  for (const auto& r : ratios) line += fmt::format(" {:>12}", std::get<0>(r));
  std::printf("%s\n", line.c_str());
  for (const Row& r : rows) {
    line = fmt::format("{:<5} {:>8} {:<4}", r.op, r.size, r.unit);
    for (const Column& c : cols) {
      const double v = r.value(c.f);
      const int digits = v < 1 ? 3 : v < 10 ? 2 : 1;
      line += v > 0 ? fmt::format(" {:>13.{}f}", v, digits) : fmt::format(" {:>13}", "-");
    }
    for (const auto& [name, a, b] : ratios) {
      const double va = r.value(a->f), vb = r.value(b->f);
      line += va > 0 && vb > 0 ? fmt::format(" {:>12.3f}", va / vb) : fmt::format(" {:>12}", "-");
    }
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace

int bench_link(const BenchLinkOptions& o) {
  if (o.sizes.empty()) fail("bench link: no sizes");
  for (const auto* sizes : {&o.sizes, &o.merge_sizes})
    for (size_t s : *sizes)
      if (s == 0 || s > (size_t{1} << 30)) fail("bench link: size {} out of range 1..1 GiB", s);
  if (!o.serve.empty()) return serve_unit(o);
  if (o.mpi) return mpi_half(o);
  // UCX reads these when a context is created; the unit process inherits them. Loopback
  // only: without UCX_NET_DEVICES, UCX would open the host's other interfaces too.
  if (!o.tls.empty()) {
    ::setenv("UCX_TLS", o.tls.c_str(), 1);
  } else {
    ::setenv("UCX_TLS", "tcp", 0);
  }
  ::setenv("UCX_NET_DEVICES", "lo", 0);

  std::vector<Column> cols;
  std::string how = "not run (--no-mpi)";
  if (!o.no_mpi) cols.push_back({"MPI", run_mpi_half(o, how)});
  for (const std::string& mode : o.modes) cols.push_back({mode, link_half(o, mode)});
  std::printf("the unit <-> syncer link, two processes on 127.0.0.1, ~%.2g s per cell\n",
              o.seconds);
  const std::map<std::string, std::string> what = {
      {"MPI", "MPI_Rget / MPI_Rput + MPI_Win_flush, passive target (" + how + ")"},
      {"trusted", fmt::format("UCX one-sided get / put+flush / atomics (UCX_TLS={} "
                              "UCX_NET_DEVICES={})",
                              std::getenv("UCX_TLS"), std::getenv("UCX_NET_DEVICES"))},
      {"authenticated", "TCP after a challenge-response: requests the unit checks and carries out"},
      {"encrypted", "the same inside TLS 1.3"}};
  for (const Column& c : cols) std::printf("  %-14s %s\n", c.name.c_str(), what.at(c.name).c_str());
  std::printf("  word: an 8-byte fetch's round trip; merge: the syncer's get of one fragment\n"
              "  from the unit and its put back (the default 832 KiB: the largest of\n"
              "  configs/kjv_decoupled.yaml's 4 fragments); both medians. Ratios of the figures\n"
              "  as printed: MB/s below 1, or µs / ms above 1, is slower.\n");
  print_table(o, cols);
  return 0;
}

}  // namespace ddiloco::cli
