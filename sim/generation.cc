// sim/generation: see generation.h.
#include "sim/generation.h"

#include <boost/asio/as_tuple.hpp>
#include <cctype>
#include <ctime>
#include <memory>
#include <optional>
#include <span>

#include "sim/abort.h"
#include "sim/openai_responses.h"
#include "sim/pd.h"
#include "sim/responses.h"
#include "sim/stream_writer.h"
#include "util/random.h"

namespace kvgate::sim {
namespace {

constexpr http::Header kJson[] = {{"content-type", "application/json"}};
constexpr http::Header kSse[] = {{"content-type", "text/event-stream"},
                                 {"cache-control", "no-cache"}};

std::string random_hex_id() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  auto& rng = thread_rng();
  for (int half = 0; half < 2; ++half) {
    uint64_t v = rng.next();
    for (int i = 0; i < 16; ++i)
      id[static_cast<size_t>(half) * 16 + static_cast<size_t>(i)] = kHex[(v >> (4 * i)) & 0xf];
  }
  return id;
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A whole answer; with a drop fault, half of it, then the connection closes.
awaitable<void> respond_whole(http::Exchange& ex, std::string_view body, bool drop) {
  if (!drop) {
    co_await ex.respond(200, kJson, body);
    co_return;
  }
  co_await ex.begin_body(200, kJson, body.size());
  co_await ex.write_body(body.substr(0, body.size() / 2));
  ex.close_after();
}

// Sends an abort answer (`body` stays alive with the caller). `head_started`: a stream's status
// and headers already went out.
awaitable<void> send_abort(http::Exchange& ex, int status, bool stream, std::string_view body,
                           bool head_started) {
  if (!stream) {
    co_await ex.respond(status, kJson, body);
    co_return;
  }
  if (!head_started) co_await ex.begin_body(200, kSse, std::nullopt);
  // Awaited into a variable, never inside an if-condition: GCC 12.2 miscompiles `if (co_await x)`
  // in some coroutines (the frame later resumes at a bad index: SIGSEGV or SIGILL even where that
  // line never runs; reproduced with plain Boost.Asio). Same below.
  bool sent = co_await ex.write_body(body);
  if (sent) co_await ex.end_body();
}

// A hang fault: never answer; return when the client goes away.
awaitable<void> hang(http::Exchange& ex) {
  auto timer = std::make_shared<Timer>(ex.executor(), Clock::time_point::max());
  ex.watch_disconnect([timer] { timer->cancel(); });
  co_await timer->async_wait(asio::as_tuple(use_awaitable));
}

// Waits until every track finished; false when the client went away first.
awaitable<bool> wait_all(http::Exchange& ex, Notifier& n, std::vector<Track>& tracks,
                         const Tokenizer& tok) {
  for (;;) {
    co_await n.wait();
    if (ex.client_gone()) co_return false;
    bool all = true;
    for (auto& t : tracks) {
      t.update(tok);
      all = all && t.finished();
    }
    if (all) co_return true;
  }
}

// Relays the tracks' progress as SSE until they all finish (or the client leaves, or a drop).
// Without `head_started`, the status and headers go out with the first event.
awaitable<void> relay_stream(http::Exchange& ex, Notifier& n, std::vector<Track>& tracks,
                             StreamWriter& writer, Emitter& em, const Tokenizer& tok,
                             bool head_started) {
  if (!head_started) co_await ex.begin_body(200, kSse, std::nullopt);
  for (;;) {
    co_await n.wait();
    if (ex.client_gone()) co_return;
    bool all = true;
    for (size_t i = 0; i < tracks.size(); ++i) {
      if (tracks[i].update(tok)) writer.on_update(tracks[i], static_cast<int>(i), em);
      all = all && tracks[i].finished();
    }
    if (all) {
      writer.on_end(tracks, em);
      if (writer.sse_done()) em.done();
    }
    if (!em.buffer().empty()) {
      bool ok = co_await ex.write_body(em.buffer());
      em.buffer().clear();
      if (!ok) co_return;
    }
    if (em.cut()) {
      ex.close_after();
      co_return;
    }
    if (all) {
      co_await ex.end_body();
      co_return;
    }
  }
}

// The answer to a request SGLang's scheduler aborts before its first token (a full queue, a
// failed KV transfer; here also --abort-first-event-rate), built whole before any I/O.
// Streams: status 200 (/generate sent its headers at once; the OpenAI routes send them with their
// first chunk, which is this abort), then per prompt a /generate chunk whose finish_reason is the
// abort, or, on OpenAI routes, one error event (SGLang stops at the first abort) and the usage
// chunk when usage was asked for; then [DONE]. Whole answers: the abort's status with FastAPI's
// HTTPException body on every route, or, for a 400, the route's own error body (SGLang raises a
// ValueError then).
FinishReason abort_reason(int status, std::string message, std::string err_type = {}) {
  return FinishReason{.kind = FinishReason::Kind::kAbort,
                      .message = std::move(message),
                      .status_code = status,
                      .err_type = std::move(err_type)};
}

struct AbortAnswer {
  int status = 200;
  bool stream = false;
  std::string body;
};

AbortAnswer make_abort_answer(const ParsedRequest& req, std::span<const OutputView> views,
                              const FinishReason& abort, bool cache_report) {
  AbortAnswer a;
  const int status = abort.status_code > 0 ? abort.status_code : 500;
  if (req.route == Route::kResponses) {
    // serving_responses sees the abort as an exception (HTTPException or ValueError).
    append_exception_failure(a.body, *req.responses, status, abort.message, req.stream, a.status);
    a.stream = req.stream;
    return a;
  }
  if (!req.stream) {
    a.status = status;
    if (status >= 500) {
      append_http_exception_error(a.body, abort.message, status);
    } else if (req.route == Route::kGenerate) {
      append_generate_error(a.body, abort.message);
    } else {
      append_openai_error(a.body, abort.message, status);
    }
    return a;
  }
  a.stream = true;
  Emitter em(std::nullopt);
  if (req.route == Route::kGenerate) {
    for (size_t i = 0; i < views.size(); ++i) {
      em.event([&](std::string& out) {
        append_generate_object(out, views[i], req.batch ? static_cast<int>(i) : -1);
      });
    }
  } else {
    em.event([&](std::string& out) { append_openai_abort_event(out, abort.message, status); });
    if (req.include_usage && !views.empty()) {
      OpenAIContext c{.id = views[0].id,
                      .model = req.model,
                      .created = static_cast<int64_t>(std::time(nullptr)),
                      .cache_report = cache_report};
      em.event([&](std::string& out) {
        append_usage_chunk(out, c, req.route == Route::kChatCompletions, views.first(1));
      });
    }
  }
  em.done();
  a.body = std::move(em.buffer());
  return a;
}

// A /v1/responses stream that already sent response.created and response.in_progress ends with
// the abort's response.failed alone.
void drop_started_events(AbortAnswer& a, Route route, bool head_started) {
  if (route != Route::kResponses || !head_started || !a.stream) return;
  a.body.erase(0, a.body.find("event: response.failed"));
}

// One view per prompt of an aborted request: no output, nothing cached.
std::vector<OutputView> abort_views(std::span<const std::string> ids,
                                    std::span<const int64_t> prompt_tokens, int dp_rank,
                                    const FinishReason& abort, double e2e_latency) {
  std::vector<OutputView> views;
  for (size_t i = 0; i < ids.size(); ++i) {
    views.push_back(OutputView{.id = ids[i],
                               .prompt_tokens = prompt_tokens[i],
                               .dp_rank = dp_rank,
                               .finish = &abort,
                               .e2e_latency = e2e_latency});
  }
  return views;
}

// The rank a request asked for (0 when none; the abort of a request never scheduled reports it).
int scratch_rank(const ParsedRequest& r) {
  return static_cast<int>(r.routed_dp_rank.value_or(0));
}

// The abort of a request before it reached the engine: a full queue, --abort-first-event-rate,
// a logprob_start_len past the prompt.
AbortAnswer abort_before_start(const ParsedRequest& req, int status, std::string message,
                               bool cache_report, int meta_dp_rank, std::string err_type = {}) {
  const FinishReason abort = abort_reason(status, std::move(message), std::move(err_type));
  std::vector<std::string> ids;
  std::vector<int64_t> prompt_tokens;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    ids.push_back(req.rids[i].empty() ? random_hex_id() : req.rids[i]);
    prompt_tokens.push_back(static_cast<int64_t>(req.prompts[i].size()));
  }
  auto views = abort_views(ids, prompt_tokens, meta_dp_rank, abort, 0.0);
  return make_abort_answer(req, views, abort, cache_report);
}

// How the instant completion ends for a request of `max_new` tokens.
InstantShape instant_shape(int64_t max_new, int32_t eos) {
  auto words = static_cast<size_t>(std::min<int64_t>(max_new, InstantCompletion::kWords));
  if (max_new > static_cast<int64_t>(InstantCompletion::kWords)) {
    return {words, words + 1,
            FinishReason{.kind = FinishReason::Kind::kStop, .matched_token = eos}};
  }
  return {words, words,
          FinishReason{.kind = FinishReason::Kind::kLength, .length = static_cast<int64_t>(words)}};
}

// Scheduler.handle_generate_request: with return_logprob, a logprob_start_len that leaves no
// prompt token is a 400 abort (set_finish_with_abort, err_type "BadRequestError"). "" when every
// prompt is fine, else the message.
std::string check_logprob_start(const ParsedRequest& req) {
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    const LogprobParams& lp = req.logprob(i);
    const auto n = static_cast<int64_t>(req.prompts[i].size());
    if (lp.return_logprob && lp.start_len >= n) {
      return "req.logprob_start_len=" + std::to_string(lp.start_len) +
             " is higher than the number of input tokens len(req.origin_input_ids)=" +
             std::to_string(n) + ". Please use a smaller logprob_start_len.";
    }
  }
  return "";
}

