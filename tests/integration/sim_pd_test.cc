// Integration: prefill/decode disaggregation between two kvgate-sim binaries, driven as a PD
// gateway drives them (bootstrap_host/port/room in both bodies, sent at once). The prefill's
// bootstrap port answers SGLang's bootstrap-server routes; the decode finds the prefill DP rank
// that holds the room as SGLang's decode does (disagg_prefill_dp_rank in its own body, else
// bootstrap_room % the prefill's dp_size) and waits for exactly that (room, rank). What a gateway
// gets wrong fails as SGLang fails it: the follow_bootstrap_room conflict on the prefill, the
// waiting timeout on the decode, a handshake failure for an unreachable prefill, the 400 abort of a
// request without a room. /abort_request ends a decode that waits for its KV. Only the prefill
// side caches the prompt; the decode side reports the prefill's hit.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <nlohmann/json.hpp>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;

struct Pd {
  // `prefill_dp`: the prefill server's --dp-size; `timeout`: the decode's --pd-room-timeout-secs.
  explicit Pd(int prefill_dp = 1, double timeout = 1, std::vector<std::string> prefill_extra = {},
              std::vector<std::string> decode_extra = {}) {
    bootstrap = free_port();
    prefill.port = free_port();
    prefill.args = {"--disaggregation-mode",
                    "prefill",
                    "--disaggregation-bootstrap-port",
                    std::to_string(bootstrap),
                    "--dp-size",
                    std::to_string(prefill_dp),
                    "--time-scale",
                    "0.05",
                    "--page-size",
                    "4"};
    prefill.args.insert(prefill.args.end(), prefill_extra.begin(), prefill_extra.end());
    prefill.start();
    decode.port = free_port();
    decode.args = {"--disaggregation-mode",  "decode",
                   "--time-scale",           "0.05",
                   "--pd-room-timeout-secs", std::to_string(timeout)};
    decode.args.insert(decode.args.end(), decode_extra.begin(), decode_extra.end());
    decode.start();
  }
  // A /generate body; `extra` is more fields (",\"routed_dp_rank\":1").
  std::string body(uint64_t room, const std::string& text, int max_new,
                   const std::string& extra = "", int port = 0) const {
    return R"({"text":")" + text + R"(","sampling_params":{"max_new_tokens":)" +
           std::to_string(max_new) + R"(},"bootstrap_host":"127.0.0.1","bootstrap_port":)" +
           std::to_string(port ? port : bootstrap) + R"(,"bootstrap_room":)" +
           std::to_string(room) + extra + "}";
  }
  // Sends one body to each server at once; returns {prefill answer, decode answer}.
  std::pair<Response, Response> both(const std::string& to_prefill, const std::string& to_decode,
                                     const std::string& path = "/generate") const {
    auto p = std::async(std::launch::async,
                        [&] { return HttpClient(prefill.port).post(path, to_prefill); });
    auto d = std::async(std::launch::async,
                        [&] { return HttpClient(decode.port).post(path, to_decode); });
    return {p.get(), d.get()};
  }
  std::pair<Response, Response> both(const std::string& b) const { return both(b, b); }
  int bootstrap = 0;
  Sim prefill, decode;
};

const std::string kText = "Tell me about the history of the printing press in Europe";
const std::string kInfoQuery =
    "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";

