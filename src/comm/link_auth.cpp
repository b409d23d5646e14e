// The challenge–response of the secure link modes (link_auth.hpp): HKDF and HMAC from OpenSSL.
#include "ddiloco/link_auth.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "ddiloco/link.hpp"

namespace ddiloco::comm::auth {

namespace {

// ---------------------------------------------------------------- wire format
constexpr std::array<std::byte, 4> kMagic = {std::byte{'d'}, std::byte{'d'}, std::byte{'L'},
                                             std::byte{'a'}};
constexpr uint32_t kVersion = 1;
constexpr size_t kNonce = 32;
constexpr size_t kChallengeBytes = 4 + 4 + 1 + kNonce;   // magic, version, mode, N_s
constexpr size_t kAnswerHeadBytes = 4 + 4 + kNonce + 4;  // magic, version, N_u, payload length
constexpr size_t kVerdictHeadBytes = 1 + 4;              // status, reason length
constexpr size_t kMaxReason = 4096;
constexpr uint8_t kAdmitted = 0;
constexpr uint8_t kRefused = 1;
constexpr uint8_t kNotAuthenticated = 2;  // sent without a MAC (reject)
// A verdict the syncer sends to a unit it could not authenticate gets this long at most: the
// unit may be gone or not reading, and nothing waits on it.
constexpr auto kRejectWindow = std::chrono::milliseconds(500);

using Bytes = std::vector<std::byte>;

void put(Bytes& out, std::span<const std::byte> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}
void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<uint32_t>(p[i]) << (8 * i);
  return v;
}
std::span<const std::byte> bytes_of(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}
bool has_magic(const std::byte* p) { return std::equal(kMagic.begin(), kMagic.end(), p); }

std::array<std::byte, kNonce> fresh_nonce() {
  std::array<std::byte, kNonce> n;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
    fail("auth link: the random generator failed");
  return n;
}

std::array<std::byte, 32> sha256(std::span<const std::byte> data) {
  std::array<std::byte, 32> out;
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), reinterpret_cast<unsigned char*>(out.data()), &len,
                 EVP_sha256(), nullptr) != 1 ||
      len != out.size())
    fail("auth link: SHA-256 failed");
  return out;
}

// challenge ‖ N_u ‖ SHA-256(payload) ‖ len(binding) ‖ binding: what both MACs cover.
Bytes transcript(std::span<const std::byte> challenge, std::span<const std::byte> nonce_u,
                 std::string_view payload, const Bytes& binding) {
  Bytes t;
  put(t, challenge);
  put(t, nonce_u);
  put(t, sha256(bytes_of(payload)));
  t.push_back(static_cast<std::byte>(binding.size()));
  put(t, binding);
  return t;
}

Mac mac_of(const Key& key, std::string_view role, const Bytes& transcript,
           std::span<const std::byte> tail = {}) {
  Bytes m;
  put(m, bytes_of(role));
  put(m, transcript);
  put(m, tail);
  return hmac(key, m);
}

// status ‖ reason length ‖ reason
Bytes verdict_head(uint8_t status, std::string_view reason) {
  Bytes v{static_cast<std::byte>(status)};
  put_u32(v, static_cast<uint32_t>(reason.size()));
  put(v, bytes_of(reason));
  return v;
}

// Tells the unit, best effort, that it did not authenticate, then throws NotAuthenticated. No
// MAC: nothing of a bad answer is authenticated to bind one to, so the unit takes the status as
// a hint (an attacker on the path who sends it could as well have cut the connection).
[[noreturn]] void reject(Stream& stream, Deadline deadline, const std::string& why) {
  try {
    stream.write_all(verdict_head(kNotAuthenticated, ""),
                     std::min(deadline, std::chrono::steady_clock::now() + kRejectWindow));
  } catch (const Error&) {
  }
  throw NotAuthenticated(fmt::format("auth link: the unit at {} {}", stream.peer(), why));
}

}  // namespace

// ---------------------------------------------------------------- primitives
Key derive_key(std::string_view secret, std::string_view label) {
  if (secret.empty()) fail("auth link: the run's secret is empty");
  using KdfPtr = std::unique_ptr<EVP_KDF, decltype(&EVP_KDF_free)>;
  using CtxPtr = std::unique_ptr<EVP_KDF_CTX, decltype(&EVP_KDF_CTX_free)>;
  KdfPtr kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr), &EVP_KDF_free);
  CtxPtr ctx(kdf ? EVP_KDF_CTX_new(kdf.get()) : nullptr, &EVP_KDF_CTX_free);
  // No salt: RFC 5869 §2.2 then uses HashLen zero bytes. The OSSL_PARAM API wants non-const
  // pointers; it does not write through them.
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_KEY, const_cast<char*>(secret.data()), secret.size()),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_INFO, const_cast<char*>(label.data()), label.size()),
                         OSSL_PARAM_construct_end()};
  Key key;
  if (!ctx || EVP_KDF_derive(ctx.get(), reinterpret_cast<unsigned char*>(key.data()), key.size(),
                             params) != 1)
    fail("auth link: HKDF-SHA256 failed");
  return key;
}

Mac hmac(const Key& key, std::span<const std::byte> message) {
  Mac mac;
  unsigned int len = 0;
  // An empty message may come with a null pointer; HMAC wants a valid one.
  static const unsigned char none = 0;
  const auto* data =
      message.empty() ? &none : reinterpret_cast<const unsigned char*>(message.data());
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data, message.size(),
           reinterpret_cast<unsigned char*>(mac.data()), &len) == nullptr ||
      len != mac.size())
    fail("auth link: HMAC-SHA256 failed");
  return mac;
}

