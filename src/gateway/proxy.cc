// gateway/proxy: the proxied request, phase by phase (see gateway.h for the order), and the state
// each request thread keeps between requests.
#include <boost/asio/as_tuple.hpp>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "gateway/decision_log.h"
#include "gateway/errors.h"
#include "gateway/gateway.h"
#include "gateway/knobs.h"
#include "gateway/output_events.h"
#include "gateway/stream_check.h"
#include "gateway/usage_scanner.h"
#include "http/client.h"
#include "http/traceparent.h"
#include "pd/pd.h"
#include "request/body_rewrite.h"
#include "util/json.h"
#include "util/log.h"
#include "util/random.h"

namespace kvgate {
namespace {

constexpr int kClientClosedStatus = 499;  // nginx's convention for "client went away"
// A stream's first event is read before the client sees anything (it may be an abort): at most
// this much of it. A longer first event is relayed without the check.
constexpr size_t kFirstEventLimit = 65536;
// A refused answer (429/503...) is kept, up to this size, to give the client when no retry works.
constexpr size_t kSavedAnswerLimit = 65536;
// Longest `model` a request may name (OpenAI and Hugging Face ids are far shorter).
constexpr size_t kMaxModelNameBytes = 256;
// Prefill/decode: how long a served request waits for its prefill's own answer.
constexpr auto kPrefillAnswerWait = std::chrono::seconds(3);
// Prefill/decode with return_logprob: the longest answer (or stream event) merged.
constexpr size_t kMaxMergedAnswer = 16 << 20;

// Watching a client for disconnects costs an I/O operation per request, so it starts only for
// requests still running after kWatchDelay, found by one sweep timer per thread: short requests
// never pay for it, long ones (queued, or long generations: the ones worth cancelling) are watched.
constexpr auto kWatchDelay = std::chrono::milliseconds(20);

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Per-site limits of the warnings a failing worker can make on every request (a dead worker
// under load would otherwise write thousands of lines a second; suppressed ones are counted on
// the next line of the site).
log::RateLimit kLogAttemptFailed(20, std::chrono::seconds(10));
log::RateLimit kLogRetryableStatus(20, std::chrono::seconds(10));
log::RateLimit kLogNoFirstEvent(20, std::chrono::seconds(10));
log::RateLimit kLogFirstEventAbort(20, std::chrono::seconds(10));
log::RateLimit kLogMidResponse(20, std::chrono::seconds(10));
log::RateLimit kLogPrefillFailed(20, std::chrono::seconds(10));
log::RateLimit kLogNoPromptLogprobs(20, std::chrono::seconds(10));

// What a client going away cancels: its wait in the admission queue, its upstream call.
struct Cancel {
  Admission* admission = nullptr;
  std::shared_ptr<Admission::Waiter> waiter;
  http::UpstreamCall* call = nullptr;
  Timer* backoff = nullptr;           // a retry's wait (its Retry-After may be long)
  pd::PrefillLeg* prefill = nullptr;  // prefill/decode: the prefill half's call
  void fire() {
    if (waiter && admission) admission->cancel(waiter);
    if (call) call->abort();
    if (backoff) backoff->cancel();
    if (prefill) prefill->abort();
  }
};

struct PendingWatch {
  PendingWatch* prev = this;
  PendingWatch* next = this;
  http::Exchange* ex = nullptr;
  Cancel* cancel = nullptr;
  Clock::time_point since{};
  void unlink() {
    prev->next = next;
    next->prev = prev;
    prev = next = this;
  }
};

}  // namespace

struct RequestThread::State {
  explicit State(const GatewayConfig& c) : pool(upstream_pool_options(c)) {}
  http::ConnectionPool pool;
  PendingWatch pending;  // list head
  std::unique_ptr<Timer> sweep;
  std::unique_ptr<Timer> reaper;
  bool sweeping = false;
  bool closed = false;
};

namespace {

thread_local RequestThread::State* tl_state = nullptr;

// The calling thread's state, bound by whoever runs the thread (RequestThread::bind).
RequestThread::State& thread_state() {
  if (!tl_state) {
    std::fprintf(stderr, "kvgate: a request ran on a thread without RequestThread::bind()\n");
    std::abort();
  }
  return *tl_state;
}

// Drops idle upstream connections past their reuse time, once a second: a worker closes its end
// of them soon after (uvicorn: 5 s), and they would sit half-closed until the next request to
// that worker.
void start_reaper(RequestThread::State& ts, const Executor& ex) {
  if (ts.reaper || ts.closed) return;
  ts.reaper = std::make_unique<Timer>(ex);
  struct Loop {
    RequestThread::State* ts;
    void operator()(const boost::system::error_code& ec) const {
      if (ec || ts->closed || !ts->reaper) return;
      ts->pool.reap(coarse_now());
      ts->reaper->expires_after(std::chrono::seconds(1));
      ts->reaper->async_wait(*this);
    }
  };
  ts.reaper->expires_after(std::chrono::seconds(1));
  ts.reaper->async_wait(Loop{&ts});
}

void sweep_watches(RequestThread::State& ts) {
  ts.sweep->expires_after(kWatchDelay);
  ts.sweep->async_wait([&ts](const boost::system::error_code& ec) {
    if (ec || ts.closed) {
      ts.sweeping = false;
      return;
    }
    auto due = coarse_now() - kWatchDelay;
    for (PendingWatch* w = ts.pending.next; w != &ts.pending;) {
      PendingWatch* next = w->next;
      if (w->since <= due) {
        w->ex->watch_disconnect([cancel = w->cancel] { cancel->fire(); });
        w->unlink();
      }
      w = next;
    }
    if (ts.pending.next == &ts.pending) {
      ts.sweeping = false;
    } else {
      sweep_watches(ts);
    }
  });
}

// Registers a request for the sweep; on destruction stops its watch (whichever was set up).
class WatchGuard {
 public:
  WatchGuard(RequestThread::State& ts, http::Exchange& ex, Cancel* cancel) : ex_(ex) {
    node_.ex = &ex;
    node_.cancel = cancel;
    node_.since = coarse_now();
    node_.prev = ts.pending.prev;
    node_.next = &ts.pending;
    ts.pending.prev->next = &node_;
    ts.pending.prev = &node_;
    if (!ts.sweeping && !ts.closed) {
      if (!ts.sweep) ts.sweep = std::make_unique<Timer>(ex.executor());
      ts.sweeping = true;
      sweep_watches(ts);
    }
  }
  ~WatchGuard() {
    node_.unlink();
    ex_.unwatch_disconnect();
  }
  WatchGuard(const WatchGuard&) = delete;
  WatchGuard& operator=(const WatchGuard&) = delete;

 private:
  http::Exchange& ex_;
  PendingWatch node_;
};

// What a policy may read of the request's headers. X-SMG-Target-Worker pins a worker: only
// honoured when the operator allows it (--allow-target-worker-header).
struct HeaderView {
  const http::Exchange* ex;
  bool allow_target;
};
std::string_view header_of(const void* self, std::string_view name) {
  const auto* v = static_cast<const HeaderView*>(self);
  if (!v->allow_target && http::iequals(name, "x-smg-target-worker")) return {};
  return v->ex->header(name);
}

// Header names a message lists in its Connection header(s): hop-by-hop for this message only.
class ConnectionTokens {
 public:
  void add(std::string_view value) {
    while (!value.empty()) {
      size_t comma = value.find(',');
      std::string_view t = value.substr(0, comma);
      value = comma == std::string_view::npos ? std::string_view{} : value.substr(comma + 1);
      while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
      while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
      if (!t.empty() && tokens_.size() < 32) tokens_.push_back(t);
    }
  }
  bool contains(std::string_view name) const {
    for (auto t : tokens_) {
      if (http::iequals(t, name)) return true;
    }
    return false;
  }
  bool empty() const { return tokens_.empty(); }

  // The tokens of a message's Connection fields (an Exchange's request or an UpstreamCall's
  // answer); the fields are walked only when the head has one.
  template <class Message>
  static ConnectionTokens of(const Message& m) {
    ConnectionTokens t;
    if (m.has_connection_header()) {
      m.for_each_header([&](std::string_view name, std::string_view value) {
        if (http::iequals(name, "connection")) t.add(value);
      });
    }
    return t;
  }

 private:
  std::vector<std::string_view> tokens_;
};

// A Forwarded "for=" node (RFC 7239): IPv6 addresses quoted and bracketed.
std::string forwarded_node(const std::string& addr) {
  if (addr.find(':') != std::string::npos) return "\"[" + addr + "]\"";
  return addr.empty() ? "unknown" : addr;
}

// How an attempt's outcome counts for the worker's circuit breaker.
enum class Verdict { kSuccess, kFailure, kNeutral };

// A dispatch to one worker: opened with the policy's on_dispatched and the worker's in-flight
// count; closed exactly once with the outcome (policy on_completed, breaker), on every path,
// including a coroutine destroyed at shutdown (then as a client abort).
// Decides nothing and hears nothing: the dispatch of a request pinned to a worker the rule's
// policy did not choose, so its hooks must not hear of it: the doctor's, or one that must reach
// the worker holding its response (/v1/responses).
class PinnedPolicy final : public Policy {
 public:
  explicit PinnedPolicy(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  Decision select(std::span<Worker* const> /*available*/, RouteContext& /*ctx*/) override {
    return {};
  }

 private:
  std::string_view name_;
};
PinnedPolicy& pinned_policy() {
  static PinnedPolicy policy("doctor");
  return policy;
}
PinnedPolicy& owner_policy() {
  static PinnedPolicy policy("response_owner");
  return policy;
}

// Owner lookups (GET /v1/responses/{id} to every worker) in flight from this thread: one per
// request whose response the gateway does not remember; bounded so a burst of unknown ids after a
// restart cannot multiply into a storm of calls.
thread_local int tl_owner_lookups = 0;
constexpr int kMaxOwnerLookups = 16;
constexpr size_t kMaxOwnerLookupWorkers = 64;
constexpr auto kOwnerLookupTimeout = std::chrono::seconds(5);
// A lookup reads no more of a worker's answer than this (the status is what it asks).
constexpr size_t kOwnerLookupBodyLimit = 16 << 10;
// The beginning of a /v1/responses answer searched for the response's id.
constexpr size_t kResponseIdScanLimit = 16384;

// What a dispatch's entry in the decision log says of its request (views into the request and
// its pinned pool, which outlive the dispatch).
struct DispatchNote {
  DecisionLog* log = nullptr;  // null: not recorded
  std::string_view rid, rule, route, model, role;
  int attempt = 1;
  int64_t page_size = 0;  // kv_exact's, when it decided
};

class Dispatch {
 public:
  Dispatch(Policy& policy, RouteContext& ctx, const Decision& d, CircuitBreaker::Pass pass,
           const DispatchNote& note = {})
      : policy_(policy), ctx_(ctx), d_(d), pass_(pass), note_(note), opened_(Clock::now()) {
    try {
      policy_.on_dispatched(d_, ctx_);
    } catch (...) {
      d_.worker->record_neutral(pass_);  // a trial pass must never be lost
      throw;
    }
    d_.worker->begin_request();
  }
  ~Dispatch() {
    if (!done_) {
      finish(Outcome{.status = kClientClosedStatus, .ok = false, .started = started_guess},
             Verdict::kNeutral);
    }
    d_.worker->end_request();
  }
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  // The stream's first event: the worker's prefill is done.
  void first_token() {
    if (done_ || first_token_) return;
    // Before the hook: a policy settles the prefill first thing in it (kv_exact), so one that
    // threw after that must not have on_completed settle it again.
    first_token_ = true;
    policy_.on_first_token(d_, ctx_);
  }
  void finish(Outcome o, Verdict v) {
    if (done_) return;
    done_ = true;
    o.first_token = first_token_;
    Worker& w = *d_.worker;
    switch (v) {
      case Verdict::kSuccess:
        w.record_success(pass_);
        break;
      case Verdict::kFailure:
        w.record_failure(pass_, Clock::now());
        break;
      case Verdict::kNeutral:
        w.record_neutral(pass_);
        break;
    }
    policy_.on_completed(d_, ctx_, o);
    if (note_.log) {
      try {
        note_.log->add(record(o));
      } catch (...) {
        // (Also reached from the destructor: the log loses an entry, nothing else.)
      }
    }
  }
  // Prompt tokens the decision expected the worker to hold (gateway/decision_log.h), given what
  // the worker reported.
  uint64_t predicted_cached(const Outcome& o) const {
    return predicted_cached_tokens(d_.predicted_tokens, d_.predicted_chars, request_chars(),
                                   o.prompt_tokens);
  }
  // The decision log's entry of this dispatch, closed with `o`.
  DecisionRecord record(const Outcome& o) const {
    DecisionRecord r;
    r.time = std::chrono::system_clock::now();
    r.duration_ms = std::chrono::duration<double, std::milli>(Clock::now() - opened_).count();
    r.rid = note_.rid;
    r.rule = note_.rule;
    r.worker = d_.worker->url();
    r.route = note_.route;
    r.model = note_.model;
    r.policy = policy_.name();
    r.branch = d_.branch;
    r.fallback_branch = d_.inner_branch;
    r.role = note_.role;
    r.rank = d_.dp_rank.value_or(-1);
    r.attempt = note_.attempt;
    r.status = o.status;
    r.started = o.started;
    r.page_size = note_.page_size;
    r.predicted_tokens = d_.predicted_tokens;
    r.predicted_chars = d_.predicted_chars;
    if (const RequestInfo* req = ctx_.request) r.request_tokens = req->tokens.size();
    r.request_chars = request_chars();
    r.prompt_tokens = o.prompt_tokens;
    r.cached_tokens = o.cached_tokens;
    return r;
  }
  bool trial() const { return pass_ == CircuitBreaker::Pass::kTrial; }
  // Characters of the text the policy matched, when it predicted some (cache_aware); else 0.
  uint64_t request_chars() const {
    const RequestInfo* req = ctx_.request;
    if (d_.predicted_chars == 0 || req == nullptr || req->text.empty()) return 0;
    return ctx_.approx_path.for_text(req->text) ? ctx_.approx_path.total_chars
                                                : prefix::count_chars(req->text);
  }
  bool done() const { return done_; }
  // For the destructor: whether the worker may have the request (true until known otherwise).
  bool started_guess = true;

