// Tests for sim/faults: reproducible fault decisions, runtime updates, the unhealthy window.
#include "sim/faults.h"

#include <gtest/gtest.h>

#include <map>

namespace kvgate::sim {
namespace {

std::vector<Fault> draws(FaultInjector& f, int n) {
  std::vector<Fault> out;
  for (int i = 0; i < n; ++i) out.push_back(f.decide());
  return out;
}

TEST(SimFaults, NoRatesNoFaults) {
  FaultInjector f({}, 1, Clock::now());
  for (Fault x : draws(f, 1000)) EXPECT_EQ(x, Fault::kNone);
}

TEST(SimFaults, RateOneAlwaysFires) {
  FaultInjector fail({.fail_rate = 1}, 1, Clock::now());
  FaultInjector hang({.hang_rate = 1}, 1, Clock::now());
  FaultInjector drop({.drop_rate = 1}, 1, Clock::now());
  FaultInjector abort({.abort_rate = 1}, 1, Clock::now());
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(fail.decide(), Fault::kFail);
    EXPECT_EQ(hang.decide(), Fault::kHang);
    EXPECT_EQ(drop.decide(), Fault::kDrop);
    EXPECT_EQ(abort.decide(), Fault::kAbort);
  }
}

TEST(SimFaults, SameSeedSameDecisions) {
  FaultSettings s{.fail_rate = 0.2, .hang_rate = 0.1, .drop_rate = 0.3, .abort_rate = 0.2};
  FaultInjector a(s, 42, Clock::now()), b(s, 42, Clock::now()), c(s, 43, Clock::now());
  auto da = draws(a, 200);
  EXPECT_EQ(da, draws(b, 200));
  EXPECT_NE(da, draws(c, 200));
}

TEST(SimFaults, FrequenciesFollowTheRates) {
  FaultInjector f({.fail_rate = 0.2, .hang_rate = 0.1, .drop_rate = 0.3, .abort_rate = 0.15}, 7,
                  Clock::now());
  std::map<Fault, int> n;
  for (Fault x : draws(f, 20000)) n[x]++;
  EXPECT_NEAR(n[Fault::kFail] / 20000.0, 0.2, 0.02);
  EXPECT_NEAR(n[Fault::kHang] / 20000.0, 0.1, 0.02);
  EXPECT_NEAR(n[Fault::kDrop] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(n[Fault::kAbort] / 20000.0, 0.15, 0.02);
  EXPECT_NEAR(n[Fault::kNone] / 20000.0, 0.25, 0.02);
}

TEST(SimFaults, AbortRateFromTheFlagAndAtRuntime) {
  SimConfig c;
  c.abort_first_event_rate = 0.25;
  c.fail_status = 502;
  FaultSettings s = fault_settings(c);
  EXPECT_DOUBLE_EQ(s.abort_rate, 0.25);
  EXPECT_EQ(s.fail_status, 502);

  FaultInjector f({}, 1, Clock::now());
  EXPECT_NE(f.to_json().find(R"("abort_first_event_rate":0.0)"), std::string::npos) << f.to_json();
  std::string body = R"({"abort_first_event_rate":1})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_EQ(f.decide(), Fault::kAbort);
  EXPECT_DOUBLE_EQ(f.settings().abort_rate, 1);
  EXPECT_NE(f.to_json().find(R"("abort_first_event_rate":1.0)"), std::string::npos) << f.to_json();
  // Exclusive with the other outcomes: the sum is checked with it.
  body = R"({"fail_rate":0.5})";
  EXPECT_NE(f.update(body).find("abort_first_event_rate must add up to at most 1"),
            std::string::npos);
  body = R"({"fail_rate":0.5,"abort_first_event_rate":0.5})";
  ASSERT_EQ(f.update(body), "");
  body = R"({"abort_first_event_rate":0})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_EQ(f.settings().abort_rate, 0);
  EXPECT_DOUBLE_EQ(f.settings().fail_rate, 0.5);
}

TEST(SimFaults, UpdateChangesSettingsAtRuntime) {
  FaultInjector f({}, 1, Clock::now());
  std::string body = R"({"fail_rate":1,"fail_status":503,"drop_after_chunks":4})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_EQ(f.decide(), Fault::kFail);
  EXPECT_EQ(f.settings().fail_status, 503);
  EXPECT_EQ(f.settings().drop_after_chunks, 4);
  body = R"({"fail_rate":0})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_EQ(f.decide(), Fault::kNone);
  EXPECT_EQ(f.settings().fail_status, 503);  // untouched fields keep their value
  EXPECT_NE(f.to_json().find(R"("fail_status":503)"), std::string::npos) << f.to_json();
}

TEST(SimFaults, UpdateIsAllOrNothing) {
  FaultInjector f({.fail_rate = 0.5}, 1, Clock::now());
  struct Case {
    std::string body, expect;
  };
  std::vector<Case> cases = {
      {R"({"hang_rate":0.5,"fail_rate":2})", "'fail_rate' must be a number between 0 and 1"},
      {R"({"fail_status":99})", "'fail_status' must be an integer between 400 and 599"},
      {R"({"hang_rate":0.6})", "must add up to at most 1"},
      {R"({"abort_first_event_rate":0.6})", "must add up to at most 1"},
      {R"({"abort_first_event_rate":-0.1})",
       "'abort_first_event_rate' must be a number between 0 and 1"},
      {R"({"unhealthy":"yes"})", "'unhealthy' must be true or false"},
      {R"({"unhealthy_secs":-1})", "'unhealthy_secs'"},
      {"[", "malformed JSON body"},
      {"[]", "must be a JSON object"},
  };
  for (auto& k : cases) {
    std::string err = f.update(k.body);
    EXPECT_NE(err.find(k.expect), std::string::npos) << k.body << " -> " << err;
  }
  EXPECT_DOUBLE_EQ(f.settings().fail_rate, 0.5);
  EXPECT_DOUBLE_EQ(f.settings().hang_rate, 0);
}

TEST(SimFaults, UnhealthyWindow) {
  auto now = Clock::now();
  FaultInjector f({}, 1, now + std::chrono::seconds(10));
  EXPECT_FALSE(f.healthy(now));
  EXPECT_TRUE(f.healthy(now + std::chrono::seconds(11)));
  std::string body = R"({"unhealthy":false})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_TRUE(f.healthy());
  body = R"({"unhealthy":true})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_FALSE(f.healthy(now + std::chrono::hours(24 * 365)));
  body = R"({"unhealthy_secs":0})";
  ASSERT_EQ(f.update(body), "");
  EXPECT_TRUE(f.healthy(Clock::now() + std::chrono::milliseconds(1)));
}

}  // namespace
}  // namespace kvgate::sim