bool same(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Key link_key(std::string_view secret) { return derive_key(secret, "ddiloco link auth v1"); }
Key tls_psk(std::string_view secret) { return derive_key(secret, "ddiloco tls psk v1"); }

// ---------------------------------------------------------------- syncer side
Answer challenge(Stream& stream, const Key& key, uint8_t mode, size_t max_payload,
                 Deadline deadline) {
  Bytes ch;
  put(ch, kMagic);
  put_u32(ch, kVersion);
  ch.push_back(static_cast<std::byte>(mode));
  put(ch, fresh_nonce());  // new for every connection: an answer recorded elsewhere fails
  stream.write_all(ch, deadline);

  std::array<std::byte, kAnswerHeadBytes> head;
  stream.read_exact(head, deadline);
  if (!has_magic(head.data())) reject(stream, deadline, "sent no ddiloco link answer");
  if (const uint32_t v = get_u32(head.data() + 4); v != kVersion)
    reject(stream, deadline,
           fmt::format("speaks version {} of the link handshake, this syncer {}", v, kVersion));
  const std::span<const std::byte> nonce_u(head.data() + 8, kNonce);
  // Checked before anything is allocated: the length is the peer's, not yet authenticated.
  const uint32_t len = get_u32(head.data() + 8 + kNonce);
  if (len > max_payload)
    reject(
        stream, deadline,
        fmt::format("announced a hello of {} bytes, more than the {} allowed", len, max_payload));

  Answer got;
  got.payload.resize(len);
  stream.read_exact(std::as_writable_bytes(std::span(got.payload.data(), len)), deadline);
  Mac mac_u;
  stream.read_exact(mac_u, deadline);
  got.transcript = transcript(ch, nonce_u, got.payload, stream.channel_binding());
  if (!same(mac_u, mac_of(key, "unit", got.transcript)))
    reject(stream, deadline,
           "did not prove it holds the run's secret (wrong secret, or a replayed answer)");
  return got;
}

void verdict(Stream& stream, const Key& key, const Answer& answer, bool admitted,
             const std::string& reason, Deadline deadline) {
  const std::string_view text =
      admitted ? std::string_view() : std::string_view(reason).substr(0, kMaxReason);
  Bytes v = verdict_head(admitted ? kAdmitted : kRefused, text);
  const Mac mac_s = mac_of(key, "syncer", answer.transcript, v);
  put(v, mac_s);
  stream.write_all(v, deadline);
}

// ---------------------------------------------------------------- unit side
void answer(Stream& stream, const Key& key, uint8_t mode, const std::string& payload,
            Deadline deadline) {
  const std::string& peer = stream.peer();
  std::array<std::byte, kChallengeBytes> ch;
  stream.read_exact(ch, deadline);
  if (!has_magic(ch.data()))
    fail("auth link: the peer at {} is no ddiloco syncer (no challenge)", peer);
  if (const uint32_t v = get_u32(ch.data() + 4); v != kVersion)
    fail("auth link: the syncer at {} speaks version {} of the link handshake, this unit {}", peer,
         v, kVersion);
  if (const auto m = std::to_integer<uint8_t>(ch[8]); m != mode)
    fail("auth link: the syncer at {} runs the link in mode {}, this unit in mode {}", peer, m,
         mode);
  if (payload.size() > UINT32_MAX)
    fail("auth link: a hello of {} bytes is too large", payload.size());

  const auto nonce_u = fresh_nonce();
  const Bytes t = transcript(ch, nonce_u, payload, stream.channel_binding());
  Bytes out;
  put(out, kMagic);
  put_u32(out, kVersion);
  put(out, nonce_u);
  put_u32(out, static_cast<uint32_t>(payload.size()));
  put(out, bytes_of(payload));
  put(out, mac_of(key, "unit", t));
  stream.write_all(out, deadline);

  std::array<std::byte, kVerdictHeadBytes> head;
  stream.read_exact(head, deadline);
  const auto status = std::to_integer<uint8_t>(head[0]);
  const uint32_t len = get_u32(head.data() + 1);
  if (status == kNotAuthenticated)
    fail(
        "auth link: the syncer at {} did not accept this unit's proof of the run's secret (wrong "
        "secret?)",
        peer);
  if ((status != kAdmitted && status != kRefused) || len > kMaxReason)
    fail("auth link: the syncer at {} sent a malformed verdict (status {}, reason of {} bytes)",
         peer, status, len);
  Bytes rest(len + sizeof(Mac));
  stream.read_exact(rest, deadline);
  Mac mac_s;
  std::copy(rest.end() - sizeof(Mac), rest.end(), mac_s.begin());
  Bytes v(head.begin(), head.end());
  v.insert(v.end(), rest.begin(), rest.end() - sizeof(Mac));
  if (!same(mac_s, mac_of(key, "syncer", t, v)))
    fail("auth link: the syncer at {} did not prove it holds the run's secret", peer);
  if (status == kRefused) {
    std::string reason(reinterpret_cast<const char*>(rest.data()), len);
    const std::string message =
        fmt::format("auth link: the syncer at {} refused the connection: {}", peer, reason);
    throw LinkRefused(message, std::move(reason));
  }
}

}  // namespace ddiloco::comm::auth
