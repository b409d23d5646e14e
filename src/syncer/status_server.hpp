// The syncer's HTTP endpoint (docs/status_page.md): the status page, /api/state, /metrics and
// the actions, served by CivetWeb on threads of its own at nice 10. Requests read the
// latest snapshot the merge loop published (status_board.hpp) and queue actions for the loop
// to carry out (take_actions): nothing here waits on, or holds, what the merge loop needs.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "syncer/status_board.hpp"

struct mg_connection;
struct mg_context;

namespace ddiloco::syncer {

struct HttpReply;  // status_server.cpp

class StatusServer {
 public:
  enum class ActionKind { kill, checkpoint, stop };
  /// An action a request with the run's secret asked for.
  struct Action {
    ActionKind kind = ActionKind::stop;
    int unit = -1;     ///< kill: the unit, 0..units−1
    std::string peer;  ///< the client's address, for the log
  };

  /// Serves `board`'s snapshots; actions need `secret` (non-empty). `units`: M, the range of
  /// a kill's unit.
  StatusServer(const StatusBoard& board, std::string secret, int units);
  ~StatusServer();  ///< stops serving and joins its threads (within about one request deadline, 2 s)
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  static constexpr size_t kMaxQueued = 64;  ///< actions waiting for the merge loop; more: 429
  /// Binds `address` ("a.b.c.d:port", port 0: any free one) and starts serving. Returns the
  /// port bound. Throws Error naming syncer.http for a malformed address or one that cannot
  /// be bound. Call once.
  int start(const std::string& address);
  /// The actions accepted since the last call, in order (the merge loop's side).
  std::vector<Action> take_actions();

 private:
  struct Rendered;
  int handle(mg_connection* c);
  HttpReply action(mg_connection* c, std::string_view what);
  std::shared_ptr<const Rendered> rendered();
  bool authorised(const char* header) const;

  const StatusBoard& board_;
  const std::string secret_;
  const int units_;
  mg_context* ctx_ = nullptr;
  std::mutex render_mutex_;  // HTTP threads only
  std::shared_ptr<const Rendered> rendered_;
  std::mutex actions_mutex_;  // held for a push or a swap
  std::vector<Action> actions_;
};

const char* action_name(StatusServer::ActionKind kind);  ///< "kill" | "checkpoint" | "stop"

}  // namespace ddiloco::syncer
