// Pid files (run_dir.hpp): how `ddiloco launch` finds the process of a unit's rank.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ddiloco/error.hpp"
#include "ddiloco/run_dir.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(PidFile, WrittenAtomicallyAndReadBack) {
  test::TempDir dir;
  const fs::path d = pid_dir(dir.path());
  EXPECT_EQ(d, dir.path() / "pids");
  EXPECT_EQ(unit_pid_name(3, 1), "unit3.rank1");
  EXPECT_FALSE(read_pid_file(d, "unit3.rank1").has_value());  // no directory yet
  const auto before = fs::file_time_type::clock::now() - std::chrono::seconds(1);
  const fs::path f = write_pid_file(d, unit_pid_name(3, 1));
  EXPECT_EQ(f, d / "unit3.rank1.pid");
  EXPECT_EQ(slurp(f), fmt::format("{}\n", ::getpid()));
  EXPECT_FALSE(fs::exists(d / "unit3.rank1.pid.tmp"));
  const auto back = read_pid_file(d, "unit3.rank1");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->pid, ::getpid());
  EXPECT_GE(back->written, before);
  for (const char* bad : {"", "0\n", "-4\n", "12x\n", "99999999999999\n"}) {
    test::write_bytes(d / "bad.pid", bad);
    EXPECT_THROW(read_pid_file(d, "bad"), Error) << bad;
  }
}

}  // namespace
}  // namespace ddiloco
