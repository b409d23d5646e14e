// The UCX link (ddiloco/ucx_link.hpp) between real processes on 127.0.0.1: the peer is this
// test binary started again in a helper mode (DDILOCO_UCX_TEST_HELPER=unit|syncer|mpi_unit),
// which runs before main() and never reaches GoogleTest. Nothing is mocked; UCX_TLS defaults
// to tcp (our machines' transport) and UCX_NET_DEVICES to lo unless the environment sets them.
#include <gtest/gtest.h>
#include <mpi.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/ucx_link.hpp"
#include "util/child_process.hpp"

namespace {

using ddiloco::Error;
using ddiloco::comm::LinkRefused;
using ddiloco::comm::RemoteMemory;
using ddiloco::comm::UcxSyncerLink;
using ddiloco::comm::UcxUnitLink;
using ddiloco::util::ChildProcess;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
void nap() { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }

// ---------------------------------------------------------------- data both sides can check
uint8_t pattern(uint64_t seed, uint64_t i) {
  uint64_t z = (seed * 0x9e3779b97f4a7c15ULL) ^ (i + 0x632be59bd9b4e5f5ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint8_t>(z ^ (z >> 31));
}
void fill(std::byte* p, size_t offset, size_t len, uint64_t seed) {
  for (size_t i = 0; i < len; ++i) p[i] = std::byte{pattern(seed, offset + i)};
}
// Index of the first byte that differs from the pattern, or -1.
int64_t mismatch(const std::byte* p, size_t offset, size_t len, uint64_t seed) {
  for (size_t i = 0; i < len; ++i)
    if (p[i] != std::byte{pattern(seed, offset + i)}) return static_cast<int64_t>(i);
  return -1;
}
std::string payload_of(uint64_t seed, size_t len) {  // binary, NULs included
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>(pattern(seed + 1000, i));
  return s;
}

constexpr int64_t kWord0 = 0x1122334455667788;  // a unit helper's word at offset 0
constexpr uint64_t kInitialSeed = 0;            // and its bytes from 8 on

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Reads stdin lines as they come (poll with a timeout, so the caller can do other work).
class StdinLines {
 public:
  // A complete line, "" if none within ms, nullopt at EOF.
  std::optional<std::string> next(int ms) {
    for (;;) {
      const auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (eof_) return std::nullopt;
      pollfd p{STDIN_FILENO, POLLIN, 0};
      if (::poll(&p, 1, ms) <= 0) return std::string();
      char chunk[1024];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
      if (n <= 0) {
        eof_ = true;
      } else {
        buf_.append(chunk, static_cast<size_t>(n));
      }
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
};

// A unit leader: memory = the pattern (seed kInitialSeed) with kWord0 at offset 0; connects to
// DDILOCO_UCX_ADDR with the payload of DDILOCO_UCX_PAYLOAD_SEED/LEN; prints "connected",
// "refused <reason>" or "error <message>"; then answers commands on stdin until EOF.
int unit_helper(bool with_mpi) {
  int rank = 0;
  MPI_Win win = MPI_WIN_NULL;
  int64_t* win_mem = nullptr;
  if (with_mpi) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Win_allocate(sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, MPI_COMM_WORLD, &win_mem,
                     &win);
    *win_mem = 0;
    MPI_Win_lock_all(0, win);
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // MPI's own traffic while rank 0 holds a UCX context: a put into rank 0's window, an
  // all-reduce; rank 1 waits without spinning (Ibarrier + sleep).
  auto mpi_round = [&] {
    if (rank == 1) {
      const int64_t v = 42;
      MPI_Put(&v, 1, MPI_INT64_T, 0, 0, 1, MPI_INT64_T, win);
      MPI_Win_flush(0, win);
    }
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    for (int done = 0; !done;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) nap();
    }
    MPI_Win_sync(win);
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return sum;
  };
  if (with_mpi && rank != 0) {
    mpi_round();
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
  }

  const size_t bytes = std::strtoull(env_or("DDILOCO_UCX_BYTES", "65536"), nullptr, 10);
  const std::string payload =
      payload_of(std::strtoull(env_or("DDILOCO_UCX_PAYLOAD_SEED", "1"), nullptr, 10),
                 std::strtoull(env_or("DDILOCO_UCX_PAYLOAD_LEN", "16"), nullptr, 10));
  UcxUnitLink link(bytes);
  std::byte* mem = link.base();
  fill(mem, 0, bytes, kInitialSeed);
  std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(mem)).store(kWord0);
  link.sync();
  try {
    link.connect(env_or("DDILOCO_UCX_ADDR", ""), payload, 10);
    say("connected");
  } catch (const LinkRefused& e) {
    say("refused " + e.reason());
  } catch (const std::exception& e) {
    say(std::string("error ") + e.what());
  }
  StdinLines in;
  for (;;) {
    const auto line = in.next(100);
    if (!line || *line == "quit") break;
    std::istringstream cmd(*line);
    std::string op;
    cmd >> op;
    link.sync();
    if (op == "check") {  // check <offset> <len> <seed>
      size_t off = 0, len = 0;
      uint64_t seed = 0;
      cmd >> off >> len >> seed;
      const int64_t bad = mismatch(mem + off, off, len, seed);
      say(bad < 0 ? "ok" : "bad " + std::to_string(bad));
    } else if (op == "word") {  // word <offset>
      size_t off = 0;
      cmd >> off;
      say("word " +
          std::to_string(std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(mem + off)).load()));
    } else if (op == "connected") {
      say(link.connected() ? "yes" : "no " + link.lost_reason());
    }
  }
  link.close();
  if (with_mpi) {
    const int sum = mpi_round();
    const int64_t got = *win_mem;
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Finalize();
    say(sum == 2 && got == 42 ? "mpi ok" : "mpi bad");
  }
  return 0;
}

// A syncer for one unit: prints "addr <ip:port>", admits the first unit that connects
// ("admitted <payload>"; others are refused "busy"), reports "lost <reason>", and answers
// "check <off> <len> <seed>" (a get compared with the pattern), "put <off> <len> <seed>" and
// "quit" (close() and exit).
int syncer_helper() {
  UcxSyncerLink link("127.0.0.1", 0, 1);
  say("addr " + link.address());
  StdinLines in;
  for (;;) {
    for (const auto& p : link.accept_pending()) {
      if (link.connected(0)) {
        link.refuse(p.id, "busy");
      } else {
        link.admit(p.id, 0);
        say("admitted " + p.payload);
      }
    }
    for (const auto& l : link.take_lost()) say("lost " + l.reason);
    const auto line = in.next(20);
    if (!line) break;
    std::istringstream cmd(*line);
    std::string op;
    size_t off = 0, len = 0;
    uint64_t seed = 0;
    cmd >> op >> off >> len >> seed;
    if (op == "quit") {
      link.close();
      say("closed");
      return 0;
    }
    if (op == "check") {
      std::vector<std::byte> buf(len);
      if (!link.get(0, off, buf)) {
        say("fail");
      } else {
        const int64_t bad = mismatch(buf.data(), off, len, seed);
        say(bad < 0 ? "ok" : "bad " + std::to_string(bad));
      }
    } else if (op == "put") {
      std::vector<std::byte> buf(len);
      fill(buf.data(), off, len, seed);
      say(link.put(0, off, buf) ? "put ok" : "put fail");
    }
  }
  return 0;
}

// Helper mode: runs instead of the tests, before main().
const int helper_mode = [] {
  const char* mode = std::getenv("DDILOCO_UCX_TEST_HELPER");
  if (mode == nullptr) return 0;
  int rc = 1;
  try {
    const std::string m = mode;
    rc = m == "syncer" ? syncer_helper() : unit_helper(m == "mpi_unit");
  } catch (const std::exception& e) {
    say(std::string("error ") + e.what());
  }
  std::fflush(nullptr);
  std::_Exit(rc);
}();

// ---------------------------------------------------------------- the test side

// The helpers' environment: UCX logs to stdout by default, and their stdout is our command
// channel.
std::vector<std::string> helper_env(std::vector<std::string> env) {
  if (std::getenv("UCX_LOG_FILE") == nullptr) env.push_back("UCX_LOG_FILE=stderr");
  return env;
}

// What follows the command name in a /proc/.../stat file, from field 3 (state) on; empty when
// the file cannot be read. The name is skipped up to its last ')', as it may hold spaces.
std::string stat_after_name(const std::filesystem::path& stat) {
  std::ifstream f(stat);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() ? std::string() : text.substr(close + 2);
}

// CPU seconds (user + system) process `pid` has used, from /proc/<pid>/stat.
double cpu_seconds(pid_t pid) {
  const std::string after = stat_after_name("/proc/" + std::to_string(pid) + "/stat");
  if (after.empty()) return -1;
  std::istringstream rest(after);
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// kill(SIGSTOP) returns before the target stops: a thread of it may still answer one more
// request. True once every thread of `pid` shows state T in /proc, false after `timeout_s`.
bool wait_stopped(pid_t pid, double timeout_s) {
  const auto t0 = Clock::now();
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  while (since(t0) < timeout_s) {
    bool all = true;
    for (const auto& t : std::filesystem::directory_iterator(tasks)) {
      if (stat_after_name(t.path() / "stat").rfind('T', 0) != 0) {
        all = false;
        break;
      }
    }
    if (all) return true;
    nap();
  }
  return false;
}

double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::string self_exe() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : std::string();
}

class UcxLink : public ::testing::Test {
 protected:
  void SetUp() override {
    // Our machines' transport, and only the loopback device (UCX would otherwise also open
    // the host's other interfaces); the environment wins. The helpers inherit both.
    ::setenv("UCX_TLS", "tcp", 0);
    ::setenv("UCX_NET_DEVICES", "lo", 0);
  }