 private:
  Policy& policy_;
  RouteContext& ctx_;
  Decision d_;
  CircuitBreaker::Pass pass_;
  DispatchNote note_;
  Clock::time_point opened_;
  bool done_ = false;
  bool first_token_ = false;
};

// Prefill/decode: the prefill half of an attempt (its decision, dispatch and call).
struct PrefillHalf {
  Decision d;
  Worker* w = nullptr;
  std::optional<Dispatch> dispatch;
  std::shared_ptr<pd::PrefillLeg> leg;
  std::string rid;  // the rid both halves carry ("" when the client's body names its own)
  // The decode half served the client (complete()): what its answer reported of the prompt, for
  // settle_prefill to count on the prefill server when the prefill's own answer says nothing.
  bool served_ok = false;
  std::optional<int64_t> decode_prompt, decode_cached;
};

// A worker's answer kept to give the client when no retry works out (its own 429/503...).
struct SavedAnswer {
  int status = 0;
  std::string content_type;
  std::string retry_after;
  std::string body;
};

// Holds a retry slot of the budget until released or destroyed.
class BudgetSlot {
 public:
  explicit BudgetSlot(RetryBudget& b) : budget_(b) {}
  ~BudgetSlot() { release(); }
  BudgetSlot(const BudgetSlot&) = delete;
  BudgetSlot& operator=(const BudgetSlot&) = delete;
  bool acquire() {
    release();
    held_ = budget_.try_acquire();
    return held_;
  }
  void release() {
    if (held_) budget_.release();
    held_ = false;
  }

 private:
  RetryBudget& budget_;
  bool held_ = false;
};

}  // namespace

RequestThread::RequestThread(const GatewayConfig& config)
    : state_(std::make_unique<State>(config)) {}
RequestThread::~RequestThread() = default;

void RequestThread::bind() {
  tl_state = state_.get();
}

void RequestThread::close() {
  state_->closed = true;
  state_->pool.close();
  state_->sweep.reset();
  state_->reaper.reset();
}

// ---------------------------------------------------------------------------------------------
// One proxied request, phase by phase. Gateway::proxy (at the end) runs the phases in order;
// each phase is a member of Request and says what comes next.

namespace {

enum class Next {
  kOn,      // go on to the next phase
  kRetry,   // this attempt failed safely and another may follow: back off, select again
  kGiveUp,  // no further attempt: the client gets the last refusal a worker sent, or an error
  kDone,    // answered (or the client left): nothing more to do
  kRefuse,  // refused: the refusal the phase left is to be sent (refuse_pending), then done
};

}  // namespace

// Everything a request carries from phase to phase. Lives in Gateway::proxy's frame and never
// moves: the disconnect watch and the dispatches point into it.
class Gateway::Request {
 public:
  Request(Gateway& g, http::Exchange& ex, ApiRoute route, std::string_view label,
          std::string_view rid);
  ~Request();
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // resolve and parse finish at once (no coroutine of their own: a frame and a resumption
  // less per request); false leaves the refusal for refuse_pending().
  bool resolve();
  void watch();
  bool admits_all() const { return !g_.admission_.enabled(); }
  awaitable<bool> admit();
  bool parse();
  // /v1/responses: the worker holding the response the request names (previous_response_id, or
  // the path's id), asked of the workers when the gateway does not remember it.
  bool names_response() const { return !response_id_.empty(); }
  bool refusing() const { return refusal_.has_value(); }
  awaitable<bool> locate();
  awaitable<void> refuse_pending();
  void forward_headers();
  bool must_back_off() const { return attempts_made_ > 0 && !skip_backoff_; }
  awaitable<bool> back_off();
  Next select(Attempt& a);  // at once, as resolve and parse
  awaitable<Next> send(Attempt& a);
  awaitable<Next> first_event(Attempt& a);
  awaitable<void> relay(Attempt& a);
  awaitable<void> give_up();
  // Prefill/decode: the prefill half ends with its attempt (joined, its dispatch closed).
  awaitable<void> settle_prefill(Attempt& a, bool served);
  void count_prefill_usage(PrefillHalf& p);
  // Prefill/decode: until the prefill half ended (its answer not awaited long: the decode half
  // had its KV, so the prefill is done or ends soon).
  awaitable<void> wait_prefill(Attempt& a);
  // Prefill/decode, /generate with return_logprob: the decode half's answer relayed with the
  // prompt's logprobs the prefill half computed (the decode computes none).
  awaitable<void> relay_with_prompt_logprobs(Attempt& a, http::HeaderList out, Verdict verdict);

 private:
  friend struct Gateway::Attempt;
  // Tags a log line with the request: its rid and trace_id (every line about a request carries
  // them; the line is written at the end of the full expression).
  log::Line& tag(log::Line&& line) const {
    return line.kv("rid", rid_).kv("trace_id", trace_.trace_id());
  }
  void begin_trace();
  // A gateway error answer, recorded.
  awaitable<void> refuse(GatewayError e, const Worker* worker = nullptr);
  void client_left();
  void record(int status) {
    g_.record(ex_, route_label_, status, model_, streaming_, start_);
    if (g_.metrics_.smg()) [[unlikely]] {
      if (auto* c = g_.metrics_.smg_router_request(model_, route_label_, streaming_,
                                                   pool_ && pool_->pd())) {
        c->inc();
      }
    }
  }
  // An attempt's worker is known and its dispatch open: its signal cells, the selections counted
  // under sgl-model-gateway's names (--metrics-compat smg).
  void dispatched(Attempt& a);
  // Which policy chose the attempt's worker (select() asked it): the doctor's pin, the owner of
  // the response the request names (/v1/responses), the decode policy for the decode half
  // (prefill/decode), the rule's policy otherwise.
  Policy& decider(const Attempt& a) const;
  // What the decision log keeps of a dispatch of this request to `w`, decided by `policy` (call
  // after attempts_made_ counted it).
  DispatchNote note(const Policy& policy, const Worker& w) const {
    return DispatchNote{.log = &g_.decisions_,
                        .rid = rid_,
                        .rule = pool_->name(),
                        .route = route_label_,
                        .model = model_,
                        .role = role_label(pool_->role(w)),
                        .attempt = attempts_made_,
                        .page_size = policy.name() == "kv_exact" ? pool_->rule().kv_block_size : 0};
  }
  void list_candidates(Clock::time_point now);
  // Prefill/decode: both sides chosen, both breakers' passes, both dispatches opened.
  Next select_pd(Attempt& a);
  // Prefill/decode: the request bodies of both halves; starts the prefill half.
  bool start_prefill(Attempt& a, std::string& decode_body);
  // Prefill/decode: the prefill half failed before the decode half answered anything.
  awaitable<Next> prefill_failed(Attempt& a);
  // Whether another attempt may follow one that failed safely ("" if so; it takes a budget
  // slot), else why not.
  std::string_view may_retry();
  void retry_denied(std::string_view why);
  // An attempt that failed with a retryable status (or abort standing for one) and will be
  // retried: its completion, counted as that status counts.
  void failed_attempt(Attempt& a, int status, bool ran);
  void complete(Attempt& a, int final_status, Verdict verdict, const UsageScanner& usage);
  // /v1/responses: looks for the new response's id in a piece of the answer (learned once).
  void scan_id(const Attempt& a, std::string_view piece);

  // First member: the request counts for the retry budget from before anything else is set up
  // until after everything else (its retry slot included) is released.
  struct BudgetRequest {
    explicit BudgetRequest(RetryBudget& b) : budget(b) { budget.request_started(); }
    ~BudgetRequest() { budget.request_ended(); }
    BudgetRequest(const BudgetRequest&) = delete;
    BudgetRequest& operator=(const BudgetRequest&) = delete;
    RetryBudget& budget;
  } budget_request_;
  Gateway& g_;
  http::Exchange& ex_;
  const ApiRoute route_;
  const std::string_view route_label_;
  const std::string_view rid_;
  const Clock::time_point start_;
  const Clock::time_point deadline_;
  RequestThread::State& ts_;

  // resolve, parse
  std::optional<GatewayError> refusal_;  // what a phase that said no leaves to send
  RequestInfo info_;
  bool parsed_ = false;                    // info_ holds the model (resolve read it)
  std::optional<DoctorKey::Pass> doctor_;  // a request of the doctor's (gateway.h)
  bool pinned_ = false;                    // the doctor chose the worker, not the policy
  std::shared_ptr<Pool> pool_;             // pinned: its policy decides and hears every completion
  std::string_view model_;                 // the metric label (empty until parsed)
  bool streaming_ = false;
  // /v1/responses: the response the request names, and the worker (URL) holding it once known.
  std::string response_id_;
  std::string owner_;
  int owner_rank_ = -1;  // the data-parallel rank that made the response (-1: none known)
  // /v1/responses answered 200: the answer's beginning, until the new response's id is in it.
  bool learn_id_ = false;
  std::string id_scan_;

  // admit; a client going away cancels what the request waits for
  Cancel cancel_;
  std::optional<WatchGuard> watch_;
  Admission* slot_ = nullptr;  // the admission slot held, released at the end

  // select, send
  HeaderView header_view_;
  http::TraceContext trace_;     // W3C trace context: continued or started (begin_trace)
  std::string_view tracestate_;  // the client's tracestate to forward ("": none) ...
  std::string tracestate_buf_;   // ... when combined from several fields or truncated
  RouteContext ctx_;
  std::string xff_, forwarded_;
  std::string cookie_buf_;      // a Cookie field forwarded without the dashboard's session
  http::HeaderBuffer<24> fwd_;  // request headers forwarded upstream
  std::shared_ptr<const WorkerSet> set_;
  CandidateList candidates_;
  CandidateList decode_candidates_;  // prefill/decode: candidates_ are the prefill side

