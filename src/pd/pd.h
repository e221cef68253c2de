// pd/pd: prefill/decode disaggregation for SGLang, the parts the request path runs per attempt.
// A prefill/decode pool's request goes to one prefill server (which computes the prompt's KV and
// sends it on) and one decode server (which waits for that KV, then generates), at once, with the
// same body plus SGLang's rendezvous fields: bootstrap_host (the prefill server's host),
// bootstrap_port (its bootstrap server) and bootstrap_room (a 63-bit id both sides agree on). The
// client gets the decode server's answer; the prefill server's is read here, beside it, to learn
// whether the prefill failed (then the decode would wait for a room that will not come: SGLang's
// decode gives up only after 300 s), and what it cached.
//
// With DP ranks on a prefill server, SGLang prefills a room on rank bootstrap_room % dp_size
// (unless the request names disagg_prefill_dp_rank, which newer builds read), and the decode
// server fetches the KV from that rank. choose_room() makes a random room land on the rank the
// prefill policy chose.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gateway/stream_check.h"
#include "gateway/usage_scanner.h"
#include "http/client.h"
#include "http/io.h"
#include "request/body_rewrite.h"
#include "workers/worker.h"

namespace kvgate::pd {

// A bootstrap_room from 63 random bits: as drawn without a rank (or with one rank), else the
// nearest room below 2^63 with room % dp_size == rank.
uint64_t choose_room(uint64_t random, std::optional<int> rank, int64_t dp_size);

// SGLang's rendezvous fields for a prefill server at `prefill` with bootstrap port `port`:
// bootstrap_host (the server's host, without IPv6 brackets), bootstrap_port, bootstrap_room.
std::vector<BodyField> bootstrap_fields(const http::Target& prefill, int64_t port, uint64_t room);

// /generate with return_logprob: SGLang's decode server computes no prompt rows (it sends the
// input_* lists empty), its prefill server does. PromptLogprobs holds the prefill's rows
// (meta_info.input_token_logprobs, input_top_logprobs, input_token_ids_logprobs of its answer, or
// of its stream's last event), parsed once, and puts them in front of the decode's, as
// sgl-model-gateway does.
class PromptLogprobs {
 public:
  explicit PromptLogprobs(std::string_view prefill_answer);
  // The prefill answer had rows to merge.
  bool empty() const;
  // `decode` (an answer's JSON) with the rows merged, or "" when it is not such an object (it is
  // then relayed as it is).
  std::string merge(std::string_view decode) const;
  // The same for one SSE event of the decode's stream (its raw text, blank line included).
  std::string merge_event(std::string_view event) const;

 private:
  struct Rows;
  std::shared_ptr<const Rows> rows_;
};

// The prefill half of one prefill/decode attempt. start() sends the prefill request and reads its
// answer to the end on a coroutine of its own; a failure there (no connection, an error status,
// an aborted stream) aborts the decode call it watches, so the request path, waiting on that call,
// wakes at once. The request path joins the leg (wait()) before its attempt ends: the leg never
// outlives the request.
class PrefillLeg : public std::enable_shared_from_this<PrefillLeg> {
 public:
  enum class State { kRunning, kOk, kFailed };

  PrefillLeg(const Executor& ex, http::ConnectionPool& pool, WorkerPtr worker,
             Clock::time_point deadline);
  ~PrefillLeg();
  PrefillLeg(const PrefillLeg&) = delete;
  PrefillLeg& operator=(const PrefillLeg&) = delete;

  // Sends `body` to the prefill worker (the headers are copied). `decode`, when given, is aborted
  // if the prefill fails while it is watched.
  void start(std::string_view method, std::string_view target, http::HeaderList headers,
             std::string body, http::UpstreamCall* decode);
  // Keep the answer's JSON (a whole answer, or a stream's last data event), for
  // merge_input_logprobs. Before start().
  void keep_answer() { keep_ = true; }
  // The kept JSON ("" when none, or longer than 64 MiB).
  const std::string& answer_json() const { return kept_; }
  // Called once when the prefill answered in full (its KV has left), unless abort() came first.
  std::function<void()> on_ok;
  // The decode half has its KV (its first event arrived, or its whole answer): a prefill failure
  // no longer concerns it.
  void release_decode() { decode_ = nullptr; }
  // Ends the prefill call if it still runs (the attempt is over without it).
  void abort();
  // Until the leg has ended.
  awaitable<void> wait();

  State state() const { return state_; }
  bool failed() const { return state_ == State::kFailed; }
  // The leg's failure aborted the decode call it watched (which then reports kAborted).
  bool aborted_decode() const { return aborted_decode_; }
  bool finished() const { return state_ != State::kRunning; }
  // The prefill's answer (0 when none came) and, for a failure, why (for logs and the client).
  int status() const { return status_; }
  const std::string& error() const { return error_; }
  // The request reached the prefill server (it may have computed the prompt).
  bool request_sent() const { return sent_; }
  // abort() came while the leg ran: its failure, if any, is the attempt's doing.
  bool ended_by_attempt() const { return aborted_; }
  // The failure is the request's own (a 4xx answer, or an error event naming none or a 4xx, as
  // the request path's first-event check classifies them): relayed, not retried.
  bool request_error() const { return request_error_; }
  // A transport failure (no answer), as the upstream call classified it.
  http::CallError call_error() const { return call_error_; }
  // An error answer's own body and content type (at most 64 KiB; a stream's error event: its
  // JSON), to give the client when the prefill refused the request itself.
  const std::string& answer_body() const { return answer_body_; }
  const std::string& answer_type() const { return answer_type_; }
  // What the prefill server reported of the prompt (meta_info / usage).
  const UsageScanner& usage() const { return usage_; }
  const WorkerPtr& worker() const { return worker_; }
  // The prefill call's connect time when it made a new connection (UpstreamCall::connect_time).
  std::optional<Clock::duration> connect_time() const { return connect_time_; }

 private:
  awaitable<void> run(std::shared_ptr<PrefillLeg> self, std::string method, std::string target,
                      std::vector<std::string> headers, std::string body);
  awaitable<void> exchange(std::string method, std::string target, std::vector<std::string> headers,
                           std::string body);
  void finish(State s);
  // The answer aborted the request (an error status in its body, or a stream's abort event).
  void failed_in_answer(const StreamAbort& a, std::string_view json);

  Executor ex_;
  http::ConnectionPool& pool_;
  WorkerPtr worker_;
  Clock::time_point deadline_;
  http::UpstreamCall* call_ = nullptr;    // while run() has one
  http::UpstreamCall* decode_ = nullptr;  // aborted on a prefill failure while set
  Timer done_;
  State state_ = State::kRunning;
  bool aborted_ = false;
  bool keep_ = false;
  bool aborted_decode_ = false;
  bool request_error_ = false;
  std::optional<Clock::duration> connect_time_;
  std::string kept_;
  bool sent_ = false;
  int status_ = 0;
  http::CallError call_error_ = http::CallError::kNone;
  std::string error_;
  std::string answer_body_, answer_type_;
  UsageScanner usage_;
};

}  // namespace kvgate::pd