std::string stream_of(std::string b) {
  b.insert(b.size() - 1, R"(,"stream":true)");
  return b;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The decode's queue count of one kind in /v1/loads (rank 0).
int64_t decode_queue(const Pd& pd, const std::string& kind) {
  auto r = HttpClient(pd.decode.port).get("/v1/loads?include=disagg");
  return static_cast<int64_t>(json_number_field(r.body, "decode_" + kind + "_queue_reqs"));
}

TEST(SimPd, RendezvousTransfersThenDecodes) {
  Pd pd;
  auto [p, d] = pd.both(pd.body(0x7fffffffffffff01ull, kText, 12));
  ASSERT_EQ(p.status, 200) << p.body;
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json_number_field(p.body, "completion_tokens"), 1)
      << "the prefill server only prefills";
  EXPECT_EQ(json_number_field(d.body, "completion_tokens"), 12);
  EXPECT_EQ(json_number_field(d.body, "cached_tokens"), 0);
  const auto prompt = static_cast<int64_t>(json_number_field(d.body, "prompt_tokens"));

  // A second request with the same prompt: the prefill side hits its cache; the decode side
  // reports that hit as its own cached_tokens, as SGLang's decode does.
  auto [p2, d2] = pd.both(pd.body(42, kText, 3));
  ASSERT_EQ(d2.status, 200) << d2.body;
  const int64_t hit = (prompt - 1) / 4 * 4;
  EXPECT_EQ(static_cast<int64_t>(json_number_field(p2.body, "cached_tokens")), hit);
  EXPECT_EQ(static_cast<int64_t>(json_number_field(d2.body, "cached_tokens")), hit);
  // The decode server caches nothing (its KV came from the prefill server).
  HttpClient dc(pd.decode.port);
  EXPECT_EQ(json_number_field(dc.get("/get_server_info").body, "num_cached_tokens"), 0);
  std::string info = HttpClient(pd.prefill.port).get("/get_server_info").body;
  EXPECT_EQ(json_string_field(info, "disaggregation_mode"), "prefill");
  EXPECT_EQ(json_number_field(info, "disaggregation_bootstrap_port"), pd.bootstrap);
  EXPECT_GT(json_number_field(info, "num_cached_tokens"), 0);
  EXPECT_EQ(decode_queue(pd, "transfer"), 0);
  EXPECT_EQ(decode_queue(pd, "prealloc"), 0);
}

TEST(SimPd, PrefillFirstDecodeLaterStillMeets) {
  Pd pd;
  auto p = HttpClient(pd.prefill.port).post("/generate", pd.body(7, kText, 5));
  ASSERT_EQ(p.status, 200) << p.body;
  auto d = HttpClient(pd.decode.port).post("/generate", pd.body(7, kText, 5));
  EXPECT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json_number_field(d.body, "completion_tokens"), 5);
}

// The bootstrap port is SGLang's bootstrap server (aiohttp): its routes, statuses and bodies.
TEST(SimPd, BootstrapPortAnswersSglangsRoutes) {
  Pd pd(2);
  HttpClient b(pd.bootstrap);
  auto health = b.get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "OK");
  EXPECT_EQ(health.header("content-type"), "text/plain; charset=utf-8");

  // All four ranks -1: the prefill's parallel info (PrefillServerInfo).
  auto info = b.get(kInfoQuery);
  ASSERT_EQ(info.status, 200) << info.body;
  EXPECT_EQ(info.header("content-type"), "application/json; charset=utf-8");
  EXPECT_TRUE(has(info.body, R"("attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 2, "pp_size": 1)"))
      << info.body;
  EXPECT_EQ(json_number_field(info.body, "page_size"), 4);
  EXPECT_TRUE(has(info.body, R"("follow_bootstrap_room": true)")) << info.body;
  EXPECT_EQ(json_number_field(info.body, "prefill_http_port"), pd.prefill.port);
  EXPECT_TRUE(has(info.body, R"("kv_cache_dtype": "auto")")) << info.body;

  // A rank's address, as each prefill rank registered it.
  auto rank1 =
      b.get("/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0");
  ASSERT_EQ(rank1.status, 200) << rank1.body;
  EXPECT_EQ(json_string_field(rank1.body, "rank_ip"), "127.0.0.1");
  EXPECT_EQ(json_number_field(rank1.body, "rank_port"), pd.bootstrap);
  auto rank5 =
      b.get("/route?prefill_dp_rank=5&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0");
  EXPECT_EQ(rank5.status, 404);
  EXPECT_EQ(rank5.body, "Bootstrap info not found for dp_rank=5 cp_rank=0 tp_rank=0 pp_rank=0");
  auto missing = b.get("/route?prefill_dp_rank=0");
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(missing.body, "Missing inputs for bootstrap server.");
  // The query of builds before sglang#19168.
  auto old = b.get("/route?engine_rank=-1&target_dp_group=-1");
  ASSERT_EQ(old.status, 200) << old.body;
  EXPECT_EQ(json_number_field(old.body, "prefill_dp_size"), 2);
  auto post = b.request("POST", "/route", "");
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.body, "Method not allowed");

  // A rank registers with PUT /route (CommonKVManager.register_to_bootstrap's payload).
  auto put = b.request("PUT", "/route",
                       R"({"attn_tp_size":1,"attn_tp_rank":0,"attn_cp_size":1,"attn_cp_rank":0,)"
                       R"("attn_dp_size":1,"attn_dp_rank":0,"pp_size":1,"pp_rank":0,)"
                       R"("system_dp_size":3,"system_dp_rank":2,"rank_ip":"10.0.0.9",)"
                       R"("rank_port":17000,"page_size":4,"kv_cache_dtype":"auto"})");
  EXPECT_EQ(put.status, 200);
  EXPECT_EQ(put.body, "OK");
  auto rank2 =
      b.get("/route?prefill_dp_rank=2&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0");
  EXPECT_EQ(rank2.status, 200);
  EXPECT_EQ(rank2.body, R"({"rank_ip": "10.0.0.9", "rank_port": 17000})");
  EXPECT_EQ(b.request("PUT", "/route", R"({"attn_tp_size":1})").status, 500);

  // Per-room DP ranks, for prefills that do not follow bootstrap_room.
  auto reg = b.post("/register_dp_rank", R"({"bootstrap_room":77,"dp_rank":1})");
  EXPECT_EQ(reg.status, 200);
  EXPECT_EQ(reg.body, "OK");
  auto q = b.post("/query_dp_ranks", R"({"bootstrap_rooms":[77,78]})");
  EXPECT_EQ(q.status, 200);
  EXPECT_EQ(q.body, R"({"77": 1})");
  EXPECT_EQ(b.get("/register_dp_rank").status, 405);
  auto nope = b.get("/nope");
  EXPECT_EQ(nope.status, 404);
  EXPECT_EQ(nope.body, "404: Not Found");
}

