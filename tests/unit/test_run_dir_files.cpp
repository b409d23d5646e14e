// Files ddiloco writes in run.dir (and beside checkpoints and shards): a symlink or a file that
// another local user planted at one of their names must never redirect or hijack the write.
// Each test plants one, pointing at a "victim" file, and checks that the victim is untouched.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/metrics.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/run_dir.hpp"
#include "ddiloco/shard.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

namespace fs = std::filesystem;

const std::string kVictimText = "precious: not ddiloco's to overwrite\n";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A victim outside the run directory, and the run directory itself.
struct Planted {
  test::TempDir dir;
  fs::path victim = dir / "victim.txt";
  fs::path run = dir / "run";
  Planted() {
    fs::create_directories(run);
    test::write_bytes(victim, kVictimText);
  }
  void symlink_at(const fs::path& name) const { fs::create_symlink(victim, name); }
  bool victim_untouched() const {
    return slurp(victim) == kVictimText && !fs::is_symlink(victim);
  }
};

void expect_error_naming(const std::function<void()>& f, const fs::path& file,
                         const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "no error for " << file;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(file.string()), std::string::npos) << m;
    EXPECT_NE(m.find(words), std::string::npos) << m;
  }
}

TEST(RunDirFiles, WriteTextAtomicallyNeverFollowsASymlinkAtItsTemporaryName) {
  Planted p;
  const fs::path target = p.run / "config.yaml";
  p.symlink_at(target.string() + ".tmp");
  write_text_atomically(target, "seed: 1\n");
  EXPECT_TRUE(p.victim_untouched());
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_EQ(slurp(target), "seed: 1\n");
  EXPECT_FALSE(fs::exists(fs::symlink_status(target.string() + ".tmp")));
}

TEST(RunDirFiles, WriteTextAtomicallyNeverReusesAFilePlantedAtItsTemporaryName) {
  // A hard link to the victim: truncating the temporary in place would empty the victim.
  Planted p;
  const fs::path target = p.run / "syncer.addr";
  fs::create_hard_link(p.victim, target.string() + ".tmp");
  write_text_atomically(target, "{}\n");
  EXPECT_TRUE(p.victim_untouched());
  EXPECT_EQ(slurp(target), "{}\n");
}

TEST(RunDirFiles, PidFileNeverFollowsASymlinkAtItsTemporaryName) {
  Planted p;
  const fs::path dir = pid_dir(p.run);
  fs::create_directories(dir);
  p.symlink_at(dir / "unit0.rank0.pid.tmp");
  const fs::path f = write_pid_file(dir, unit_pid_name(0, 0));
  EXPECT_TRUE(p.victim_untouched());
  EXPECT_FALSE(fs::is_symlink(f));
  EXPECT_EQ(slurp(f), fmt::format("{}\n", ::getpid()));
}

TEST(RunDirFiles, JsonlWriterRefusesASymlinkAtTheLogsName) {
  for (const bool truncate : {false, true}) {
    Planted p;
    const fs::path log = p.run / "metrics.jsonl";
    p.symlink_at(log);
    expect_error_naming([&] { JsonlWriter w(log, truncate); }, log, "symbolic link");
    EXPECT_TRUE(p.victim_untouched()) << "truncate " << truncate;
  }
}

TEST(RunDirFiles, JsonlWriterRefusesAHardLinkToAnotherFile) {
  // Appending to it would append to the file it is linked to.
  Planted p;
  const fs::path log = p.run / "unit_0.jsonl";
  fs::create_hard_link(p.victim, log);
  expect_error_naming([&] { JsonlWriter w(log, /*truncate=*/true); }, log, "hard links");
  EXPECT_TRUE(p.victim_untouched());
}

TEST(RunDirFiles, JsonlWriterRefusesAFileOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (uid 65534)";
  Planted p;
  const fs::path log = p.run / "launch.jsonl";
  test::write_bytes(log, "{\"event\":\"theirs\"}\n");
  ASSERT_EQ(::chown(log.c_str(), 65534, 65534), 0);
  expect_error_naming([&] { JsonlWriter w(log, /*truncate=*/false); }, log, "owned by uid 65534");
  EXPECT_EQ(slurp(log), "{\"event\":\"theirs\"}\n");
}

TEST(RunDirFiles, JsonlWriterStillAppendsToItsOwnLogAndTruncatesOnRequest) {
  test::TempDir dir;
  const fs::path log = dir / "sub" / "metrics.jsonl";
  {
    JsonlWriter w(log, /*truncate=*/true);
    w.write({{"event", "a"}});
    EXPECT_EQ(slurp(log), "{\"event\":\"a\"}\n");  // on disk at once, before the writer closes
  }
  {
    JsonlWriter w(log, /*truncate=*/false);
    w.write({{"event", "b"}});
  }
  EXPECT_EQ(read_events(log, "a").size(), 1u);
  EXPECT_EQ(read_events(log, "b").size(), 1u);
  JsonlWriter moved;
  moved = JsonlWriter(log, /*truncate=*/true);
  EXPECT_TRUE(moved.enabled());
  moved.write({{"event", "c"}});
  EXPECT_EQ(slurp(log), "{\"event\":\"c\"}\n");
}

TEST(RunDirFiles, ModelFileNeverFollowsASymlinkAtItsHdf5TemporaryName) {
  // The write succeeds: the planted link is removed, and the temporary created afresh.
  Planted p;
  const GptConfig c{256, 16, 2, 2, 16};
  const std::vector<float> params(ParameterLayout::gpt2(c).size(), 0.25f);
  const fs::path model = p.run / "model.h5";
  p.symlink_at(model.string() + ".tmp");
  save_model(model, c, params, {{"step", 3}});
  EXPECT_TRUE(p.victim_untouched());
  EXPECT_FALSE(fs::is_symlink(model));
  EXPECT_EQ(load_model(model).params, params);
}

TEST(RunDirFiles, CheckpointDirectoryProbeNeverFollowsASymlink) {
  Planted p;
  const fs::path root = p.run / "checkpoints";
  fs::create_directories(root);
  p.symlink_at(root / fmt::format(".write_test_{}", ::getpid()));
  checkpoint::check_directory(root);
  EXPECT_TRUE(p.victim_untouched());
}

TEST(RunDirFiles, ShardNeverFollowsASymlinkAtItsTemporaryName) {
  Planted p;
  const fs::path shard = p.run / "train_000.bin";
  p.symlink_at(shard.string() + ".tmp");
  const std::vector<uint16_t> tokens = {1, 2, 3};
  write_shard(shard, tokens);
  EXPECT_TRUE(p.victim_untouched());
  EXPECT_FALSE(fs::is_symlink(shard));
  EXPECT_EQ(read_shard_header(shard), 3);
}

}  // namespace
}  // namespace ddiloco
