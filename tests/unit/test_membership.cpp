// Who may join the isolated deployment's syncer, and heal times (membership.hpp).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "ddiloco/error.hpp"
#include "ddiloco/membership.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

Config job() {
  Config c;
  c.mode = Mode::decoupled;
  c.units.count = 3;
  c.units.ranks = {1, 2, 1};
  return c;
}

protocol::Hello hello_for(const Config& c, int unit) {
  protocol::Hello h;
  h.unit = unit;
  h.ranks = c.unit_ranks(unit);
  h.model = c.model;
  h.config_digest = protocol::config_digest(c);
  h.run_id = "run-a";
  h.proof = protocol::hello_proof("s3cret");
  h.host = "node7";
  h.pid = 4242;
  h.window_bytes = 1000;
  return h;
}

TEST(Membership, AdmitsAMatchingUnit) {
  const Config c = job();
  protocol::Membership m(c, "run-a", "s3cret", 1000);
  EXPECT_EQ(m.judge(hello_for(c, 1)), "");
}

TEST(Membership, RefusesWithBothSidesValues) {
  const Config c = job();
  protocol::Membership m(c, "run-a", "s3cret", 1000);
  auto h = hello_for(c, 1);
  h.proof = "";
  EXPECT_NE(m.judge(h).find("secret"), std::string::npos);
  h.proof = protocol::hello_proof("s3cret!");  // another run's secret
  EXPECT_NE(m.judge(h).find("secret"), std::string::npos);
  h.proof = "s3cret";  // the secret itself is no proof
  EXPECT_NE(m.judge(h).find("secret"), std::string::npos);
  h = hello_for(c, 1);
  h.run_id = "run-b";
  EXPECT_EQ(m.judge(h), "run id run-b is not this run's (run-a)");
  h = hello_for(c, 2);
  h.unit = 3;
  EXPECT_EQ(m.judge(h), "unit 3 is outside 0..2 (units.count = 3)");
  h = hello_for(c, 1);
  h.ranks = 1;
  EXPECT_EQ(m.judge(h), "unit 1 has 1 ranks, the syncer's configuration gives it 2");
  h = hello_for(c, 0);
  h.model.n_embd = 64;
  const std::string shape = m.judge(h);
  EXPECT_NE(shape.find("n_embd=64"), std::string::npos) << shape;
  EXPECT_NE(shape.find("n_embd=128"), std::string::npos) << shape;
  h = hello_for(c, 0);
  h.window_bytes = 999;
  EXPECT_EQ(m.judge(h), "unit 0 exposes 999 bytes, the syncer's window layout needs 1000");
  Config other = c;
  other.train.lr = 1e-4;
  h = hello_for(other, 0);
  EXPECT_NE(m.judge(h).find("configuration digest"), std::string::npos);
}

TEST(Membership, ASecondLiveProcessOfAUnitIsRefused) {
  const Config c = job();
  protocol::Membership m(c, "run-a", "s3cret", 1000);
  m.joined(hello_for(c, 2), 1.0);
  auto second = hello_for(c, 2);
  second.pid = 99;
  EXPECT_EQ(m.judge(second), "unit 2 is already held by a live process (pid 4242 on node7)");
  EXPECT_THROW(m.joined(second, 2.0), Error);
  // Once it is lost, a new process may take its place.
  m.lost(2, 3.0, "endpoint timeout");
  EXPECT_EQ(m.judge(second), "");
}

TEST(Membership, HealTimeRunsFromTheLossToTheFirstMergeAfterTheRejoin) {
  const Config c = job();
  protocol::Membership m(c, "run-a", "s3cret", 1000);
  m.joined(hello_for(c, 0), 0.0);
  EXPECT_FALSE(m.merged(0, 5.0));  // a first start heals nothing
  m.lost(0, 10.0, "killed");
  EXPECT_FALSE(m.present(0));
  m.joined(hello_for(c, 0), 14.0);
  EXPECT_EQ(m.restarts(0), 1);
  EXPECT_DOUBLE_EQ(m.absent_s(0), 4.0);
  const auto heal = m.merged(0, 16.5);
  ASSERT_TRUE(heal);
  EXPECT_DOUBLE_EQ(*heal, 6.5);
  EXPECT_FALSE(m.merged(0, 20.0));  // only the first merge after the rejoin
  EXPECT_EQ(m.heal_times(), std::vector<double>{6.5});
  EXPECT_EQ(m.total_restarts(), 1);
}

