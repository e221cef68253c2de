// Tests for sim/pd and sim/abort: SGLang's message texts; the bootstrap server's rooms, per
// (room, prefill DP rank), kept for a decode that asks late; the decode's wait (the rank it looks
// on, its timeout, an abort, an unknown rank, an unreachable server); the registry /abort_request
// finds requests in.
#include "sim/pd.h"

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <thread>

#include "sim/abort.h"
#include "support/http_client.h"
#include "support/process.h"

namespace kvgate::sim {
namespace {

using namespace std::chrono_literals;
using testing::HttpClient;

TEST(SimPdMessages, AreSglangs) {
  EXPECT_EQ(python_repr("abc"), "'abc'");
  EXPECT_EQ(python_repr("it's"), "\"it's\"");
  EXPECT_EQ(python_repr("a'b\"c"), "'a\\'b\"c'");
  EXPECT_EQ(python_repr("a\x01\x7f\nb"), "'a\\x01\\x7f\\nb'");
  EXPECT_EQ(kv_transfer_error(7, "x"), "KVTransferError(bootstrap_room=7): x");
  EXPECT_EQ(decode_failure(false, "r1", 7, waiting_timeout_reason(7, 300.04)),
            "Decode transfer failed for request rank=0 decode_req.req.rid='r1' "
            "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): "
            "Request 7 timed out after 300.0s in KVPoll.WaitingForInput");
  EXPECT_EQ(decode_failure(true, "r1", 7, "Aborted by AbortReq."),
            "Decode handshake failed for request rank=0 decode_req.req.rid='r1' "
            "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): "
            "Aborted by AbortReq.");
  EXPECT_EQ(prefill_bootstrap_failure("r2", 43, follow_bootstrap_room_conflict(0, 43, 2)),
            "Prefill bootstrap failed for request rank=0 req.rid='r2' req.bootstrap_room=43 with "
            "exception KVTransferError(bootstrap_room=43): follow_bootstrap_room conflict: "
            "dispatched to dp_rank 0 but bootstrap_room 43 implies dp_rank 1. Set "
            "SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.");
  EXPECT_EQ(missing_room_message("x"),
            "Invalid request: Disaggregated request received without bootstrap room id. "
            "req.rid='x'");
}

// One event loop on a thread, for the decode side's coroutines.
class Loop {
 public:
  Loop()
      : thread_([this] {
          auto guard = asio::make_work_guard(ctx);
          ctx.run();
        }) {}
  ~Loop() {
    ctx.stop();
    thread_.join();
  }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;
  asio::io_context ctx{1};

 private:
  std::thread thread_;
};

class SimPdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server = BootstrapServer::start(BootstrapSettings{.dp_size = 2, .page_size = 16}, error);
    ASSERT_TRUE(server) << error;
  }
  std::future<RoomWait> wait(RoomRequest r, std::shared_ptr<RequestControl> control = nullptr) {
    if (!control) control = std::make_shared<RequestControl>(loop.ctx.get_executor());
    r.host = "127.0.0.1";
    r.port = server->port();
    return asio::co_spawn(loop.ctx, wait_for_room(std::move(r), infos, std::move(control)),
                          asio::use_future);
  }
  std::string room(uint64_t room, int rank) {
    return HttpClient(server->port())
        .get("/kvgate_sim/room/" + std::to_string(room) +
             "?prefill_dp_rank=" + std::to_string(rank))
        .body;
  }
  Loop loop;  // destroyed after the server: its coroutines may still hold connections
  PrefillInfoTable infos;
  std::unique_ptr<BootstrapServer> server;
};

TEST_F(SimPdTest, RoomsArePerPrefillRankAndWaitForALateDecode) {
  // A decode already waiting for (6, rank 0) gets rank 0's answer, not rank 1's.
  auto waiting = std::async(std::launch::async, [&] { return room(6, 0); });
  server->room_ready(6, 1, RoomInfo{.prompt_tokens = 10, .cached_tokens = 11});
  server->room_ready(6, 0, RoomInfo{.prompt_tokens = 10, .cached_tokens = 22});
  std::string a = waiting.get();
  EXPECT_NE(a.find(R"("status": "success")"), std::string::npos) << a;
  EXPECT_NE(a.find(R"("prefill_dp_rank": 0)"), std::string::npos) << a;
  EXPECT_NE(a.find(R"("cached_tokens": 22)"), std::string::npos) << a;
  // Rank 1's answer was kept for a decode that asks later, and is given once.
  std::string b = room(6, 1);
  EXPECT_NE(b.find(R"("cached_tokens": 11)"), std::string::npos) << b;
  server->room_failed(8, 0, "the prefill request was cancelled");
  std::string c = room(8, 0);
  EXPECT_NE(c.find(R"("status": "failed")"), std::string::npos) << c;
  EXPECT_EQ(HttpClient(server->port()).get("/kvgate_sim/room/x").status, 400);
}

