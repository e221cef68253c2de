// Tests for prefix/chunk_index: chains extend with the prompt, a worker's match is the deepest
// hash it holds, expiry and exact retraction, the same records in any order give the same index,
// and the bound.
#include "prefix/chunk_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

namespace kvgate::prefix {
namespace {

std::vector<uint64_t> chain(std::string_view text, std::string_view model = "m", size_t chunk = 8) {
  std::vector<uint64_t> out;
  chunk_chain(model, text, chunk, out);
  return out;
}

TEST(ChunkChain, ExtendsWithThePromptAndDependsOnTheModel) {
  const auto a = chain("0123456789abcdef");           // two full chunks
  const auto b = chain("0123456789abcdefXYZ");        // the same two, and a short one
  const auto c = chain("0123456789abcdefXYZ", "m2");  // another model
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
  EXPECT_NE(b[0], c[0]);
  // A short last chunk is not the start of a longer one.
  const auto d = chain("01234567abc");
  const auto e = chain("01234567abcdefgh");
  EXPECT_EQ(d[0], e[0]);
  EXPECT_NE(d[1], e[1]);
  EXPECT_TRUE(chain("").empty());
  EXPECT_EQ(chunk_bytes_covered(3, 8, 19), 19u);
  EXPECT_EQ(chunk_bytes_covered(2, 8, 19), 16u);
}

TEST(ChunkIndex, AWorkersMatchIsTheDeepestHashItHolds) {
  ChunkIndex index(1 << 16);
  const auto turn1 = chain("system prompt....user: hi......");
  const auto turn2 = chain("system prompt....user: hi......assistant: hello...user: more");
  index.apply(turn1, /*worker=*/1, /*expiry=*/1000);
  index.apply(chain("system prompt....other user text"), 2, 1000);
  const uint64_t workers[] = {1, 2, 3};
  size_t matched[3];
  const size_t best = index.match(turn2, workers, matched, 500);
  EXPECT_EQ(best, turn1.size() - 1);  // turn 1's short last chunk is not turn 2's
  EXPECT_EQ(matched[0], turn1.size() - 1);
  EXPECT_EQ(matched[1], 2u);  // "system p", "rompt..."
  EXPECT_EQ(matched[2], 0u);
  EXPECT_EQ(index.held(turn1, 1, 500), turn1.size());
  // Expired: nothing held.
  EXPECT_EQ(index.match(turn2, workers, matched, 1000), 0u);
}

TEST(ChunkIndex, ARetractionUndoesItsOwnRecordOnly) {
  ChunkIndex index(1 << 16);
  const auto c = chain("a prompt of some length, long enough");
  index.apply(c, 1, 2000);
  index.apply(c, 1, 1000);  // an older record heard late
  index.apply(c, 1, 2000);  // the same record again (a replay): once
  EXPECT_EQ(index.held(c, 1, 1500), c.size());
  index.retract(c, 1, 2000);  // the latest goes: the older record still holds it
  EXPECT_EQ(index.held(c, 1, 999), c.size());
  EXPECT_EQ(index.held(c, 1, 1000), 0u);
  index.retract(c, 1, 1000);
  EXPECT_EQ(index.held(c, 1, 0), 0u);
  EXPECT_EQ(index.size(), 0u);
  // Only the 4 latest are kept: a fifth, older one is not.
  for (int64_t e : {10, 20, 30, 40, 5}) index.apply(c, 2, e);
  for (int64_t e : {40, 30, 20}) index.retract(c, 2, e);
  EXPECT_EQ(index.held(c, 2, 9), c.size());
  index.retract(c, 2, 10);
  EXPECT_EQ(index.held(c, 2, 0), 0u);
}

TEST(ChunkIndex, WithASettleTimeARecordCountsFromItsOriginPlusIt) {
  ChunkIndex index(1 << 16);
  index.set_settle(/*ttl_us=*/1000, /*settle_us=*/100);
  const auto c = chain("a prompt of some length, long enough");
  index.apply(c, 1, 1500);  // origin 500: counts over [600, 1500)
  EXPECT_EQ(index.held(c, 1, 599), 0u);
  EXPECT_EQ(index.held(c, 1, 600), c.size());
  EXPECT_EQ(index.held(c, 1, 1499), c.size());
  EXPECT_EQ(index.held(c, 1, 1500), 0u);
  // A newer record not counting yet leaves an older one counting.
  index.apply(c, 1, 2450);  // origin 1450: counts from 1550
  EXPECT_EQ(index.held(c, 1, 1499), c.size());
  EXPECT_EQ(index.held(c, 1, 1520), 0u);  // the old one expired, the new one not yet counting
  EXPECT_EQ(index.held(c, 1, 1550), c.size());
}

TEST(ChunkIndex, RecordsArrivingFasterThanTheySettleNeverLeaveAHolderHoldingNothing) {
  ChunkIndex index(1 << 16);
  constexpr int64_t kTtl = 100'000, kSettle = 7'000;
  index.set_settle(kTtl, kSettle);
  const auto c = chain("a system prompt every request of a fan-out shares....");
  // One record every millisecond for 1 s (ten TTLs): from the first's settling on, the worker
  // holds the chunk at every moment, however many newer records have not settled yet.
  int missed = 0;
  for (int64_t origin = 0; origin < 1'000'000; origin += 1'000) {
    index.apply(c, 1, origin + kTtl);
    for (int64_t t = origin; t < origin + 1'000; t += 250) {
      if (t >= kSettle && index.held(c, 1, t) != c.size()) ++missed;
    }
  }
  EXPECT_EQ(missed, 0);
  // A burst of five within the settle time after a settled record: still held.
  ChunkIndex burst(1 << 16);
  burst.set_settle(kTtl, kSettle);
  burst.apply(c, 1, 0 + kTtl);
  for (int64_t origin = 20'000; origin < 25'000; origin += 1'000) burst.apply(c, 1, origin + kTtl);
  EXPECT_EQ(burst.held(c, 1, 24'000), c.size());
  EXPECT_EQ(burst.held(c, 1, 27'000), c.size());
}

TEST(ChunkIndex, AHotHolderIsHeldWhenAskedALittleLateOrByAClockALittleBehind) {
  constexpr int64_t kTtl = 100'000, kSettle = 7'000;
  const auto c = chain("a system prompt every request of a fan-out shares....");
  // Two replicas send the same worker the same prefix every 2 ms in turn, the second's clock
  // 5 ms ahead of the first's; the index is asked at every moment of the first's clock, and
  // also a settle time late (the records of the moments after it applied already).
  ChunkIndex index(1 << 16);
  index.set_settle(kTtl, kSettle);
  int missed = 0, late_missed = 0;
  for (int64_t i = 0; i < 500; ++i) {
    const int64_t now = i * 2'000;
    index.apply(c, 1, now + (i % 2 == 1 ? 5'000 : 0) + kTtl);
    if (now >= 3 * kSettle) {
      missed += index.held(c, 1, now) != c.size();
      late_missed += index.held(c, 1, now - kSettle) != c.size();
    }
  }
  EXPECT_EQ(missed, 0);
  EXPECT_EQ(late_missed, 0);
}

TEST(ChunkIndex, WithASettleTimeTheSameRecordsInAnyOrderKeepTheSame) {
  constexpr int64_t kTtl = 100'000, kSettle = 7'000;
  const auto c = chain("a prompt shared by many requests, long enough to chunk");
  std::vector<int64_t> expiries;
  std::mt19937 rng(17);
  for (int i = 0; i < 40; ++i) expiries.push_back(kTtl + static_cast<int64_t>(rng() % 60'000));
  auto answers = [&](const std::vector<int64_t>& order) {
    ChunkIndex index(1 << 16);
    index.set_settle(kTtl, kSettle);
    for (int64_t e : order) index.apply(c, 1, e);
    std::vector<size_t> held;
    for (int64_t t = 0; t < 200'000; t += 500) held.push_back(index.held(c, 1, t));
    return held;
  };
  const auto first = answers(expiries);
  for (int k = 0; k < 20; ++k) {
    std::shuffle(expiries.begin(), expiries.end(), rng);
    EXPECT_EQ(answers(expiries), first) << "order " << k;
  }
}

TEST(ChunkIndex, TheSameRecordsInAnyOrderGiveTheSameIndex) {
  struct Record {
    std::vector<uint64_t> chain;
    uint64_t worker;
    int64_t expiry;
    bool retract;
  };
  std::vector<Record> records;
  std::mt19937_64 rng(5);
  const std::string base = "a shared system prompt that every conversation starts with......";
  for (int i = 0; i < 200; ++i) {
    std::string text =
        base + "conversation " + std::to_string(i % 17) + std::string(i % 5 * 9, 'x');
    // Expiries are distinct (a record is known by its microsecond origin).
    records.push_back({chain(text), rng() % 4, 1000 + i, false});
  }
  // Retractions follow their record (NATS keeps one publisher's order), anywhere after it.
  for (int i = 0; i < 30; ++i) {
    Record r = records[static_cast<size_t>(i * 6)];
    r.retract = true;
    records.push_back(r);
  }
  auto build = [&](const std::vector<size_t>& order) {
    auto index = std::make_unique<ChunkIndex>(1 << 16);
    for (size_t i : order) {
      const Record& r = records[i];
      if (r.retract) {
        index->retract(r.chain, r.worker, r.expiry);
      } else {
        index->apply(r.chain, r.worker, r.expiry);
      }
    }
    return index;
  };
  std::vector<size_t> in_order(records.size());
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  auto reference = build(in_order);
  for (int trial = 0; trial < 5; ++trial) {
    // Shuffle the applications among themselves; each retraction stays after its record.
    std::vector<size_t> order(in_order.begin(), in_order.begin() + 200);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k = 200; k < records.size(); ++k) {
      const size_t original = (k - 200) * 6;
      auto at = std::find(order.begin(), order.end(), original);
      order.insert(at + 1 + static_cast<ptrdiff_t>(rng() % static_cast<uint64_t>(order.end() - at)),
                   k);
    }
    auto other = build(order);
    EXPECT_EQ(other->size(), reference->size());
    const uint64_t workers[] = {0, 1, 2, 3};
    for (const Record& r : records) {
      size_t a[4], b[4];
      reference->match(r.chain, workers, a, 1100);
      other->match(r.chain, workers, b, 1100);
      EXPECT_TRUE(std::equal(a, a + 4, b));
    }
  }
}

TEST(ChunkIndex, BoundedAndSwept) {
  ChunkIndex index(16 * 4);  // 4 entries per shard
  std::vector<uint64_t> many;
  for (uint64_t i = 0; i < 1000; ++i) many.push_back(i * 0x1000000000000000ULL + i);
  const size_t dropped = index.apply(many, 1, 100);
  EXPECT_GT(dropped, 0u);
  EXPECT_LE(index.size(), 64u);
  // Full shards are trimmed back to 75% oldest first; expired entries go.
  EXPECT_GT(index.expire(50), 0u);
  EXPECT_LE(index.size(), 48u);
  index.expire(100);
  EXPECT_EQ(index.size(), 0u);
  index.apply(many, 1, 200);
  index.apply(many, 2, 200);
  index.remove_worker(1);
  EXPECT_EQ(index.held(std::span<const uint64_t>(many).first(1), 1, 0), 0u);
  index.remove_worker(2);
  EXPECT_EQ(index.size(), 0u);
}

}  // namespace
}  // namespace kvgate::prefix