// SGLang's FAKE_BOOTSTRAP_HOST: a request with this bootstrap_host uses the fake transfer backend
// (no KV moves; SGLang's own PD warmup sends it).
constexpr std::string_view kFakeBootstrapHost = "2.2.2.2";

}  // namespace

InstantCompletion make_instant_completion(const PseudoText& model, const Tokenizer& tokenizer) {
  InstantCompletion ic;
  const std::vector<int32_t> prompt;  // the empty prompt: the text starts without a space
  ic.ids = model.generate(prompt, 0, InstantCompletion::kWords);
  ic.text_end.push_back(0);
  for (int32_t id : ic.ids) {
    tokenizer.decode_token(id, ic.text);
    ic.text_end.push_back(ic.text.size());
  }
  ic.ids.push_back(tokenizer.eos_token_id());
  return ic;
}

// A request header's value (names compare case-insensitively), or nullopt when it is absent.
std::optional<std::string_view> header_value(const http::Exchange& ex, std::string_view name) {
  std::optional<std::string_view> out;
  ex.for_each_header([&](std::string_view k, std::string_view v) {
    if (out || k.size() != name.size()) return;
    for (size_t i = 0; i < k.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(k[i])) != name[i]) return;
    }
    out = v;
  });
  return out;
}

awaitable<void> respond_error(http::Exchange& ex, Route route, int status,
                              std::string_view message) {
  std::string body;
  if (route == Route::kGenerate) {
    append_generate_error(body, message);
  } else if (route == Route::kResponses) {
    body = responses_error_body(message,
                                status == 400 ? "invalid_request_error" : openai_error_type(status),
                                std::nullopt, status);
  } else {
    append_openai_error(body, message, status);
  }
  co_await ex.respond(status, kJson, body);
}