  // Units 0..n−1, each a helper process with `bytes` of memory, connected and admitted.
  static void connect_units(UcxSyncerLink& syncer, size_t bytes, int n,
                            std::vector<std::unique_ptr<ChildProcess>>& units) {
    for (int u = 0; u < n; ++u) {
      units.push_back(start_unit(syncer.address(), bytes, u + 1, 10));
      const auto p = next_pending(syncer, 10);
      ASSERT_TRUE(p);
      syncer.admit(p->id, u);
      ASSERT_EQ(units[u]->read_line(10).value_or("(nothing)"), "connected");
    }
  }
  static std::unique_ptr<ChildProcess> start_unit(const std::string& addr, size_t bytes,
                                                  uint64_t payload_seed, size_t payload_len) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{self_exe()},
        helper_env({"DDILOCO_UCX_TEST_HELPER=unit", "DDILOCO_UCX_ADDR=" + addr,
                    "DDILOCO_UCX_BYTES=" + std::to_string(bytes),
                    "DDILOCO_UCX_PAYLOAD_SEED=" + std::to_string(payload_seed),
                    "DDILOCO_UCX_PAYLOAD_LEN=" + std::to_string(payload_len)}));
  }
  static std::unique_ptr<ChildProcess> start_syncer(std::string& addr) {
    auto c = std::make_unique<ChildProcess>(std::vector<std::string>{self_exe()},
                                            helper_env({"DDILOCO_UCX_TEST_HELPER=syncer"}));
    const auto line = c->read_line(10);
    if (!line || line->rfind("addr ", 0) != 0) {
      ADD_FAILURE() << "syncer helper said: " << line.value_or("(nothing)");
      return c;
    }
    addr = line->substr(5);
    return c;
  }
  // The next handshake, waiting up to timeout_s (polling every 10 ms).
  static std::optional<UcxSyncerLink::Pending> next_pending(UcxSyncerLink& s, double timeout_s) {
    const auto t0 = Clock::now();
    while (since(t0) < timeout_s) {
      auto p = s.accept_pending();
      if (!p.empty()) return p.front();
      nap();
    }
    return std::nullopt;
  }
  static std::string ask(ChildProcess& c, const std::string& command) {
    if (!c.send(command)) return "(send failed)";
    return c.read_line(10).value_or("(no answer)");
  }
};