TEST_F(SimPdTest, DecodeWaitsOnTheRoomsRankOrItsOwnDisaggRank) {
  server->room_ready(9, 1, RoomInfo{.prompt_tokens = 5, .cached_tokens = 4});
  RoomRequest r;
  r.room = 9;  // 9 % 2: rank 1
  r.rid = "d1";
  r.timeout = 5s;
  RoomWait w = wait(r).get();
  ASSERT_TRUE(w.ok) << w.error;
  EXPECT_EQ(w.info.prompt_tokens, 5);
  EXPECT_EQ(w.info.cached_tokens, 4);

  // disagg_prefill_dp_rank in the decode's body wins over the room.
  server->room_ready(10, 1, RoomInfo{.prompt_tokens = 3, .cached_tokens = 0});
  r.room = 10;
  r.prefill_dp_rank = 1;
  w = wait(r).get();
  EXPECT_TRUE(w.ok) << w.error;

  // Announced on rank 1, looked for on rank 0 (11 % 2 would be 1, the body says 0): timeout.
  server->room_ready(11, 1, RoomInfo{.prompt_tokens = 3, .cached_tokens = 0});
  r.room = 11;
  r.prefill_dp_rank = 0;
  r.timeout = 200ms;
  w = wait(r).get();
  EXPECT_FALSE(w.ok);
  EXPECT_EQ(w.error.rfind("Decode transfer failed for request rank=0 decode_req.req.rid='d1' "
                          "decode_req.req.bootstrap_room=11 with exception "
                          "KVTransferError(bootstrap_room=11): Request 11 timed out after 0.",
                          0),
            0u)
      << w.error;
  EXPECT_NE(w.error.find("s in KVPoll.WaitingForInput"), std::string::npos) << w.error;

  // A rank the bootstrap server does not know: the handshake fails.
  r.prefill_dp_rank = 4;
  w = wait(r).get();
  EXPECT_EQ(w.error, decode_failure(true, "d1", 11,
                                    "Could not fetch bootstrap info for: prefill_dp_rank: 4 "
                                    "prefill_cp_rank: 0 target_tp_rank: 0 and target_pp_rank 0"));
}

TEST_F(SimPdTest, AbortEndsTheWaitAndCountsLeaveTheQueues) {
  DecodeQueues queues;
  auto control = std::make_shared<RequestControl>(loop.ctx.get_executor());
  RoomRequest r;
  r.room = 12;
  r.rid = "a1";
  r.timeout = 60s;
  r.queues = &queues;
  auto f = wait(r, control);
  ASSERT_TRUE(testing::wait_until([&] { return queues.transfer.load() == 1; }));
  EXPECT_EQ(queues.prealloc.load(), 0);
  control->abort();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  RoomWait w = f.get();
  EXPECT_FALSE(w.ok);
  EXPECT_EQ(w.error, decode_failure(false, "a1", 12, "Aborted by AbortReq."));
  EXPECT_EQ(queues.transfer.load(), 0);
}

TEST_F(SimPdTest, StopsWithADecodeStillWaiting) {
  // A decode long-polls a room nobody answers and is still connected when the server stops (what
  // an abort's closed connection looks like before the server has read the hang-up): its wait
  // must end with the server, before the server's event loop goes.
  asio::io_context io;
  Socket decode(io);
  decode.connect({asio::ip::make_address("127.0.0.1"), server->port()});
  asio::write(decode,
              asio::buffer(std::string_view(
                  "GET /kvgate_sim/room/77?prefill_dp_rank=0 HTTP/1.1\r\nhost: x\r\n\r\n")));
  // Round trips on another connection: the server (one thread) has taken the room's long poll
  // (its request was readable before this connection was made) by the time they are answered.
  HttpClient other(server->port());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(other.get("/health").status, 200);
  server.reset();
}

TEST_F(SimPdTest, UnreachableServerFailsTheHandshakeAfterItsAttempts) {
  RoomRequest r;
  r.room = 13;
  r.rid = "u1";
  r.retry_interval = 1ms;
  r.host = "127.0.0.1";
  r.port = testing::free_port();
  auto control = std::make_shared<RequestControl>(loop.ctx.get_executor());
  RoomWait w = asio::co_spawn(loop.ctx, wait_for_room(r, infos, control), asio::use_future).get();
  EXPECT_EQ(w.error, decode_failure(true, "u1", 13, "Aborted by AbortReq."));
  // No bootstrap_host at all: the same.
  r.host.clear();
  w = asio::co_spawn(loop.ctx, wait_for_room(r, infos, control), asio::use_future).get();
  EXPECT_EQ(w.error, decode_failure(true, "u1", 13, "Aborted by AbortReq."));
}

TEST(SimAbort, RegistryFindsRequestsByRid) {
  asio::io_context ctx;
  RequestRegistry reg;
  auto a = std::make_shared<RequestControl>(ctx.get_executor());
  auto b = std::make_shared<RequestControl>(ctx.get_executor());
  int interrupted = 0;
  a->set_interrupt([&] { ++interrupted; });
  auto ea = reg.add({"r1", "r1-b"}, a);
  {
    auto eb = reg.add({"r2"}, b);
    EXPECT_EQ(reg.size(), 3u);
    EXPECT_EQ(reg.abort("nobody", false), 0u);
    EXPECT_EQ(reg.abort("r1", false), 1u);
    ctx.run();
    EXPECT_TRUE(a->aborted());
    EXPECT_FALSE(b->aborted());
    EXPECT_EQ(interrupted, 1);
    EXPECT_EQ(reg.abort("", true), 2u) << "abort_all: each request once";
    ctx.restart();
    ctx.run();
    EXPECT_TRUE(b->aborted());
    EXPECT_EQ(interrupted, 1) << "an interruption fires once";
  }
  EXPECT_EQ(reg.size(), 2u) << "a finished request leaves the registry";
  ea.reset();
  EXPECT_EQ(reg.size(), 0u);
}

}  // namespace
}  // namespace kvgate::sim
