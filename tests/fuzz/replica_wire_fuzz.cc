// Fuzz target: what a peer replica (or anything publishing on the fleet's NATS subjects) sends
// (replica/wire.h): chains batches, load reports, inventory requests and reply parts. Checks:
// decoding never reads past the input nor throws; a decoded message encodes back to the same
// values (nothing is invented or dropped on the way); a failed decode yields nothing; every
// record's counts are within the wire's bounds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "replica/wire.h"

using namespace kvgate::replica;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view msg(reinterpret_cast<const char*>(data), size);
  Header h;
  const bool header_ok = decode_header(msg, h).empty();
  std::vector<ChainRecord> records;
  if (decode_chains(msg, records).empty()) {
    if (!header_ok || h.kind != Kind::kChains) __builtin_trap();
    if (records.size() > kMaxRecords) __builtin_trap();
    size_t rules = 0;
    std::vector<std::string_view> seen;
    for (const auto& r : records) {
      if (r.rule.empty() || r.rule.size() > kMaxRuleBytes || r.rank < -1) __builtin_trap();
      bool known = false;
      for (auto s : seen) known = known || s == r.rule;
      if (!known) seen.push_back(r.rule);
    }
    rules = seen.size();
    // Re-encoding gives the same records (the rule table may be laid out differently when the
    // input listed unused or repeated names, so compare decoded values, not bytes).
    std::string again;
    encode_chains(h, records, again);
    std::vector<ChainRecord> back;
    if (!decode_chains(again, back).empty() || back != records) __builtin_trap();
    (void)rules;
  } else if (!records.empty()) {
    __builtin_trap();
  }
  LoadReport report;
  if (decode_load(msg, report).empty()) {
    if (!header_ok || h.kind != Kind::kLoad) __builtin_trap();
    std::string again;
    encode_load(h, report, again);
    if (again != msg) __builtin_trap();
  } else if (!report.entries.empty() || report.seq != 0) {
    __builtin_trap();
  }
  InventoryRequest req;
  if (decode_inventory_request(msg, req).empty()) {
    if (!header_ok || h.kind != Kind::kInventoryRequest || req.rank < 0) __builtin_trap();
    std::string again;
    encode_inventory_request(h, req, again);
    if (again != msg) __builtin_trap();
  } else if (req.worker != 0 || !req.rule.empty()) {
    __builtin_trap();
  }
  InventoryPart part;
  if (decode_inventory_part(msg, part).empty()) {
    if (!header_ok || h.kind != Kind::kInventoryReply || part.part >= part.parts) __builtin_trap();
    if (!part.warm && (!part.data.links.empty() || !part.data.holdings.empty())) __builtin_trap();
    // One part's data, encoded again, decodes to the same data (in as many parts as it needs).
    auto parts = encode_inventory_reply(h, part.source, part.warm, part.seq, part.data);
    kvgate::kv::SourceExport joined;
    for (const auto& p : parts) {
      InventoryPart back;
      if (!decode_inventory_part(p, back).empty() || back.seq != part.seq) __builtin_trap();
      joined.links.insert(joined.links.end(), back.data.links.begin(), back.data.links.end());
      joined.holdings.insert(joined.holdings.end(), back.data.holdings.begin(),
                             back.data.holdings.end());
    }
    if (joined != part.data) __builtin_trap();
  } else if (!part.data.links.empty() || part.seq != 0) {
    __builtin_trap();
  }
  return 0;
}