TEST_F(UcxLink, HandshakeThenGetPutAndWordsRoundTrip) {
  UcxSyncerLink syncer("127.0.0.1", 0, 2);
  const std::string addr = syncer.address();
  ASSERT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  ASSERT_NE(addr, "127.0.0.1:0");
  const size_t bytes = (size_t{8} << 20) + 64;
  const size_t payload_len = 64 * 1024;  // a large hello: the caller's JSON may be that big
  auto unit = start_unit(addr, bytes, 7, payload_len);

  const auto p = next_pending(syncer, 10);
  ASSERT_TRUE(p) << "no handshake arrived";
  EXPECT_EQ(p->payload, payload_of(7, payload_len)) << "payload not intact";
  EXPECT_EQ(p->bytes, bytes);
  EXPECT_EQ(p->peer.rfind("127.0.0.1:", 0), 0u) << p->peer;
  EXPECT_FALSE(syncer.connected(1));
  syncer.admit(p->id, 1);
  EXPECT_TRUE(syncer.connected(1));
  EXPECT_FALSE(syncer.connected(0));
  EXPECT_EQ(syncer.bytes(1), bytes);
  ASSERT_EQ(unit->read_line(10).value_or("(nothing)"), "connected");
  EXPECT_THROW(syncer.admit(p->id, 0), Error) << "an id is admitted once";

  // Words.
  int64_t w = 0;
  ASSERT_TRUE(syncer.fetch_word(1, 0, w));
  EXPECT_EQ(w, kWord0);
  ASSERT_TRUE(syncer.put_word(1, 16, -5));
  EXPECT_EQ(ask(*unit, "word 16"), "word -5");
  ASSERT_TRUE(syncer.fetch_word(1, 16, w));
  EXPECT_EQ(w, -5);

  // Small and unaligned: 13 bytes at an odd offset, neighbours untouched.
  std::vector<std::byte> small(13);
  ASSERT_TRUE(syncer.get(1, 29, small));
  EXPECT_EQ(mismatch(small.data(), 29, 13, kInitialSeed), -1);
  fill(small.data(), 101, 13, 5);
  ASSERT_TRUE(syncer.put(1, 101, small));
  EXPECT_EQ(ask(*unit, "check 101 13 5"), "ok");
  EXPECT_EQ(ask(*unit, "check 100 1 0"), "ok");
  EXPECT_EQ(ask(*unit, "check 114 1 0"), "ok");

  // Large: 4 MiB + 3 at an odd offset, put then read back, and checked in the unit's memory.
  const size_t big = (size_t{4} << 20) + 3, off = 1'000'003;
  std::vector<std::byte> out(big), back(big);
  fill(out.data(), off, big, 9);
  ASSERT_TRUE(syncer.put(1, off, out));
  EXPECT_EQ(ask(*unit, "check " + std::to_string(off) + " " + std::to_string(big) + " 9"), "ok");
  ASSERT_TRUE(syncer.get(1, off, back));
  EXPECT_EQ(mismatch(back.data(), off, big, 9), -1);
  // The last byte of the memory, through get_all beside an absent unit.
  std::vector<std::byte> tail(1), head(64), absent(8, std::byte{0x5a});
  RemoteMemory::Read reads[] = {{1, bytes - 1, tail}, {0, 0, absent}, {1, 128, head}};
  syncer.get_all(reads);
  EXPECT_TRUE(reads[0].ok);
  EXPECT_FALSE(reads[1].ok);
  EXPECT_TRUE(reads[2].ok);
  EXPECT_EQ(mismatch(tail.data(), bytes - 1, 1, kInitialSeed), -1);
  EXPECT_EQ(mismatch(head.data(), 128, 64, kInitialSeed), -1);
  EXPECT_EQ(absent[0], std::byte{0x5a}) << "a read of an absent unit leaves dst alone";

  // Absent unit: false, no wait. Malformed requests: Error.
  EXPECT_FALSE(syncer.put_word(0, 0, 1));
  EXPECT_FALSE(syncer.fetch_word(0, 0, w));
  EXPECT_FALSE(syncer.get(0, 0, small));
  EXPECT_THROW(syncer.get(1, bytes - 12, small), Error);
  EXPECT_THROW(syncer.put_word(1, 4, 1), Error);
  EXPECT_THROW(syncer.fetch_word(1, bytes, w), Error);
  EXPECT_THROW(syncer.connected(2), Error);

  // Connected and idle, the unit's progress thread sleeps: it must not spin a core.
  const double cpu0 = cpu_seconds(unit->pid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double idle_cpu = cpu_seconds(unit->pid()) - cpu0;
  EXPECT_LT(idle_cpu, 0.1) << "an idle unit used " << idle_cpu << " s of CPU in 1 s";
  std::printf("[ measured ] idle connected unit: %.3f s CPU in 1 s\n", idle_cpu);

  // A graceful disconnect: a loss "closed" here, connected() false there.
  syncer.disconnect(1);
  EXPECT_FALSE(syncer.connected(1));
  const auto lost = syncer.take_lost();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].unit, 1);
  EXPECT_EQ(lost[0].reason, "closed");
  // The graceful close is a round trip that the syncer's worker must progress: the syncer
  // calls into the link regularly (here take_lost(), which reports nothing more).
  const auto t0 = Clock::now();
  std::string state;
  while (since(t0) < 10 && (state = ask(*unit, "connected")) == "yes") {
    EXPECT_TRUE(syncer.take_lost().empty());
    nap();
  }
  EXPECT_EQ(state.rfind("no", 0), 0u) << state;
  std::printf("[ measured ] unit saw the syncer's disconnect after %.3f s (%s)\n", since(t0),
              state.c_str());
  unit->close_stdin();
  EXPECT_EQ(unit->wait(10).value_or(-1), 0);
}

