// Integration: prefill/decode disaggregation between two kvgate-sim binaries, driven as a PD
// gateway drives them (the same body with bootstrap_host/port/room to both at once). The decode
// server waits for its room's KV from the prefill server's bootstrap rendezvous; it fails with a
// clear error when the room never arrives, the prefill server is unreachable, or the fields are
// missing. Only the prefill side caches the prompt; the decode side reports the prefill's hit.
#include <gtest/gtest.h>

#include <future>

#include "support/cluster.h"

namespace kvgate::testing {
namespace {

struct Pd {
  Pd() {
    bootstrap = free_port();
    prefill.port = free_port();
    prefill.args = {"--disaggregation-mode",
                    "prefill",
                    "--disaggregation-bootstrap-port",
                    std::to_string(bootstrap),
                    "--time-scale",
                    "0.05",
                    "--page-size",
                    "4"};
    prefill.start();
    decode.port = free_port();
    decode.args = {"--disaggregation-mode",  "decode", "--time-scale", "0.05",
                   "--pd-room-timeout-secs", "1"};
    decode.start();
  }
  std::string body(uint64_t room, const std::string& text, int max_new, int port = 0) const {
    return R"({"text":")" + text + R"(","sampling_params":{"max_new_tokens":)" +
           std::to_string(max_new) + R"(},"bootstrap_host":"127.0.0.1","bootstrap_port":)" +
           std::to_string(port ? port : bootstrap) + R"(,"bootstrap_room":)" +
           std::to_string(room) + "}";
  }
  // Sends `b` to both servers at once; returns {prefill answer, decode answer}.
  std::pair<Response, Response> both(const std::string& b) const {
    auto p = std::async(std::launch::async,
                        [&] { return HttpClient(prefill.port).post("/generate", b); });
    auto d = std::async(std::launch::async,
                        [&] { return HttpClient(decode.port).post("/generate", b); });
    return {p.get(), d.get()};
  }
  int bootstrap = 0;
  Sim prefill, decode;
};

const std::string kText = "Tell me about the history of the printing press in Europe";

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
}

TEST(SimPd, PrefillFirstDecodeLaterStillMeets) {
  Pd pd;
  auto p = HttpClient(pd.prefill.port).post("/generate", pd.body(7, kText, 5));
  ASSERT_EQ(p.status, 200) << p.body;
  auto d = HttpClient(pd.decode.port).post("/generate", pd.body(7, kText, 5));
  EXPECT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(json_number_field(d.body, "completion_tokens"), 5);
}

TEST(SimPd, WrongRoomTimesOutWithAClearError) {
  Pd pd;
  auto start = std::chrono::steady_clock::now();
  auto p = std::async(std::launch::async, [&] {
    return HttpClient(pd.prefill.port).post("/generate", pd.body(1001, kText, 5));
  });
  auto d = HttpClient(pd.decode.port).post("/generate", pd.body(1002, kText, 5));
  EXPECT_EQ(p.get().status, 200);
  EXPECT_EQ(d.status, 500) << d.body;
  EXPECT_NE(d.body.find("bootstrap_room 1002 never arrived"), std::string::npos) << d.body;
  EXPECT_EQ(json_string_field(d.body, "type"), "500") << d.body;  // FastAPI's HTTPException body
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
}

// Streams: the decode server has answered 200 (a /generate stream's headers go out at once) when
// the KV fails to arrive, so the failure is an abort in the stream, as SGLang's decode sends it.
TEST(SimPd, StreamedTransferFailureIsAnAbortInTheStream) {
  Pd pd;
  std::string b = pd.body(2002, kText, 5);
  b.insert(b.size() - 1, R"(,"stream":true)");
  auto d = HttpClient(pd.decode.port).post("/generate", b);
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.header("content-type"), "text/event-stream");
  auto data = sse_data(d.body);
  ASSERT_EQ(data.size(), 2u) << d.body;
  EXPECT_EQ(data[1], "[DONE]");
  EXPECT_NE(data[0].find(R"("finish_reason":{"type":"abort","message":"PD transfer failed: )"),
            std::string::npos)
      << data[0];
  EXPECT_NE(data[0].find("bootstrap_room 2002 never arrived"), std::string::npos) << data[0];
  EXPECT_NE(data[0].find(R"("status_code":500,"err_type":null})"), std::string::npos) << data[0];
  EXPECT_EQ(json_number_field(data[0], "completion_tokens"), 0);

  auto chat = HttpClient(pd.decode.port)
                  .post("/v1/chat/completions",
                        R"({"messages":[{"role":"user","content":"hi"}],"stream":true,)"
                        R"("bootstrap_host":"127.0.0.1","bootstrap_port":)" +
                            std::to_string(pd.bootstrap) + R"(,"bootstrap_room":2003})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  data = sse_data(chat.body);
  ASSERT_EQ(data.size(), 2u) << chat.body;
  EXPECT_NE(data[0].find(R"("type": "INTERNAL_SERVER_ERROR", "param": null, "code": 500}})"),
            std::string::npos)
      << data[0];
  EXPECT_EQ(data[1], "[DONE]");
}

TEST(SimPd, MissingPrefillServerFailsFast) {
  Pd pd;
  const int closed = free_port();
  auto d = HttpClient(pd.decode.port).post("/generate", pd.body(5, kText, 5, closed));
  EXPECT_EQ(d.status, 500) << d.body;
  EXPECT_NE(d.body.find("cannot reach the prefill bootstrap server at 127.0.0.1:" +
                        std::to_string(closed)),
            std::string::npos)
      << d.body;
}

TEST(SimPd, MissingFieldsAre400NamingThem) {
  Pd pd;
  auto d =
      HttpClient(pd.decode.port).post("/generate", R"({"text":"hi","bootstrap_host":"127.0.0.1"})");
  EXPECT_EQ(d.status, 400);
  EXPECT_NE(d.body.find("missing: bootstrap_port, bootstrap_room"), std::string::npos) << d.body;
  auto chat = HttpClient(pd.decode.port)
                  .post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})");
  EXPECT_EQ(chat.status, 400);
  EXPECT_NE(chat.body.find("--disaggregation-mode decode"), std::string::npos) << chat.body;
  auto p = HttpClient(pd.prefill.port).post("/generate", R"({"text":"hi"})");
  EXPECT_EQ(p.status, 400);
  EXPECT_NE(p.body.find("missing: bootstrap_room"), std::string::npos) << p.body;
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
