// The work order of the fused (single-launch, persistent) prepass: CTAs take items by ticket in
// this order, which keeps pass 2 of a group of kv heads right behind pass 1 of the same group (so
// its second reads of K and V find them in L2) and never lets an item wait for a later one:
//
//   S(0), S(1), Q(0), S(2), Q(1), ..., S(ng-1), Q(ng-2), Q(ng-1)
//
// S(g) = the stats items of group g (kv heads [g G, g G + n_g), n_g = min(G, pairs - g G); nch per
// kv head, head-major); Q(g) = its quantization items (qper per kv head: its KV tiles, then the Q
// tiles of the query heads reading it). A Q item of group g depends only on S(g), which comes
// earlier; S(g+1) sits between them so that a CTA reaching Q(g) rarely finds S(g) unfinished.
// Plain C++ (host and device), so the CPU tests check the order.
#pragma once

#include <cstdint>

#include "cuda/fast_div.h"
#include "quant/quant_rule.h"

namespace sparge::cuda::quant {

struct Schedule {
  std::int64_t pairs;  // kv heads (b, hk) in all
  std::int64_t group;  // kv heads per group (G >= 1)
  std::int64_t nch;    // stats items per kv head
  std::int64_t qper;   // quantization items per kv head

  SPARGE_QUANT_HD std::int64_t groups() const { return (pairs + group - 1) / group; }
  SPARGE_QUANT_HD std::int64_t heads_in(std::int64_t g) const {
    return pairs - g * group < group ? pairs - g * group : group;
  }
  SPARGE_QUANT_HD std::int64_t total() const { return pairs * (nch + qper); }
};

struct Item {
  bool stats;          // a stats item (else a quantization item)
  std::int64_t pair;   // kv head b * Hk + hk
  std::int64_t index;  // stats: the chunk; quantization: the item within the kv head
};

SPARGE_QUANT_HD Item stats_item(const Schedule& s, std::int64_t g, std::int64_t r) {
  return {true, g * s.group + r / s.nch, r % s.nch};
}
SPARGE_QUANT_HD Item quant_item(const Schedule& s, std::int64_t g, std::int64_t r) {
  return {false, g * s.group + r / s.qper, r % s.qper};
}

// The item of ticket t (0 <= t < total()).
SPARGE_QUANT_HD Item decode(const Schedule& s, std::int64_t t) {
  const std::int64_t ng = s.groups();
  const std::int64_t s0 = s.heads_in(0) * s.nch;
  if (t < s0) return stats_item(s, 0, t);
  std::int64_t u = t - s0;
  // Blocks g = 0..ng-1, each [S(g+1) if g + 1 < ng] then Q(g). While g + 1 < ng - 1 both parts
  // are whole groups, so those blocks have one length and are found by a division.
  const std::int64_t nfull = ng >= 2 ? ng - 2 : 0;
  const std::int64_t sl = s.group * s.nch, ql = s.group * s.qper, len = sl + ql;
  if (u < nfull * len) {
    const std::int64_t g = u / len, r = u % len;
    return r < sl ? stats_item(s, g + 1, r) : quant_item(s, g, r - sl);
  }
  u -= nfull * len;
  for (std::int64_t g = nfull; g < ng; ++g) {
    const std::int64_t sn = g + 1 < ng ? s.heads_in(g + 1) * s.nch : 0;
    if (u < sn) return stats_item(s, g + 1, u);
    u -= sn;
    const std::int64_t qn = s.heads_in(g) * s.qper;
    if (u < qn) return quant_item(s, g, u);
    u -= qn;
  }
  return {true, -1, -1};  // t out of range
}

// ---- 32-bit decoding (the stream variant: every thread decodes its CTA's tickets) ------------------
// The 32-bit divisions: cuda/fast_div.h (shared with the block map's selection).
using ::sparge::cuda::FastDiv;

// decode() in 32-bit arithmetic, for schedules whose total() is below 2^31 (fits32).
struct Schedule32 {
  std::uint32_t pairs, group, nch, qper, ng, s0, nfull, sl, len;
  FastDiv div_nch, div_qper, div_len;

  static bool fits32(const Schedule& s) { return s.total() < (std::int64_t{1} << 31); }
  explicit Schedule32(const Schedule& s)
      : pairs(static_cast<std::uint32_t>(s.pairs)), group(static_cast<std::uint32_t>(s.group)),
        nch(static_cast<std::uint32_t>(s.nch)), qper(static_cast<std::uint32_t>(s.qper)),
        ng(static_cast<std::uint32_t>(s.groups())), s0(static_cast<std::uint32_t>(s.heads_in(0) * s.nch)),
        nfull(static_cast<std::uint32_t>(s.groups() >= 2 ? s.groups() - 2 : 0)),
        sl(static_cast<std::uint32_t>(s.group * s.nch)), len(static_cast<std::uint32_t>(s.group * (s.nch + s.qper))),
        div_nch(static_cast<std::uint32_t>(s.nch)), div_qper(static_cast<std::uint32_t>(s.qper)),
        div_len(static_cast<std::uint32_t>(s.group * (s.nch + s.qper))) {}

  SPARGE_QUANT_HD std::uint32_t heads_in(std::uint32_t g) const {
    return pairs - g * group < group ? pairs - g * group : group;
  }
  SPARGE_QUANT_HD Item stats(std::uint32_t g, std::uint32_t r) const {
    const std::uint32_t q = div_nch.div(r);
    return {true, static_cast<std::int64_t>(g * group + q), static_cast<std::int64_t>(r - q * nch)};
  }
  SPARGE_QUANT_HD Item quant(std::uint32_t g, std::uint32_t r) const {
    const std::uint32_t q = div_qper.div(r);
    return {false, static_cast<std::int64_t>(g * group + q), static_cast<std::int64_t>(r - q * qper)};
  }
  // The item of ticket t (0 <= t < total): the same as decode(schedule, t).
  SPARGE_QUANT_HD Item decode(std::uint32_t t) const {
    if (t < s0) return stats(0, t);
    std::uint32_t u = t - s0;
    if (u < nfull * len) {
      const std::uint32_t g = div_len.div(u), r = u - g * len;
      return r < sl ? stats(g + 1, r) : quant(g, r - sl);
    }
    u -= nfull * len;
    for (std::uint32_t g = nfull; g < ng; ++g) {
      const std::uint32_t sn = g + 1 < ng ? heads_in(g + 1) * nch : 0;
      if (u < sn) return stats(g + 1, u);
      u -= sn;
      const std::uint32_t qn = heads_in(g) * qper;
      if (u < qn) return quant(g, u);
      u -= qn;
    }
    return {true, -1, -1};
  }
};

}  // namespace sparge::cuda::quant