TEST(Membership, ConfigDigestIgnoresPerProcessKeysOnly) {
  Config a = job(), b = job();
  b.run.threads = 7;
  b.run.progress = false;
  b.syncer.address = "10.0.0.1:5000";
  EXPECT_EQ(protocol::config_digest(a), protocol::config_digest(b));
  b.outer.h = a.outer.h + 1;
  EXPECT_NE(protocol::config_digest(a), protocol::config_digest(b));
  EXPECT_EQ(protocol::config_digest(a).size(), 16u);
}

TEST(Membership, HelloRoundTripsAndNamesAMissingField) {
  const Config c = job();
  const auto h = hello_for(c, 1);
  const auto back = protocol::Hello::from_json(h.to_json(), "test");
  EXPECT_EQ(back.to_json(), h.to_json());
  auto j = h.to_json();
  j.erase("proof");
  try {
    protocol::Hello::from_json(j, "handshake from 127.0.0.1:9");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "handshake from 127.0.0.1:9: handshake field 'proof' is missing");
  }
  j = h.to_json();
  j["unit"] = "one";
  EXPECT_THROW(protocol::Hello::from_json(j, "x"), Error);
}

// Issue 34: nlohmann's get<int>() on 1e20 is a cast whose result is undefined, and on 2^40 a
// truncation: an integer field out of its type's range, or not an integer, is refused.
TEST(Membership, HelloIntegerFieldsOutOfRangeOrNotIntegersAreRefused) {
  const auto h = hello_for(job(), 1);
  const std::vector<std::pair<const char*, nlohmann::json>> bad = {
      {"unit", 1e20}, {"unit", 1.5}, {"unit", int64_t{1} << 40}, {"ranks", -1e300},
      {"pid", 18446744073709551615ULL}, {"window_bytes", -1}, {"restart", true}};
  for (const auto& [key, value] : bad) {
    auto j = h.to_json();
    j[key] = value;
    try {
      protocol::Hello::from_json(j, "hello");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("handshake field '{}' must be an integer in", key)),
                std::string::npos) << e.what();
    }
  }
  auto j = h.to_json();
  j["window_bytes"] = 18446744073709551615ULL;  // in range of uint64_t: read as it is
  EXPECT_EQ(protocol::Hello::from_json(j, "hello").window_bytes, 18446744073709551615ULL);
}

TEST(Membership, EndpointParsing) {
  const auto e = protocol::Endpoint::parse("127.0.0.1:0", "syncer.listen");
  EXPECT_EQ(e.ip, "127.0.0.1");
  EXPECT_EQ(e.port, 0);
  EXPECT_EQ(protocol::Endpoint::parse("169.254.100.1:65535", "x").port, 65535);
  for (const char* bad : {"", "127.0.0.1", ":80", "127.0.0.1:", "127.0.0.1:70000", "1.2.3:4",
                          "1.2.3.4.5:6", "256.0.0.1:1", "localhost:80", "1.2.3.4:8x"})
    EXPECT_THROW(protocol::Endpoint::parse(bad, "syncer.listen"), Error) << bad;
}

