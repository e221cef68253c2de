// bench/driver: see driver.h.
#include "bench/driver.h"

#include <simdjson.h>

#include <boost/asio/as_tuple.hpp>
#include <deque>
#include <memory>

#include "http/client.h"
#include "http/io.h"
#include "util/json.h"

namespace kvgate::bench {

std::string record_json(const RequestRecord& r, double epoch0) {
  std::string line =
      "{\"t\":" + std::to_string(epoch0 + r.start_s) + ",\"start_s\":" + std::to_string(r.start_s) +
      ",\"e2e_ms\":" + std::to_string(r.e2e_ms) + ",\"ttft_ms\":" + std::to_string(r.ttft_ms) +
      ",\"session\":" + std::to_string(r.session) + ",\"turn\":" + std::to_string(r.turn) +
      ",\"prompt\":" + std::to_string(r.prompt_tokens) +
      ",\"cached\":" + std::to_string(r.cached_tokens) +
      ",\"reusable\":" + std::to_string(r.oracle_reusable_tokens) +
      ",\"status\":" + std::to_string(r.status) + ",\"worker\":";
  json::append_string(line, r.worker);
  line += ",\"route\":";
  json::append_string(line, r.route);
  line += ",\"error\":";
  json::append_string(line, r.error);
  line += "}\n";
  return line;
}

Api parse_api(std::string_view name) {
  if (name == "completions") return Api::kCompletions;
  if (name == "generate") return Api::kGenerate;
  return Api::kChat;
}

std::string_view to_string(Api api) {
  switch (api) {
    case Api::kChat:
      return "chat";
    case Api::kCompletions:
      return "completions";
    case Api::kGenerate:
      return "generate";
  }
  return "?";
}

namespace {

// The conversation so far: history of (user, reply) and the new user message.
struct History {
  const Session* session;
  std::vector<std::string> replies;  // one per finished turn
};

std::vector<sim::ChatMessage> chat_messages(const History& h, size_t turn) {
  std::vector<sim::ChatMessage> m;
  if (!h.session->system.empty()) m.push_back({"system", h.session->system});
  for (size_t k = 0; k <= turn; ++k) {
    m.push_back({"user", h.session->turns[k].user});
    if (k < turn) m.push_back({"assistant", h.replies[k]});
  }
  return m;
}

std::string plain_prompt(const History& h, size_t turn) {
  std::string p = h.session->system;
  for (size_t k = 0; k <= turn; ++k) {
    if (!p.empty()) p.push_back('\n');
    p += h.session->turns[k].user;
    if (k < turn) {
      p.push_back('\n');
      p += h.replies[k];
    }
  }
  return p;
}

std::string request_body(const DriverConfig& c, const History& h, size_t turn) {
  int max_tokens = h.session->turns[turn].max_tokens;
  std::string b;
  if (c.api == Api::kChat) {
    b = R"({"model":)" + json::quote(c.model) + R"(,"messages":[)";
    bool first = true;
    for (const auto& m : chat_messages(h, turn)) {
      if (!first) b.push_back(',');
      first = false;
      b += R"({"role":)" + json::quote(m.role) + R"(,"content":)" + json::quote(m.content) + "}";
    }
    b += R"(],"max_tokens":)" + std::to_string(max_tokens) +
         R"(,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}})";
  } else if (c.api == Api::kCompletions) {
    b = R"({"model":)" + json::quote(c.model) + R"(,"prompt":)" +
        json::quote(plain_prompt(h, turn)) + R"(,"max_tokens":)" + std::to_string(max_tokens) +
        R"(,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}})";
  } else {
    b = R"({"text":)" + json::quote(plain_prompt(h, turn)) +
        R"(,"sampling_params":{"max_new_tokens":)" + std::to_string(max_tokens) +
        R"(,"ignore_eos":true},"stream":true})";
  }
  return b;
}

// Usage (OpenAI) or meta_info (SGLang). On OpenAI routes SGLang sends prompt_tokens_details only
// when cached tokens > 0 (with --enable-cache-report): absent or null then means 0.
void read_usage(simdjson::dom::element usage, RequestRecord& r, bool openai) {
  int64_t v = 0;
  if (!usage["prompt_tokens"].get_int64().get(v)) {
    r.prompt_tokens = v;
    if (openai && r.cached_tokens < 0) r.cached_tokens = 0;
  }
  if (!usage["completion_tokens"].get_int64().get(v)) r.completion_tokens = v;
  if (!usage["prompt_tokens_details"]["cached_tokens"].get_int64().get(v)) r.cached_tokens = v;
  if (!usage["cached_tokens"].get_int64().get(v)) r.cached_tokens = v;
}

}  // namespace

std::string apply_event(Api api, std::string_view payload, const std::string& so_far,
                        RequestRecord& r) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(payload.data(), payload.size()).get(e)) {
    r.error = "unparseable stream event";
    return "";
  }
  simdjson::dom::element err;
  if (!e["error"].get(err)) {
    std::string_view msg;
    r.error = !err["message"].get_string().get(msg) ? std::string(msg) : simdjson::minify(err);
    return "";
  }
  std::string_view text;
  if (api == Api::kGenerate) {
    simdjson::dom::element meta;
    if (!e["meta_info"].get(meta)) read_usage(meta, r, false);
    if (e["text"].get_string().get(text)) return "";
    if (text.size() >= so_far.size() && text.substr(0, so_far.size()) == so_far) {
      return std::string(text.substr(so_far.size()));  // cumulative text (SGLang's default)
    }
    return std::string(text);  // --incremental-streaming-output
  }
  simdjson::dom::element usage;
  if (!e["usage"].get(usage) && usage.is_object()) read_usage(usage, r, true);
  simdjson::dom::array choices;
  if (e["choices"].get_array().get(choices) || choices.size() == 0) return "";
  simdjson::dom::element c0 = choices.at(0).value_unsafe();
  if (api == Api::kChat) {
    if (!c0["delta"]["content"].get_string().get(text)) return std::string(text);
  } else if (!c0["text"].get_string().get(text)) {
    return std::string(text);
  }
  return "";
}

