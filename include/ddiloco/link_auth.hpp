// Mutual authentication of a unit and the syncer without sending the run's secret: a
// challenge–response with HMAC-SHA256 (OpenSSL), bound to the stream's TLS session when there is
// one. What the exchange proves, and what it does not, is docs/security.md.
//
// The exchange (all integers little-endian, on a Stream; u32 = 4 bytes, u8 = 1 byte):
//   syncer → unit   challenge: magic "ddLa", version (u32, 1), mode (u8), 32-byte fresh nonce
//                              N_s (41 bytes)
//   unit → syncer   answer:    magic "ddLa", version (u32), 32-byte fresh nonce N_u, payload
//                              length (u32), payload (the unit's hello),
//                              MAC_u = HMAC(K, "unit" ‖ transcript)
//   syncer → unit   verdict:   status (u8: 0 admitted, 1 refused, 2 not authenticated), reason
//                              length (u32, at most 4096), reason text, then
//                              MAC_s = HMAC(K, "syncer" ‖ transcript ‖ status ‖ reason length ‖
//                              reason), except after "not authenticated" (no MAC, no reason)
// transcript = challenge ‖ N_u ‖ SHA-256(payload) ‖ binding length (u8) ‖ channel binding.
// K = HKDF-SHA256(secret, "ddiloco link auth v1"). A replayed answer fails (N_s is new for every
// connection), and so does an answer made on another TLS session (the channel binding differs);
// the unit believes a verdict only with a valid MAC_s (only a holder of the secret can make
// one); MACs are compared in constant time (CRYPTO_memcmp). Each side checks the magic,
// version, mode and lengths it reads before it allocates anything for them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddiloco/error.hpp"
#include "ddiloco/secure_stream.hpp"

namespace ddiloco::comm::auth {

using Key = std::array<std::byte, 32>;
using Mac = std::array<std::byte, 32>;

/// HKDF-SHA256 (RFC 5869) of the run's secret with `label` as info and no salt: 32 bytes.
/// Throws Error if the secret is empty or OpenSSL fails.
Key derive_key(std::string_view secret, std::string_view label);
/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
Mac hmac(const Key& key, std::span<const std::byte> message);
/// Constant-time equality (CRYPTO_memcmp) of two MACs.
bool same(const Mac& a, const Mac& b);

/// The key of the handshake's MACs: derive_key(secret, "ddiloco link auth v1").
Key link_key(std::string_view secret);
/// The TLS pre-shared key: derive_key(secret, "ddiloco tls psk v1").
Key tls_psk(std::string_view secret);

/// Thrown on the syncer's side when an answer does not prove the secret (wrong secret,
/// replayed, garbage, too large): what() is one line naming the peer and the reason.
class NotAuthenticated : public Error {
 public:
  using Error::Error;
};

/// What the syncer keeps of one connection's handshake between its answer and its verdict.
struct Answer {
  std::string payload;                    ///< the unit's hello, authenticated
  std::vector<std::byte> transcript;      ///< for the verdict's MAC
};

/// Syncer side, steps 1–2: sends a challenge (with `mode`, one byte the unit checks against its
/// own), reads and verifies the answer. The payload may be at most `max_payload` bytes (checked
/// before it is read). Throws NotAuthenticated when the MAC does not verify, the magic/version
/// are wrong or the payload is too large (then sends the unit a "not authenticated" verdict
/// without a MAC, best effort, for at most 0.5 s, before throwing); Error when the stream
/// fails or `deadline` passes.
Answer challenge(Stream& stream, const Key& key, uint8_t mode, size_t max_payload, Deadline deadline);

/// Syncer side, step 3: the verdict on an authenticated answer (the reason is sent only when
/// refused, cut at 4096 bytes).
void verdict(Stream& stream, const Key& key, const Answer& answer, bool admitted,
             const std::string& reason, Deadline deadline);

/// Unit side, the whole exchange. Returns when admitted with a verified MAC_s. Throws
/// LinkRefused (link.hpp) with the syncer's reason when refused with a verified MAC_s
/// ("auth link: the syncer at <peer> refused the connection: <reason>"); Error when the
/// syncer's MAC does not verify ("the syncer at <peer> did not prove it holds the run's
/// secret"), the syncer says the unit is not authenticated ("... wrong secret?"), the
/// challenge or verdict is malformed or the challenge of another mode, the stream fails, or
/// `deadline` passes.
void answer(Stream& stream, const Key& key, uint8_t mode, const std::string& payload, Deadline deadline);

}  // namespace ddiloco::comm::auth
