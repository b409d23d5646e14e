// Errors ddiloco reports to its user.
//
// Every failure a user can cause (a bad config key, a corrupt shard, a missing file, a command
// line that makes no sense) is thrown as ddiloco::Error with a one-line message that names the
// file, the field and the value that was expected. `main` prints it as
// "ddiloco: error: <message>" and exits with status 2. Inputs are validated before outputs
// are touched, and outputs are replaced atomically, so a failure leaves the previous files.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace ddiloco {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Throws Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace ddiloco
