// Fuzz target: the hello a unit job sends when it connects (protocol::Hello::from_json,
// include/ddiloco/membership.hpp), the first thing the syncer reads from an unauthenticated
// peer.
//
// Feeds: the input as JSON text, parsed with nlohmann::json::parse(..., nullptr, false) (text
// that is not JSON is dropped, as the link does before from_json), then Hello::from_json.
// Checks: no crash or sanitizer report; the only exception is ddiloco::Error; an accepted hello
// survives to_json → from_json unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "ddiloco/error.hpp"
#include "ddiloco/membership.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const auto hello = ddiloco::protocol::Hello::from_json(j, "fuzz hello");
    const nlohmann::json again = hello.to_json();
    if (ddiloco::protocol::Hello::from_json(again, "fuzz hello (again)").to_json() != again) {
      std::fprintf(stderr, "fuzz_hello: to_json/from_json does not round-trip\n");
      std::abort();
    }
  } catch (const ddiloco::Error&) {
  }
  return 0;
}