TEST(Membership, RendezvousIsWrittenAtomicallyWithAPrivateSecret) {
  test::TempDir dir;
  EXPECT_FALSE(protocol::Rendezvous::read(dir.path()));
  protocol::Rendezvous r;
  r.address = "127.0.0.1:4567";
  r.run_id = protocol::Rendezvous::random_token();
  r.secret = protocol::Rendezvous::random_token();
  r.pid = 12;
  r.host = "h";
  EXPECT_EQ(r.run_id.size(), 32u);
  EXPECT_NE(r.run_id, r.secret);
  r.write(dir.path());
  struct stat st {};
  ASSERT_EQ(::stat(protocol::Rendezvous::secret_file(dir.path()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const auto back = protocol::Rendezvous::read(dir.path());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->address, r.address);
  EXPECT_EQ(back->run_id, r.run_id);
  EXPECT_EQ(back->secret, r.secret);
  test::write_bytes(protocol::Rendezvous::addr_file(dir.path()), "{\"address\": 5}");
  EXPECT_THROW(protocol::Rendezvous::read(dir.path()), Error);
}

// A unit reads the run's secret from run.dir; one that others can read, or that someone else
// put there, is no secret: refused before it is read.
protocol::Rendezvous written_rendezvous(const std::filesystem::path& dir) {
  protocol::Rendezvous r;
  r.address = "127.0.0.1:4567";
  r.run_id = "run-a";
  r.secret = "s3cret";
  r.write(dir);
  return r;
}

void expect_refused(const std::filesystem::path& dir, const std::filesystem::path& file,
                    const std::string& words) {
  try {
    protocol::Rendezvous::read(dir);
    ADD_FAILURE() << file << " was read";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(file.string()), std::string::npos) << m;
    EXPECT_NE(m.find(words), std::string::npos) << m;
  }
}

void expect_secret_refused(const std::filesystem::path& dir, const std::string& words) {
  expect_refused(dir, protocol::Rendezvous::secret_file(dir), words);
}

TEST(Membership, SecretReadableByOthersIsRefusedAndA0600OneIsRead) {
  test::TempDir dir;
  written_rendezvous(dir.path());
  const auto file = protocol::Rendezvous::secret_file(dir.path());
  ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  expect_secret_refused(dir.path(), "mode 0644");
  expect_secret_refused(dir.path(), "chmod 600 " + file.string());
  ASSERT_EQ(::chmod(file.c_str(), 0640), 0);
  expect_secret_refused(dir.path(), "mode 0640");
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  const auto back = protocol::Rendezvous::read(dir.path());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->secret, "s3cret");
}

TEST(Membership, SecretThatIsASymlinkIsRefused) {
  test::TempDir dir;
  written_rendezvous(dir.path());
  const auto file = protocol::Rendezvous::secret_file(dir.path());
  std::filesystem::rename(file, dir / "elsewhere");  // still 0600 and ours
  std::filesystem::create_symlink(dir / "elsewhere", file);
  expect_secret_refused(dir.path(), "symbolic link");
}

TEST(Membership, SecretOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user (uid 65534)";
  test::TempDir dir;
  written_rendezvous(dir.path());
  const auto file = protocol::Rendezvous::secret_file(dir.path());
  ASSERT_EQ(::chown(file.c_str(), 65534, 65534), 0);
  expect_secret_refused(dir.path(), "owned by uid 65534");
  expect_secret_refused(dir.path(), "it must be owned by you");
}

// Whoever plants the address file stands between the units and the syncer: a symlink, or one
// of another user, is refused as the secret is (its mode may be 0644: it holds no secret).
TEST(Membership, AddressFileThatIsASymlinkOrAnotherUsersIsRefused) {
  test::TempDir dir;
  written_rendezvous(dir.path());
  const auto file = protocol::Rendezvous::addr_file(dir.path());
  std::filesystem::rename(file, dir / "elsewhere");
  std::filesystem::create_symlink(dir / "elsewhere", file);
  expect_refused(dir.path(), file, "symbolic link");
  std::filesystem::remove(file);
  std::filesystem::rename(dir / "elsewhere", file);
  ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  EXPECT_EQ(protocol::Rendezvous::read(dir.path())->address, "127.0.0.1:4567");
  if (::geteuid() != 0) return;  // giving a file to another user needs root
  ASSERT_EQ(::chown(file.c_str(), 65534, 65534), 0);
  expect_refused(dir.path(), file, "owned by uid 65534");
}

TEST(Membership, SecretWriteNeverFollowsASymlinkAtItsTemporaryName) {
  test::TempDir dir;
  test::write_bytes(dir / "victim", "precious\n");
  std::filesystem::create_symlink(dir / "victim",
                                  protocol::Rendezvous::secret_file(dir.path()).string() + ".tmp");
  written_rendezvous(dir.path());
  std::ifstream in(dir / "victim");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "precious");
  EXPECT_EQ(protocol::Rendezvous::read(dir.path())->secret, "s3cret");
}

}  // namespace
}  // namespace ddiloco