GenerationHandler::GenerationHandler(const SimConfig& config, Engine& engine, FaultInjector& faults,
                                     const ChatTemplate& chat_template)
    : config_(config),
      engine_(engine),
      faults_(faults),
      chat_template_(chat_template),
      limits_{.default_max_new_tokens = config.default_max_new_tokens,
              .context_length = config.context_length,
              .max_req_input_len = max_req_input_len(config),
              .default_include_usage = config.stream_response_default_include_usage},
      instant_(make_instant_completion(engine.model(), engine.tokenizer())),
      lora_adapters_(lora_names(config)),
      response_store_(static_cast<size_t>(config.max_stored_responses)) {
  responses_options_ = ResponsesOptions{.enable_store = config.enable_response_store,
                                        .served_model_name = config_.served_model_name,
                                        .lora_adapters = lora_adapters_,
                                        .context_length = config.context_length,
                                        .default_max_new_tokens = config.default_max_new_tokens};
}

awaitable<void> GenerationHandler::handle(http::Exchange& ex, Route route) {
  // Parsed into a per-thread scratch object: nothing below suspends before it is used up or moved.
  thread_local ParsedRequest scratch;
  std::string err;
  if (route == Route::kResponses) {
    ResponsesError refused =
        parse_responses_request(ex.body(), responses_options_, response_store_, engine_.tokenizer(),
                                chat_template_, limits_, scratch);
    if (refused.status != 0) {
      co_await ex.respond(refused.status, kJson, refused.body);
      co_return;
    }
  } else {
    err = parse_request(route, ex.body(), engine_.tokenizer(), chat_template_, limits_, scratch);
  }
  // The OpenAI routes take the DP rank from an X-Data-Parallel-Rank header before the body's.
  if (err.empty() && route != Route::kGenerate) {
    err = apply_dp_rank_header(header_value(ex, "x-data-parallel-rank"), scratch);
  }
  if (err.empty()) err = check_loras(scratch, config_.enable_lora, lora_adapters_);
  if (err.empty()) err = engine_.check_rank(scratch.routed_dp_rank);
  for (size_t i = 0; err.empty() && i < scratch.rids.size(); ++i) {
    // TokenizerManager: a rid still in flight is refused (a ValueError: 400).
    if (!scratch.rids[i].empty() && registry_.live(scratch.rids[i])) {
      err = "Duplicate request ID detected: " + scratch.rids[i];
    }
  }
  if (!err.empty()) {
    co_await respond_error(ex, route, 400, err);
    co_return;
  }
  if (std::string bad = check_logprob_start(scratch); !bad.empty()) {
    // The scheduler's 400 abort: a whole answer is the route's 400, a stream carries the abort.
    AbortAnswer a =
        abort_before_start(scratch, 400, bad, config_.enable_cache_report,
                           engine_.meta_dp_rank(scratch_rank(scratch)), "BadRequestError");
    co_await send_abort(ex, a.status, a.stream, a.body, false);
    co_return;
  }
  if (!config_.instant) {
    if (std::string full = engine_.check_queue(scratch.routed_dp_rank, scratch.prompts.size());
        !full.empty()) {
      // SGLang's scheduler aborts it (503): a stream still answers 200, with the abort.
      AbortAnswer a = abort_before_start(scratch, 503, full, config_.enable_cache_report,
                                         engine_.meta_dp_rank(scratch_rank(scratch)));
      co_await send_abort(ex, a.status, a.stream, a.body, false);
      co_return;
    }
  }
  std::optional<int64_t> drop_after;
  bool aborted = false;
  switch (faults_.decide()) {
    case Fault::kFail:
      co_await respond_error(ex, route, static_cast<int>(faults_.settings().fail_status),
                             "injected failure (kvgate-sim --fail-rate)");
      co_return;
    case Fault::kHang:
      co_await hang(ex);
      co_return;
    case Fault::kDrop:
      drop_after = faults_.settings().drop_after_chunks;
      break;
    case Fault::kAbort:
      aborted = true;
      break;
    case Fault::kNone:
      break;
  }
  if (aborted) {
    // As SGLang's scheduler aborts a request it cannot serve, before any token.
    AbortAnswer a = abort_before_start(
        scratch, 503, "injected abort (kvgate-sim --abort-first-event-rate)",
        config_.enable_cache_report, engine_.meta_dp_rank(scratch_rank(scratch)));
    co_await send_abort(ex, a.status, a.stream, a.body, false);
    co_return;
  }
  if (config_.instant) {
    co_await answer_instant(ex, scratch, drop_after);
  } else {
    co_await run(ex, std::move(scratch), drop_after);
  }
}