TEST_F(UcxLink, RefusedUnitGetsTheReasonAndNoAccess) {
  UcxSyncerLink syncer("127.0.0.1", 0, 1);
  auto unit = start_unit(syncer.address(), 4096, 3, 100);
  const auto p = next_pending(syncer, 10);
  ASSERT_TRUE(p);
  const std::string reason = "unit 0 is already connected (run.id mismatch: \"a\" vs \"b\")";
  syncer.refuse(p->id, reason);
  EXPECT_EQ(unit->read_line(10).value_or("(nothing)"), "refused " + reason);
  EXPECT_FALSE(syncer.connected(0));
  EXPECT_THROW(syncer.admit(p->id, 0), Error) << "a refused connection cannot be admitted";
  int64_t w = 0;
  EXPECT_FALSE(syncer.fetch_word(0, 0, w));
  EXPECT_TRUE(syncer.take_lost().empty()) << "a refused peer was never a unit";
  EXPECT_TRUE(syncer.accept_pending().empty());
  EXPECT_EQ(ask(*unit, "connected").rfind("no", 0), 0u);
}

TEST_F(UcxLink, KilledUnitIsLostPromptlyAndANewProcessTakesItsPlace) {
  UcxSyncerLink syncer("127.0.0.1", 0, 1);
  const size_t bytes = size_t{2} << 20;
  auto a = start_unit(syncer.address(), bytes, 1, 10);
  auto p = next_pending(syncer, 10);
  ASSERT_TRUE(p);
  syncer.admit(p->id, 0);
  ASSERT_EQ(a->read_line(10).value_or("(nothing)"), "connected");

  // Mid-run: 1 MiB gets back to back; kill -9 after a few. The failed op or take_lost()
  // must report the loss, within a bound.
  std::vector<std::byte> buf(size_t{1} << 20);
  Clock::time_point killed{};
  bool op_failed = false;
  for (int i = 0; i < 400 && !op_failed; ++i) {
    if (i == 5) {
      a->signal(SIGKILL);
      killed = Clock::now();
    }
    op_failed = !syncer.get(0, 4096, buf);
    if (!op_failed) {
      EXPECT_EQ(mismatch(buf.data(), 4096, buf.size(), kInitialSeed), -1);
    }
  }
  std::vector<UcxSyncerLink::Lost> lost;
  while (lost.empty() && since(killed) < 10) {
    lost = syncer.take_lost();
    if (lost.empty()) nap();
  }
  const double detect_s = since(killed);
  ASSERT_EQ(lost.size(), 1u) << "no loss reported " << detect_s << " s after kill -9";
  EXPECT_EQ(lost[0].unit, 0);
  EXPECT_LE(detect_s, 10.0);
  std::printf("[ measured ] kill -9 of a busy unit: lost after %.3f s (\"%s\", op failed: %d)\n",
              detect_s, lost[0].reason.c_str(), op_failed);
  EXPECT_EQ(a->wait(5).value_or(-1), 128 + SIGKILL);

  // Afterwards: every operation is refused at once.
  EXPECT_FALSE(syncer.connected(0));
  const auto t0 = Clock::now();
  int64_t w = 0;
  EXPECT_FALSE(syncer.get(0, 0, buf));
  EXPECT_FALSE(syncer.put(0, 0, buf));
  EXPECT_FALSE(syncer.put_word(0, 0, 1));
  EXPECT_FALSE(syncer.fetch_word(0, 0, w));
  EXPECT_LT(since(t0), 0.05);

  // A new process for the same unit, with other data: admitted and read correctly.
  auto b = start_unit(syncer.address(), bytes / 2, 2, 10);
  p = next_pending(syncer, 10);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->payload, payload_of(2, 10));
  syncer.admit(p->id, 0);
  ASSERT_EQ(b->read_line(10).value_or("(nothing)"), "connected");
  EXPECT_EQ(syncer.bytes(0), bytes / 2);
  ASSERT_TRUE(syncer.fetch_word(0, 0, w));
  EXPECT_EQ(w, kWord0);
  std::vector<std::byte> some(4000);
  ASSERT_TRUE(syncer.get(0, 8, some));
  EXPECT_EQ(mismatch(some.data(), 8, some.size(), kInitialSeed), -1);
  EXPECT_THROW(syncer.get(0, bytes / 2 - 3, some), Error) << "bounds are the new unit's";

  // kill -9 of an idle unit: seen by take_lost() alone.
  b->signal(SIGKILL);
  killed = Clock::now();
  lost.clear();
  while (lost.empty() && since(killed) < 10) {
    lost = syncer.take_lost();
    if (lost.empty()) nap();
  }
  ASSERT_EQ(lost.size(), 1u);
  std::printf("[ measured ] kill -9 of an idle unit: lost after %.3f s (\"%s\")\n", since(killed),
              lost[0].reason.c_str());
  EXPECT_LE(since(killed), 10.0);
  EXPECT_EQ(b->wait(5).value_or(-1), 128 + SIGKILL);
}

