// The syncer's admission of a unit whose hello passed (syncer::admit_or_refuse): when the link
// cannot take it (UCX: a malformed remote key; the secure link: out of threads or descriptors),
// that unit is refused and the syncer goes on; nothing escapes. Issue 34: "a malformed rkey
// makes admit() throw, uncaught in syncer.cpp".
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ddiloco/error.hpp"
#include "syncer/syncer.hpp"

namespace ddiloco::syncer {
namespace {

// A link whose admit() and refuse() do what the test says, recording the calls.
class ScriptedDoor final : public comm::UnitListener {
 public:
  bool admit_throws = false, refuse_throws = false;
  std::vector<int> admitted;
  std::vector<std::pair<int64_t, std::string>> refusals;

  std::string address() const override { return "127.0.0.1:1"; }
  std::vector<Pending> accept_pending() override { return {}; }
  void admit(int64_t, int unit) override {
    if (admit_throws) fail("UCX: ucp_ep_rkey_unpack failed: Invalid parameter (a malformed remote key)");
    admitted.push_back(unit);
  }
  void refuse(int64_t id, const std::string& reason) override {
    if (refuse_throws) fail("connection {} is gone", id);
    refusals.emplace_back(id, reason);
  }
  std::vector<Lost> take_lost() override { return {}; }
  void disconnect(int) override {}
};

TEST(SyncerAdmission, AUnitTheLinkCannotAdmitIsRefusedAndNothingEscapes) {
  ScriptedDoor door;
  EXPECT_EQ(admit_or_refuse(door, 7, 2), "");
  EXPECT_EQ(door.admitted, std::vector<int>{2});

  door.admit_throws = true;
  std::string why;
  EXPECT_NO_THROW(why = admit_or_refuse(door, 8, 3));
  EXPECT_NE(why.find("malformed remote key"), std::string::npos) << why;
  ASSERT_EQ(door.refusals.size(), 1u);
  EXPECT_EQ(door.refusals[0].first, 8);
  EXPECT_EQ(door.refusals[0].second, why);  // the unit is told why
  EXPECT_EQ(door.admitted, std::vector<int>{2});

  // The link dropped the connection itself: its refusal fails too, and that is no error.
  door.refuse_throws = true;
  EXPECT_NO_THROW(why = admit_or_refuse(door, 9, 4));
  EXPECT_NE(why.find("malformed remote key"), std::string::npos) << why;
}

}  // namespace
}  // namespace ddiloco::syncer