// A prefill server with two DP ranks prefills a room on bootstrap_room % 2 unless routed_dp_rank
// pins it; the decode looks for the room there, or on the disagg_prefill_dp_rank in its own body.
TEST(SimPd, DpTwoPrefillFollowsTheRoomRule) {
  Pd pd(2);
  // The room picks the rank (odd: rank 1), with or without routed_dp_rank saying the same.
  auto [p, d] = pd.both(pd.body(1001, kText, 4, R"(,"routed_dp_rank":1)"), pd.body(1001, kText, 4));
  ASSERT_EQ(p.status, 200) << p.body;
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json_number_field(p.body, "dp_rank"), 1);
  EXPECT_EQ(json_number_field(d.body, "completion_tokens"), 4);
  auto [p2, d2] = pd.both(pd.body(2002, kText, 4));
  ASSERT_EQ(p2.status, 200) << p2.body;
  ASSERT_EQ(d2.status, 200) << d2.body;
  EXPECT_EQ(json_number_field(p2.body, "dp_rank"), 0);

  // Any room, the rank pinned on the prefill, disagg_prefill_dp_rank in both bodies.
  const std::string pinned = R"(,"disagg_prefill_dp_rank":1)";
  auto [p3, d3] = pd.both(pd.body(3000, kText, 4, R"(,"routed_dp_rank":1)" + pinned),
                          pd.body(3000, kText, 4, pinned));
  ASSERT_EQ(p3.status, 200) << p3.body;
  ASSERT_EQ(d3.status, 200) << d3.body;
  EXPECT_EQ(json_number_field(p3.body, "dp_rank"), 1);
  EXPECT_EQ(json_number_field(d3.body, "completion_tokens"), 4);
  EXPECT_GT(json_number_field(d3.body, "cached_tokens"), 0) << "rank 1 saw this prompt before";
}

