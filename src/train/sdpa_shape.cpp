// Shapes and in-place views of cuDNN's fused attention graphs (include/ddiloco/sdpa_shape.hpp).
#include "ddiloco/sdpa_shape.hpp"

#include <cmath>

#include "ddiloco/error.hpp"

namespace ddiloco::gpu {

namespace {

using Dims = std::array<int64_t, 4>;

SdpaTensor view(Dims dims, Dims strides, int64_t offset = 0) {
  SdpaTensor t;
  t.dims = dims;
  t.strides = strides;
  t.offset = offset;
  return t;
}

// The same memory with the last two axes swapped.
SdpaTensor transposed(SdpaTensor t) {
  std::swap(t.dims[2], t.dims[3]);
  std::swap(t.strides[2], t.strides[3]);
  return t;
}

// cudnnGetVersion()'s number: major·10000 + minor·100 + patch from cuDNN 9 on, major·1000 +
// minor·100 + patch before.
std::string version_name(long v) {
  if (v < kCudnnMinVersion) return fmt::format("{}.{}.{}", v / 1000, v / 100 % 10, v % 100);
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

std::string unsupported_inputs(const SdpaLayout& l, SdpaDtype dtype, long cudnn_version) {
  if (dtype == SdpaDtype::float32)
    return "cuDNN's fused SDPA takes fp16 or bf16 inputs, got fp32";
  if (cudnn_version < kCudnnMinVersion)
    return fmt::format("needs cuDNN 9 or newer (the backend's SDPA graphs), found {}",
                       version_name(cudnn_version));
  if (cudnn_version == 91000 || cudnn_version == 91001)
    return fmt::format("cuDNN {} has known SDPA bugs; use 9.10.2 or newer",
                       version_name(cudnn_version));
  if (l.hs % 8 != 0)
    return fmt::format("head size n_embd/n_head must be a multiple of 8, got {}", l.hs);
  if (l.hs > 128) return fmt::format("head size n_embd/n_head must be ≤ 128, got {}", l.hs);
  return "";
}

std::string unsupported_backward(const SdpaLayout& l, long cudnn_version) {
  if (l.T < 2) return "the backward pass needs seq_len ≥ 2 (cuDNN refuses s_q = s_kv = 1)";
  if (cudnn_version <= 91500 && l.T % 128 != 0)
    return fmt::format("cuDNN {}'s backward needs seq_len a multiple of 128 (9.15.1 and newer "
                       "do not), got {}",
                       version_name(cudnn_version), l.T);
  return "";
}

}  // namespace

SdpaLayout sdpa_layout(int B, int T, int C, int NH) {
  if (B < 1 || T < 1 || C < 1 || NH < 1 || C % NH != 0)
    fail("cuDNN attention: need B, T, C, NH ≥ 1 and NH dividing C, got B={} T={} C={} NH={}", B,
         T, C, NH);
  SdpaLayout l;
  l.B = B, l.T = T, l.C = C, l.NH = NH, l.hs = C / NH;
  l.scale = 1.0f / std::sqrt(static_cast<float>(l.hs));
  const int64_t b = B, t = T, c = C, nh = NH, hs = l.hs;
  // (b,h,t,d) of Q is qkv[b][t][h·hs + d]: rows of 3C, heads hs apart.
  const Dims in_qkv{t * 3 * c, hs, 3 * c, 1}, in_out{t * c, hs, c, 1};
  const Dims bhtd{b, nh, t, hs};
  l.q = view(bhtd, in_qkv, 0);
  l.k = view(bhtd, in_qkv, c);
  l.v = view(bhtd, in_qkv, 2 * c);
  l.k_t = transposed(l.k);
  l.v_t = transposed(l.v);
  l.o = view(bhtd, in_out);
  l.stats = view({b, nh, t, 1}, {nh * t, t, 1, 1});
  l.rows = l.stats;
  l.scores = view({b, nh, t, t}, {nh * t * t, t * t, t, 1});
  l.scores_t = transposed(l.scores);
  l.do_o = view(bhtd, {nh * t * hs, t * hs, nh * hs, 1});
  l.softmax_sum_bytes = b * nh * t * static_cast<int64_t>(sizeof(float));
  l.engine_workspace_offset = (l.softmax_sum_bytes + 255) / 256 * 256;
  return l;
}

std::string sdpa_unsupported(const SdpaLayout& l, SdpaDtype dtype, bool backward,
                             long cudnn_version) {
  std::string why = unsupported_inputs(l, dtype, cudnn_version);
  if (why.empty() && backward) why = unsupported_backward(l, cudnn_version);
  return why;
}

void check_sdpa(const SdpaLayout& l, SdpaDtype dtype, bool backward, long cudnn_version) {
  const std::string why = sdpa_unsupported(l, dtype, backward, cudnn_version);
  if (!why.empty())
    fail("cuDNN attention (B={}, T={}, C={}, NH={}): {}", l.B, l.T, l.C, l.NH, why);
}

}  // namespace ddiloco::gpu