TEST_F(UcxLink, UnitThatStopsProgressingTimesOutAndIsLost) {
  // SIGSTOP: the socket stays open, so UCX sees nothing (as on a cut link). The operation
  // fails after its patience, sleeping, not spinning; the unit is stalled meanwhile (every
  // operation fails at once) and lost once the operation timeout has passed.
  if (std::string(env_or("UCX_TLS", "")) != "tcp")
    GTEST_SKIP() << "needs UCX_TLS=tcp: over shared memory (cma) a stopped process's memory "
                    "stays readable, with no progress of its own";
  UcxSyncerLink syncer("127.0.0.1", 0, 1);
  syncer.set_op_timeout(1.0);
  EXPECT_THROW(syncer.set_op_timeout(0), Error);
  auto unit = start_unit(syncer.address(), 65536, 1, 10);
  const auto p = next_pending(syncer, 10);
  ASSERT_TRUE(p);
  syncer.admit(p->id, 0);
  ASSERT_EQ(unit->read_line(10).value_or("(nothing)"), "connected");
  int64_t w = 0;
  ASSERT_TRUE(syncer.fetch_word(0, 0, w));
  unit->signal(SIGSTOP);
  ASSERT_TRUE(wait_stopped(unit->pid(), 10)) << "the unit did not stop";
  const auto t0 = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  std::vector<std::byte> buf(4096, std::byte{0x77});
  EXPECT_FALSE(syncer.get(0, 8, buf));
  const double wall = since(t0), cpu = thread_cpu_seconds() - cpu0;
  std::printf("[ measured ] stopped unit: get failed after %.3f s, %.3f s CPU\n", wall, cpu);
  EXPECT_GE(wall, 0.2);
  EXPECT_LE(wall, 0.9) << "the get waited for more than its patience";
  EXPECT_LT(cpu, 0.25 * wall) << "the wait spun";
  EXPECT_EQ(buf[0], std::byte{0x77}) << "a failed get wrote into the caller's buffer";
  EXPECT_TRUE(syncer.connected(0)) << "stalled, not lost yet";
  const auto t_stalled = Clock::now();
  EXPECT_FALSE(syncer.fetch_word(0, 0, w));
  EXPECT_LT(since(t_stalled), 0.1) << "an operation queued behind the stalled one";
  std::vector<UcxSyncerLink::Lost> lost;
  while (lost.empty() && since(t0) < 5) {
    lost = syncer.take_lost();
    if (lost.empty()) nap();
  }
  std::printf("[ measured ] stopped unit: lost %.3f s after the get was issued\n", since(t0));
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_GE(since(t0), 0.95);
  EXPECT_NE(lost[0].reason.find("timed out"), std::string::npos) << lost[0].reason;
  EXPECT_FALSE(syncer.connected(0));
  EXPECT_FALSE(syncer.fetch_word(0, 0, w));
  // Woken up, the unit finds its endpoint closed.
  unit->signal(SIGCONT);
  const auto t1 = Clock::now();
  std::string state;
  while (since(t1) < 10 && (state = ask(*unit, "connected")) == "yes") nap();
  EXPECT_EQ(state.rfind("no", 0), 0u) << state;
}