// routed_dp_rank against the room's rank, without disagg_prefill_dp_rank: the prefill aborts the
// request (SGLang's CommonKVSender), and the decode, looking on the room's rank, times out.
TEST(SimPd, RoutedRankAgainstTheRoomIsTheConflictError) {
  Pd pd(2);
  auto [p, d] = pd.both(pd.body(4000, kText, 4, R"(,"routed_dp_rank":1,"rid":"conflict-1")"),
                        pd.body(4000, kText, 4));
  EXPECT_EQ(p.status, 500) << p.body;
  EXPECT_EQ(json_string_field(p.body, "message"),
            "Prefill bootstrap failed for request rank=0 req.rid='conflict-1' "
            "req.bootstrap_room=4000 with exception KVTransferError(bootstrap_room=4000): "
            "follow_bootstrap_room conflict: dispatched to dp_rank 1 but bootstrap_room 4000 "
            "implies dp_rank 0. Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow "
            "mixed routing.")
      << p.body;
  EXPECT_EQ(json_string_field(p.body, "type"), "500") << "FastAPI's HTTPException body";
  EXPECT_EQ(d.status, 500) << d.body;
  EXPECT_TRUE(has(d.body, "Request 4000 timed out after 1.")) << d.body;
  EXPECT_TRUE(has(d.body, "s in KVPoll.WaitingForInput")) << d.body;

  // Streamed, the prefill's /generate answers 200 and ends with the abort.
  auto s = HttpClient(pd.prefill.port)
               .post("/generate", stream_of(pd.body(4002, kText, 4, R"(,"routed_dp_rank":1)")));
  ASSERT_EQ(s.status, 200) << s.body;
  auto data = sse_data(s.body);
  ASSERT_EQ(data.size(), 2u) << s.body;
  EXPECT_TRUE(
      has(data[0], R"("finish_reason":{"type":"abort","message":"Prefill bootstrap failed)"))
      << data[0];
  EXPECT_TRUE(has(data[0], "dispatched to dp_rank 1 but bootstrap_room 4002 implies dp_rank 0"))
      << data[0];
  EXPECT_TRUE(has(data[0], R"("status_code":500,"err_type":null})")) << data[0];
  EXPECT_EQ(data[1], "[DONE]");
}

// The rank sent to the prefill but not to the decode: the prefill serves it on rank 1, the decode
// waits on the room's rank 0 and is aborted after its waiting timeout, as SGLang's decode is.
TEST(SimPd, DisaggRankOnlyOnThePrefillTimesOutTheDecode) {
  Pd pd(2);
  const std::string to_prefill = R"(,"routed_dp_rank":1,"disagg_prefill_dp_rank":1)";
  auto start = std::chrono::steady_clock::now();
  auto [p, d] = pd.both(pd.body(5000, kText, 4, to_prefill),
                        pd.body(5000, kText, 4, R"(,"rid":"mismatch-1")"));
  EXPECT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(json_number_field(p.body, "dp_rank"), 1);
  ASSERT_EQ(d.status, 500) << d.body;
  // "{elapsed:.1f}s": 1.0 unless the loop was late.
  const std::string message = json_string_field(d.body, "message");
  EXPECT_EQ(message.substr(0, message.find(" timed out after 1.")),
            "Decode transfer failed for request rank=0 decode_req.req.rid='mismatch-1' "
            "decode_req.req.bootstrap_room=5000 with exception "
            "KVTransferError(bootstrap_room=5000): Request 5000")
      << d.body;
  EXPECT_TRUE(message.ends_with("s in KVPoll.WaitingForInput")) << d.body;
  EXPECT_EQ(json_string_field(d.body, "type"), "500");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms);

  // Streamed: /generate answers 200 then the abort chunk; the OpenAI routes an error event.
  auto [p2, g] =
      pd.both(stream_of(pd.body(5002, kText, 4, to_prefill)), stream_of(pd.body(5002, kText, 4)));
  EXPECT_EQ(p2.status, 200);
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(g.header("content-type"), "text/event-stream");
  auto data = sse_data(g.body);
  ASSERT_EQ(data.size(), 2u) << g.body;
  EXPECT_TRUE(has(data[0], R"("finish_reason":{"type":"abort","message":"Decode transfer failed)"))
      << data[0];
  EXPECT_TRUE(has(data[0], "Request 5002 timed out after 1.")) << data[0];
  EXPECT_TRUE(has(data[0], R"(s in KVPoll.WaitingForInput","status_code":500)")) << data[0];
  EXPECT_TRUE(has(data[0], R"("status_code":500,"err_type":null})")) << data[0];
  EXPECT_EQ(json_number_field(data[0], "completion_tokens"), 0);
  EXPECT_EQ(data[1], "[DONE]");

  const std::string chat_fields = R"("bootstrap_host":"127.0.0.1","bootstrap_port":)" +
                                  std::to_string(pd.bootstrap) + R"(,"bootstrap_room":5004)";
  auto [p3, c] =
      pd.both(R"({"messages":[{"role":"user","content":"hi"}],"routed_dp_rank":1,)"
              R"("disagg_prefill_dp_rank":1,)" +
                  chat_fields + "}",
              R"({"messages":[{"role":"user","content":"hi"}],"stream":true,)" + chat_fields + "}",
              "/v1/chat/completions");
  EXPECT_EQ(p3.status, 200) << p3.body;
  ASSERT_EQ(c.status, 200) << c.body;
  data = sse_data(c.body);
  ASSERT_EQ(data.size(), 2u) << c.body;
  EXPECT_TRUE(has(data[0], R"({"error": {"object": "error", "message": "Decode transfer failed)"))
      << data[0];
  EXPECT_TRUE(has(data[0], R"("type": "INTERNAL_SERVER_ERROR", "param": null, "code": 500}})"))
      << data[0];
  EXPECT_EQ(data[1], "[DONE]");
}

// POST /abort_request ends a decode that waits for its KV: its client gets SGLang's abort.
TEST(SimPd, AbortRequestFreesAWaitingDecode) {
  Pd pd(1, 60);
  HttpClient control(pd.decode.port);
  auto none = control.post("/abort_request", R"({"rid":"nobody","abort_all":false})");
  EXPECT_EQ(none.status, 200);
  EXPECT_EQ(none.body, "");
  EXPECT_EQ(control.get("/abort_request").status, 405);
  EXPECT_EQ(control.post("/abort_request", "{nope").status, 422);

  auto start = std::chrono::steady_clock::now();
  auto d = std::async(std::launch::async, [&] {
    return HttpClient(pd.decode.port)
        .post("/generate", pd.body(6000, kText, 4, R"(,"rid":"wait-me")"));
  });
  ASSERT_TRUE(wait_until([&] { return decode_queue(pd, "transfer") == 1; }))
      << "the decode waits for its KV";
  auto a = control.post("/abort_request", R"({"rid":"wait-me","abort_all":false})");
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(a.body, "");
  auto r = d.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "not its 60 s timeout";
  ASSERT_EQ(r.status, 500) << r.body;
  EXPECT_EQ(json_string_field(r.body, "message"),
            "Decode transfer failed for request rank=0 decode_req.req.rid='wait-me' "
            "decode_req.req.bootstrap_room=6000 with exception "
            "KVTransferError(bootstrap_room=6000): Aborted by AbortReq.")
      << r.body;
  EXPECT_EQ(decode_queue(pd, "transfer"), 0);

  // Streamed, and found through abort_all.
  auto s = std::async(std::launch::async, [&] {
    return HttpClient(pd.decode.port)
        .post("/generate", stream_of(pd.body(6001, kText, 4, R"(,"rid":"wait-too")")));
  });
  ASSERT_TRUE(wait_until([&] { return decode_queue(pd, "transfer") == 1; }));
  EXPECT_EQ(control.post("/abort_request", R"({"abort_all":true})").status, 200);
  auto sr = s.get();
  ASSERT_EQ(sr.status, 200) << sr.body;
  auto data = sse_data(sr.body);
  ASSERT_EQ(data.size(), 2u) << sr.body;
  EXPECT_TRUE(has(data[0], "decode_req.req.rid='wait-too'")) << data[0];
  EXPECT_TRUE(has(data[0], "Aborted by AbortReq.")) << data[0];
  EXPECT_EQ(data[1], "[DONE]");
}

// A prefill request aborted while its KV leaves: the decode waiting for it fails as SGLang's does
// when the prefill reports the transfer failed.
TEST(SimPd, AbortedPrefillFailsTheDecode) {
  Pd pd(1, 60, {"--pd-transfer-fixed-ms", "400000"});  // 20 s at --time-scale 0.05
  auto p = std::async(std::launch::async, [&] {
    return HttpClient(pd.prefill.port)
        .post("/generate", pd.body(7000, kText, 4, R"(,"rid":"prefill-1")"));
  });
  auto d = std::async(std::launch::async, [&] {
    return HttpClient(pd.decode.port).post("/generate", pd.body(7000, kText, 4));
  });
  ASSERT_TRUE(wait_until([&] {
    auto r = HttpClient(pd.prefill.port).get("/v1/loads?include=disagg");
    return json_number_field(r.body, "prefill_inflight_queue_reqs") == 1;
  })) << "the prefill's KV is leaving";
  ASSERT_TRUE(wait_until([&] { return decode_queue(pd, "transfer") == 1; }));
  EXPECT_EQ(HttpClient(pd.prefill.port).post("/abort_request", R"({"rid":"prefill-1"})").status,
            200);
  auto pr = p.get();
  EXPECT_EQ(pr.status, 200) << pr.body;
  EXPECT_TRUE(has(pr.body, R"("finish_reason":{"type":"abort","message":"Aborted")")) << pr.body;
  auto dr = d.get();
  ASSERT_EQ(dr.status, 500) << dr.body;
  EXPECT_TRUE(has(dr.body,
                  "KVTransferError(bootstrap_room=7000): Failed to get kvcache from prefill "
                  "instance, it might be dead"))
      << dr.body;
}

// Without a reachable bootstrap server (nothing listens, no host given), the decode's handshake
// gives up after its attempts, as SGLang's (15 attempts; shortened here to fit the timeout).
TEST(SimPd, UnreachablePrefillIsAHandshakeFailure) {
  Pd pd;
  const int closed = free_port();
  auto start = std::chrono::steady_clock::now();
  auto d = HttpClient(pd.decode.port)
               .post("/generate", pd.body(5, kText, 5, R"(,"rid":"lost-1")", closed));
  EXPECT_EQ(d.status, 500) << d.body;
  EXPECT_EQ(json_string_field(d.body, "message"),
            "Decode handshake failed for request rank=0 decode_req.req.rid='lost-1' "
            "decode_req.req.bootstrap_room=5 with exception KVTransferError(bootstrap_room=5): "
            "Aborted by AbortReq.")
      << d.body;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  auto no_host = HttpClient(pd.decode.port)
                     .post("/generate", R"({"text":"hi","bootstrap_room":6,"bootstrap_port":)" +
                                            std::to_string(pd.bootstrap) + "}");
  EXPECT_EQ(no_host.status, 500);
  EXPECT_TRUE(has(no_host.body, "Decode handshake failed")) << no_host.body;
  // A prefill rank the bootstrap server does not know.
  auto bad_rank = HttpClient(pd.decode.port)
                      .post("/generate", pd.body(7, kText, 5, R"(,"disagg_prefill_dp_rank":3)"));
  EXPECT_EQ(bad_rank.status, 500);
  EXPECT_TRUE(has(bad_rank.body,
                  "Could not fetch bootstrap info for: prefill_dp_rank: 3 prefill_cp_rank: 0 "
                  "target_tp_rank: 0 and target_pp_rank 0"))
      << bad_rank.body;
}

// A request without bootstrap_room on a PD server: SGLang's scheduler aborts it with a 400.
TEST(SimPd, MissingRoomIsThe400Abort) {
  Pd pd;
  const std::string message =
      "Invalid request: Disaggregated request received without bootstrap room id. req.rid='r1'";
  for (int port : {pd.decode.port, pd.prefill.port}) {
    auto g = HttpClient(port).post("/generate", R"({"text":"hi","rid":"r1"})");
    EXPECT_EQ(g.status, 400);
    EXPECT_EQ(g.body, R"({"error":{"message":")" + message + R"("}})");
    auto chat = HttpClient(port).post(
        "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"rid":"r1"})");
    EXPECT_EQ(chat.status, 400);
    EXPECT_EQ(json_string_field(chat.body, "message"), message) << chat.body;
    auto s = HttpClient(port).post("/generate", R"({"text":"hi","rid":"r1","stream":true})");
    EXPECT_EQ(s.status, 200);
    EXPECT_TRUE(has(s.body, R"("status_code":400)")) << s.body;
  }
}

// The JSON value (compact) of `key` in an answer or stream event, at its top level or in its
// meta_info ("" when absent or not JSON).
std::string json_value(const std::string& text, const std::string& key) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return "";
  if (j.contains(key)) return j[key].dump();
  if (j.contains("meta_info") && j["meta_info"].is_object() && j["meta_info"].contains(key)) {
    return j["meta_info"][key].dump();
  }
  return "";
}

// The data payloads of a stream's events, without [DONE].
std::vector<std::string> stream_events(const Response& r) {
  auto data = sse_data(r.body);
  EXPECT_FALSE(data.empty()) << r.body;
  if (!data.empty() && data.back() == "[DONE]") data.pop_back();
  return data;
}

// /generate with return_logprob in PD, as SGLang answers it: the prefill server computes the
// prompt's rows (the same a plain server computes for the prompt) and its one output token's; the
// decode server computes none (empty input lists) but returns every output row, the first one
// having come with the KV. A PD gateway's merged answer is therefore a plain server's.
TEST(SimPd, PromptLogprobsComeFromThePrefill) {
  Pd pd(1, 5);
  Sim plain;
  plain.port = free_port();
  plain.args = {"--time-scale", "0.05", "--page-size", "4"};
  plain.start();
  const std::string lp =
      R"(,"return_logprob":true,"logprob_start_len":0,"top_logprobs_num":2,"token_ids_logprob":[7])";
  auto whole = HttpClient(plain.port)
                   .post("/generate", R"({"text":")" + kText +
                                          R"(","sampling_params":{"max_new_tokens":6})" + lp + "}");
  ASSERT_EQ(whole.status, 200) << whole.body;
  const auto prompt = static_cast<size_t>(json_number_field(whole.body, "prompt_tokens"));
  const std::string rows = json_value(whole.body, "input_token_logprobs");
  ASSERT_TRUE(rows.starts_with("[[null,")) << "the first prompt row has no logprob: " << rows;
  ASSERT_EQ(std::count(rows.begin(), rows.end(), '['), static_cast<long>(prompt + 1))
      << "one row per prompt token: " << rows;

  auto [p, d] = pd.both(pd.body(0x51, kText, 6, lp));
  ASSERT_EQ(p.status, 200) << p.body;
  ASSERT_EQ(d.status, 200) << d.body;
  for (const char* key :
       {"input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs"}) {
    EXPECT_EQ(json_value(p.body, key), json_value(whole.body, key)) << key;
    EXPECT_EQ(json_value(d.body, key), "[]") << key << ": the decode computes no prompt rows";
  }
  for (const char* key : {"output_token_logprobs", "output_top_logprobs"}) {
    EXPECT_EQ(json_value(d.body, key), json_value(whole.body, key)) << key;
  }
  EXPECT_EQ(json_number_field(d.body, "output_token_logprobs_length"), 6);
  // The prefill's one token, and its row.
  const std::string first = json_value(whole.body, "output_token_logprobs");
  EXPECT_EQ(json_value(p.body, "output_token_logprobs"),
            first.substr(0, first.find("],[") + 1) + "]");
  // token_ids_logprob rows do not travel with the KV: the decode's start at its second token.
  const std::string ids = json_value(whole.body, "output_token_ids_logprobs");
  EXPECT_EQ(json_value(d.body, "output_token_ids_logprobs"),
            "[" + ids.substr(ids.find("]],[[") + 3))
      << ids;

  // Streamed: the decode's every chunk has empty input lists and the output rows so far; the
  // prefill's chunk has the prompt rows.
  auto [ps, ds] = pd.both(stream_of(pd.body(0x52, kText, 6, lp)));
  auto pe = stream_events(ps);
  ASSERT_EQ(pe.size(), 1u) << ps.body;
  EXPECT_EQ(json_value(pe[0], "input_token_logprobs"),
            json_value(whole.body, "input_token_logprobs"));
  auto de = stream_events(ds);
  ASSERT_FALSE(de.empty()) << ds.body;
  size_t rows_before = 0;
  for (const auto& e : de) {
    EXPECT_EQ(json_value(e, "input_token_logprobs"), "[]") << e;
    const auto n = static_cast<size_t>(json_number_field(e, "output_token_logprobs_length"));
    EXPECT_GT(n, rows_before) << "cumulative: each chunk has every output row so far";
    EXPECT_EQ(n, static_cast<size_t>(json_number_field(e, "completion_tokens")));
    rows_before = n;
  }
  EXPECT_EQ(json_value(de.back(), "output_token_logprobs"),
            json_value(whole.body, "output_token_logprobs"));
}