  // retry: Pingora's rule, written down in docs/reliability.md
  std::vector<uint64_t> failed_;
  std::vector<Worker*> charge_if_served_;  // answered 500 once: charged if another worker serves
  int ran_and_failed_ = 0;                 // 500 answers: at most one is retried
  int attempts_made_ = 0;
  int denied_ = 0;
  http::CallError last_error_ = http::CallError::kNone;
  std::optional<SavedAnswer> saved_;
  std::optional<GatewayError> prefill_error_;  // prefill/decode: the last prefill's failure
  std::optional<std::chrono::milliseconds> retry_after_;
  BudgetSlot budget_slot_;
  std::optional<Timer> backoff_timer_;  // made by the first retry (a timer looks up its service)
  std::chrono::milliseconds next_delay_{0};  // the wait may_retry() checked, used as checked
  bool skip_backoff_ = false;                // the last round made no attempt (breaker turned)
};

// One attempt on one worker: its decision, its dispatch (closed exactly once), its upstream call.
struct Gateway::Attempt {
  explicit Attempt(Request& r)
      : r(r),
        output_events(r.route_ == ApiRoute::kResponses || r.route_ == ApiRoute::kResponse
                          ? OutputEventCounter::Format::kResponses
                          : OutputEventCounter::Format::kDefault) {}
  ~Attempt() {
    r.cancel_.call = nullptr;
    r.cancel_.prefill = nullptr;
    if (prefill && prefill->leg) prefill->leg->abort();  // (joined unless torn down at shutdown)
  }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // Tags a log line with the attempt (the line is written at the end of the full expression).
  log::Line& tag(log::Line&& line) const {
    return r.tag(std::move(line))
        .kv("worker_id", w->id())
        .kv("worker", w->url())
        .kv("attempt", r.attempts_made_);
  }

  Request& r;
  Clock::time_point now;
  Decision d;
  Worker* w = nullptr;
  std::optional<Dispatch> dispatch;
  std::optional<http::UpstreamCall> call;
  int status = 0;
  bool sse = false;
  std::string pre;             // body bytes read before committing (a stream's first event)
  bool worker_abort = false;   // relays a worker-side abort: a failure for the breaker
  bool abort_ran = false;      // ... with status 500 (ran and failed, like an HTTP 500)
  int abort_status = 0;        // ... the status it stands for
  bool request_abort = false;  // the first event is the request's own error
  // Prefill/decode: the decode half says its KV transfer failed (which side is at fault is not
  // known: neither is charged, both avoided by the next attempt).
  bool blame_prefill = false;
  // Prefill/decode: the prefill half (d, w, dispatch and call above are the decode half, whose
  // answer the client gets).
  using Prefill = PrefillHalf;
  std::optional<Prefill> prefill;