TEST_F(UcxLink, StalledUnitHoldsNobodyUpAndIsUsableAgainOnceItProgresses) {
  // Unit 0 stops (as behind a cut link); unit 1 goes on. A batch over both returns after the
  // patience with unit 1's read; unit 1's operations then never wait for unit 0's; unit 0,
  // woken before the operation timeout, is read again without having been lost.
  if (std::string(env_or("UCX_TLS", "")) != "tcp")
    GTEST_SKIP() << "needs UCX_TLS=tcp (see UnitThatStopsProgressingTimesOutAndIsLost)";
  UcxSyncerLink syncer("127.0.0.1", 0, 2);
  syncer.set_op_timeout(30.0);
  std::vector<std::unique_ptr<ChildProcess>> units;
  connect_units(syncer, 65536, 2, units);
  ASSERT_FALSE(HasFatalFailure());
  units[0]->signal(SIGSTOP);
  ASSERT_TRUE(wait_stopped(units[0]->pid(), 10)) << "the unit did not stop";
  std::vector<std::byte> a(4096), b(4096);
  std::vector<UcxSyncerLink::Read> reads = {{0, 8, a}, {1, 8, b}};
  const auto t0 = Clock::now();
  syncer.get_all(reads);
  const double batch_s = since(t0);
  EXPECT_FALSE(reads[0].ok);
  ASSERT_TRUE(reads[1].ok);
  EXPECT_EQ(mismatch(b.data(), 8, b.size(), kInitialSeed), -1);
  EXPECT_LE(batch_s, 0.9) << "the batch waited for the stopped unit beyond its patience";
  const auto t1 = Clock::now();
  for (int i = 0; i < 20; ++i) {
    reads = {{0, 8, a}, {1, 8, b}};
    syncer.get_all(reads);
    EXPECT_FALSE(reads[0].ok);
    EXPECT_TRUE(reads[1].ok);
  }
  const double per_batch_s = since(t1) / 20;
  std::printf("[ measured ] one unit stopped: first batch %.3f s, then %.4f s per batch\n", batch_s,
              per_batch_s);
  EXPECT_LT(per_batch_s, 0.1) << "batches queued behind the stalled unit";
  EXPECT_TRUE(syncer.connected(0));
  units[0]->signal(SIGCONT);
  const auto t2 = Clock::now();
  bool back = false;
  while (!back && since(t2) < 10) {
    back = syncer.get(0, 8, a);
    if (!back) nap();
  }
  ASSERT_TRUE(back) << "unit 0 was not usable again after it progressed";
  std::printf("[ measured ] unit 0 usable again %.3f s after SIGCONT\n", since(t2));
  EXPECT_EQ(mismatch(a.data(), 8, a.size(), kInitialSeed), -1);
  EXPECT_TRUE(syncer.take_lost().empty()) << "a stall shorter than the timeout lost the unit";
}

// Tests a transfer until it is no longer running, at most `seconds`.
RemoteMemory::Status until_ended(UcxSyncerLink& syncer, RemoteMemory::Ticket t, std::span<std::byte> dst,
                                 double seconds) {
  const auto t0 = Clock::now();
  RemoteMemory::Status s = syncer.test(t, dst);
  while (s == RemoteMemory::Status::running && since(t0) < seconds) {
    nap();
    s = syncer.test(t, dst);
  }
  return s;
}

