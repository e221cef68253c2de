// Unit tests: gateway/doctor (the parts without a gateway: step ranges, the report's text) and
// the doctor's key to the request path (gateway.h).
#include "gateway/doctor.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "gateway/gateway.h"
#include "http/message.h"

namespace kvgate::doctor {
namespace {

TEST(DoctorSteps, RangesWithinOneToSeven) {
  int a = 0, b = 0;
  EXPECT_TRUE(parse_steps("1-7", a, b));
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 7);
  EXPECT_TRUE(parse_steps("5", a, b));
  EXPECT_EQ(a, 5);
  EXPECT_EQ(b, 5);
  EXPECT_TRUE(parse_steps("4-6", a, b));
  for (const char* bad : {"", "0", "8", "6-4", "1-8", "1-", "-7", "a", "1--7", "17"}) {
    EXPECT_FALSE(parse_steps(bad, a, b)) << bad;
  }
}

TEST(DoctorReport, TheTextSaysStatusMeasureAndFix) {
  Report r;
  r.rule = "llama";
  r.steps.push_back(Step{.number = 1,
                         .name = "model readiness",
                         .status = Status::kPass,
                         .measured = "2 of 2 endpoints serve directly"});
  r.steps.push_back(Step{.number = 2,
                         .name = "pool homogeneity",
                         .status = Status::kFail,
                         .measured = "page size 32",
                         .fix = "set kvBlockSize to 32",
                         .lines = {"FAIL the engines' page size is 32"}});
  r.steps.push_back(Step{.number = 3, .name = "proxy path", .status = Status::kSkip});
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.failed_step(), 2);
  auto j = to_json(r);
  EXPECT_EQ(j["failed_step"], 2);
  EXPECT_EQ(j["steps"][1]["status"], "FAIL");
  EXPECT_TRUE(j["steps"][0]["fix"].is_null());
  std::string text = format_text(j);
  EXPECT_NE(text.find("PASS  1 model readiness: 2 of 2 endpoints serve directly"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("FAIL  2 pool homogeneity: page size 32"), std::string::npos) << text;
  EXPECT_NE(text.find("fix: set kvBlockSize to 32"), std::string::npos) << text;
  EXPECT_NE(text.find("stopped at step 2"), std::string::npos) << text;
}

TEST(DoctorKey, OnlyThisProcesssKeyGrantsAPass) {
  DoctorKey key;
  EXPECT_EQ(key.value().size(), 32u);
  EXPECT_NE(key.value(), DoctorKey().value()) << "random per process";
  auto pass = key.check(key.value() + " rule=llama pin=http://10.0.0.1:30000");
  ASSERT_TRUE(pass);
  EXPECT_EQ(pass->rule, "llama");
  EXPECT_EQ(pass->pin, "http://10.0.0.1:30000");
  auto bare = key.check(key.value());
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->rule, "");
  EXPECT_EQ(bare->pin, "");
  std::string wrong = key.value();
  wrong[31] = wrong[31] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(key.check(wrong + " pin=http://10.0.0.1:30000"));
  EXPECT_FALSE(key.check(key.value().substr(0, 31)));
  EXPECT_FALSE(key.check(key.value() + "0"));
  EXPECT_FALSE(key.check(""));
  EXPECT_FALSE(key.armed());
  key.arm();
  EXPECT_TRUE(key.armed());
  key.disarm();
  EXPECT_FALSE(key.armed());
}

TEST(DoctorKey, TheHeaderHasAKindTheRequestPathDrops) {
  // The request path forwards only kOther and kContentType headers, either way (its filters
  // are not exercised here).
  EXPECT_EQ(http::classify_header("x-kvgate-doctor"), http::HeaderKind::kDoctor);
  EXPECT_EQ(http::classify_header("X-KVGate-Doctor"), http::HeaderKind::kDoctor);
  EXPECT_EQ(http::classify_header("accept-encoding"), http::HeaderKind::kOther);
}

}  // namespace
}  // namespace kvgate::doctor
