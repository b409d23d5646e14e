// The syncer's status page (docs/status_page.md): the board's history, the two renderings,
// the HTTP server's answers and its refusals, the launcher's request files and the terminal
// table of `ddiloco status`, each from untrusted input where a peer or a file supplies it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <thread>

#include "cli/commands.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/status.hpp"
#include "syncer/status_board.hpp"
#include "syncer/status_server.hpp"
#include "temp_dir.hpp"

namespace ddiloco::syncer {
namespace {

using nlohmann::json;

std::shared_ptr<StatusSnapshot> snapshot(StatusBoard& board, int units) {
  auto s = std::make_shared<StatusSnapshot>();
  s->elapsed_s = 12.5;
  s->run = {{"dir", "runs/x"}, {"mode", "decoupled"}, {"units", units}};
  s->tokens = 4096;
  s->merges = 7;
  s->versions = {4, 3};
  for (int u = 0; u < units; ++u) {
    UnitStatus st;
    st.unit = u;
    st.state = u == 0 ? "training" : "lost";
    st.steps = 10 + u;
    st.bytes_up = 100;
    st.bytes_down = 200;
    s->units.push_back(st);
  }
  s->actions = {.kill = true, .checkpoint = true, .stop = true};
  board.attach_history(*s);
  return s;
}

TEST(StatusBoard, MergesFeedTheRateAndEachUnitsLastMerge) {
  StatusBoard board(3);
  EXPECT_EQ(board.merge_rate(5), 0);
  for (int i = 0; i < 10; ++i) board.event({{"event", "merge"}, {"elapsed_s", 10.0 + i}, {"units", {0, 2}}});
  // A peer's claim in a merge's units cannot index past the board.
  board.event({{"event", "merge"}, {"elapsed_s", 19.5}, {"units", {7, -1, "x"}}});
  EXPECT_DOUBLE_EQ(board.last_merged_at(0), 19.0);
  EXPECT_DOUBLE_EQ(board.last_merged_at(1), -1.0);
  EXPECT_DOUBLE_EQ(board.last_merged_at(2), 19.0);
  EXPECT_DOUBLE_EQ(board.merge_rate(20.0), 11 / 10.0);  // since the first merge
  // Over the last 60 s only.
  EXPECT_DOUBLE_EQ(board.merge_rate(79.2), 1 / 60.0);
  EXPECT_EQ(board.merge_rate(200.0), 0);
}

TEST(StatusBoard, EvaluationsMakeTheCurveAndOtherEventsTheList) {
  StatusBoard board(2);
  board.event({{"event", "global_eval"}, {"elapsed_s", 1.0}, {"tokens", 100}, {"val_loss", 4.5}});
  board.event({{"event", "global_eval"}, {"elapsed_s", 2.0}, {"tokens", 200}, {"val_loss", "bad"}});
  for (size_t i = 0; i < StatusBoard::kEvents + 5; ++i)
    board.event({{"event", "unit_lost"}, {"unit", 1}, {"elapsed_s", static_cast<double>(i)}});
  StatusSnapshot s;
  board.attach_history(s);
  ASSERT_EQ(s.val_loss->size(), 1u);
  EXPECT_EQ((*s.val_loss)[0], (std::array<double, 3>{100, 1.0, 4.5}));
  ASSERT_EQ(s.events->size(), StatusBoard::kEvents);
  EXPECT_EQ(s.events->front()["elapsed_s"], 5.0);  // the oldest dropped
  EXPECT_EQ(s.events->back()["elapsed_s"], static_cast<double>(StatusBoard::kEvents + 4));
}

TEST(StatusBoard, TrainingLossIsSampledWhenItChanges) {
  StatusBoard board(2);
  board.train_loss(0, 0.0, 10, 1.0);  // none yet
  board.train_loss(0, 3.0, 20, 2.0);
  board.train_loss(0, 3.0, 30, 3.0);  // the same interval's mean again
  board.train_loss(1, 2.0, 30, 3.0);
  board.train_loss(1, NAN, 35, 3.5);  // a diverged unit's claim
  board.train_loss(1, NAN, 40, 4.0);
  board.train_loss(0, 2.5, 50, 5.0);
  StatusSnapshot s;
  board.attach_history(s);
  ASSERT_EQ(s.train_loss->size(), 4u);
  EXPECT_EQ((*s.train_loss)[3], (std::array<double, 4>{0, 50, 5.0, 2.5}));
  // NaN is kept in the history but never reaches JSON, which has none.
  const json j = to_json(s);
  EXPECT_EQ(j["train_loss"].size(), 3u);
}

TEST(StatusBoard, PublishedSnapshotsAreWhatReadersGet) {
  StatusBoard board(1);
  EXPECT_EQ(board.latest(), nullptr);
  auto s = snapshot(board, 1);
  board.publish(s);
  EXPECT_EQ(board.latest(), s);
}

TEST(StatusJson, FollowsTheDocumentedSchema) {
  StatusBoard board(2);
  board.event({{"event", "global_eval"}, {"elapsed_s", 1.0}, {"tokens", 100}, {"val_loss", 4.5}});
  auto s = snapshot(board, 2);
  s->units[0].train_loss = 3.25;
  s->units[1].train_loss = INFINITY;  // a unit's claim
  s->units[0].pid = 42;
  s->units[0].host = "node1";
  s->units[0].last_merge_s = 0.5;
  const json j = to_json(*s);
  EXPECT_EQ(j["schema"], "ddiloco.status/1");
  EXPECT_EQ(j["progress"]["merges"], 7);
  EXPECT_EQ(j["progress"]["versions"], json({4, 3}));
  EXPECT_EQ(j["units"][0]["state"], "training");
  EXPECT_EQ(j["units"][0]["pid"], 42);
  EXPECT_EQ(j["units"][0]["host"], "node1");
  EXPECT_EQ(j["units"][0]["train_loss"], 3.25);
  EXPECT_EQ(j["units"][0]["last_merge_s"], 0.5);
  EXPECT_TRUE(j["units"][1]["train_loss"].is_null());
  EXPECT_TRUE(j["units"][1]["pid"].is_null());
  EXPECT_TRUE(j["units"][1]["host"].is_null());
  EXPECT_TRUE(j["units"][1]["last_merge_s"].is_null());
  EXPECT_TRUE(j["goodput"]["ratio"].is_null());
  EXPECT_EQ(j["val_loss"], json::parse("[[100.0, 1.0, 4.5]]"));
  EXPECT_EQ(j["actions"], json({{"kill", true}, {"checkpoint", true}, {"stop", true}}));
  EXPECT_EQ(j["config"], "");
}

// Every line of the exposition format: a comment, or name{labels} value (text format 0.0.4).
TEST(StatusPrometheus, EveryLineIsWellFormedAndEveryFamilyDeclared) {
  StatusBoard board(2);
  auto s = snapshot(board, 2);
  s->goodput = 0.75;
  s->units[1].train_loss = NAN;
  const std::string text = to_prometheus(*s);
  const std::regex comment(R"(# (HELP|TYPE) (ddiloco_[a-z_]+) .+)");
  const std::regex sample(R"((ddiloco_[a-z_]+)(\{([a-z_]+="[^"\\]*")(,[a-z_]+="[^"\\]*")*\})? (NaN|[+-]Inf|-?[0-9.e+-]+))");
  std::set<std::string> typed;
  std::istringstream in(text);
  int samples = 0;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, comment)) {
      if (m[1] == "TYPE") typed.insert(m[2]);
      continue;
    }
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    EXPECT_TRUE(typed.count(m[1])) << "sample before its # TYPE: " << line;
    ++samples;
  }
  EXPECT_GT(samples, 20);
  EXPECT_NE(text.find("ddiloco_merges_total 7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ddiloco_unit_up{unit=\"0\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("ddiloco_unit_up{unit=\"1\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("ddiloco_link_bytes_total{unit=\"1\",direction=\"down\"} 200\n"), std::string::npos);
  EXPECT_NE(text.find("ddiloco_goodput_ratio 0.75\n"), std::string::npos);
  EXPECT_NE(text.find("ddiloco_units{state=\"lost\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE ddiloco_merges_total counter\n"), std::string::npos);
}

// A server on a free loopback port over a board with one published snapshot.
class StatusServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = server_.start("127.0.0.1:0");
    ASSERT_GT(port_, 0);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(5);
    c.set_read_timeout(5);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& secret) {
    httplib::Headers h;
    if (!secret.empty()) h.emplace("Authorization", "Bearer " + secret);
    return client().Post(path, h, "", "text/plain");
  }
  StatusBoard board_{2};
  StatusServer server_{board_, "s3cret-token", 2};
  int port_ = 0;
};