TEST_F(UcxLink, TransfersRunSideBySideWithoutTheSyncerWaiting) {
  // start_get / start_put return at once; unit 0 stops (as behind a slow or cut link) with a
  // read on its way, while unit 1's read and write complete. Unit 0's ends once it progresses;
  // a transfer to a unit killed meanwhile fails, and its ticket is forgotten.
  if (std::string(env_or("UCX_TLS", "")) != "tcp")
    GTEST_SKIP() << "needs UCX_TLS=tcp (see UnitThatStopsProgressingTimesOutAndIsLost)";
  UcxSyncerLink syncer("127.0.0.1", 0, 2);
  syncer.set_op_timeout(30.0);
  const size_t bytes = size_t{1} << 20;
  std::vector<std::unique_ptr<ChildProcess>> units;
  connect_units(syncer, bytes, 2, units);
  ASSERT_FALSE(HasFatalFailure());
  units[0]->signal(SIGSTOP);
  ASSERT_TRUE(wait_stopped(units[0]->pid(), 10)) << "the unit did not stop";
  const size_t n = 512 * 1024;
  std::vector<std::byte> a(n), b(n), out(n);
  fill(out.data(), 300'001, n, 11);
  const auto t0 = Clock::now();
  const RemoteMemory::Ticket ga = syncer.start_get(0, 8, n);
  const RemoteMemory::Ticket gb = syncer.start_get(1, 8, n);
  const RemoteMemory::Ticket pb = syncer.start_put(1, 300'001, out);
  const double start_s = since(t0);
  ASSERT_NE(ga, 0);
  ASSERT_NE(gb, 0);
  ASSERT_NE(pb, 0);
  EXPECT_LT(start_s, 0.1) << "starting transfers waited for them";
  std::fill(out.begin(), out.end(), std::byte{0});  // the link keeps its own copy
  using S = RemoteMemory::Status;
  S sgb = S::running, spb = S::running;
  while ((sgb == S::running || spb == S::running) && since(t0) < 10) {
    if (sgb == S::running) sgb = syncer.test(gb, b);
    if (spb == S::running) spb = syncer.test(pb);
    nap();
  }
  ASSERT_EQ(sgb, S::done);
  ASSERT_EQ(spb, S::done);
  EXPECT_EQ(mismatch(b.data(), 8, n, kInitialSeed), -1);
  EXPECT_EQ(ask(*units[1], "check 300001 " + std::to_string(n) + " 11"), "ok");
  EXPECT_EQ(syncer.test(gb, b), S::failed) << "a ticket is forgotten once done";
  EXPECT_EQ(syncer.test(ga, a), S::running) << "unit 0 is stopped";
  std::printf("[ measured ] unit 1's read and write done %.3f s after they started, unit 0's read on its way\n",
              since(t0));
  units[0]->signal(SIGCONT);
  ASSERT_EQ(until_ended(syncer, ga, a, 10), S::done);
  EXPECT_EQ(mismatch(a.data(), 8, n, kInitialSeed), -1);
  EXPECT_TRUE(syncer.take_lost().empty());
  // kill -9 with a read on its way (stopped first, so that it cannot have completed).
  units[1]->signal(SIGSTOP);
  ASSERT_TRUE(wait_stopped(units[1]->pid(), 10));
  const RemoteMemory::Ticket gk = syncer.start_get(1, 8, n);
  ASSERT_NE(gk, 0);
  EXPECT_EQ(syncer.test(gk, b), S::running);
  units[1]->signal(SIGKILL);
  const auto t2 = Clock::now();
  EXPECT_EQ(until_ended(syncer, gk, b, 15), S::failed);
  std::printf("[ measured ] a read on its way to a unit killed -9 failed after %.3f s\n", since(t2));
  EXPECT_EQ(units[1]->wait(5).value_or(-1), 128 + SIGKILL);
  EXPECT_FALSE(syncer.connected(1));
  EXPECT_EQ(syncer.start_get(1, 8, n), 0) << "a lost unit starts nothing";
}

TEST_F(UcxLink, UnitSeesTheSyncerDieAndConnectsToANewOne) {
  UcxUnitLink unit(size_t{1} << 20);
  fill(unit.base(), 0, unit.bytes(), 4);
  unit.sync();
  EXPECT_FALSE(unit.connected());

  std::string addr;
  auto a = start_syncer(addr);
  ASSERT_FALSE(addr.empty());
  unit.connect(addr, "hello A", 10);
  EXPECT_TRUE(unit.connected());
  EXPECT_EQ(a->read_line(10).value_or("(nothing)"), "admitted hello A");
  EXPECT_EQ(ask(*a, "check 64 4096 4"), "ok");
  EXPECT_THROW(unit.connect(addr, "again", 1), Error) << "already connected";

  a->signal(SIGKILL);
  auto t0 = Clock::now();
  while (unit.connected() && since(t0) < 10) nap();
  EXPECT_FALSE(unit.connected());
  std::printf("[ measured ] kill -9 of the syncer: unit saw it after %.3f s (\"%s\")\n", since(t0),
              unit.lost_reason().c_str());
  EXPECT_LE(since(t0), 10.0);
  EXPECT_FALSE(unit.lost_reason().empty());
  EXPECT_EQ(a->wait(5).value_or(-1), 128 + SIGKILL);

  // Same memory, same rkey, a new endpoint to a new syncer.
  std::string addr_b;
  auto b = start_syncer(addr_b);
  ASSERT_FALSE(addr_b.empty());
  unit.connect(addr_b, "hello B", 10);
  EXPECT_TRUE(unit.connected());
  EXPECT_EQ(unit.lost_reason(), "");
  EXPECT_EQ(b->read_line(10).value_or("(nothing)"), "admitted hello B");
  EXPECT_EQ(ask(*b, "check 1000 70000 4"), "ok");
  EXPECT_EQ(ask(*b, "put 333 13 8"), "put ok");
  unit.sync();
  EXPECT_EQ(mismatch(unit.base() + 333, 333, 13, 8), -1);
  EXPECT_EQ(mismatch(unit.base() + 332, 332, 1, 4), -1);

  // A syncer that closes: the unit sees that too.
  EXPECT_EQ(ask(*b, "quit"), "closed");
  t0 = Clock::now();
  while (unit.connected() && since(t0) < 10) nap();
  EXPECT_FALSE(unit.connected());
  std::printf("[ measured ] syncer close(): unit saw it after %.3f s (\"%s\")\n", since(t0),
              unit.lost_reason().c_str());
  EXPECT_EQ(b->wait(5).value_or(-1), 0);
  unit.close();
  EXPECT_THROW(unit.connect(addr_b, "x", 1), Error);
}

TEST_F(UcxLink, ConnectFailsWithinItsTimeoutWhenNobodyListensOrAnswers) {
  UcxUnitLink unit(4096);
  // A port that is bound but not listening: the kernel refuses the connection.
  const int bound = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(bound, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(bound, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(bound, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string closed_addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto t0 = Clock::now();
  try {
    unit.connect(closed_addr, "x", 2.0);
    ADD_FAILURE() << "connected to nothing";
  } catch (const LinkRefused& e) {
    ADD_FAILURE() << "not a refusal by a syncer: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(closed_addr), std::string::npos) << e.what();
    std::printf("[ measured ] no listener: \"%s\" after %.3f s\n", e.what(), since(t0));
  }
  EXPECT_LE(since(t0), 3.0);

  // A TCP listener that is not a UCX syncer: nothing answers; connect() gives up in time.
  ASSERT_EQ(::listen(bound, 4), 0);
  t0 = Clock::now();
  try {
    unit.connect(closed_addr, "x", 2.0);
    ADD_FAILURE() << "connected to a plain socket";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(closed_addr), std::string::npos) << e.what();
    std::printf("[ measured ] silent listener: \"%s\" after %.3f s\n", e.what(), since(t0));
  }
  EXPECT_GE(since(t0), 1.9);
  EXPECT_LE(since(t0), 3.0);
  ::close(bound);
  EXPECT_FALSE(unit.connected());
  EXPECT_THROW(unit.connect("127.0.0.1", "x", 1), Error) << "no port";
}

#ifdef DDILOCO_MPIEXEC
TEST_F(UcxLink, UnitLeaderUnderMpirunCoexistsWithOpenMpi) {
  UcxSyncerLink syncer("127.0.0.1", 0, 1);
  // Our MPI settings (tests/CMakeLists.txt DDILOCO_MPI_ENV): ob1, no UCX inside MPI.
  ChildProcess job({DDILOCO_MPIEXEC, "--oversubscribe", "--bind-to", "none", "-np", "2",
                    self_exe()},
                   helper_env({"DDILOCO_UCX_TEST_HELPER=mpi_unit",
                               "DDILOCO_UCX_ADDR=" + syncer.address(), "DDILOCO_UCX_BYTES=65536",
                               "DDILOCO_UCX_PAYLOAD_SEED=5", "DDILOCO_UCX_PAYLOAD_LEN=33",
                               "OMPI_MCA_pml=ob1", "OMPI_MCA_btl=self,vader,tcp",
                               "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                               "OMP_NUM_THREADS=1"}));
  const auto p = next_pending(syncer, 20);
  ASSERT_TRUE(p) << "no handshake from the MPI job";
  EXPECT_EQ(p->payload, payload_of(5, 33));
  syncer.admit(p->id, 0);
  ASSERT_EQ(job.read_line(10).value_or("(nothing)"), "connected");
  std::vector<std::byte> buf(60000);
  ASSERT_TRUE(syncer.get(0, 8, buf));
  EXPECT_EQ(mismatch(buf.data(), 8, buf.size(), kInitialSeed), -1);
  ASSERT_TRUE(syncer.put_word(0, 64, 77));
  EXPECT_EQ(ask(job, "word 64"), "word 77");
  job.close_stdin();  // rank 0 leaves its loop, closes the link, then MPI's round
  EXPECT_EQ(job.read_line(20).value_or("(nothing)"), "mpi ok");
  EXPECT_EQ(job.wait(20).value_or(-1), 0);
  job.terminate(2);
}
#endif

}  // namespace