awaitable<void> GenerationHandler::run(http::Exchange& ex, ParsedRequest req,
                                       std::optional<int64_t> drop_after) {
  const auto start = Clock::now();
  const Tokenizer& tok = engine_.tokenizer();
  // SGLang's /generate returns its StreamingResponse at once: the status and headers go out before
  // the prefill (on a PD decode server, before the wait for the KV), then a silence until the first
  // token. Its OpenAI routes first pull the stream's first chunk (so that a validation error can
  // still be a 400), so their headers go out with the first event (relay_stream).
  // /v1/responses streams too: its generator yields response.created and response.in_progress
  // before the engine's first output, so a client learns the response id at once.
  bool head_started = false;
  if (req.stream && req.route == Route::kGenerate) {
    co_await ex.begin_body(200, kSse, std::nullopt);
    bool flushed = co_await ex.flush();  // not in the if-condition: see send_abort
    if (!flushed) co_return;
    head_started = true;
  }
  std::optional<Emitter> em;
  std::unique_ptr<StreamWriter> writer;
  OpenAIContext c{.model = req.model,
                  .created = static_cast<int64_t>(std::time(nullptr)),
                  .cache_report = config_.enable_cache_report};
  if (req.stream) {
    em.emplace(drop_after);
    writer = make_stream_writer(req, c, config_.incremental_streaming_output);
  }
  if (req.stream && req.route == Route::kResponses) {
    co_await ex.begin_body(200, kSse, std::nullopt);
    writer->on_start(*em);
    bool sent = co_await ex.write_body(em->buffer());
    em->buffer().clear();
    if (!sent) co_return;
    bool flushed = co_await ex.flush();
    if (!flushed) co_return;
    head_started = true;
  }
  auto notifier = std::make_shared<Notifier>(ex.executor());
  // What ends the request early: the client going away, or /abort_request with one of its rids.
  auto control = std::make_shared<RequestControl>(ex.executor());
  ex.watch_disconnect([notifier, control] {
    control->client_gone();
    notifier->notify();
  });
  std::vector<Track> tracks(req.prompts.size());
  struct CancelOnExit {
    std::vector<Track>& tracks;
    ~CancelOnExit() {
      for (auto& t : tracks) {
        if (t.seq && !t.finished()) t.seq->cancel();
      }
    }
  } cancel_on_exit{tracks};
  std::vector<std::string> rids;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    tracks[i].id = req.rids[i].empty() ? random_hex_id() : req.rids[i];
    tracks[i].prompt_tokens = static_cast<int64_t>(req.prompts[i].size());
    rids.push_back(tracks[i].id);
  }
  auto registered = registry_.add(std::move(rids), control);
  // An abort before any token (a failed KV transfer, a request PD cannot serve), as SGLang's
  // scheduler sends it: in the stream under status 200, or as the whole answer's error status.
  auto abort_answer = [&](const FinishReason& reason) {
    std::vector<std::string> ids;
    std::vector<int64_t> prompt_tokens;
    for (const auto& t : tracks) {
      ids.push_back(t.id);
      prompt_tokens.push_back(t.prompt_tokens);
    }
    auto views = abort_views(ids, prompt_tokens, engine_.meta_dp_rank(scratch_rank(req)), reason,
                             seconds_between(start, Clock::now()));
    return make_abort_answer(req, views, reason, config_.enable_cache_report);
  };
  const PdRole role = engine_.role();
  std::optional<AbortAnswer> refused;
  for (size_t i = 0; i < req.prompts.size() && role != PdRole::kNone && !refused; ++i) {
    Bootstrap b;
    bool has_host = false, has_port = false, has_room = false;
    req.bootstrap(i, b.host, b.port, b.room, has_host, has_port, has_room);
    const auto dp = static_cast<uint64_t>(engine_.dp_size());
    if (!has_room) {
      // Scheduler.handle_generate_request: a disaggregated request without a room is aborted.
      refused = abort_answer(abort_reason(400, missing_room_message(tracks[i].id)));
    } else if (role == PdRole::kPrefill && dp > 1 && !req.disagg_prefill_dp_rank &&
               req.routed_dp_rank && static_cast<uint64_t>(*req.routed_dp_rank) != b.room % dp) {
      // CommonKVSender: routed_dp_rank overrode follow_bootstrap_room, so the decode (which looks
      // for the room on bootstrap_room % dp_size) would never find it.
      refused = abort_answer(abort_reason(
          500, prefill_bootstrap_failure(tracks[i].id, b.room,
                                         follow_bootstrap_room_conflict(*req.routed_dp_rank, b.room,
                                                                        engine_.dp_size()))));
    }
  }
  if (refused) {
    drop_started_events(*refused, req.route, head_started);
    co_await send_abort(ex, refused->status, refused->stream, refused->body, head_started);
    co_return;
  }
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    Track& t = tracks[i];
    GenerationRequest g{std::move(req.prompts[i]), req.sampling, t.id, req.routed_dp_rank};
    g.ns = req.cache_namespace(i);
    g.logprob = req.logprob(i);
    Bootstrap b;
    bool has_host = false, has_port = false, has_room = false;
    req.bootstrap(i, b.host, b.port, b.room, has_host, has_port, has_room);
    if (role != PdRole::kNone) g.bootstrap = b;
    if (role == PdRole::kDecode && b.host != kFakeBootstrapHost) {
      // SGLang dispatches a decode request to its DP rank first; that rank's prealloc and transfer
      // queues hold it until the KV from the prefill rank that holds the room arrived.
      const int decode_rank = engine_.pick_rank(req.routed_dp_rank);
      g.routed_dp_rank = decode_rank;
      RoomRequest rr;
      rr.queues = &engine_.decode_queues(decode_rank);
      rr.host = has_host ? b.host : std::string();
      if (has_port) rr.port = b.port;
      rr.room = b.room;
      rr.rid = t.id;
      rr.prefill_dp_rank = req.disagg_prefill_dp_rank;
      rr.timeout =
          std::chrono::milliseconds(static_cast<int64_t>(config_.pd_room_timeout_secs * 1000));
      rr.retry_interval = std::clamp(rr.timeout / kEnsureInfoAttempts, std::chrono::milliseconds(1),
                                     std::chrono::milliseconds(1000));
      RoomWait w = co_await wait_for_room(std::move(rr), prefill_infos_, control);
      if (ex.client_gone() || control->gone()) co_return;
      std::optional<AbortAnswer> failed;
      if (w.ok && w.info.prompt_tokens != t.prompt_tokens) {
        failed = abort_answer(abort_reason(
            400, "bootstrap_room " + std::to_string(b.room) + " was prefilled with " +
                     std::to_string(w.info.prompt_tokens) + " prompt tokens but this request has " +
                     std::to_string(t.prompt_tokens) +
                     " (prefill and decode must get the same body)"));
      } else if (!w.ok) {
        failed = abort_answer(abort_reason(500, w.error));
      }
      if (failed) {
        drop_started_events(*failed, req.route, head_started);
        co_await send_abort(ex, failed->status, failed->stream, failed->body, head_started);
        co_return;
      }
      g.transferred_cached_tokens = w.info.cached_tokens;
    } else if (role == PdRole::kDecode) {
      g.transferred_cached_tokens = 0;  // the fake transfer backend: nothing arrives
    }
    t.seq = engine_.submit(std::move(g), notifier);
    t.dp_rank = engine_.meta_dp_rank(t.seq->dp_rank());
    if (t.seq->request().logprob.return_logprob) {
      // A decode server's prompt rows are the prefill server's (SGLang's decode sends none).
      t.logprobs = LogprobRows{.model = &engine_.logprob_model(),
                               .params = &t.seq->request().logprob,
                               .prompt = t.seq->request().prompt,
                               .prompt_rows = role != PdRole::kDecode};
    }
    control->add_sequence(t.seq);
    if (control->aborted()) {
      // Aborted while an earlier prompt waited: this one ends at once too.
      t.seq->abort("Aborted");
      t.seq->cancel();
    }
  }

  c.id = tracks[0].id;
  if (req.stream) {
    co_await relay_stream(ex, *notifier, tracks, *writer, *em, tok, head_started);
    co_return;
  }
  bool all_done = co_await wait_all(ex, *notifier, tracks, tok);
  if (!all_done) co_return;
  std::vector<OutputView> views;
  views.reserve(tracks.size());
  for (const auto& t : tracks) views.push_back(t.view());
  std::string body;
  append_whole(body, req, c, views);
  co_await respond_whole(ex, body, drop_after.has_value());
}

