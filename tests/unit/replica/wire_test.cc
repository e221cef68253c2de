// Tests for replica/wire: chains and load messages round-trip; every truncation, a wrong magic,
// version or kind, and counts larger than the message are errors, never a crash or a record.
#include "replica/wire.h"

#include <gtest/gtest.h>

#include "workers/worker.h"

namespace kvgate::replica {
namespace {

std::vector<ChainRecord> sample_records() {
  return {
      ChainRecord{.rule = "default",
                  .worker = worker_key("http://10.0.0.1:30000"),
                  .rank = -1,
                  .origin_us = 1796442854123,
                  .chunk_bytes = 64,
                  .hashes = {1, 2, 0xffffffffffffffffULL}},
      ChainRecord{.rule = "chat.v2",
                  .worker = 42,
                  .rank = 3,
                  .origin_us = 7,
                  .retract = true,
                  .chunk_bytes = 64,
                  .hashes = {}},
      ChainRecord{.rule = "default",
                  .worker = 43,
                  .rank = 0,
                  .origin_us = 8,
                  .predict = true,
                  .chunk_bytes = 0,
                  .hashes = {9, 10}},
  };
}

TEST(ReplicaWire, ChainsRoundTrip) {
  const Header h{.kind = Kind::kChains, .replica = 0x1234, .sent_us = 99};
  std::string msg;
  encode_chains(h, sample_records(), msg);
  Header got;
  ASSERT_EQ(decode_header(msg, got), "");
  EXPECT_EQ(got.kind, Kind::kChains);
  EXPECT_EQ(got.replica, 0x1234u);
  EXPECT_EQ(got.sent_us, 99);
  std::vector<ChainRecord> out;
  ASSERT_EQ(decode_chains(msg, out), "");
  EXPECT_EQ(out, sample_records());
  // The size each record costs is what the encoder wrote (the rule table apart).
  size_t records = 0;
  for (const auto& r : sample_records()) records += chain_record_bytes(r);
  EXPECT_EQ(msg.size(), kHeaderBytes + 2 + (1 + 7) + (1 + 7) + 2 + records);
}

TEST(ReplicaWire, A4KbPromptCostsUnder1Kb) {
  // 4096 bytes in 64-byte chunks: 64 hashes of 8 bytes, plus the record's fixed fields.
  ChainRecord r{
      .rule = "default", .worker = 1, .chunk_bytes = 64, .hashes = std::vector<uint64_t>(64, 5)};
  std::string msg;
  encode_chains(Header{}, std::span<const ChainRecord>(&r, 1), msg);
  EXPECT_LT(msg.size(), 1024u);
}

TEST(ReplicaWire, LoadRoundTrip) {
  LoadReport report{.seq = 17,
                    .entries = {{.worker = 1, .rank = -1, .inflight = 5, .prefill_tokens = 0},
                                {.worker = 1, .rank = 2, .inflight = 3, .prefill_tokens = 4096}}};
  std::string msg;
  encode_load(Header{.kind = Kind::kLoad, .replica = 5, .sent_us = 6}, report, msg);
  LoadReport out;
  ASSERT_EQ(decode_load(msg, out), "");
  EXPECT_EQ(out, report);
  // Out-of-range values are clamped on the way out, not wrapped.
  LoadReport odd{.seq = 1,
                 .entries = {{.worker = 2, .rank = -5, .inflight = -3, .prefill_tokens = -1}}};
  msg.clear();
  encode_load(Header{}, odd, msg);
  ASSERT_EQ(decode_load(msg, out), "");
  EXPECT_EQ(out.entries[0].rank, -1);
  EXPECT_EQ(out.entries[0].inflight, 0);
  EXPECT_EQ(out.entries[0].prefill_tokens, 0);
}

TEST(ReplicaWire, EveryTruncationIsAnError) {
  std::string chains, load;
  encode_chains(Header{}, sample_records(), chains);
  encode_load(Header{}, LoadReport{.seq = 1, .entries = {{.worker = 1, .inflight = 2}}}, load);
  std::vector<ChainRecord> records;
  LoadReport report;
  for (size_t n = 0; n < chains.size(); ++n) {
    EXPECT_NE(decode_chains(chains.substr(0, n), records), "") << n;
    EXPECT_TRUE(records.empty()) << n;
  }
  for (size_t n = 0; n < load.size(); ++n)
    EXPECT_NE(decode_load(load.substr(0, n), report), "") << n;
  // Bytes past the end are refused too (a message is one batch, whole).
  EXPECT_NE(decode_chains(chains + "x", records), "");
  EXPECT_NE(decode_load(load + "x", report), "");
}

TEST(ReplicaWire, RefusesOtherMagicVersionAndKind) {
  std::string msg;
  encode_chains(Header{}, sample_records(), msg);
  Header h;
  std::string bad = msg;
  bad[0] = 'X';
  EXPECT_NE(decode_header(bad, h).find("magic"), std::string::npos);
  bad = msg;
  bad[4] = 2;
  EXPECT_NE(decode_header(bad, h).find("version 2"), std::string::npos);
  bad = msg;
  bad[5] = 9;
  EXPECT_NE(decode_header(bad, h).find("unknown kind"), std::string::npos);
  // A chains message is not a load report.
  LoadReport report;
  EXPECT_NE(decode_load(msg, report), "");
}

TEST(ReplicaWire, CountsLargerThanTheMessageAreRefusedBeforeAllocating) {
  std::string msg;
  encode_chains(Header{}, {}, msg);  // no rules, no records
  std::vector<ChainRecord> out;
  ASSERT_EQ(decode_chains(msg, out), "");
  // Claim 4096 records in a message that holds none.
  msg[kHeaderBytes + 2] = 0x00;
  msg[kHeaderBytes + 3] = 0x10;
  EXPECT_NE(decode_chains(msg, out), "");
  // A load report claiming 65536 entries.
  std::string load;
  encode_load(Header{}, LoadReport{}, load);
  load[kHeaderBytes + 8 + 2] = 0x01;
  LoadReport report;
  EXPECT_NE(decode_load(load, report), "");
}

TEST(ReplicaWire, WorkerKeyIsTheUrlsHash) {
  EXPECT_EQ(worker_key("http://a:1"), worker_key("http://a:1"));
  // A worker's own key (made once) is the same: replicas name it alike whichever computes it.
  http::Target t;
  ASSERT_EQ(http::parse_url("http://10.0.0.1:30000", t), "");
  Worker w(1, t, BreakerConfig{});
  EXPECT_EQ(w.url_key(), worker_key(w.url()));
  EXPECT_NE(worker_key("http://a:1"), worker_key("http://a:2"));
}

}  // namespace
}  // namespace kvgate::replica
