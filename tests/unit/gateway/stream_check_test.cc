// gateway/stream_check: a worker's SSE stream's first event, and what an abort in it stands for
// (shared by the request path's first-event check and the prefill half of prefill/decode).
#include "gateway/stream_check.h"

#include <gtest/gtest.h>

namespace kvgate {
namespace {

TEST(StreamCheck, FirstEventEnd) {
  EXPECT_FALSE(first_event_end("data: {\"a\":1}\n"));
  EXPECT_EQ(first_event_end("data: {\"a\":1}\n\ndata: x"), 15u);
  EXPECT_TRUE(first_event_end("data: {}\r\n\r\n"));
}

TEST(StreamCheck, AbortsAndWhatTheyStandFor) {
  // SGLang's /generate abort chunk with a status: that status.
  auto a = event_abort(
      R"(data: {"text":"","meta_info":{"finish_reason":{"type":"abort","message":"queue full","status_code":503}}})"
      "\n\n");
  ASSERT_TRUE(a);
  EXPECT_EQ(abort_status(*a), 503);
  EXPECT_FALSE(request_error_status(abort_status(*a)));
  // An engine abort naming no status (a drain): the worker's doing, a 503.
  a = event_abort(R"(data: {"meta_info":{"finish_reason":{"type":"abort","message":"Aborted"}}})"
                  "\n\n");
  ASSERT_TRUE(a);
  EXPECT_EQ(abort_status(*a), 503);
  // An error object naming none: the request's own error (SGLang streams a ValueError so).
  a = event_abort("data: {\"error\":{\"message\":\"input too long\"}}\n\n");
  ASSERT_TRUE(a);
  EXPECT_EQ(abort_status(*a), 0);
  EXPECT_TRUE(request_error_status(abort_status(*a)));
  // Statuses: 4xx are the request's, except timeouts and rate limits; 5xx are the worker's.
  EXPECT_TRUE(request_error_status(400));
  EXPECT_TRUE(request_error_status(404));
  EXPECT_FALSE(request_error_status(408));
  EXPECT_FALSE(request_error_status(429));
  EXPECT_FALSE(request_error_status(500));
  EXPECT_FALSE(request_error_status(503));
  // A normal chunk is no abort.
  EXPECT_FALSE(event_abort("data: {\"text\":\"hi\",\"meta_info\":{\"finish_reason\":null}}\n\n"));
}

TEST(StreamCheck, KvTransferFailuresAreRecognized) {
  // SGLang's decode messages (DecodeTransferQueue / DecodePreallocQueue).
  EXPECT_TRUE(kv_transfer_failure(
      "Decode transfer failed for request rank=0 decode_req.req.rid='x' "
      "decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): Request 7 "
      "timed out after 300.0s in KVPoll.WaitingForInput"));
  EXPECT_TRUE(kv_transfer_failure("Decode handshake failed for request rank=0 ..."));
  EXPECT_TRUE(kv_transfer_failure("KVTransferError(bootstrap_room=1): Aborted by AbortReq."));
  EXPECT_FALSE(kv_transfer_failure("queue full"));
  EXPECT_FALSE(kv_transfer_failure(""));
}

}  // namespace
}  // namespace kvgate
