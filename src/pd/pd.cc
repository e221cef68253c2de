// pd/pd: see pd.h.
#include "pd/pd.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <nlohmann/json.hpp>

#include "gateway/stream_check.h"

namespace kvgate::pd {
namespace {

constexpr size_t kReadBuffer = 16384;
// An error answer kept for the client, and the longest stream event checked for an abort.
constexpr size_t kKeptLimit = 65536;
// The prefill's answer kept for a logprobs merge (a long prompt's rows are large).
constexpr size_t kKeepLimit = 64 << 20;

// The data payload of one SSE event ("" for none or [DONE]).
std::string_view event_data(std::string_view event) {
  size_t at = event.starts_with("data:") ? 0 : event.find("\ndata:");
  if (at == std::string_view::npos) return {};
  if (at != 0) ++at;
  std::string_view data = event.substr(at + 5);
  if (!data.empty() && data.front() == ' ') data.remove_prefix(1);
  data = data.substr(0, data.find('\n'));
  while (!data.empty() && data.back() == '\r') data.remove_suffix(1);
  return data == "[DONE]" ? std::string_view{} : data;
}

}  // namespace

std::string merge_input_logprobs(std::string_view prefill, std::string_view decode) {
  using nlohmann::json;
  json p = json::parse(prefill, nullptr, false);
  json d = json::parse(decode, nullptr, false);
  if (!p.is_object() || !d.is_object()) return "";
  auto pm = p.find("meta_info");
  auto dm = d.find("meta_info");
  if (pm == p.end() || dm == d.end() || !pm->is_object() || !dm->is_object()) return "";
  bool merged = false;
  for (const char* key :
       {"input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs"}) {
    auto pv = pm->find(key);
    if (pv == pm->end() || !pv->is_array()) continue;
    json rows = *pv;
    auto dv = dm->find(key);
    if (dv != dm->end() && dv->is_array()) {
      for (auto& row : *dv) rows.push_back(std::move(row));
    }
    (*dm)[key] = std::move(rows);
    merged = true;
  }
  return merged ? d.dump() : "";
}

std::string merge_input_logprobs_event(std::string_view prefill, std::string_view event) {
  std::string_view data = event_data(event);
  if (data.empty()) return "";
  std::string merged = merge_input_logprobs(prefill, data);
  return merged.empty() ? "" : "data: " + merged + "\n\n";
}

uint64_t choose_room(uint64_t random, std::optional<int> rank, int64_t dp_size) {
  uint64_t room = random & ((uint64_t{1} << 63) - 1);
  if (!rank || dp_size <= 1 || *rank < 0) return room;
  const auto dp = static_cast<uint64_t>(dp_size);
  const auto r = static_cast<uint64_t>(*rank) % dp;
  room = room - room % dp + r;
  if (room >= (uint64_t{1} << 63)) room -= dp;  // stays below 2^63, same residue
  return room;
}

std::string bootstrap_host(const http::Target& prefill) {
  return prefill.host;
}

PrefillLeg::PrefillLeg(const asio::any_io_executor& ex, http::ConnectionPool& pool,
                       WorkerPtr worker, Clock::time_point deadline)
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
  asio::co_spawn(ex_,
                 run(std::string(method), std::string(target), std::move(copied), std::move(body)),
                 asio::detached);
}

void PrefillLeg::abort() {
  aborted_ = true;
  decode_ = nullptr;
  on_ok = nullptr;
  if (call_) call_->abort();
}

awaitable<void> PrefillLeg::wait() {
  if (finished()) co_return;
  co_await done_.async_wait(asio::as_tuple(asio::use_awaitable));
}

void PrefillLeg::finish(State s) {
  if (state_ != State::kRunning) return;
  state_ = s;
  if (s == State::kFailed && decode_) {
    decode_->abort();
    aborted_decode_ = true;
  }
  decode_ = nullptr;
  if (s == State::kOk && on_ok) {
    auto f = std::move(on_ok);
    on_ok = nullptr;
    f();
  }
  done_.cancel();
}

awaitable<void> PrefillLeg::run(std::string method, std::string target,
                                std::vector<std::string> headers, std::string body) {
  auto self = shared_from_this();  // the leg lives until its call has ended
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
  std::string pending;
  const size_t limit = keep_ ? kKeepLimit : kKeptLimit;
  std::unique_ptr<char[]> buf(new char[kReadBuffer]);
  for (;;) {
    http::CallError re = http::CallError::kNone;
    size_t n = co_await call.read_some(buf.get(), kReadBuffer, re);
    if (n > 0) {
      std::string_view piece(buf.get(), n);
      usage_.feed(piece);
      if (pending.size() + n <= limit) {
        pending.append(piece);
      } else {
        pending.clear();  // an event this long is not checked (nor is a long whole answer)
      }
      while (sse) {
        auto end = first_event_end(pending);
        if (!end) break;
        if (auto a = event_abort(std::string_view(pending).substr(0, *end))) {
          status_ = a->status != 0 ? a->status : 500;
          error_ = "the prefill server " + worker_->url() + " aborted the request: " + a->message;
          call.abort();
          finish(State::kFailed);
          co_return;
        }
        if (keep_) {
          std::string_view data = event_data(std::string_view(pending).substr(0, *end));
          if (!data.empty()) kept_.assign(data);
        }
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
    if (n == 0) break;
  }
  if (!sse && !pending.empty()) {
    // A whole answer whose finish_reason says abort (as a stream's event would).
    std::string event = "data: " + pending + "\n\n";
    if (auto a = event_abort(event)) {
      status_ = a->status != 0 ? a->status : 500;
      error_ = "the prefill server " + worker_->url() + " aborted the request: " + a->message;
      finish(State::kFailed);
      co_return;
    }
    if (keep_) kept_ = std::move(pending);
  }
  finish(State::kOk);
}

}  // namespace kvgate::pd
