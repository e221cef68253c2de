// pd/pd: see pd.h.
#include "pd/pd.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <nlohmann/json.hpp>

#include "gateway/stream_check.h"
#include "util/json.h"

namespace kvgate::pd {
namespace {

// An error answer kept for the client, and the longest stream event checked for an abort.
constexpr size_t kKeptLimit = 65536;
// The prefill's answer kept for a logprobs merge (a long prompt's rows are large).
constexpr size_t kKeepLimit = 16 << 20;

}  // namespace

uint64_t choose_room(uint64_t random, std::optional<int> rank, int64_t dp_size) {
  uint64_t room = random & ((uint64_t{1} << 63) - 1);
  if (!rank || dp_size <= 1 || *rank < 0) return room;
  const auto dp = static_cast<uint64_t>(dp_size);
  const auto r = static_cast<uint64_t>(*rank) % dp;
  room = room - room % dp + r;
  if (room >= (uint64_t{1} << 63)) room -= dp;  // stays below 2^63, same residue
  return room;
}

std::vector<BodyField> bootstrap_fields(const http::Target& prefill, int64_t port, uint64_t room) {
  std::string host;
  json::append_string(host, prefill.host);  // parse_url keeps IPv6 hosts without brackets
  std::vector<BodyField> fields;
  fields.reserve(6);
  fields.push_back({"bootstrap_host", std::move(host)});
  fields.push_back({"bootstrap_port", std::to_string(port)});
  fields.push_back({"bootstrap_room", std::to_string(room)});
  return fields;
}

namespace {
constexpr const char* kPromptKeys[] = {"input_token_logprobs", "input_top_logprobs",
                                       "input_token_ids_logprobs"};
}  // namespace

struct PromptLogprobs::Rows {
  nlohmann::json lists[std::size(kPromptKeys)];  // null: the prefill had none of that key
};

PromptLogprobs::PromptLogprobs(std::string_view prefill_answer) {
  nlohmann::json p = nlohmann::json::parse(prefill_answer, nullptr, false);
  if (!p.is_object()) return;
  auto meta = p.find("meta_info");
  if (meta == p.end() || !meta->is_object()) return;
  auto rows = std::make_shared<Rows>();
  bool any = false;
  for (size_t k = 0; k < std::size(kPromptKeys); ++k) {
    auto v = meta->find(kPromptKeys[k]);
    if (v == meta->end() || !v->is_array()) continue;
    rows->lists[k] = std::move(*v);
    any = true;
  }
  if (any) rows_ = std::move(rows);
}

bool PromptLogprobs::empty() const {
  return rows_ == nullptr;
}

std::string PromptLogprobs::merge(std::string_view decode) const {
  if (!rows_) return "";
  nlohmann::json d = nlohmann::json::parse(decode, nullptr, false);
  if (!d.is_object()) return "";
  auto dm = d.find("meta_info");
  if (dm == d.end() || !dm->is_object()) return "";
  for (size_t k = 0; k < std::size(kPromptKeys); ++k) {
    const nlohmann::json& prefill = rows_->lists[k];
    if (prefill.is_null()) continue;
    nlohmann::json rows = prefill;
    auto dv = dm->find(kPromptKeys[k]);
    if (dv != dm->end() && dv->is_array()) {
      for (auto& row : *dv) rows.push_back(std::move(row));
    }
    (*dm)[kPromptKeys[k]] = std::move(rows);
  }
  return d.dump();
}

std::string PromptLogprobs::merge_event(std::string_view event) const {
  std::string merged = merge(event_data(event));  // "" for [DONE] or no data: relayed as is
  return merged.empty() ? "" : "data: " + merged + "\n\n";
}

PrefillLeg::PrefillLeg(const Executor& ex, http::ConnectionPool& pool, WorkerPtr worker,
                       Clock::time_point deadline)
    : ex_(ex),
      pool_(pool),
      worker_(std::move(worker)),
      deadline_(deadline),
      done_(ex, Clock::time_point::max()) {}

PrefillLeg::~PrefillLeg() = default;

void PrefillLeg::start(std::string_view method, std::string_view target, http::HeaderList headers,
                       std::string body, http::UpstreamCall* decode) {
  decode_ = decode;
  std::vector<std::string> copied;
  copied.reserve(headers.size() * 2);
  for (const auto& h : headers) {
    copied.emplace_back(h.name);
    copied.emplace_back(h.value);
  }
  // The coroutine owns the leg from the start (not from its first resumption).
  asio::co_spawn(ex_,
                 run(shared_from_this(), std::string(method), std::string(target),
                     std::move(copied), std::move(body)),
                 asio::detached);
}

void PrefillLeg::abort() {
  if (state_ != State::kRunning) return;  // ended already: its outcome stands
  aborted_ = true;
  decode_ = nullptr;
  on_ok = nullptr;
  if (call_) call_->abort();
}

awaitable<void> PrefillLeg::wait() {
  if (finished()) co_return;
  co_await done_.async_wait(asio::as_tuple(use_awaitable));
}

void PrefillLeg::failed_in_answer(const StreamAbort& a, std::string_view json) {
  // As the request path classifies a decode's first event (stream_check.h).
  status_ = abort_status(a);
  request_error_ = request_error_status(status_);
  if (status_ == 0) status_ = 400;  // an error object naming no status: the request's
  answer_type_ = "application/json";
  answer_body_.assign(json.substr(0, kKeptLimit));
  error_ = "the prefill server " + worker_->url() + " aborted the request: " + a.message;
}

void PrefillLeg::finish(State s) {
  if (state_ != State::kRunning) return;
  state_ = s;
  if (s == State::kFailed && decode_) {
    decode_->abort();
    aborted_decode_ = true;
  }
  decode_ = nullptr;
  done_.cancel();  // first: whatever the hook below does, the request is woken
  if (s == State::kOk && on_ok) {
    auto f = std::move(on_ok);
    on_ok = nullptr;
    try {
      f();
    } catch (...) {  // a policy hook's failure is not the prefill's; the dispatch still closes
    }
  }
}

awaitable<void> PrefillLeg::run(std::shared_ptr<PrefillLeg> self, std::string method,
                                std::string target, std::vector<std::string> headers,
                                std::string body) {
  try {
    co_await self->exchange(std::move(method), std::move(target), std::move(headers),
                            std::move(body));
  } catch (const std::exception& e) {
    self->error_ = std::string("the prefill half failed inside kvgate: ") + e.what();
  } catch (...) {
    self->error_ = "the prefill half failed inside kvgate";
  }
  self->finish(State::kFailed);  // no-op when exchange() ended it; never left running
}

awaitable<void> PrefillLeg::exchange(std::string method, std::string target,
                                     std::vector<std::string> headers, std::string body) {
  if (aborted_) {
    error_ = "not sent: the attempt ended first";
    finish(State::kFailed);
    co_return;
  }
  std::vector<http::Header> list;
  list.reserve(headers.size() / 2);
  for (size_t i = 0; i + 1 < headers.size(); i += 2) list.push_back({headers[i], headers[i + 1]});
  http::UpstreamCall call(ex_, pool_, worker_->target(), worker_->id());
  call.set_deadline(deadline_);
  call_ = &call;
  struct Clear {
    http::UpstreamCall*& p;
    ~Clear() { p = nullptr; }
  } clear{call_};

  http::CallError e = co_await call.start(method, target, list, body);
  sent_ = call.request_sent();
  connect_time_ = call.connect_time();
  if (e != http::CallError::kNone) {
    call_error_ = e;
    error_ = aborted_ ? std::string("aborted: the attempt ended first")
                      : "no answer from the prefill server " + worker_->url() + " (" +
                            std::string(http::to_string(e)) +
                            (call.error_detail().empty() ? "" : ": " + call.error_detail()) + ")";
    finish(State::kFailed);
    co_return;
  }
  status_ = call.status();
  if (status_ < 200 || status_ >= 300) {
    request_error_ = request_error_status(status_);
    answer_type_ = std::string(call.header("content-type"));
    http::CallError re = co_await call.read_all(answer_body_, kKeptLimit);
    if (re != http::CallError::kNone) answer_body_.clear();
    error_ = "the prefill server " + worker_->url() + " answered HTTP " + std::to_string(status_);
    finish(State::kFailed);
    co_return;
  }
  // Read the answer to its end (the prefill request is done only when its KV has left), checking
  // a stream's events and a whole answer for an abort.
  const bool sse = call.header("content-type").starts_with("text/event-stream");
  // A whole answer's head comes once the prefill is done: its KV has left, and the decode has it
  // or is receiving it; from here a failure of this answer must not abort the decode.
  if (!sse) decode_ = nullptr;
  std::string pending;
  const size_t limit = keep_ ? kKeepLimit : kKeptLimit;
  for (;;) {
    http::CallError re = http::CallError::kNone;
    std::string_view piece = co_await call.read_view(re);  // in the connection's buffer
    if (!piece.empty()) {
      usage_.feed(piece);
      if (pending.size() + piece.size() <= limit) {
        pending.append(piece);
      } else {
        pending.clear();  // an event this long is not checked (nor is a long whole answer)
      }
      while (sse) {
        auto end = first_event_end(pending);
        if (!end) break;
        std::string_view event(pending.data(), *end);
        if (auto a = event_abort(event)) {
          failed_in_answer(*a, event_data(event));
          call.abort();
          finish(State::kFailed);
          co_return;
        }
        if (keep_) {
          std::string data = event_data(event);
          if (!data.empty() && data != "[DONE]") kept_ = std::move(data);
        }
        decode_ = nullptr;  // a good event: the prefill is done (its one token), the KV has left
        pending.erase(0, *end);
      }
    }
    if (re != http::CallError::kNone) {
      call_error_ = re;
      error_ = aborted_ ? std::string("aborted: the attempt ended first")
                        : "the prefill server " + worker_->url() + " broke off its answer (" +
                              std::string(http::to_string(re)) + ")";
      finish(State::kFailed);
      co_return;
    }
    if (piece.empty()) break;
  }
  if (!sse && !pending.empty()) {
    // A whole answer whose finish_reason says abort (as a stream's event would).
    std::string event = "data: " + pending + "\n\n";
    if (auto a = event_abort(event)) {
      failed_in_answer(*a, pending);
      finish(State::kFailed);
      co_return;
    }
    if (keep_) kept_ = std::move(pending);
  }
  finish(State::kOk);
}

}  // namespace kvgate::pd
