// Two ends of a TCP connection on 127.0.0.1 for the tests of secure_stream.hpp and
// link_auth.hpp, and the clock helpers they share.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddiloco/error.hpp"
#include "ddiloco/secure_stream.hpp"

// EXPECT_THROW(statement, ddiloco::Error) that also checks that what() contains `text`.
#define EXPECT_ERROR_WITH(statement, text)                                      \
  try {                                                                         \
    statement;                                                                  \
    ADD_FAILURE() << "no Error thrown";                                         \
  } catch (const ddiloco::Error& e) {                                           \
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what(); \
  }

namespace stream_test {

using Clock = std::chrono::steady_clock;
using ddiloco::comm::Deadline;
using ddiloco::comm::Stream;

inline Deadline in(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}
inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The next connection to `listener`, waiting up to 2 s for it (nullptr if none came).
inline std::unique_ptr<Stream> accept_one(ddiloco::comm::TcpListener& listener) {
  pollfd p{listener.fd(), POLLIN, 0};
  if (::poll(&p, 1, 2000) != 1) return nullptr;
  return listener.accept();
}

struct Pair {
  std::unique_ptr<Stream> client;  // tcp_connect's end
  std::unique_ptr<Stream> server;  // the listener's
};

inline Pair tcp_pair(ddiloco::comm::TcpListener& listener) {
  Pair p;
  p.client = ddiloco::comm::tcp_connect(listener.address(), in(2));
  p.server = accept_one(listener);
  EXPECT_NE(p.server, nullptr) << "no connection to accept";
  return p;
}

}  // namespace stream_test
