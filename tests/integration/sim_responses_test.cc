// Integration: the kvgate-sim binary's SGLang routes beyond generation, as a client (a gateway)
// observes them: /v1/responses with --enable-response-store (a conversation chained by
// previous_response_id whose cached tokens grow turn by turn, the stream's event sequence and
// framing with the response id in its first event, GET and cancel of stored responses, SGLang's
// answers for unknown and unstored ids, the store's bound), the store off by default, and the
// prefill-only routes /encode, /classify and /v1/score.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/http_client.h"

namespace kvgate::testing {
namespace {

using Json = nlohmann::json;

const std::vector<std::string> kStore = {"--enable-response-store", "--page-size", "1",
                                         "--time-scale", "0.01"};

Json parse(const Response& r) {
  Json j = Json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  return j;
}

std::string create(const std::string& input, const std::string& extra = "") {
  return R"({"input":")" + input + R"(","max_output_tokens":8)" + extra + "}";
}

// One SSE event of a Responses stream: its "event:" name and its data.
struct Event {
  std::string name;
  Json data;
};

std::vector<Event> events(const std::string& body) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    const std::string block = body.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = block.find('\n');
    EXPECT_EQ(block.rfind("event: ", 0), 0u) << block;
    EXPECT_EQ(block.compare(nl + 1, 6, "data: "), 0) << block;
    out.push_back(Event{block.substr(7, nl - 7), Json::parse(block.substr(nl + 7))});
  }
  EXPECT_EQ(pos, body.size()) << "trailing bytes: " << body.substr(pos);
  return out;
}

TEST(SimResponsesApi, ConversationChainedByPreviousResponseIdHitsAGrowingPrefix) {
  Sim s = Sim::launch(kStore);
  HttpClient c(s.port);
  std::string prev;
  int64_t last_cached = -1;
  const char* inputs[] = {"Tell me about the sea.", "And the mountains?", "Which is older?"};
  Json last;
  for (int turn = 0; turn < 3; ++turn) {
    const std::string extra = prev.empty() ? R"(,"instructions":"Answer briefly.")"
                                           : R"(,"previous_response_id":")" + prev + "\"";
    auto r = c.post("/v1/responses", create(inputs[turn], extra));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("content-type"), "application/json");
    const Json j = parse(r);
    EXPECT_EQ(std::string(j["id"]).rfind("resp_", 0), 0u);
    EXPECT_EQ(j["object"], "response");
    EXPECT_EQ(j["output"][0]["type"], "message");
    EXPECT_EQ(j["output"][0]["role"], "assistant");
    const int64_t cached = j["usage"]["input_tokens_details"]["cached_tokens"];
    if (turn == 0) {
      EXPECT_EQ(cached, 0);
    } else {
      // Page size 1: the cache holds the previous prompt and reply but the reply's last token.
      // (The first turn's instructions do not carry over, so turn 2 matches up to them only.)
      EXPECT_GT(cached, last_cached);
      if (turn == 2) {
        EXPECT_EQ(cached, int64_t(last["usage"]["input_tokens"]) +
                              int64_t(last["usage"]["output_tokens"]) - 1);
      }
      EXPECT_EQ(j["previous_response_id"], prev);
    }
    EXPECT_EQ(j["usage"]["total_tokens"],
              int64_t(j["usage"]["input_tokens"]) + int64_t(j["usage"]["output_tokens"]));
    // max_output_tokens 8 less SGLang's 2 tokens of headroom: the answer stops at the limit.
    EXPECT_EQ(j["usage"]["output_tokens"], 6);
    EXPECT_EQ(j["status"], "incomplete");
    last_cached = cached;
    prev = j["id"];
    last = j;
  }
  // The stored object is what the create answered.
  auto got = c.get("/v1/responses/" + prev);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(parse(got), last);
}