// With --incremental-streaming-output the decode's chunks carry only their new output rows (the
// input lists, empty, in every chunk).
TEST(SimPd, IncrementalDecodeStreamCutsTheOutputRows) {
  Pd pd(1, 5, {}, {"--incremental-streaming-output"});
  auto [p, d] = pd.both(stream_of(pd.body(0x53, kText, 5, R"(,"return_logprob":true)")));
  ASSERT_EQ(p.status, 200) << p.body;
  auto de = stream_events(d);
  ASSERT_FALSE(de.empty()) << d.body;
  size_t rows = 0;
  for (const auto& e : de) {
    EXPECT_EQ(json_value(e, "input_token_logprobs"), "[]") << e;
    const std::string out = json_value(e, "output_token_logprobs");
    const auto in_chunk = static_cast<size_t>(std::count(out.begin(), out.end(), '[') - 1);
    const std::string ids = json_value(e, "output_ids");
    EXPECT_EQ(in_chunk, static_cast<size_t>(std::count(ids.begin(), ids.end(), ',') + 1)) << e;
    rows += in_chunk;
    EXPECT_EQ(json_number_field(e, "output_token_logprobs_length"), static_cast<double>(rows));
  }
  EXPECT_EQ(rows, 5u);
}

TEST(SimCli, BadKvEventsConfigAndPortsAreStartupErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const int taken = free_port();
  std::vector<Case> cases = {
      {{"--kv-events-config", "{nope"}, "--kv-events-config: not valid JSON"},
      {{"--kv-events-config", R"({"edpoint":"tcp://*:5557"})"}, "unknown key \"edpoint\""},
      {{"--kv-events-config", R"({"publisher":"kafka"})"},
       "\"publisher\" must be \"zmq\" or \"null\""},
      {{"--kv-events-config", R"({"endpoint":"ipc:///tmp/x"})"},
       "must be a tcp://HOST:PORT endpoint"},
      {{"--kv-events-config", R"({"publisher":"zmq","endpoint":"tcp://*:65535"})", "--dp-size",
        "2"},
       "past 65535"},
      {{"--kv-events-config",
        R"({"publisher":"zmq","endpoint":"tcp://*:6000","replay_endpoint":"tcp://*:6001"})",
        "--dp-size", "2"},
       "overlap"},
      {{"--kv-events-config", R"({"buffer_steps":-1})"}, "\"buffer_steps\" must be at least 0"},
      {{"--time-scale", "-1"}, "--time-scale: -1 is out of range"},
      {{"--disaggregation-mode", "both"}, "--disaggregation-mode: 'both' is not a valid value"},
      {{"--scheduler", "magic"}, "--scheduler: 'magic' is not a valid value"},
  };
  for (const auto& c : cases) {
    auto r = run("kvgate-sim", c.args);
    EXPECT_EQ(r.status, 2) << c.message;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
  // A PUB port already in use: the startup error names the endpoint.
  Sim holder;
  holder.port = free_port();
  holder.args = {"--kv-events-config",
                 R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(taken) + R"("})"};
  holder.start();
  auto r = run("kvgate-sim",
               {"--port", std::to_string(free_port()), "--kv-events-config",
                R"({"publisher":"zmq","endpoint":"tcp://*:)" + std::to_string(taken) + R"("})"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("cannot bind tcp://*:" + std::to_string(taken)), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace kvgate::testing