  // Request signals (docs/metrics.md): the worker's cells (the decode half's with prefill/decode)
  // and what the answer showed of its timing. Its times are the worker's: from `sent_at`, when
  // this attempt began (a connection taken or opened, the request written), not from the
  // request's arrival (admission, an owner lookup, attempts at other workers are not this
  // worker's doing).
  const SignalCells* cells = nullptr;
  Clock::time_point sent_at{}, headers_at{}, first_byte_at{}, last_output_at{};
  OutputEventCounter output_events;
  bool timing_committed = false;  // the client gets this answer (a success): headers/first byte
  // A piece of the answer's body, as read: the first byte's time; for a stream, its output events
  // (the first one is the time to first token, each later one an inter-token gap; events that
  // end in the same read as the one before are gaps of 0). Output events are observed as they
  // arrive, whatever happens to the stream later: the worker produced them at those times.
  void saw(std::string_view piece) {
    if (piece.empty() || !cells) return;
    const bool events = sse && status < 400;
    if (!events && first_byte_at != Clock::time_point{}) return;
    const auto now = Clock::now();
    if (first_byte_at == Clock::time_point{}) {
      first_byte_at = now;
      if (timing_committed) cells->first_byte->observe(seconds(now - sent_at));
    }
    if (!events) return;
    uint32_t n = output_events.feed(piece);
    if (n == 0) return;
    if (last_output_at == Clock::time_point{}) {
      cells->first_token->observe(seconds(now - sent_at));
    } else {
      cells->itl->observe(seconds(now - last_output_at));
    }
    cells->itl->observe_n(0, n - 1);
    last_output_at = now;
  }
};

Gateway::Request::Request(Gateway& g, http::Exchange& ex, ApiRoute route, std::string_view label,
                          std::string_view rid)
    : budget_request_(g.budget_),
      g_(g),
      ex_(ex),
      route_(route),
      route_label_(label),
      rid_(rid),
      start_(Clock::now()),
      deadline_(start_ + g.timeout_),
      ts_(thread_state()),
      header_view_{&ex, g.config_.allow_target_worker_header},
      budget_slot_(g.budget_) {
  start_reaper(ts_, ex.executor());
  cancel_.admission = &g.admission_;
  ctx_.request = &info_;
  ctx_.header_fn = &header_of;
  ctx_.header_self = &header_view_;
  begin_trace();
}

Gateway::Request::~Request() {
  cancel_.backoff = nullptr;
  if (slot_) slot_->release();
}

awaitable<void> Gateway::Request::refuse(GatewayError e, const Worker* worker) {
  int status = e.status;
  tag(log::debug("request refused")).kv("status", status).kv("code", e.code);
  co_await g_.fail(ex_, std::move(e), rid_, worker);
  record(status);
}

void Gateway::Request::client_left() {
  tag(log::debug("client went away"));
  g_.metrics_.client_disconnects.with({}).inc();
  record(kClientClosedStatus);
}

// Phase: resolve. The rule table may change at any time; this request keeps the pool it resolved
// (and with it the policy that decides and hears the completion) until it is done. Only when rules
// name models is the body read here, for its model alone (cheap next to the parse, which waits for
// admission).
bool Gateway::Request::resolve() {
  std::string parse_error;
  if (g_.doctor_.armed()) [[unlikely]] {
    if (std::string_view v = ex_.header("x-kvgate-doctor"); !v.empty())
      doctor_ = g_.doctor_.check(v);
  }
  if (doctor_ && !doctor_->rule.empty()) [[unlikely]] {
    auto table = g_.pools_.table();
    for (const auto& p : table->pools) {
      if (p->name() == doctor_->rule) pool_ = p;
    }
    if (pool_) return true;
    refusal_ = GatewayError{404, "invalid_request_error", "rule_not_found",
                            "the rule the doctor names ('" + doctor_->rule +
                                "') is not in force: it changed or was deleted during the run"};
    return false;
  }
  {
    auto table = g_.pools_.table();
    uint16_t port = ex_.local_port();
    // /v1/responses is always read: previous_response_id decides where it goes.
    if (table->needs_model(port, ex_.path()) || route_ == ApiRoute::kResponses) {
      parse_error = parse_request(route_, ex_.body(), info_);
      parsed_ = parse_error.empty();
      if (!parsed_) info_ = RequestInfo{};  // no model: a catch-all rule may still take it
    }
    if (route_ == ApiRoute::kResponse) {
      std::string_view id = ex_.path().substr(std::string_view("/v1/responses/").size());
      if (id.ends_with("/cancel")) id.remove_suffix(std::string_view("/cancel").size());
      response_id_ = id;
    } else if (route_ == ApiRoute::kResponses) {
      response_id_ = info_.previous_response_id;
      if (!response_id_.empty() && !ResponseOwners::valid_id(response_id_)) {
        // It goes into the lookup's request line (locate): only an id's characters may.
        refusal_ = errors::invalid_request(
            "'previous_response_id' is not a response id: response ids are 'resp_' followed by "
            "1 to 128 letters, digits, '-' or '_' (as the engine makes them)");
        return false;
      }
    }
    if (!response_id_.empty()) {
      if (auto owner = g_.owners_.find(response_id_)) {
        // The rule that holds it, if this listener and path may reach that rule at all.
        for (const auto& p : table->pools) {
          if (p->name() == owner->rule && RuleTable::serves(*p, port, ex_.path())) pool_ = p;
        }
        if (pool_) {
          owner_ = std::move(owner->worker);
          owner_rank_ = owner->dp_rank;
          g_.owners_.count("owner");
          return true;
        }
      }
    }
    // A response asked for by id names no model: locate() looks for it in every rule.
    if (route_ == ApiRoute::kResponse) return true;
    pool_ = table->resolve(port, ex_.path(), info_.model);
  }
  if (pool_) return true;
  if (!parse_error.empty()) {
    refusal_ = errors::bad_json(std::move(parse_error));
  } else {
    refusal_ = parsed_ ? errors::model_not_found(info_.model) : errors::no_rule(ex_.path());
  }
  return false;
}

awaitable<void> Gateway::Request::refuse_pending() {
  GatewayError e = std::move(*refusal_);
  refusal_.reset();
  co_await refuse(std::move(e));
}

void Gateway::Request::watch() {
  watch_.emplace(ts_, ex_, &cancel_);
}

// Phase: admit. Before parsing: parsing, rendering and tokenizing cost CPU in proportion to the
// body, and only admitted requests may spend it. One admission for the process, whichever rule.
awaitable<bool> Gateway::Request::admit() {
  Admission& admission = g_.admission_;
  g_.metrics_.queue_depth_now.add(1);
  const auto queued = Clock::now();
  auto r = co_await admission.acquire(ex_.executor(), &cancel_.waiter);
  g_.metrics_.queue_depth_now.add(-1);
  cancel_.waiter.reset();
  if (r == Admission::Result::kAdmitted) {
    slot_ = &admission;
    // (A response asked for by id has no rule until locate() finds its owner.)
    if (pool_) pool_->queue_time().observe(seconds(Clock::now() - queued));
  }
  if (r == Admission::Result::kCancelled || ex_.client_gone()) {
    client_left();
    co_return false;
  }
  if (r == Admission::Result::kQueueFull) {
    g_.metrics_.admission_rejected.with({"queue_full"}).inc();
    co_await refuse(errors::queue_full(admission.queue_size()));
    co_return false;
  }
  if (r == Admission::Result::kTimeout) {
    g_.metrics_.admission_rejected.with({"timeout"}).inc();
    co_await refuse(errors::queue_timeout(static_cast<long>(g_.config_.queue_timeout_secs)));
    co_return false;
  }
  co_return true;
}

// Phase: parse: what routing needs from the body (a pool in mode 0 proxies without reading it).
bool Gateway::Request::parse() {
  const ParseOptions& options = pool_->parse_options();
  bool wants_content = options.want_text || options.want_tokens;
  // A request going to the worker holding its response has nothing for the policy to read (and
  // /v1/responses/{id} has no body).
  const bool routed = !owner_.empty() || route_ == ApiRoute::kResponse;
  if (pool_->reads_body() && (!parsed_ || wants_content) && !routed) {
    info_ = RequestInfo{};
    if (std::string err = parse_request(route_, ex_.body(), info_, options); !err.empty()) {
      refusal_ = errors::bad_json(std::move(err));
      return false;
    }
  }
  if (info_.model.size() > kMaxModelNameBytes) {
    // A model name becomes a metric label and a prefix-tree key: bounded like any client input.
    refusal_ = errors::invalid_request("'model' is " + std::to_string(info_.model.size()) +
                                       " bytes long; model names are at most " +
                                       std::to_string(kMaxModelNameBytes) + " bytes");
    return false;
  }
  model_ = g_.metrics_.models.admit(info_.model);
  streaming_ = info_.stream;
  return true;
}

// Phase: locate (/v1/responses naming a response the gateway does not remember: forgotten,
// expired, created before a restart or through another replica). Every healthy worker that could
// hold it (the rule's, or for GET/DELETE/cancel every rule's) is asked GET /v1/responses/{id} at
// once; the one that answers 200 holds it. Not finding it is the client's answer (404, or 503
// when some worker did not answer and may hold it): never sent where it cannot be.
awaitable<bool> Gateway::Request::locate() {
  if (!owner_.empty()) co_return true;
  if (pool_ && pool_->pd()) co_return true;  // select_pd refuses /v1/responses with why
  if (tl_owner_lookups >= kMaxOwnerLookups) {
    g_.owners_.count("lookup_busy");
    refusal_ = GatewayError{503, "server_error", "response_lookup_busy",
                            "response " + response_id_ +
                                " is not one this gateway remembers, and too many lookups are "
                                "running; retry shortly"};
    co_return false;
  }
  struct Candidate {
    std::shared_ptr<Pool> pool;
    WorkerPtr worker;
  };
  std::vector<Candidate> candidates;
  std::set<std::string_view> seen;
  auto table = g_.pools_.table();
  const uint16_t port = ex_.local_port();
  size_t unasked = 0;  // past the bound: they may hold it (so never a definite "not found")
  auto add = [&](const std::shared_ptr<Pool>& p) {
    if (p->pd()) return;                 // a prefill/decode pool does not serve /v1/responses
    const auto snapshot = p->workers();  // (held: the loop reads it)
    for (const auto& w : snapshot->workers) {
      if (!w->healthy() || !seen.insert(w->url()).second) continue;
      if (candidates.size() < kMaxOwnerLookupWorkers) {
        candidates.push_back({p, w});
      } else {
        ++unasked;
      }
    }
  };
  if (pool_) {
    add(pool_);
  } else {
    // Only the rules this listener and path may reach (a rule kept to another port is not).
    for (const auto& p : table->pools) {
      if (RuleTable::serves(*p, port, ex_.path())) add(p);
    }
  }
  if (candidates.empty()) {
    refusal_ = GatewayError{503, "server_error", "no_available_workers",
                            "response " + response_id_ +
                                " is not one this gateway remembers, and no healthy worker can "
                                "be asked for it"};
    co_return false;
  }
  // Shared with the calls, which may outlive this request (it goes on at the first 200); the
  // lookup counts against this thread's bound until the last call ends.
  struct Join {
    Join(const Executor& ex, size_t n) : status(n, 0), bodies(n), left(n), timer(ex) {
      ++tl_owner_lookups;
    }
    ~Join() { --tl_owner_lookups; }
    Join(const Join&) = delete;
    Join& operator=(const Join&) = delete;
    std::vector<int> status;  // -1: no answer
    std::vector<std::string> bodies;
    size_t left;
    int found = -1;  // the first candidate that answered 200
    Timer timer;
  };
  auto join = std::make_shared<Join>(ex_.executor(), candidates.size());
  auto path = std::make_shared<const std::string>("/v1/responses/" + response_id_);
  auto auth = std::make_shared<const std::string>(ex_.header("authorization"));
  for (size_t i = 0; i < candidates.size(); ++i) {
    asio::co_spawn(
        ex_.executor(),
        [join, i, path, auth, w = candidates[i].worker, ex = ex_.executor()]() -> awaitable<void> {
          const http::Header headers[] = {{"authorization", *auth}};
          const size_t n = auth->empty() ? 0 : 1;
          // Only the status matters (and a refusal's message): the body is not kept whole.
          auto r = co_await http::fetch(ex, w->target(), "GET", *path, kOwnerLookupTimeout, {},
                                        http::HeaderList(headers, n), false, kOwnerLookupBodyLimit);
          join->status[i] = r.status > 0 ? r.status : -1;
          if (r.status != 200) join->bodies[i] = std::move(r.body);
          const bool first = r.status == 200 && join->found < 0;
          if (first) join->found = static_cast<int>(i);
          if (--join->left == 0 || first) join->timer.cancel();
        },
        asio::detached);
  }
  if (join->left > 0 && join->found < 0) {
    join->timer.expires_at(Clock::time_point::max());
    co_await join->timer.async_wait(asio::as_tuple(use_awaitable));
  }
  if (ex_.client_gone()) {
    // (Before anything is sent: a generation for nobody is never started.)
    client_left();
    co_return false;
  }
  if (join->found >= 0) {
    const auto& c = candidates[static_cast<size_t>(join->found)];
    pool_ = c.pool;
    owner_ = c.worker->url();
    if (!g_.owners_.learn(response_id_, pool_->name(), owner_)) g_.owners_.count("conflict");
    g_.owners_.count("found");
    co_return true;
  }
  size_t silent = unasked;
  int refused = 0;  // the status every worker answered, when all gave the same 4xx but 404
  bool same = true;
  for (size_t i = 0; i < candidates.size(); ++i) {
    int st = join->status[i];
    if (st < 0 || st >= 500) ++silent;
    if (refused == 0) refused = st;
    same = same && st == refused;
  }
  if (unasked > 0 || !(same && refused >= 400 && refused < 500 && refused != 404)) refused = 0;
  std::string asked =
      std::to_string(candidates.size()) + " worker" + (candidates.size() == 1 ? "" : "s");
  if (refused != 0) {
    // Every worker refused the lookup the same way (the engines' response store is off: 400;
    // the client's credentials: 401/403): that is the client's answer, not "not found".
    g_.owners_.count("refused");
    std::string said = join->bodies[0].substr(0, 300);
    std::replace_if(
        said.begin(), said.end(), [](char ch) { return ch < 0x20; }, ' ');
    refusal_ = GatewayError{refused, "invalid_request_error", "response_lookup_refused",
                            "response " + response_id_ + " could not be looked up: each of the " +
                                asked + " that could hold it answered HTTP " +
                                std::to_string(refused) + ": " + said};
    co_return false;
  }
  g_.owners_.count(silent > 0 ? "owner_unavailable" : "not_found");
  if (unasked > 0) asked += " (and " + std::to_string(unasked) + " not asked: over the bound)";
  refusal_ = silent > 0 ? GatewayError{503, "server_error", "response_owner_unavailable",
                                       "response " + response_id_ + " was not found; " +
                                           std::to_string(silent) + " of the " + asked +
                                           " asked did not answer and may hold it; retry later"}
                        : GatewayError{
                              404, "invalid_request_error", "response_not_found",
                              "response " + response_id_ + " was not found on any of the " + asked +
                                  " that could hold it (SGLang keeps responses in "
                                  "the memory of the server that made them: a restart loses "
                                  "them; store=false keeps none)"};
  co_return false;
}

// The request's trace, before anything is logged about it (http/traceparent.h). A valid
// traceparent (the only one) is continued: forwarded as the client sent it, with the client's
// tracestate (its fields combined in order with commas, RFC 9110 5.3; truncated past 512
// characters as Trace Context says). Else kvgate starts the trace, without the client's
// tracestate (it belongs to a trace not continued). A future span exporter would make kvgate a
// span of the trace: then each attempt would get a parent-id of its own here and in send().
void Gateway::Request::begin_trace() {
  std::string_view traceparent;
  int traceparents = 0, tracestates = 0;
  ex_.for_each_header([&](std::string_view name, std::string_view value) {
    auto kind = http::classify_header(name);
    if (kind == http::HeaderKind::kTraceParent) {
      traceparent = value;
      ++traceparents;
    } else if (kind == http::HeaderKind::kOther && !value.empty() &&
               http::iequals(name, "tracestate")) {
      if (++tracestates == 2) tracestate_buf_.assign(tracestate_);
      if (tracestates >= 2) tracestate_buf_.append(",").append(value);
      tracestate_ = tracestates == 1 ? value : std::string_view(tracestate_buf_);
    }
  });
  if (!trace_.continue_from(traceparent, traceparents)) {
    Rng& rng = thread_rng();
    const uint64_t hi = rng.next(), lo = rng.next(), parent = rng.next();
    trace_.start(hi, lo, parent);
    tracestate_ = {};
    return;
  }
  if (tracestate_.empty()) return;
  if (ConnectionTokens::of(ex_).contains("tracestate")) {  // hop-by-hop, then
    tracestate_ = {};
  } else if (tracestate_.size() > http::kMaxTraceState) {
    tracestate_buf_ = http::truncate_tracestate(tracestate_);
    tracestate_ = tracestate_buf_;
  }
}

// Request headers forwarded upstream: not hop-by-hop (nor named in Connection), not those the
// upstream call sets; X-Forwarded-For and Forwarded extended with this client.
void Gateway::Request::forward_headers() {
  const ConnectionTokens conn_tokens = ConnectionTokens::of(ex_);
  bool allow_target = g_.config_.allow_target_worker_header;
  ex_.for_each_header([&](std::string_view name, std::string_view value) {
    auto kind = http::classify_header(name);
    if (kind != http::HeaderKind::kOther && kind != http::HeaderKind::kContentType) return;
    if (!conn_tokens.empty() && conn_tokens.contains(name)) return;
    if (http::iequals(name, "tracestate")) return;  // as begin_trace decided, below
    if (http::iequals(name, "x-forwarded-for")) {
      xff_.append(value).append(", ");
      return;
    }
    if (http::iequals(name, "forwarded")) {
      forwarded_.append(value).append(", ");
      return;
    }
    if (!allow_target && http::iequals(name, "x-smg-target-worker")) return;
    if (http::iequals(name, "cookie") &&
        value.find(http::kSessionCookiePrefix) != std::string_view::npos) [[unlikely]] {
      // The dashboard's session cookie (the admin listener's; a browser sends it to every port
      // of the host) is not the worker's to see: dropped, the client's other cookies kept (of
      // every such field, joined into one, sent after the loop: the buffer grows meanwhile).
      std::string kept = http::without_cookies(value, http::kSessionCookiePrefix);
      if (!kept.empty()) cookie_buf_.append(cookie_buf_.empty() ? "" : "; ").append(kept);
      return;
    }
    fwd_.push_back({name, value});
  });
  if (!cookie_buf_.empty()) fwd_.push_back({"cookie", cookie_buf_});
  const std::string& client_addr = ex_.remote_address();
  xff_.append(client_addr.empty() ? "unknown" : client_addr);
  forwarded_.append("for=").append(forwarded_node(client_addr));
  forwarded_.append(ex_.secure() ? ";proto=https" : ";proto=http");
  fwd_.push_back({"x-forwarded-for", xff_});
  fwd_.push_back({"forwarded", forwarded_});
  fwd_.push_back({"x-request-id", rid_});
  // Every upstream call of the request (each attempt, both halves of prefill/decode) carries the
  // same traceparent: kvgate exports no spans, so it has no span ids to give them (begin_trace).
  fwd_.push_back({"traceparent", trace_.header()});
  if (!tracestate_.empty()) fwd_.push_back({"tracestate", tracestate_});
  set_ = pool_->workers();  // keeps every worker of this request alive
}

// The available workers (the pool's availability index: no look at each worker on a first
// attempt) minus those that failed this request; a side whose every available worker failed
// once tries them again.
void Gateway::Request::list_candidates(Clock::time_point now) {
  if (pool_->pd()) {
    candidates_.list(pool_->prefill_available(), failed_, now);
    decode_candidates_.list(pool_->decode_available(), failed_, now);
    if (decode_candidates_.empty()) candidates_.clear();  // no pair: nothing to try
    return;
  }
  candidates_.list(pool_->available(), failed_, now);
}

std::string_view Gateway::Request::may_retry() {
  const RetryConfig& retry = g_.retry_;
  if (attempts_made_ >= retry.max_attempts) return "attempts";
  auto now = Clock::now();
  auto wait = backoff_delay(retry, attempts_made_ - 1, thread_rng().uniform());
  if (retry_after_) {
    if (*retry_after_ > retry.max_backoff) return "retry_after";
    wait = std::max(wait, *retry_after_);
  }
  if (now + wait >= deadline_) return "deadline";
  next_delay_ = wait;
  list_candidates(now);
  if (candidates_.empty()) return "no_worker";
  // Only the response's owner can run it: no other worker is a retry, and the owner itself is
  // not asked twice (a 500 there may have run the turn; a cancel or DELETE is not repeated).
  if (!owner_.empty()) return "no_worker";
  if (!budget_slot_.acquire()) return "budget";
  return "";
}

void Gateway::Request::retry_denied(std::string_view why) {
  g_.metrics_.retries_denied.with({why}).inc();
  tag(log::debug("not retrying")).kv("why", why).kv("attempts", attempts_made_);
}

// Phase: retry (the wait). A retry waits its backoff (or the worker's Retry-After).
awaitable<bool> Gateway::Request::back_off() {
  g_.metrics_.retries.with({route_label_}).inc();
  if (g_.metrics_.smg()) [[unlikely]] {
    // sgl-model-gateway counts a prefill/decode retry on both sides.
    const std::string_view endpoint = smg_endpoint(route_label_);
    if (pool_->pd()) {
      g_.metrics_.smg_retry("prefill", endpoint);
      g_.metrics_.smg_retry("decode", endpoint);
    } else {
      g_.metrics_.smg_retry("regular", endpoint);
    }
  }
  retry_after_.reset();
  if (!backoff_timer_) {
    backoff_timer_.emplace(ex_.executor());
    cancel_.backoff = &*backoff_timer_;
  }
  backoff_timer_->expires_after(next_delay_);
  co_await backoff_timer_->async_wait(asio::as_tuple(use_awaitable));
  if (ex_.client_gone()) {
    client_left();
    co_return false;
  }
  co_return true;
}

// Phase: select. The policy chooses among the available workers; the worker's breaker gives a
// pass; the dispatch opens (the policy hears on_dispatched; on_completed follows exactly once).
Next Gateway::Request::select(Attempt& a) {
  skip_backoff_ = false;
  a.now = Clock::now();
  list_candidates(a.now);
  if (pool_->pd()) return select_pd(a);
  if (candidates_.empty()) {
    if (attempts_made_ > 0) return Next::kGiveUp;
    refusal_ = errors::no_worker(set_->workers.size());
    return Next::kRefuse;
  }
  const bool pinned = doctor_ && !doctor_->pin.empty();
  const bool owned = !owner_.empty();
  Policy& policy = pinned ? pinned_policy() : owned ? owner_policy() : pool_->policy();
  if (pinned) [[unlikely]] {
    // The doctor's proxy-path check: the worker it names, if the gateway would route to it.
    a.d = Decision{.branch = "pinned"};
    for (Worker* w : candidates_.workers()) {
      if (w->url() == doctor_->pin) a.d.worker = w;
    }
    pinned_ = true;
  } else if (owned) {
    // The worker holding the response: no other has its conversation.
    a.d = Decision{.branch = "owner"};
    if (owner_rank_ >= 0) a.d.dp_rank = owner_rank_;  // where its prefix is cached
    for (Worker* w : candidates_.workers()) {
      if (w->url() == owner_) a.d.worker = w;
    }
    if (a.d.worker == nullptr) {
      g_.owners_.count("owner_unavailable");
      bool in_rule = false;
      for (const auto& w : set_->workers) in_rule = in_rule || w->url() == owner_;
      // Its worker left the rule: the entry is stale (the next request asks the workers again).
      if (!in_rule) g_.owners_.forget(response_id_);
      if (attempts_made_ > 0) return Next::kGiveUp;
      // Named by number (a worker's address is not the client's to see); the log has its URL.
      std::string who = "a worker no longer in rule '" + pool_->name() + "'";
      for (const auto& w : set_->workers) {
        if (w->url() == owner_) who = "worker #" + std::to_string(w->id());
      }
      tag(log::info("response owner unavailable")).kv("worker", owner_);
      refusal_ = GatewayError{503, "server_error", "response_owner_unavailable",
                              "response " + std::string(response_id_) + " is held by " + who +
                                  ", which cannot take requests now (unhealthy, its breaker "
                                  "open, or it failed this request); no other worker has it"};
      return Next::kRefuse;
    }
  } else {
    ctx_.candidates = candidates_.view();
    a.d = policy.select(candidates_.workers(), ctx_);
    ctx_.candidates = {};  // the list may be replaced before the next select
  }
  a.w = a.d.worker;
  if (a.w == nullptr) {
    g_.metrics_.branch_counter(policy.name(), a.d.branch).inc();
    if (attempts_made_ > 0) return Next::kGiveUp;
    refusal_ = errors::policy_refused(policy.name(), a.d.branch);
    return Next::kRefuse;
  }
  CircuitBreaker::Pass pass = a.w->admit(a.now);
  if (pass == CircuitBreaker::Pass::kDenied) {
    // Its breaker turned (another request took the half-open trial): choose again, bounded.
    failed_.push_back(a.w->id());
    if (++denied_ > static_cast<int>(set_->workers.size()) + 1) return Next::kGiveUp;
    skip_backoff_ = true;  // no attempt was made: nothing to back off from
    return Next::kRetry;
  }
  if (metrics::Counter* c = pool_->selected(*a.w)) c->inc();
  g_.metrics_.branch_counter(policy.name(), a.d.branch).inc();
  ++attempts_made_;
  a.dispatch.emplace(policy, ctx_, a.d, pass, note(policy, *a.w));
  a.call.emplace(ex_.executor(), ts_.pool, a.w->target(), a.w->id());
  a.call->set_deadline(deadline_);
  cancel_.call = &*a.call;
  return Next::kOn;
}

// Phase: select, prefill/decode. The prefill policy (kv_exact with kvExactMode 1) chooses a
// prefill server (and rank), the decode policy a decode server; each breaker gives a pass; both
// dispatches open. A retry chooses both again.
Next Gateway::Request::select_pd(Attempt& a) {
  if (!generates(route_) || route_ == ApiRoute::kResponses) {
    refusal_ = errors::invalid_request(
        std::string(route_label_) +
        " is not served by a prefill/decode pool (it serves /generate, /v1/chat/completions and "
        "/v1/completions; /v1/responses keeps its state in one server); route it to a plain "
        "pool");
    return Next::kRefuse;
  }
  if (candidates_.empty()) {
    if (attempts_made_ > 0) return Next::kGiveUp;
    const auto& prefill = pool_->prefill_workers().workers;
    const bool usable_prefill = std::any_of(
        prefill.begin(), prefill.end(), [&](const WorkerPtr& w) { return w->available(a.now); });
    refusal_ = usable_prefill
                   ? errors::no_worker_of_role("decode", pool_->decode_workers().workers.size())
                   : errors::no_worker_of_role("prefill", prefill.size());
    return Next::kRefuse;
  }
  Policy& prefill_policy = pool_->policy();
  Policy& decode_policy = pool_->decode_policy();
  Attempt::Prefill& p = a.prefill.emplace();
  ctx_.candidates = candidates_.view();
  p.d = prefill_policy.select(candidates_.workers(), ctx_);
  p.w = p.d.worker;
  if (p.w != nullptr) {
    ctx_.candidates = decode_candidates_.view();
    a.d = decode_policy.select(decode_candidates_.workers(), ctx_);
    a.w = a.d.worker;
  }
  ctx_.candidates = {};
  if (p.w == nullptr || a.w == nullptr) {
    Policy& refused = p.w == nullptr ? prefill_policy : decode_policy;
    std::string_view branch = p.w == nullptr ? p.d.branch : a.d.branch;
    g_.metrics_.branch_counter(refused.name(), branch).inc();
    if (attempts_made_ > 0) return Next::kGiveUp;
    refusal_ = errors::policy_refused(refused.name(), branch);
    return Next::kRefuse;
  }
  // Each pass is taken right before its dispatch opens (which records it on every path).
  auto denied = [&](Worker* w) {
    // A breaker turned (another request took the half-open trial): choose again, bounded.
    failed_.push_back(w->id());
    skip_backoff_ = true;
    return ++denied_ > static_cast<int>(set_->workers.size()) + 1 ? Next::kGiveUp : Next::kRetry;
  };
  CircuitBreaker::Pass prefill_pass = p.w->admit(a.now);
  if (prefill_pass == CircuitBreaker::Pass::kDenied) {
    a.prefill.reset();
    return denied(p.w);
  }
  ++attempts_made_;
  p.dispatch.emplace(prefill_policy, ctx_, p.d, prefill_pass, note(prefill_policy, *p.w));
  CircuitBreaker::Pass decode_pass = a.w->admit(a.now);
  if (decode_pass == CircuitBreaker::Pass::kDenied) {
    p.dispatch->finish(Outcome{.status = kClientClosedStatus, .started = false}, Verdict::kNeutral);
    --attempts_made_;  // nothing was sent
    return denied(a.w);
  }
  a.dispatch.emplace(decode_policy, ctx_, a.d, decode_pass, note(decode_policy, *a.w));
  if (metrics::Counter* c = pool_->selected(*p.w)) c->inc();
  if (metrics::Counter* c = pool_->selected(*a.w)) c->inc();
  g_.metrics_.branch_counter(prefill_policy.name(), p.d.branch).inc();
  g_.metrics_.branch_counter(decode_policy.name(), a.d.branch).inc();
  a.call.emplace(ex_.executor(), ts_.pool, a.w->target(), a.w->id());
  a.call->set_deadline(deadline_);
  cancel_.call = &*a.call;
  return Next::kOn;
}

// Prefill/decode: SGLang's rendezvous fields (and a rid to abort the decode half by) added to the
// body, the prefill half started with its copy; the decode half's goes in `decode_body`. False
// when the body cannot take fields (not a JSON object).
bool Gateway::Request::start_prefill(Attempt& a, std::string& decode_body) {
  Attempt::Prefill& p = *a.prefill;
  const int64_t dp = p.w->dp_size().value_or(pool_->rule().kv_dp_rank_count);
  // The prefill rank reaches SGLang by the room (room % dp_size, every build), or pinned
  // (routed_dp_rank) with disagg_prefill_dp_rank, which lets the prefill take a pin other than
  // the room's rank and tells the decode where the KV is (--pd-prefill-rank field).
  const bool pin = p.d.dp_rank && dp > 1 && g_.config_.pd_prefill_rank == "field";
  const uint64_t room = pd::choose_room(thread_rng().next(), pin ? std::nullopt : p.d.dp_rank, dp);
  std::vector<BodyField> fields =
      pd::bootstrap_fields(p.w->target(), pool_->bootstrap_port(*p.w), room);
  // SGLang's /abort_request finds a request by its rid, and refuses a rid it still runs: one per
  // attempt, never taken from a client's header (two clients' requests must not share it). The
  // client's own rid stands for its first attempt.
  if (info_.batch) {
    // A batch: SGLang gives prompt i the room room + i (so the prompts spread over the prefill's
    // ranks from the chosen one) and wants a list of rids, one per prompt: none is added (its
    // decode half is ended by its closed connection alone).
  } else if (!info_.rid.empty() && attempts_made_ == 1) {
    p.rid = info_.rid;
  } else {
    const uint64_t hi = thread_rng().next(), lo = thread_rng().next();
    char nonce[40];
    std::snprintf(nonce, sizeof nonce, "%016llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
    p.rid = info_.rid.empty() ? "kvgate-" + std::string(nonce)
                              : info_.rid + "-kvgate-" + std::string(nonce, 16);
    std::string quoted;
    json::append_string(quoted, p.rid);
    fields.push_back({"rid", std::move(quoted)});
  }
  if (pin) fields.push_back({"disagg_prefill_dp_rank", std::to_string(*p.d.dp_rank)});
  if (pin) fields.push_back({g_.config_.dp_rank_field, std::to_string(*p.d.dp_rank)});
  std::string prefill_body = add_fields(ex_.body(), fields);
  if (prefill_body.empty()) return false;
  if (pin) fields.pop_back();  // the pin is the prefill's; the decode has its own rank
  if (a.d.dp_rank) {
    // The decode server's own rank (a dp-aware decode policy), for the decode half only.
    fields.push_back({g_.config_.dp_rank_field, std::to_string(*a.d.dp_rank)});
  }
  decode_body = add_fields(ex_.body(), fields);
  p.leg = std::make_shared<pd::PrefillLeg>(ex_.executor(), ts_.pool, pool_->worker_ptr(*p.w),
                                           deadline_);
  if (info_.return_logprob) p.leg->keep_answer();
  // The prefill is done once its whole answer came (its KV has left): the policy hears it then.
  p.leg->on_ok = [&p] {
    if (p.dispatch) p.dispatch->first_token();
  };
  cancel_.prefill = p.leg.get();
  p.leg->start(ex_.method(), ex_.target(), fwd_, std::move(prefill_body), &*a.call);
  return true;
}

namespace {

// /abort_request calls in flight from this thread: the closed connection already tells SGLang;
// this only hurries it, and must not pile up sockets during a prefill outage.
thread_local int tl_abort_requests = 0;
constexpr int kMaxAbortRequests = 16;

awaitable<void> send_abort_request(Executor ex, http::Target target, std::string body,
                                   std::string authorization) {
  ++tl_abort_requests;
  struct Done {
    ~Done() { --tl_abort_requests; }
  } done;
  // With the client's credentials, as its request went (an engine run with --api-key).
  const http::Header headers[] = {{"content-type", "application/json"},
                                  {"authorization", authorization}};
  const size_t n = authorization.empty() ? 1 : 2;
  co_await http::fetch(ex, target, "POST", "/abort_request", std::chrono::seconds(2), body,
                       http::HeaderList(headers, n));
}

}  // namespace

// Prefill/decode: the prefill half failed while the decode half had not answered (its call was
// aborted). The decode server forgets the request (the closed connection, and SGLang's
// /abort_request with its rid); the prefill server's failure counts against it. Another pair is
// tried when it may be (nothing reached the client); a prefill's refusal of the request itself
// (a 4xx, or an error event naming no status) is the client's answer.
awaitable<Next> Gateway::Request::prefill_failed(Attempt& a) {
  Attempt::Prefill& p = *a.prefill;
  pd::PrefillLeg& leg = *p.leg;
  http::UpstreamCall& call = *a.call;
  call.abort();
  if (call.request_sent() && !p.rid.empty() && tl_abort_requests < kMaxAbortRequests) {
    std::string body = R"({"rid":)";
    json::append_string(body, p.rid);
    body.push_back('}');
    asio::co_spawn(ex_.executor(),
                   send_abort_request(ex_.executor(), a.w->target(), std::move(body),
                                      std::string(ex_.header("authorization"))),
                   asio::detached);
  }
  g_.metrics_.pd_prefill_failures.with({p.w->url()}).inc();
  a.tag(log::warn(kLogPrefillFailed, "prefill failed; its decode request was aborted"))
      .kv("prefill", p.w->url())
      .kv("status", leg.status())
      .kv("error", leg.error());
  // The decode server did nothing wrong.
  a.dispatch->finish(Outcome{.status = 502, .started = false}, Verdict::kNeutral);
  const int status = leg.status();
  const bool answered = status != 0;
  const bool request_error = leg.request_error();
  const bool ran = status == 500;
  Verdict v = request_error                ? Verdict::kNeutral
              : ran && p.dispatch->trial() ? Verdict::kFailure
              : ran                        ? Verdict::kNeutral
              : answered && status < 500   ? Verdict::kNeutral
                                           : Verdict::kFailure;
  if (ran) {
    ++ran_and_failed_;
    if (!p.dispatch->trial()) charge_if_served_.push_back(p.w);
  }
  p.dispatch->finish(Outcome{.status = answered ? status : 502,
                             .started = answered ? !refused_status(status) : leg.request_sent()},
                     v);
  failed_.push_back(p.w->id());
  if (answered) {
    // The prefill server's own answer: the client's when it refused the request itself, or when
    // no retry works out.
    saved_ =
        SavedAnswer{.status = status, .content_type = leg.answer_type(), .body = leg.answer_body()};
    if (saved_->body.empty()) {
      saved_->content_type = "application/json";
      saved_->body = error_body(GatewayError{
          status, status < 500 ? "invalid_request_error" : "server_error", "prefill_answer",
          "the prefill server (worker #" + std::to_string(p.w->id()) + ") answered HTTP " +
              std::to_string(status)});
    }
    prefill_error_.reset();
  } else {
    saved_.reset();  // an earlier attempt's answer is not this failure's
    prefill_error_ = leg.call_error() == http::CallError::kTimeout
                         ? errors::upstream_timeout(static_cast<long>(g_.timeout_.count()))
                         : errors::prefill_failed(p.w->id(), "no answer");
  }
  if (request_error) co_return Next::kGiveUp;
  if (ran && ran_and_failed_ > 1) {
    retry_denied("attempts");
    co_return Next::kGiveUp;
  }
  if (auto why = may_retry(); !why.empty()) {
    retry_denied(why);
    co_return Next::kGiveUp;
  }
  co_return Next::kRetry;
}

void Gateway::Request::failed_attempt(Attempt& a, int status, bool ran) {
  if (a.blame_prefill) {
    // Prefill/decode: the decode's KV never came (settle_prefill avoids both servers).
    a.dispatch->finish(Outcome{.status = status, .started = false}, Verdict::kNeutral);
    return;
  }
  // A 500 ran the request and failed: it counts against the worker only if another worker then
  // serves the same request (else the request, not the worker, is at fault).
  Verdict v = ran             ? (a.dispatch->trial() ? Verdict::kFailure : Verdict::kNeutral)
              : status >= 500 ? Verdict::kFailure
                              : Verdict::kNeutral;
  if (ran) {
    ++ran_and_failed_;
    if (!a.dispatch->trial()) charge_if_served_.push_back(a.w);
  }
  a.dispatch->finish(Outcome{.status = status, .started = !refused_status(status)}, v);
  failed_.push_back(a.w->id());
}

// Phase: send. The request (with the body rewrites of its pool) goes to the worker; its answer's
// head comes back. A failure before the worker had the whole request is retried; after, not (it
// may be running it). A retryable status is kept as the client's answer in case no retry works.
awaitable<Next> Gateway::Request::send(Attempt& a) {
  http::UpstreamCall& call = *a.call;
  dispatched(a);
  // Body rewrites (fields added, the rest forwarded byte for byte): the rank the policy chose,
  // as --dp-rank-field names it.
  std::string rewritten;
  std::string_view body = ex_.body();
  if (a.prefill) {
    // Prefill/decode: both halves at once, the same body with SGLang's rendezvous fields.
    if (!start_prefill(a, rewritten)) {
      a.prefill->dispatch->finish(Outcome{.status = 400, .started = false}, Verdict::kNeutral);
      a.dispatch->finish(Outcome{.status = 400, .started = false}, Verdict::kNeutral);
      co_await refuse(errors::invalid_request(
          "prefill/decode adds SGLang's bootstrap fields to the request body, which must be a "
          "JSON object"));
      co_return Next::kDone;
    }
    body = rewritten;
  } else if (a.d.dp_rank && pool_->reads_body()) {
    const BodyField rank{g_.config_.dp_rank_field, std::to_string(*a.d.dp_rank)};
    rewritten = add_fields(body, {&rank, 1});
    if (!rewritten.empty()) body = rewritten;
  }
  a.sent_at = Clock::now();
  http::CallError e = co_await call.start(ex_.method(), ex_.target(), fwd_, body);
  a.dispatch->started_guess = call.request_sent();
  if (e == http::CallError::kNone) a.headers_at = Clock::now();
  if (auto connected = call.connect_time()) {
    if (metrics::Histogram* h = pool_->connect_time(*a.w)) h->observe(seconds(*connected));
  }
  if (a.prefill) {
    // (Before any suspension: once released, the prefill half can no longer abort the call.)
    if (e == http::CallError::kNone &&
        (call.status() != 200 || !call.header("content-type").starts_with("text/event-stream"))) {
      a.prefill->leg->release_decode();  // a whole answer (or an error): the decode is done
    }
    if (a.prefill->leg->aborted_decode() && !ex_.client_gone()) {
      Next next = co_await prefill_failed(a);
      co_return next;
    }
  }
  if (e == http::CallError::kAborted || ex_.client_gone()) {
    call.abort();
    a.dispatch->finish(Outcome{.status = kClientClosedStatus, .started = call.request_sent()},
                       Verdict::kNeutral);
    client_left();
    co_return Next::kDone;
  }
  if (e != http::CallError::kNone) {
    last_error_ = e;
    g_.metrics_.upstream_errors.with({a.w->url(), http::to_string(e)}).inc();
    a.tag(log::warn(kLogAttemptFailed, "upstream attempt failed"))
        .kv("error", http::to_string(e))
        .kv("detail", call.error_detail())
        .kv("request_sent", call.request_sent());
    a.dispatch->finish(Outcome{.status = 502, .started = call.request_sent()}, Verdict::kFailure);
    if (e == http::CallError::kTimeout) {
      co_await refuse(errors::upstream_timeout(static_cast<long>(g_.timeout_.count())), a.w);
      co_return Next::kDone;
    }
    if (call.request_sent()) {
      // The worker received the whole request: it may be running it. Not retried.
      retry_denied("unsafe");
      GatewayError ge = e == http::CallError::kProtocol ? errors::upstream_protocol(a.w->id())
                                                        : errors::upstream_no_answer(a.w->id());
      co_await refuse(ge, a.w);
      co_return Next::kDone;
    }
    failed_.push_back(a.w->id());
    if (auto why = may_retry(); !why.empty()) {
      retry_denied(why);
      co_return Next::kGiveUp;
    }
    co_return Next::kRetry;
  }

  a.status = call.status();
  // A 500 says the worker ran the request and failed: retried once, elsewhere. (A 504 is not
  // retried: the request may still be running behind whatever timed out.)
  bool ran = a.status == 500;
  if (!retryable_status(a.status) || (ran && ran_and_failed_ > 0)) co_return Next::kOn;
  // The worker's Retry-After is honoured; when no retry may follow, this answer is the
  // client's (relayed), not a gateway error.
  retry_after_.reset();
  if (auto ra = call.header("retry-after"); !ra.empty()) {
    retry_after_ = parse_retry_after(ra, std::chrono::system_clock::now());
  }
  if (auto why = may_retry(); !why.empty()) {
    retry_denied(why);
    co_return Next::kOn;
  }
  g_.metrics_.upstream_errors.with({a.w->url(), "status_" + std::to_string(a.status)}).inc();
  a.tag(log::warn(kLogRetryableStatus, "upstream answered a retryable status"))
      .kv("status", a.status);
  SavedAnswer answer{.status = a.status,
                     .content_type = std::string(call.header("content-type")),
                     .retry_after = std::string(call.header("retry-after"))};
  // (GCC 12 miscompiles co_await inside an if condition: awaited into a variable first.)
  http::CallError read = co_await call.read_all(answer.body, kSavedAnswerLimit);
  // Prefill/decode: a decode's 5xx saying its KV transfer failed (neither side charged).
  a.blame_prefill = a.prefill && kv_transfer_failure(answer.body);
  if (read == http::CallError::kNone) {
    saved_ = std::move(answer);
    prefill_error_.reset();  // this later answer is what the client gets if nothing works out
  }
  failed_attempt(a, a.status, ran);
  co_return Next::kRetry;
}

// Phase: a stream's first event, read before the client sees anything. An abort there with a
// worker-side status (503 queue full, a failed PD transfer...) is a failed attempt, retried like
// that status when it may be; one naming a client error (4xx) or no status at all (SGLang sends a
// request's ValueError this way: input too long...) is the request's own answer.
awaitable<Next> Gateway::Request::first_event(Attempt& a) {
  http::UpstreamCall& call = *a.call;
  a.sse = call.header("content-type").starts_with("text/event-stream");
  if (!a.sse || a.status != 200 || call.done()) co_return Next::kOn;
  http::CallError re = http::CallError::kNone;
  while (a.pre.size() < kFirstEventLimit && !first_event_end(a.pre)) {
    std::string_view piece = co_await call.read_view(re);
    a.saw(piece);
    a.pre.append(piece);
    if (piece.empty() || re != http::CallError::kNone) break;
  }
  if (a.prefill) {
    // Nothing reached the client yet: a decode stream the prefill's failure cut (even after its
    // first event) is that failure, retried as such.
    if (a.prefill->leg->aborted_decode() && !ex_.client_gone()) {
      Next next = co_await prefill_failed(a);
      co_return next;
    }
    a.prefill->leg->release_decode();  // its first event: the decode half had its KV
  }
  if (re == http::CallError::kAborted || ex_.client_gone()) {
    call.abort();
    a.dispatch->finish(Outcome{.status = kClientClosedStatus, .started = true}, Verdict::kNeutral);
    client_left();
    co_return Next::kDone;
  }
  if (re != http::CallError::kNone && !first_event_end(a.pre)) {
    // Headers, then nothing (or part of an event, which the client could not use): the worker had
    // the request; not retried.
    g_.metrics_.upstream_errors.with({a.w->url(), "stream_" + std::string(http::to_string(re))})
        .inc();
    a.tag(log::warn(kLogNoFirstEvent, "upstream stream ended before its first event"))
        .kv("error", http::to_string(re))
        .kv("detail", call.error_detail());
    a.dispatch->finish(Outcome{.status = 502, .started = true}, Verdict::kFailure);
    GatewayError ge = re == http::CallError::kTimeout
                          ? errors::upstream_timeout(static_cast<long>(g_.timeout_.count()))
                          : errors::upstream_no_answer(a.w->id());
    co_await refuse(ge, a.w);
    co_return Next::kDone;
  }
  auto end = first_event_end(a.pre);
  if (!end) {
    a.dispatch->first_token();  // a first event longer than the limit: data all the same
    co_return Next::kOn;
  }
  auto abort = event_abort(std::string_view(a.pre).substr(0, *end));
  if (!abort) {
    a.dispatch->first_token();
    co_return Next::kOn;
  }
  // An engine-side abort naming no status (SGLang's FINISH_ABORT from an abort or a drain) is the
  // worker's doing: treated as a 503. An error object naming none is the request's (SGLang streams
  // a request's ValueError that way).
  int as = abort_status(*abort);
  bool request_error = request_error_status(as);
  a.blame_prefill = a.prefill && kv_transfer_failure(abort->message);
  a.request_abort = request_error;
  a.abort_status = as;
  a.tag(log::warn(kLogFirstEventAbort, "upstream aborted the stream in its first event"))
      .kv("message", abort->message)
      .kv("status", as)
      .kv("request_error", request_error);
  if (request_error) co_return Next::kOn;
  g_.metrics_.stream_aborts.with({a.w->url()}).inc();
  a.worker_abort = true;
  a.abort_ran = as == 500;
  if (!retryable_status(as) || (a.abort_ran && ran_and_failed_ > 0)) co_return Next::kOn;
  if (auto why = may_retry(); !why.empty()) {
    retry_denied(why);  // the abort goes to the client as the worker sent it
    co_return Next::kOn;
  }
  call.abort();
  failed_attempt(a, as, a.abort_ran);
  last_error_ = http::CallError::kNone;
  saved_.reset();
  co_return Next::kRetry;
}

// Phase: relay. Committed to this answer: from here on nothing is retried. The worker's answer
// streams to the client as it arrives (backpressure: one buffer in flight).
awaitable<void> Gateway::Request::relay(Attempt& a) {
  http::UpstreamCall& call = *a.call;
  for (Worker* charged : charge_if_served_) {
    // Charged only when this worker serves the request (not when it, too, answers an error).
    if (charged != a.w && a.status < 400 && !a.worker_abort && !a.request_abort) {
      charged->record_failure(CircuitBreaker::Pass::kNormal, a.now);
    }
  }
  charge_if_served_.clear();
  const ConnectionTokens resp_tokens = ConnectionTokens::of(call);
  http::HeaderBuffer<24> out;
  call.for_each_header([&](std::string_view name, std::string_view value) {
    switch (http::classify_header(name)) {
      case http::HeaderKind::kContentType:
      case http::HeaderKind::kOther:
      case http::HeaderKind::kHost:
      case http::HeaderKind::kExpect:
      case http::HeaderKind::kTraceParent:  // a worker's own, relayed as it always was
        if (resp_tokens.empty() || !resp_tokens.contains(name)) out.push_back({name, value});
        break;
      default:  // hop-by-hop, content-length (we frame the body), x-request-id (ours)
        break;
    }
  });
  out.push_back({"x-request-id", rid_});
  std::string route_header, attempts_header, rank_header, prefill_route, prefill_rank;
  if (g_.config_.debug_headers || doctor_) {
    route_header = std::string(decider(a).name()) + "/" + std::string(a.d.branch);
    if (a.prefill) {
      // Prefill/decode: x-kvgate-worker and x-kvgate-route are the decode half's.
      const Attempt::Prefill& p = *a.prefill;
      prefill_route = std::string(pool_->policy().name()) + "/" + std::string(p.d.branch);
      out.push_back({"x-kvgate-prefill-worker", p.w->url()});
      out.push_back({"x-kvgate-prefill-route", prefill_route});
      if (p.d.dp_rank) {
        prefill_rank = std::to_string(*p.d.dp_rank);
        out.push_back({"x-kvgate-prefill-dp-rank", prefill_rank});
      }
    }
    attempts_header = std::to_string(attempts_made_);
    out.push_back({"x-kvgate-worker", a.w->url()});
    out.push_back({"x-kvgate-route", route_header});
    out.push_back({"x-kvgate-attempts", attempts_header});
    if (a.d.dp_rank) {
      rank_header = std::to_string(*a.d.dp_rank);
      out.push_back({"x-kvgate-dp-rank", rank_header});
    }
  }

  int status = a.status;
  int final_status = status;
  // As an HTTP answer of the same status would count: a 500 after one elsewhere is the request's
  // fault, not this worker's; a relayed 408/429 abort is backpressure (neutral).
  bool ran = status == 500;
  Verdict verdict = a.worker_abort               ? (a.abort_status < 500                 ? Verdict::kNeutral
                                                    : a.abort_ran && ran_and_failed_ > 0 ? Verdict::kNeutral
                                                                                         : Verdict::kFailure)
                    : status < 500               ? Verdict::kSuccess
                    : ran && ran_and_failed_ > 0 ? Verdict::kNeutral
                                                 : Verdict::kFailure;
  if (a.blame_prefill) verdict = Verdict::kNeutral;  // a failed KV transfer: neither side charged
  if (a.cells && status < 400 && !a.worker_abort && !a.request_abort) {
    // The client gets this answer: its head's (and first byte's, when read already) times count.
    a.timing_committed = true;
    a.cells->headers->observe(seconds(a.headers_at - a.sent_at));
    if (a.first_byte_at != Clock::time_point{}) {
      a.cells->first_byte->observe(seconds(a.first_byte_at - a.sent_at));
    }
  }
  UsageScanner usage;
  // Always read (the token counters); the policy hears it when it wants it (Outcome).
  bool scan_usage = status < 400;
  learn_id_ = route_ == ApiRoute::kResponses && info_.store && status == 200 && !a.worker_abort;
  if (call.done() && a.pre.empty()) {  // no body (a.pre: what the first event's check read)
    bool sent = co_await ex_.respond(status, out, "");
    if (!sent) final_status = kClientClosedStatus;
    complete(a, final_status, verdict, usage);
    co_return;
  }
  if (a.prefill && info_.return_logprob && status == 200 && !a.worker_abort) {
    co_await relay_with_prompt_logprobs(a, out, verdict);
    co_return;
  }
  auto length = call.content_length();
  co_await ex_.begin_body(status, out, length);
  bool ok = true;
  if (!a.pre.empty()) {
    if (scan_usage) usage.feed(a.pre);
    if (learn_id_) scan_id(a, a.pre);
    ok = co_await ex_.write_body(a.pre);
    std::string().swap(a.pre);  // (a stream may last minutes: not kept for it)
  }
  while (ok) {
    http::CallError re = http::CallError::kNone;
    // In place in the worker connection's buffer: no relay buffer, no copy.
    std::string_view piece = co_await call.read_view(re);
    a.saw(piece);
    if (!piece.empty() && scan_usage) usage.feed(piece);
    if (learn_id_ && !piece.empty()) scan_id(a, piece);
    if (!piece.empty()) {
      bool written = co_await ex_.write_body(piece);
      if (!written) {
        ok = false;
        break;
      }
    }
    if (re == http::CallError::kAborted || ex_.client_gone()) {
      ok = false;
      break;
    }
    if (re != http::CallError::kNone) {
      // The response started: the client cannot be given another one. End it visibly.
      g_.metrics_.upstream_errors
          .with({a.w->url(), "mid_response_" + std::string(http::to_string(re))})
          .inc();
      a.tag(log::warn(kLogMidResponse, "upstream failed mid-response"))
          .kv("error", http::to_string(re))
          .kv("detail", call.error_detail());
      GatewayError ge = re == http::CallError::kTimeout
                            ? errors::upstream_timeout(static_cast<long>(g_.timeout_.count()))
                            : errors::upstream_failed(a.w->id());
      final_status = ge.status;
      if (!ex_.response_started()) {
        // Nothing reached the client yet (a stream's head waits for its first bytes): a plain
        // error answer is still possible.
        co_await g_.fail(ex_, ge, rid_, a.w);
      } else if (a.sse && !length) {
        std::string event = "data: " + error_body(ge) + "\n\ndata: [DONE]\n\n";
        co_await ex_.write_body(event);
        co_await ex_.end_body();
      } else {
        ex_.close_after();
      }
      verdict = Verdict::kFailure;
      break;
    }
    if (piece.empty()) {
      bool ended = co_await ex_.end_body();
      if (!ended) ok = false;
      break;
    }
  }
  if (!ok) {
    call.abort();
    final_status = kClientClosedStatus;
  }
  complete(a, final_status, verdict, usage);
}

void Gateway::Request::scan_id(const Attempt& a, std::string_view piece) {
  std::string_view id;
  if (id_scan_.empty()) id = ResponseOwners::find_id(piece);
  if (id.empty()) {
    id_scan_.append(piece.substr(0, kResponseIdScanLimit - id_scan_.size()));
    id = ResponseOwners::find_id(id_scan_);
  }
  if (!id.empty()) {
    if (!g_.owners_.learn(id, pool_->name(), a.w->url(), a.d.dp_rank.value_or(-1))) {
      g_.owners_.count("conflict");
    }
  } else if (id_scan_.size() < kResponseIdScanLimit) {
    return;  // not yet: the id may be in the next piece
  }
  learn_id_ = false;
  std::string().swap(id_scan_);
}

// Phase: complete. Every dispatch gets exactly one completion: the policy's on_completed (with
// what the worker reported of its cache), the breaker's verdict, the request's metrics.
void Gateway::Request::complete(Attempt& a, int final_status, Verdict verdict,
                                const UsageScanner& usage) {
  if (final_status == kClientClosedStatus) {
    g_.metrics_.client_disconnects.with({}).inc();
    verdict = Verdict::kNeutral;
  }
  const Outcome outcome{.status = final_status,
                        .ok = final_status < 400,
                        .cached_tokens = usage.cached_tokens(),
                        .prompt_tokens = usage.prompt_tokens(),
                        .started = true};
  a.dispatch->finish(outcome, verdict);
  if (route_ == ApiRoute::kResponse && final_status == 200 && ex_.method() == "DELETE") {
    g_.owners_.forget(response_id_);
  }
  if (a.cells && final_status < 400) {
    a.cells->e2e->observe(seconds(Clock::now() - a.sent_at));
    // As the engine reported them (the last value in the answer: streams repeat them).
    if (a.prefill) {
      // Prefill/decode: the prompt was computed by the prefill server; its cells count it
      // (settle_prefill), once.
      a.prefill->served_ok = true;
      a.prefill->decode_prompt = usage.prompt_tokens();
      a.prefill->decode_cached = usage.cached_tokens();
    } else {
      if (auto n = usage.prompt_tokens(); n && *n > 0) a.cells->prompt_tokens->inc(*n);
      if (auto n = usage.cached_tokens(); n && *n > 0) a.cells->cached_tokens->inc(*n);
      // What the deciding policy expected cached, for the same requests as cached_tokens.
      if (usage.cached_tokens()) {
        if (uint64_t p = a.dispatch->predicted_cached(outcome); p > 0) {
          a.cells->predicted_tokens->inc(p);
        }
      }
    }
    if (auto n = usage.completion_tokens(); n && *n > 0) a.cells->generated_tokens->inc(*n);
  }
  record(final_status);
}

Policy& Gateway::Request::decider(const Attempt& a) const {
  if (pinned_) return pinned_policy();
  if (!owner_.empty()) return owner_policy();
  return a.prefill ? pool_->decode_policy() : pool_->policy();
}

void Gateway::Request::dispatched(Attempt& a) {
  a.cells = pool_->signals(*a.w, a.d.dp_rank);
  if (!g_.metrics_.smg()) [[likely]] {
    return;
  }
  if (auto* c =
          g_.metrics_.smg_selection(role_label(pool_->role(*a.w)), model_, decider(a).name())) {
    c->inc();
  }
  if (a.prefill) {
    if (auto* c = g_.metrics_.smg_selection("prefill", model_, pool_->policy().name())) c->inc();
  }
}

// Prefill/decode, the request served: the prompt's figures on the prefill server's cells (it
// computed the prompt, and the prefill policy's prediction was about it): what its own answer
// reported, else what the decode's did. The decode server's cells count none of them.
void Gateway::Request::count_prefill_usage(PrefillHalf& p) {
  const UsageScanner& own = p.leg->usage();
  std::optional<int64_t> prompt = own.prompt_tokens();
  std::optional<int64_t> cached = own.cached_tokens();
  if (!prompt || *prompt <= 0) {
    prompt = p.decode_prompt;
    cached = p.decode_cached;
  }
  const SignalCells* cells = pool_->signals(*p.w, p.d.dp_rank);
  if (!cells || !prompt || *prompt <= 0) return;
  cells->prompt_tokens->inc(*prompt);
  if (!cached) return;
  if (*cached > 0) cells->cached_tokens->inc(*cached);
  const Outcome reported{.cached_tokens = cached, .prompt_tokens = prompt};
  if (uint64_t n = p.dispatch->predicted_cached(reported); n > 0) cells->predicted_tokens->inc(n);
}

// Prefill/decode: the prefill half ends with its attempt. When the decode half served the client
// the prefill's answer is awaited (it has come, or comes soon: the decode had its KV); otherwise
// the prefill call is ended. Its dispatch then closes with what the prefill server did.
awaitable<void> Gateway::Request::settle_prefill(Attempt& a, bool served) {
  Attempt::Prefill& p = *a.prefill;
  cancel_.prefill = nullptr;
  if (!p.dispatch || p.dispatch->done()) co_return;  // none opened, or closed already
  if (!p.leg) {
    p.dispatch->finish(Outcome{.status = kClientClosedStatus, .started = false}, Verdict::kNeutral);
    co_return;
  }
  pd::PrefillLeg& leg = *p.leg;
  if (served && slot_) {
    slot_->release();  // the client has its answer: the prefill's own is not worth a slot
    slot_ = nullptr;
  }
  if (!served || ex_.client_gone()) leg.abort();
  co_await wait_prefill(a);
  if (auto connected = leg.connect_time()) {
    if (metrics::Histogram* h = pool_->connect_time(*p.w)) h->observe(seconds(*connected));
  }
  if (p.served_ok) count_prefill_usage(p);
  if (a.blame_prefill) {
    // The decode said the KV never came: either side may be at fault (the prefill's sender, the
    // decode's receiver, the path between). Neither is charged; this request tries another pair.
    failed_.push_back(p.w->id());
    failed_.push_back(a.w->id());
  }
  if (leg.state() == pd::PrefillLeg::State::kOk) {
    const Outcome outcome{.status = leg.status(),
                          .ok = true,
                          .cached_tokens = leg.usage().cached_tokens(),
                          .prompt_tokens = leg.usage().prompt_tokens(),
                          .started = true};
    p.dispatch->finish(outcome, Verdict::kSuccess);
    co_return;
  }
  // The prefill failed on its own (not ended by this attempt: after its decode had the KV, or
  // while the decode failed too): the prefill server's fault, and the next attempt chooses
  // another. Ended by the attempt (it failed elsewhere, the client left, the answer was not
  // awaited longer): neutral.
  const bool its_fault = leg.failed() && !leg.ended_by_attempt();
  if (its_fault) {
    g_.metrics_.pd_prefill_failures.with({p.w->url()}).inc();
    failed_.push_back(p.w->id());
    a.tag(log::warn(kLogPrefillFailed, "prefill failed"))
        .kv("prefill", p.w->url())
        .kv("served", served)
        .kv("error", leg.error());
  }
  p.dispatch->finish(Outcome{.status = leg.status() != 0 ? leg.status() : kClientClosedStatus,
                             .started = leg.request_sent()},
                     its_fault ? Verdict::kFailure : Verdict::kNeutral);
}

awaitable<void> Gateway::Request::wait_prefill(Attempt& a) {
  const std::shared_ptr<pd::PrefillLeg>& leg = a.prefill->leg;
  if (leg->finished()) co_return;
  Timer guard(ex_.executor(), kPrefillAnswerWait);
  guard.async_wait([leg](const boost::system::error_code& ec) {
    if (!ec) leg->abort();
  });
  co_await leg->wait();
  guard.cancel();
}

awaitable<void> Gateway::Request::relay_with_prompt_logprobs(Attempt& a, http::HeaderList out,
                                                             Verdict verdict) {
  http::UpstreamCall& call = *a.call;
  co_await wait_prefill(a);
  // The prefill's rows, parsed once for the whole answer.
  const pd::PromptLogprobs prefill(a.prefill->leg->answer_json());
  if (prefill.empty()) {
    a.tag(log::warn(kLogNoPromptLogprobs, "no prompt logprobs from the prefill to merge"))
        .kv("prefill", a.prefill->w->url())
        .kv("prefill_state", a.prefill->leg->finished() ? a.prefill->leg->error() : "no answer");
  }
  UsageScanner usage;
  int final_status = a.status;
  auto failed = [&](http::CallError re) {
    g_.metrics_.upstream_errors
        .with({a.w->url(), "mid_response_" + std::string(http::to_string(re))})
        .inc();
    verdict = Verdict::kFailure;
    return re == http::CallError::kTimeout
               ? errors::upstream_timeout(static_cast<long>(g_.timeout_.count()))
               : errors::upstream_failed(a.w->id());
  };
  if (!a.sse) {
    std::string body;
    http::CallError re = co_await call.read_all(body, kMaxMergedAnswer);
    if (re == http::CallError::kAborted || ex_.client_gone()) {
      complete(a, kClientClosedStatus, verdict, usage);
      co_return;
    }
    if (re != http::CallError::kNone) {
      GatewayError ge = failed(re);
      co_await g_.fail(ex_, ge, rid_, a.w);
      complete(a, ge.status, verdict, usage);
      co_return;
    }
    std::string merged = prefill.merge(body);
    if (!merged.empty()) body = std::move(merged);
    usage.feed(body);
    bool sent = co_await ex_.respond(a.status, out, body);
    complete(a, sent ? final_status : kClientClosedStatus, verdict, usage);
    co_return;
  }
  // A stream: each event rewritten as it comes (the prefill's rows in every one that carries
  // meta_info), the rest relayed as is.
  co_await ex_.begin_body(a.status, out, std::nullopt);
  std::string pending = std::move(a.pre);
  bool ok = true;
  for (;;) {
    while (ok) {
      auto end = first_event_end(pending);
      if (!end) break;
      std::string_view event(pending.data(), *end);
      std::string merged = prefill.merge_event(event);
      std::string_view send = merged.empty() ? event : std::string_view(merged);
      usage.feed(send);
      ok = co_await ex_.write_body(send);
      pending.erase(0, *end);
    }
    if (!ok) break;
    http::CallError re = http::CallError::kNone;
    std::string_view piece = co_await call.read_view(re);
    a.saw(piece);
    if (!piece.empty()) {
      if (pending.size() + piece.size() > kMaxMergedAnswer) {
        re = http::CallError::kProtocol;  // an event past any sane size
      } else {
        pending.append(piece);
      }
    }
    if (re == http::CallError::kAborted || ex_.client_gone()) {
      ok = false;
      break;
    }
    if (re != http::CallError::kNone) {
      GatewayError ge = failed(re);
      final_status = ge.status;
      std::string event = "data: " + error_body(ge) + "\n\ndata: [DONE]\n\n";
      co_await ex_.write_body(event);
      co_await ex_.end_body();
      break;
    }
    if (piece.empty()) {
      if (!pending.empty()) ok = co_await ex_.write_body(pending);
      if (ok) ok = co_await ex_.end_body();
      break;
    }
  }
  if (!ok) {
    call.abort();
    final_status = kClientClosedStatus;
  }
  complete(a, final_status, verdict, usage);
}

// No attempt produced an answer to relay: the last refusal a worker sent, else a gateway error.
awaitable<void> Gateway::Request::give_up() {
  if (ex_.client_gone()) {
    client_left();
    co_return;
  }
  if (saved_) {
    http::HeaderBuffer<4> h;
    h.push_back({"content-type", saved_->content_type.empty()
                                     ? std::string_view("application/json")
                                     : std::string_view(saved_->content_type)});
    if (!saved_->retry_after.empty()) h.push_back({"retry-after", saved_->retry_after});
    h.push_back({"x-request-id", rid_});
    co_await ex_.respond(saved_->status, h, saved_->body);
    record(saved_->status);
    co_return;
  }
  if (prefill_error_) {
    GatewayError pe = *prefill_error_;
    co_await refuse(pe);
    co_return;
  }
  GatewayError ge = last_error_ != http::CallError::kNone
                        ? errors::upstream_unreachable(attempts_made_)
                        : errors::no_worker(set_->workers.size());
  co_await refuse(ge);
}

// The request path, in phase order (gateway.h lists them).
awaitable<void> Gateway::proxy(http::Exchange& ex, ApiRoute route, std::string_view label,
                               std::string_view rid) {
  // On the heap, not in this coroutine's frame: a frame under ~2 KB is recycled by Asio's
  // per-thread cache, a larger one is a malloc and free per request.
  auto owned = std::make_unique<Request>(*this, ex, route, label, rid);
  Request& r = *owned;
  bool go = r.resolve();
  if (!go) {
    co_await r.refuse_pending();
    co_return;
  }
  r.watch();
  if (!r.admits_all()) {
    go = co_await r.admit();
    if (!go) co_return;
  }
  if (r.names_response()) {
    go = co_await r.locate();
    if (!go) {
      if (r.refusing()) co_await r.refuse_pending();
      co_return;
    }
  }
  go = r.parse();
  if (!go) {
    co_await r.refuse_pending();
    co_return;
  }
  r.forward_headers();
  for (;;) {
    if (r.must_back_off()) {
      go = co_await r.back_off();
      if (!go) co_return;
    }
    Attempt a(r);
    Next next = r.select(a);
    if (next == Next::kRefuse) {
      co_await r.refuse_pending();
      next = Next::kDone;
    }
    if (next == Next::kOn) next = co_await r.send(a);
    if (next == Next::kOn) next = co_await r.first_event(a);
    bool served = false;
    if (next == Next::kOn) {
      co_await r.relay(a);  // and complete
      served = a.status < 400 && !a.worker_abort && !a.request_abort;
      next = Next::kDone;
    }
    if (a.prefill) co_await r.settle_prefill(a, served);
    if (next == Next::kRetry) continue;
    if (next == Next::kGiveUp) break;
    co_return;
  }
  co_await r.give_up();
}

}  // namespace kvgate
