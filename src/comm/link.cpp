// The link's modes and the factories that pick a transport for each (link.hpp).
#include "ddiloco/link.hpp"

#include "comm/stream_link.hpp"
#include "comm/ucx_common.hpp"
#include "ddiloco/ucx_link.hpp"

namespace ddiloco::comm {

const char* link_mode_name(LinkMode mode) {
  switch (mode) {
    case LinkMode::trusted: return "trusted";
    case LinkMode::authenticated: return "authenticated";
    case LinkMode::encrypted: return "encrypted";
  }
  return "?";
}

LinkMode resolve_link_mode(const std::string& security, const std::string& listen) {
  if (security == "trusted") return LinkMode::trusted;
  if (security == "authenticated") return LinkMode::authenticated;
  if (security == "encrypted") return LinkMode::encrypted;
  if (security != "auto")
    fail("wan.security: expected auto | trusted | authenticated | encrypted, got '{}'", security);
  // Whether listen names loopback: a host name resolves as the syncer will bind it.
  const auto colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  const sockaddr_storage a = ucx::resolve(host, 0, true);
  return ucx::is_loopback(a) ? LinkMode::authenticated : LinkMode::encrypted;
}

std::unique_ptr<SyncerEnd> listen_for_units(LinkMode mode, const std::string& secret,
                                            const std::string& bind_ip, int port, int units) {
  if (mode == LinkMode::trusted) return std::make_unique<UcxSyncerLink>(bind_ip, port, units);
  return make_stream_syncer_link(mode == LinkMode::encrypted, secret, bind_ip, port, units);
}

std::unique_ptr<UnitEnd> expose_to_syncer(LinkMode mode, size_t bytes) {
  if (mode == LinkMode::trusted) return std::make_unique<UcxUnitLink>(bytes);
  return make_stream_unit_link(mode == LinkMode::encrypted, bytes);
}

}  // namespace ddiloco::comm