void GenerationHandler::instant_outputs(const ParsedRequest& req, const InstantShape& shape,
                                        std::vector<std::string>& ids,
                                        std::vector<OutputView>& views) {
  const auto start = Clock::now();
  const int rank = engine_.pick_rank(req.routed_dp_rank);
  const std::span<const int32_t> out_ids(instant_.ids.data(), shape.total);
  const std::string_view text(instant_.text.data(), instant_.text_end[shape.words]);
  ids.resize(req.prompts.size());
  views.clear();
  int64_t prompt_total = 0;
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    ids[i] = req.rids[i].empty() ? random_hex_id() : req.rids[i];
    auto prompt = static_cast<int64_t>(req.prompts[i].size());
    prompt_total += prompt;
    views.push_back(OutputView{.id = ids[i],
                               .ids = out_ids,
                               .text = text,
                               .prompt_tokens = prompt,
                               .completion_tokens = static_cast<int64_t>(shape.total),
                               .dp_rank = engine_.meta_dp_rank(rank),
                               .finish = &shape.finish,
                               .e2e_latency = seconds_between(start, Clock::now())});
    if (req.logprob(i).return_logprob) {
      views.back().logprobs = LogprobRows{.model = &engine_.logprob_model(),
                                          .params = &req.logprob(i),
                                          .prompt = req.prompts[i],
                                          .output = out_ids};
    }
  }
  RankMetrics& m = engine_.rank_metrics(rank);
  m.prompt_tokens->inc(static_cast<uint64_t>(prompt_total));
  m.generation_tokens->inc(shape.total * views.size());
  m.requests->inc(views.size());
  m.ttft->observe(seconds_between(start, Clock::now()));
  m.e2e->observe(seconds_between(start, Clock::now()));
}