TEST(SimResponsesApi, UnstoredAndUnknownIdsGetSglangsErrors) {
  Sim s = Sim::launch(kStore);
  HttpClient c(s.port);
  auto r = c.post("/v1/responses", create("hello", R"(,"store":false)"));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id = parse(r)["id"];
  EXPECT_EQ(parse(r)["store"], false);
  const std::string not_found = R"({"error":{"message":"Response with id ')" + id +
                                R"(' not found.","type":"invalid_request_error",)"
                                R"("param":"response_id","code":404}})";
  auto cont = c.post("/v1/responses", create("again", R"(,"previous_response_id":")" + id + "\""));
  EXPECT_EQ(cont.status, 404);
  EXPECT_EQ(cont.body, not_found);
  auto get = c.get("/v1/responses/" + id);
  EXPECT_EQ(get.status, 404);
  EXPECT_EQ(get.body, not_found);
  auto bad = c.get("/v1/responses/chatcmpl-1");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(parse(bad)["error"]["message"],
            "Invalid 'response_id': 'chatcmpl-1'. Expected an ID that begins with 'resp'.");
  EXPECT_EQ(c.post("/v1/responses/" + id + "/cancel", "").status, 404);
  // SGLang registers no DELETE: FastAPI's 405 on the known path.
  auto del = c.request("DELETE", "/v1/responses/" + id, "");
  EXPECT_EQ(del.status, 405);
  EXPECT_EQ(del.body, R"({"detail":"Method Not Allowed"})");
  EXPECT_EQ(c.request("PUT", "/v1/responses", create("x")).status, 405);

  // A stored response: cancel returns it as it is (it already completed).
  auto kept = c.post("/v1/responses", create("keep me"));
  ASSERT_EQ(kept.status, 200) << kept.body;
  const std::string kept_id = parse(kept)["id"];
  auto cancelled = c.post("/v1/responses/" + kept_id + "/cancel", "");
  EXPECT_EQ(cancelled.status, 200);
  EXPECT_EQ(parse(cancelled), parse(kept));
}

TEST(SimResponsesApi, StoreIsOffByDefaultAsInSglang) {
  Sim s = Sim::launch({"--time-scale", "0.01"});
  HttpClient c(s.port);
  auto r = c.post("/v1/responses", create("hello"));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string id = parse(r)["id"];
  const std::string disabled =
      "Response store is disabled. Stateful Responses require --enable-response-store on a "
      "standalone server; response storage is unavailable in PD mode.";
  auto cont = c.post("/v1/responses", create("again", R"(,"previous_response_id":")" + id + "\""));
  EXPECT_EQ(cont.status, 400);
  EXPECT_EQ(parse(cont)["error"]["message"], disabled);
  EXPECT_EQ(parse(cont)["error"]["param"], "previous_response_id");
  auto get = c.get("/v1/responses/" + id);
  EXPECT_EQ(get.status, 400);
  EXPECT_EQ(parse(get)["error"]["param"], "response_id");
  auto info = c.get("/get_server_info");
  EXPECT_EQ(parse(info)["enable_response_store"], false);
}

