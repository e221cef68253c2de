// Tests for sim/tokenizer_routes: the /tokenize and /detokenize bodies in SGLang's shapes, with the
// stand-in tokenizer (the integration tests check the real models' ids over HTTP).
#include "sim/tokenizer_routes.h"

#include <gtest/gtest.h>

namespace kvgate::sim {
namespace {

struct Answer {
  int status;
  std::string body;
};

Answer tokenize(std::string body, int64_t max_model_len = 4096) {
  StandInTokenizer t;
  Answer a;
  a.status = tokenize_response(body, t, max_model_len, a.body);
  return a;
}

Answer detokenize(std::string body) {
  StandInTokenizer t;
  Answer a;
  a.status = detokenize_response(body, t, a.body);
  return a;
}

std::string error_body(std::string_view message, int status = 400) {
  return R"({"object":"error","message":")" + std::string(message) + R"(","type":")" +
         (status == 400 ? "BadRequestError" : "InternalServerError") + R"(","param":null,"code":)" +
         std::to_string(status) + "}";
}

TEST(SimTokenizerRoutes, TokenizeShapes) {
  Answer a = tokenize(R"({"prompt":"{<|im_end|>"})", 123);
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, R"({"tokens":[123,257],"count":2,"max_model_len":123})");
  a = tokenize(R"({"model":"x","prompt":["{",""],"add_special_tokens":false})");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, R"({"tokens":[[123],[]],"count":[1,0],"max_model_len":4096})");
  // null is an absent field, as elsewhere in the sim.
  a = tokenize(R"({"model":null,"prompt":"}","add_special_tokens":null})");
  EXPECT_EQ(a.body, R"({"tokens":[125],"count":1,"max_model_len":4096})");
}

TEST(SimTokenizerRoutes, TokenizeErrors) {
  EXPECT_EQ(tokenize(R"({"prompt":1.5})").body,
            error_body("Invalid prompt type: <class 'float'>. Expected str or List[str]."));
  EXPECT_EQ(tokenize(R"({"prompt":true})").body,
            error_body("Invalid prompt type: <class 'bool'>. Expected str or List[str]."));
  EXPECT_EQ(tokenize(R"({"prompt":null})").body,
            error_body("Exactly one of 'prompt' or 'messages' must be provided."));
  EXPECT_EQ(tokenize(R"({"prompt":"a","messages":[]})").body,
            error_body("Exactly one of 'prompt' or 'messages' must be provided."));
  Answer a = tokenize(R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(a.status, 400);
  EXPECT_NE(a.body.find("'messages' is not simulated"), std::string::npos) << a.body;
  EXPECT_EQ(tokenize(R"({"prompt":"a","model":3})").body, error_body("'model' must be a string"));
  EXPECT_EQ(tokenize("[]").body, error_body("the request body must be a JSON object"));
  EXPECT_EQ(tokenize("").body, error_body("the request body is empty; send a JSON object"));
  EXPECT_EQ(tokenize("{").status, 400);
}

TEST(SimTokenizerRoutes, DetokenizeShapes) {
  // skip_special_tokens defaults to true.
  EXPECT_EQ(detokenize(R"({"tokens":[256,104,105,257]})").body, R"({"text":"hi"})");
  EXPECT_EQ(detokenize(R"({"tokens":[256,104,105],"skip_special_tokens":false})").body,
            R"({"text":"<|im_start|>hi"})");
  EXPECT_EQ(detokenize(R"({"tokens":[[104],[],[256,105]]})").body, R"({"text":["h","","i"]})");
  EXPECT_EQ(detokenize(R"({"tokens":[]})").body, R"({"text":""})");
  // A float without a fraction is an id (pydantic's lax int); ids past the vocabulary are skipped.
  EXPECT_EQ(detokenize(R"({"tokens":[104.0,4294967295,105]})").body, R"({"text":"hi"})");
  // Text is JSON-escaped; a cut UTF-8 sequence is U+FFFD.
  EXPECT_EQ(detokenize(R"({"tokens":[34,10,226,156]})").body, "{\"text\":\"\\\"\\n\xef\xbf\xbd\"}");
}

TEST(SimTokenizerRoutes, DetokenizeErrors) {
  EXPECT_EQ(detokenize(R"({})").body, error_body("'tokens' is required"));
  EXPECT_EQ(
      detokenize(R"({"tokens":{"a":1}})").body,
      error_body("Invalid tokens type: <class 'dict'>. Expected List[int] or List[List[int]]."));
  EXPECT_EQ(
      detokenize(R"({"tokens":[null]})").body,
      error_body("Invalid tokens type: <class 'list'>. Expected List[int] or List[List[int]]."));
  EXPECT_EQ(detokenize(R"({"tokens":[1,[2]]})").body,
            error_body("Invalid input: 'tokens' must be a list of integers."));
  // The sublist as Python prints it.
  EXPECT_EQ(
      detokenize(R"({"tokens":[[1],[0.5,1.5e-05,2.5e20,1e15,"it's","a\"b'",{"k":false},[null]]]})")
          .body,
      error_body(R"(Invalid input: Sublist in 'tokens' must contain only integers. Found: [0.5, )"
                 R"(1.5e-05, 2.5e+20, 1000000000000000.0, \"it's\", 'a\"b\\'', {'k': False}, )"
                 R"([None]])"));
  EXPECT_EQ(detokenize(R"({"tokens":[[1],7]})").body,
            error_body("Invalid input: Sublist in 'tokens' must contain only integers. Found: 7"));
  // Each sublist is checked and decoded before the next: the id error of the first comes first.
  EXPECT_EQ(detokenize(R"({"tokens":[[-1],["x"]]})").body,
            error_body("Internal server error during detokenization: out of range integral type "
                       "conversion attempted",
                       500));
  EXPECT_EQ(detokenize(R"({"tokens":[[1],["x"],[-1]]})").status, 400);
  // A flat list is checked whole first.
  EXPECT_EQ(detokenize(R"({"tokens":[-1,"x"]})").status, 400);
  EXPECT_EQ(detokenize(R"({"tokens":[4294967296]})").body,
            error_body("Internal server error during detokenization: out of range integral type "
                       "conversion attempted",
                       500));
  EXPECT_EQ(detokenize(R"({"tokens":[18446744073709551615]})").body,
            error_body("Internal server error during detokenization: Python int too large to "
                       "convert to C long",
                       500));
  EXPECT_EQ(detokenize(R"({"tokens":[1],"skip_special_tokens":"no"})").body,
            error_body("'skip_special_tokens' must be true or false"));
}

}  // namespace
}  // namespace kvgate::sim