void GenerationHandler::instant_events(const ParsedRequest& req, const OpenAIContext& c,
                                       std::span<const OutputView> views, const InstantShape& shape,
                                       Emitter& em) {
  std::vector<Track> tracks(views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    tracks[i].id = std::string(views[i].id);
    tracks[i].prompt_tokens = views[i].prompt_tokens;
    tracks[i].dp_rank = views[i].dp_rank;
    tracks[i].e2e = views[i].e2e_latency;
    tracks[i].logprobs = views[i].logprobs;
  }
  auto writer = make_stream_writer(req, c, config_.incremental_streaming_output);
  writer->on_start(em);
  // Step k shows the first k tokens, as a timed generation would one tick at a time.
  for (size_t step = shape.total > 0 ? 1 : 0; step <= shape.total; ++step) {
    for (size_t i = 0; i < tracks.size(); ++i) {
      Track& t = tracks[i];
      t.ids.assign(views[i].ids.begin(), views[i].ids.begin() + static_cast<std::ptrdiff_t>(step));
      t.text.assign(views[i].text.substr(0, instant_.text_end[std::min(step, shape.words)]));
      if (step == shape.total) t.p.finish = shape.finish;
      writer->on_update(t, static_cast<int>(i), em);
    }
  }
  writer->on_end(tracks, em);
  if (writer->sse_done()) em.done();
}

awaitable<void> GenerationHandler::answer_instant(http::Exchange& ex, const ParsedRequest& req,
                                                  std::optional<int64_t> drop_after) {
  // Everything is built before the first write, while the per-thread `req` is still this one's.
  const InstantShape shape =
      instant_shape(req.sampling.max_new_tokens, engine_.tokenizer().eos_token_id());
  thread_local std::vector<std::string> ids;
  thread_local std::vector<OutputView> views;
  instant_outputs(req, shape, ids, views);
  OpenAIContext c{.id = views[0].id,
                  .model = req.model,
                  .created = static_cast<int64_t>(std::time(nullptr)),
                  .cache_report = config_.enable_cache_report};
  if (!req.stream) {
    std::string body;
    body.reserve(1024);
    append_whole(body, req, c, views);
    co_await respond_whole(ex, body, drop_after.has_value());
    co_return;
  }
  Emitter em(drop_after);
  instant_events(req, c, views, shape, em);
  co_await ex.begin_body(200, kSse, std::nullopt);
  bool sent = co_await ex.write_body(em.buffer());
  if (!sent) co_return;
  if (em.cut()) {
    ex.close_after();
    co_return;
  }
  co_await ex.end_body();
}

}  // namespace kvgate::sim