namespace {

struct Runner {
  Runner(const Workload& w, const DriverConfig& c) : w(w), c(c) {}

  awaitable<RequestRecord> one(History& h, int session, size_t turn) {
    RequestRecord r;
    r.session = session;
    r.turn = static_cast<int>(turn);
    auto start = Clock::now();
    r.start_s = std::chrono::duration<double>(start - t0).count();
    std::vector<int32_t> prompt;
    if (c.oracle) {
      if (c.api == Api::kChat) {
        auto msgs = chat_messages(h, turn);
        prompt = c.oracle->chat_tokens(msgs);
      } else {
        prompt = c.oracle->text_tokens(plain_prompt(h, turn));
      }
      r.oracle_prompt_tokens = prompt.size();
      r.oracle_reusable_tokens = c.oracle->arrive(prompt);
    }
    std::string body = request_body(c, h, turn);
    if (c.on_body) {
      if (auto hold = c.on_body(session, turn, body); hold.count() > 0) {
        Timer timer(ctx);
        timer.expires_after(hold);
        co_await timer.async_wait(asio::as_tuple(use_awaitable));
        start = Clock::now();
        r.start_s = std::chrono::duration<double>(start - t0).count();
      }
    }
    static constexpr http::Header kHeaders[] = {{"content-type", "application/json"}};
    size_t which = (static_cast<size_t>(session) + turn) % targets.size();
    http::UpstreamCall call(ctx.get_executor(), pool, targets[which], which + 1);
    call.set_deadline(start + c.timeout);
    auto ms = [&] {
      return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    };
    auto err = co_await call.start("POST", api_path(c.api), kHeaders, body);
    std::string reply;
    if (err != http::CallError::kNone) {
      r.error = std::string(http::to_string(err)) + ": " + call.error_detail();
    } else {
      r.status = call.status();
      // Prefill/decode: the prefill server holds the cache (and the policy under test chose it).
      std::string_view prefill = call.header("x-kvgate-prefill-worker");
      r.worker = std::string(prefill.empty() ? call.header("x-kvgate-worker") : prefill);
      r.route = std::string(prefill.empty() ? call.header("x-kvgate-route")
                                            : call.header("x-kvgate-prefill-route"));
      std::string pending;
      double last_token = -1;
      for (;;) {
        http::CallError e = http::CallError::kNone;
        std::string_view piece = co_await call.read_view(e);
        if (e != http::CallError::kNone) {
          r.error = std::string(http::to_string(e)) + " mid-stream: " + call.error_detail();
          break;
        }
        if (piece.empty()) break;
        pending.append(piece);
        if (r.status != 200) continue;
        size_t pos;
        while ((pos = pending.find("\n\n")) != std::string::npos) {
          std::string_view event(pending.data(), pos);
          if (event.starts_with("data: ")) event.remove_prefix(6);
          if (event != "[DONE]" && !event.empty()) {
            std::string payload(event);
            payload.reserve(payload.size() + 64);
            std::string delta = apply_event(c.api, payload, reply, r);
            if (!delta.empty()) {
              double now = ms();
              if (last_token < 0) {
                r.ttft_ms = now;
              } else {
                r.itl_ms.push_back(static_cast<float>(now - last_token));
              }
              last_token = now;
              ++r.streamed_tokens;
              reply += delta;
            }
          }
          pending.erase(0, pos + 2);
        }
      }
      if (r.status != 200 && r.error.empty())
        r.error = "status " + std::to_string(r.status) + ": " + pending.substr(0, 300);
    }
    r.e2e_ms = ms();
    if (r.ttft_ms == 0) r.ttft_ms = r.e2e_ms;
    if (c.oracle && r.ok()) c.oracle->finish(prompt, reply);
    h.replies.push_back(reply);
    co_return r;
  }