TEST(SimResponsesApi, StreamSendsSglangsEventSequence) {
  Sim s = Sim::launch(kStore);
  HttpClient c(s.port);
  auto r = c.post("/v1/responses", create("stream please", R"(,"stream":true)"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_EQ(r.body.find("[DONE]"), std::string::npos);
  const auto ev = events(r.body);
  ASSERT_GE(ev.size(), 9u);
  std::vector<std::string> names;
  for (size_t i = 0; i < ev.size(); ++i) {
    names.push_back(ev[i].name);
    EXPECT_EQ(ev[i].data["type"], ev[i].name);
    EXPECT_EQ(ev[i].data["sequence_number"], int64_t(i));
  }
  const size_t n = ev.size();
  std::vector<std::string> expected = {"response.created", "response.in_progress",
                                       "response.output_item.added", "response.content_part.added"};
  for (size_t i = 4; i + 4 < n; ++i) expected.emplace_back("response.output_text.delta");
  for (const char* e : {"response.output_text.done", "response.content_part.done",
                        "response.output_item.done", "response.incomplete"}) {
    expected.emplace_back(e);
  }
  EXPECT_EQ(names, expected);
  // The first event names the response: a gateway learns its owner from it.
  const std::string id = ev[0].data["response"]["id"];
  EXPECT_EQ(id.rfind("resp_", 0), 0u);
  EXPECT_EQ(ev[0].data["response"]["status"], "in_progress");
  const Json& final = ev.back().data["response"];
  EXPECT_EQ(final["id"], id);
  std::string text;
  for (const auto& e : ev) {
    if (e.name == "response.output_text.delta") text += std::string(e.data["delta"]);
  }
  EXPECT_EQ(final["output"][0]["content"][0]["text"], text);
  EXPECT_EQ(final["output"][0]["id"], ev[2].data["item"]["id"]);
  EXPECT_EQ(final["usage"]["output_tokens"], 6);
  // Stored once done.
  auto got = c.get("/v1/responses/" + id);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(parse(got)["output"], final["output"]);
}

TEST(SimResponsesApi, StoreKeepsAtMostMaxStoredResponses) {
  std::vector<std::string> args = kStore;
  args.insert(args.end(), {"--max-stored-responses", "2"});
  Sim s = Sim::launch(args);
  HttpClient c(s.port);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto r = c.post("/v1/responses", create("turn " + std::to_string(i)));
    ASSERT_EQ(r.status, 200) << r.body;
    ids.push_back(parse(r)["id"]);
  }
  EXPECT_EQ(c.get("/v1/responses/" + ids[0]).status, 404);  // the oldest went first
  EXPECT_EQ(c.get("/v1/responses/" + ids[1]).status, 200);
  EXPECT_EQ(c.get("/v1/responses/" + ids[2]).status, 200);
}

TEST(SimResponsesApi, PdServerRefusesTheStore) {
  const RunResult r =
      run("kvgate-sim", {"--port", std::to_string(free_port()), "--enable-response-store",
                         "--disaggregation-mode", "decode"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--enable-response-store is not supported with "
                          "--disaggregation-mode=prefill or decode"),
            std::string::npos)
      << r.output;
}

TEST(SimEncode, EncodeSingleAndBatchThroughTheEngine) {
  Sim s = Sim::launch({"--page-size", "1", "--time-scale", "0.01"});
  HttpClient c(s.port);
  auto one = c.post("/encode", R"({"text":"The capital city of France is"})");
  ASSERT_EQ(one.status, 200) << one.body;
  const Json j = parse(one);
  EXPECT_EQ(j["embedding"].size(), 32u);
  EXPECT_EQ(j["meta_info"]["finish_reason"], Json::parse(R"({"type":"length","length":0})"));
  EXPECT_GT(int64_t(j["meta_info"]["prompt_tokens"]), 0);
  EXPECT_EQ(j["meta_info"]["weight_version"], "default");
  EXPECT_GT(double(j["meta_info"]["e2e_latency"]), 0.0);
  EXPECT_FALSE(j["meta_info"].contains("cached_tokens"));

  auto batch = c.post("/encode", R"({"input_ids":[[1,2,3],[4,5,6,7]],"rid":["a","b"]})");
  ASSERT_EQ(batch.status, 200) << batch.body;
  const Json b = parse(batch);
  ASSERT_TRUE(b.is_array());
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0]["meta_info"]["id"], "a");
  EXPECT_EQ(b[1]["meta_info"]["prompt_tokens"], 4);
  // The same ids embed the same way.
  auto again = c.post("/encode", R"({"input_ids":[1,2,3]})");
  EXPECT_EQ(parse(again)["embedding"], b[0]["embedding"]);

  auto reward = c.post("/classify", R"({"text":"a fine answer"})");
  ASSERT_EQ(reward.status, 200) << reward.body;
  EXPECT_EQ(parse(reward)["embedding"].size(), 1u);

  auto none = c.post("/encode", R"({"sampling_params":{"max_new_tokens":1}})");
  EXPECT_EQ(none.status, 400);
  EXPECT_EQ(parse(none)["error"]["message"], "Either text or input_ids should be provided.");
  EXPECT_EQ(c.get("/encode").status, 405);
}

TEST(SimEncode, ScoreGivesLabelProbabilities) {
  Sim s = Sim::launch({"--time-scale", "0.01"});
  HttpClient c(s.port);
  auto r = c.post("/v1/score", R"({"query":"Is this good? ","items":["yes","no","maybe"],)"
                               R"("label_token_ids":[1,2],"apply_softmax":true,"model":"m"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = parse(r);
  EXPECT_EQ(j["object"], "scoring");
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["scores"].size(), 3u);
  for (const auto& row : j["scores"]) {
    ASSERT_EQ(row.size(), 2u);
    EXPECT_NEAR(double(row[0]) + double(row[1]), 1.0, 1e-9);
  }
  auto raw = c.post("/v1/score", R"({"query":[1,2],"items":[[3],[4,5]],"label_token_ids":[7]})");
  ASSERT_EQ(raw.status, 200) << raw.body;
  const Json scored = parse(raw);  // (a range-for over a temporary's member would dangle)
  for (const auto& row : scored["scores"]) {
    EXPECT_GT(double(row[0]), 0.0);
    EXPECT_LT(double(row[0]), 1.0);
  }
  auto missing = c.post("/v1/score", R"({"query":"q","items":["a"]})");
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(parse(missing)["message"], "label_token_ids must be provided");
}

}  // namespace
}  // namespace kvgate::testing