TEST_F(StatusServerTest, ServesThePageTheStateAndTheMetrics) {
  auto r = client().Get("/api/state");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);  // nothing published yet
  board_.publish(snapshot(board_, 2));
  r = client().Get("/api/state");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["progress"]["merges"], 7);
  r = client().Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  r = client().Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("id=\"loss-chart\""), std::string::npos);
  EXPECT_NE(r->get_header_value("Content-Security-Policy").find("default-src 'none'"), std::string::npos);
  r = client().Get("/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

TEST_F(StatusServerTest, ActionsWithoutTheSecretAreRefusedAndQueueNothing) {
  board_.publish(snapshot(board_, 2));
  for (const std::string secret : {"", "s3cret-tokeN", "s3cret-token x", "s3cret", "x"}) {
    for (const char* path : {"/api/action/kill?unit=1", "/api/action/checkpoint", "/api/action/stop"}) {
      auto r = post(path, secret);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 401) << path << " with '" << secret << "'";
    }
  }
  auto r = client().Post("/api/action/stop", {{"Authorization", "s3cret-token"}}, "", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);  // not the Bearer scheme
  r = client().Get("/api/action/stop");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_TRUE(server_.take_actions().empty());
}

TEST_F(StatusServerTest, ActionsWithTheSecretAreQueuedForTheMergeLoop) {
  board_.publish(snapshot(board_, 2));
  for (const char* bad : {"/api/action/kill", "/api/action/kill?unit=2", "/api/action/kill?unit=-1",
                          "/api/action/kill?unit=1x", "/api/action/kill?unit=99999999999"}) {
    auto r = post(bad, "s3cret-token");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad;
  }
  auto r = post("/api/action/reboot", "s3cret-token");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(server_.take_actions().empty());
  r = post("/api/action/kill?unit=1", "s3cret-token");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 202);
  EXPECT_EQ(json::parse(r->body), json({{"accepted", true}, {"action", "kill"}, {"unit", 1}}));
  // The scheme's name in any case (RFC 7235).
  r = client().Post("/api/action/checkpoint", {{"Authorization", "bearer s3cret-token"}}, "", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 202);
  const auto actions = server_.take_actions();
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, StatusServer::ActionKind::kill);
  EXPECT_EQ(actions[0].unit, 1);
  EXPECT_EQ(actions[0].peer, "127.0.0.1");
  EXPECT_EQ(actions[1].kind, StatusServer::ActionKind::checkpoint);
  EXPECT_TRUE(server_.take_actions().empty());
}