  // The run ends when every session has: pooled connections' idle timers must not hold it open.
  struct SessionDone {
    Runner* r;
    ~SessionDone() {
      if (++r->finished == r->w.sessions.size()) r->ctx.stop();
    }
  };

  awaitable<void> session(int index) {
    SessionDone done{this};
    History h{&w.sessions[static_cast<size_t>(index)], {}};
    Timer timer(ctx);
    for (size_t t = 0; t < h.session->turns.size(); ++t) {
      if (double think = h.session->turns[t].think_s; think > 0) {
        timer.expires_after(
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(think)));
        co_await timer.async_wait(asio::as_tuple(use_awaitable));
      }
      RequestRecord r = co_await one(h, index, t);
      bool failed = !r.ok();
      if (c.on_done) c.on_done(r);
      result.records.push_back(std::move(r));
      if (failed) {
        // The conversation cannot go on without the reply; count its remaining turns as failed.
        for (size_t rest = t + 1; rest < h.session->turns.size(); ++rest) {
          RequestRecord skipped;
          skipped.session = index;
          skipped.turn = static_cast<int>(rest);
          skipped.error = "skipped: an earlier turn of the conversation failed";
          if (c.on_done) c.on_done(skipped);
          result.records.push_back(std::move(skipped));
        }
        co_return;
      }
    }
  }

  awaitable<void> closed_loop_user() {
    while (next < w.sessions.size()) co_await session(static_cast<int>(next++));
  }

  awaitable<void> open_loop() {
    Timer timer(ctx);
    for (size_t i = 0; i < w.sessions.size(); ++i) {
      auto at = t0 + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(w.sessions[i].arrival_s));
      timer.expires_at(at);
      co_await timer.async_wait(asio::as_tuple(use_awaitable));
      asio::co_spawn(ctx, session(static_cast<int>(i)), asio::detached);
    }
  }

  const Workload& w;
  const DriverConfig& c;
  asio::io_context ctx{1};
  http::ConnectionPool pool{
      http::ConnectionPool::Options{4096, std::chrono::seconds(30), std::chrono::seconds(10)}};
  std::vector<http::Target> targets;  // replicas: see DriverConfig::urls
  Clock::time_point t0;
  size_t next = 0;
  size_t finished = 0;
  RunResult result;
};

}  // namespace

RunResult run_workload(const Workload& w, const DriverConfig& c) {
  auto r = std::make_unique<Runner>(w, c);
  std::vector<std::string> urls = c.urls.empty() ? std::vector<std::string>{c.url} : c.urls;
  for (const auto& url : urls) {
    http::Target t;
    if (std::string e = http::parse_url(url, t); !e.empty()) {
      r->result.fatal = "bad --url: " + e;
      return std::move(r->result);
    }
    if (std::string e = http::resolve(t); !e.empty()) {
      r->result.fatal = "bad --url: " + e;
      return std::move(r->result);
    }
    r->targets.push_back(std::move(t));
  }
  r->t0 = Clock::now();
  if (w.sessions.empty()) return std::move(r->result);
  if (w.open_loop) {
    asio::co_spawn(r->ctx, r->open_loop(), asio::detached);
  } else {
    int users = std::max(1, w.concurrency);
    for (int i = 0; i < users; ++i) asio::co_spawn(r->ctx, r->closed_loop_user(), asio::detached);
  }
  r->ctx.run();
  r->result.wall_s = std::chrono::duration<double>(Clock::now() - r->t0).count();
  return std::move(r->result);
}

std::string_view api_path(Api api) {
  switch (api) {
    case Api::kChat:
      return "/v1/chat/completions";
    case Api::kCompletions:
      return "/v1/completions";
    case Api::kGenerate:
      return "/generate";
  }
  return "/";
}

}  // namespace kvgate::bench