TEST_F(StatusServerTest, ARequestWithABodyIsRefused) {
  board_.publish(snapshot(board_, 2));
  auto r = client().Post("/api/action/stop", {{"Authorization", "Bearer s3cret-token"}}, "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(server_.take_actions().empty());
  r = client().Get("/api/state");  // and the server goes on
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(StatusServerTest, ActionsThisRunCannotDoAreAConflict) {
  auto s = snapshot(board_, 2);
  s->actions = {.kill = false, .checkpoint = false, .stop = true};
  board_.publish(s);
  for (const char* path : {"/api/action/kill?unit=0", "/api/action/checkpoint"}) {
    auto r = post(path, "s3cret-token");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 409) << path;
  }
  EXPECT_TRUE(server_.take_actions().empty());
}

TEST(StatusServer, NeedsASecretAndAnAddress) {
  StatusBoard board(1);
  EXPECT_THROW(StatusServer(board, "", 1), Error);
  StatusServer server(board, "x", 1);
  try {
    server.start("localhost:80");
    FAIL() << "a host name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("syncer.http"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddiloco::syncer

namespace ddiloco {
namespace {

TEST(HttpAddressFile, RoundTripsAndNamesTheFileWhenMalformed) {
  test::TempDir dir;
  EXPECT_FALSE(HttpAddress::read(dir.path()));
  HttpAddress a{.address = "127.0.0.1:8080", .pid = 77, .host = "node1"};
  a.write(dir.path());
  const auto b = HttpAddress::read(dir.path());
  ASSERT_TRUE(b);
  EXPECT_EQ(b->address, a.address);
  EXPECT_EQ(b->pid, 77);
  EXPECT_EQ(b->url(), "http://127.0.0.1:8080/");
  for (const std::string bad : {"", "[]", R"({"pid": 1})", R"({"address": "nohost", "pid": 1})",
                                R"({"address": "127.0.0.1:1", "pid": "1"})"}) {
    test::write_bytes(HttpAddress::file(dir.path()), bad);
    try {
      HttpAddress::read(dir.path());
      FAIL() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("syncer.http"), std::string::npos) << e.what();
    }
  }
}

TEST(KillRequests, AreTakenOnceAndMalformedOnesRefused) {
  test::TempDir dir;
  EXPECT_TRUE(take_kill_requests(dir.path(), 2).empty());  // no directory yet
  launch_request_kill(dir.path(), 1, 1);
  struct stat st{};
  ASSERT_EQ(::stat((dir.path() / "requests").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::vector<std::filesystem::path> written;  // kill-<our pid>-000001.json
  for (const auto& e : std::filesystem::directory_iterator(dir.path() / "requests")) written.push_back(e.path());
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].filename(), fmt::format("kill-{:010d}-000001.json", ::getpid()));
  // Planted after it in name order (no pid has 11 digits).
  const auto planted = [&](int n) { return dir.path() / "requests" / fmt::format("kill-99999999999-{:06d}.json", n); };
  test::write_bytes(planted(2), R"({"unit": 2})");
  test::write_bytes(planted(3), "not json");
  test::write_bytes(planted(4), R"({"unit": 0.5})");
  std::filesystem::create_symlink(written[0], planted(5));
  test::write_bytes(planted(6).string() + ".tmp", R"({"unit": 0})");  // being written
  const auto got = take_kill_requests(dir.path(), 2);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].unit, 1);
  EXPECT_EQ(got[0].error, "");
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_EQ(got[i].unit, -1) << got[i].file;
    EXPECT_NE(got[i].error.find(got[i].file), std::string::npos) << got[i].error;
  }
  EXPECT_NE(got[1].error.find("0..1"), std::string::npos) << got[1].error;
  // Taken once: only the file still being written is left.
  EXPECT_TRUE(take_kill_requests(dir.path(), 2).empty());
  EXPECT_TRUE(std::filesystem::exists(planted(6).string() + ".tmp"));
}

TEST(StatusTable, ShowsAStateAndSurvivesAHostileOne) {
  const nlohmann::json state = {
      {"schema", "ddiloco.status/1"}, {"elapsed_s", 3.5},
      {"run", {{"dir", "runs/x"}, {"mode", "decoupled"}, {"units", 1}, {"token_budget", 1000}, {"pid", 4242}}},
      {"progress", {{"tokens", 500}, {"merges", 9}, {"merge_rate_per_s", 1.5}}},
      {"units", {{{"unit", 0}, {"state", "training"}, {"pid", 12}, {"host", "node1"}, {"steps", 40},
                  {"bytes_up", 2048}}}},
      {"events", {{{"event", "unit_lost"}, {"unit", 0}, {"elapsed_s", 1.0}, {"reason", "reset"}}}}};
  const std::string table = cli::format_status(state);
  EXPECT_NE(table.find("runs/x · syncer 4242 · mode decoupled"), std::string::npos) << table;
  EXPECT_NE(table.find("12@node1"), std::string::npos) << table;
  EXPECT_NE(table.find("training"), std::string::npos) << table;
  EXPECT_NE(table.find("2.0 KiB"), std::string::npos) << table;
  EXPECT_NE(table.find("unit_lost"), std::string::npos) << table;
  // Wrong types, missing objects and terminal escapes from a peer: shown as "-" or made printable.
  for (const std::string hostile :
       {R"([])", R"("x")", R"({"units": 5})", R"({"units": [1, null, "x", {"unit": "0", "state": 7}]})",
        R"({"run": [], "progress": "x", "goodput": 1, "events": {"a": 1}})",
        R"({"events": [1, {"event": {"x": 1}, "elapsed_s": "now"}]})"}) {
    EXPECT_NO_THROW(cli::format_status(nlohmann::json::parse(hostile))) << hostile;
  }
  nlohmann::json evil = state;
  evil["units"][0]["host"] = "node\x1b]0;pwned\x07";
  evil["events"][0]["reason"] = "\x1b[2J";
  const std::string shown = cli::format_status(evil);
  EXPECT_EQ(shown.find('\x1b'), std::string::npos);
  EXPECT_EQ(shown.find('\x07'), std::string::npos);
}

}  // namespace
}  // namespace ddiloco
