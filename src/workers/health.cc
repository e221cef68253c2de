// workers/health: see health.h.
#include "workers/health.h"

#include <simdjson.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "util/log.h"

namespace kvgate {
namespace {

// Failed /get_load polls in a row after which a worker counts as loaded as the busiest one.
constexpr uint32_t kLoadFailuresBeforePessimism = 3;
// A worker's figures are clamped to [0, kMaxLoad] and their sums saturate there: any number it
// sends (2^63 - 1, 1e300, -5) is a load, never an overflow or a negative load that attracts all.
constexpr int64_t kMaxLoad = int64_t{1} << 48;

int64_t add_load(int64_t total, int64_t n) {
  return std::min(total + n, kMaxLoad);  // both within [0, kMaxLoad]: no overflow
}

std::optional<int64_t> rank_load(simdjson::dom::element e) {
  if (!e.is_object()) return std::nullopt;
  int64_t total = 0;
  bool any = false;
  for (const char* key : {"num_reqs", "num_running_reqs", "num_waiting_reqs", "load"}) {
    auto v = e[key];
    if (v.error()) continue;
    if (std::string_view(key) == "num_running_reqs" && !e["num_reqs"].error()) continue;
    int64_t n = 0;
    if (v.is_int64())
      n = std::clamp<int64_t>(v.get_int64().value(), 0, kMaxLoad);
    else if (v.is_uint64())
      n = kMaxLoad;  // past INT64_MAX
    else if (v.is_double())
      n = static_cast<int64_t>(std::clamp(v.get_double().value(), 0.0, double(kMaxLoad)));
    else
      continue;
    total = add_load(total, n);
    any = true;
  }
  return any ? std::optional<int64_t>(total) : std::nullopt;
}

}  // namespace

std::optional<int64_t> parse_load_report(std::string_view json, std::vector<int64_t>* per_rank) {
  if (per_rank) per_rank->clear();
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(json.data(), json.size()).get(doc)) return std::nullopt;
  simdjson::dom::array ranks;
  if (doc.is_array()) {
    ranks = doc.get_array().value();
  } else if (doc.is_object()) {
    auto loads = doc["loads"];
    if (!loads.error() && loads.is_array()) {
      ranks = loads.get_array().value();
    } else {
      return rank_load(doc);
    }
  } else {
    return std::nullopt;
  }
  int64_t total = 0;
  bool any = false;
  int64_t position = 0;
  for (auto r : ranks) {
    if (auto l = rank_load(r)) {
      total = add_load(total, *l);
      any = true;
      int64_t rank = position;
      if (int64_t said = 0; !r["dp_rank"].get_int64().get(said)) rank = said;
      if (per_rank && rank >= 0 && rank < Worker::kMaxDpRanks) {
        auto i = static_cast<size_t>(rank);
        if (per_rank->size() <= i) per_rank->resize(i + 1, 0);
        (*per_rank)[i] = add_load((*per_rank)[i], *l);
      }
    }
    ++position;
  }
  if (!any && ranks.size() > 0) {
    if (per_rank) per_rank->clear();
    return std::nullopt;
  }
  return total;
}

std::optional<int64_t> parse_dp_size(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(json.data(), json.size()).get(doc)) return std::nullopt;
  int64_t n = 0;
  if (doc["dp_size"].get_int64().get(n) && doc["kv_events"]["dp_size"].get_int64().get(n)) {
    return std::nullopt;
  }
  if (n < 1 || n > Worker::kMaxDpRanks) return std::nullopt;
  return n;
}

std::optional<std::vector<std::string>> parse_model_list(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(json.data(), json.size()).get(doc)) return std::nullopt;
  simdjson::dom::array data;
  if (doc["data"].get_array().get(data)) return std::nullopt;
  std::vector<std::string> out;
  for (auto m : data) {
    if (!m.is_object()) continue;
    out.push_back(simdjson::minify(m));
  }
  return out;
}

struct HealthPlane::Stop {
  std::atomic<bool> stopped{false};
  std::set<Timer*> timers;  // control loop only
  // A loop's timer, listed while the loop runs.
  struct Waiting {
    Waiting(Stop& s, Timer& t) : stop(s), timer(t) { stop.timers.insert(&timer); }
    ~Waiting() { stop.timers.erase(&timer); }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
    Stop& stop;
    Timer& timer;
  };
};

HealthPlane::HealthPlane(asio::io_context& ctx, WorkerRegistry& registry, HealthConfig config)
    : ctx_(ctx), registry_(registry), config_(std::move(config)), stop_(std::make_shared<Stop>()) {
  // A config not built by health_config() (zero interval: a tight probe loop) is a programming
  // error, not an operator's.
  if (config_.interval.count() <= 0 || config_.timeout.count() <= 0 ||
      config_.failure_threshold == 0 || config_.success_threshold == 0 ||
      config_.endpoint.empty() || (config_.poll_load && config_.load_interval.count() <= 0)) {
    std::fprintf(stderr, "kvgate: HealthPlane given an incomplete HealthConfig\n");
    std::abort();
  }
}

HealthPlane::~HealthPlane() {
  stop();
}

void HealthPlane::start() {
  auto set = registry_.snapshot();
  for (const auto& w : set->workers) {
    asio::co_spawn(ctx_, probe_loop(w), asio::detached);
    if (config_.poll_load) asio::co_spawn(ctx_, load_loop(w), asio::detached);
  }
}

void HealthPlane::stop() {
  if (stop_->stopped.exchange(true)) return;
  asio::post(ctx_, [stop = stop_] {
    for (Timer* t : stop->timers) t->cancel();
  });
}

std::optional<KvEventsInfo> parse_kv_events_info(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(json.data(), json.size()).get(doc)) return std::nullopt;
  simdjson::dom::object kv;
  if (doc["kv_events"].get_object().get(kv)) return std::nullopt;
  std::string_view publisher;
  if (kv["publisher"].get_string().get(publisher) || publisher != "zmq") return std::nullopt;
  KvEventsInfo info;
  int64_t n = 0;
  if (kv["endpoint_port_base"].get_int64().get(n) || n < 1 || n > 65535) return std::nullopt;
  info.port_base = n;
  if (!kv["replay_endpoint_port_base"].get_int64().get(n) && n >= 1 && n <= 65535) {
    info.replay_port_base = n;
  }
  std::string_view s;
  if (!kv["endpoint_host"].get_string().get(s)) info.host = s;
  if (!kv["topic"].get_string().get(s)) info.topic = s;
  if (!kv["block_size"].get_int64().get(n) && n > 0) info.block_size = n;
  if (!kv["dp_size"].get_int64().get(n) && n >= 1 && n <= 64) info.dp_size = n;
  return info;
}

awaitable<void> HealthPlane::refresh_server_info(WorkerPtr w) {
  auto r = co_await http::fetch(ctx_.get_executor(), w->target(), "GET", "/server_info",
                                config_.timeout);
  if (r.error == http::CallError::kNone && r.status == 404) {
    r = co_await http::fetch(ctx_.get_executor(), w->target(), "GET", "/get_server_info",
                             config_.timeout);
  }
  if (r.error != http::CallError::kNone || r.status != 200) co_return;
  if (config_.fetch_kv_events) w->set_kv_events(parse_kv_events_info(r.body));
  if (config_.fetch_dp_size) w->set_dp_size(parse_dp_size(r.body));
}

awaitable<void> HealthPlane::refresh_models(WorkerPtr w) {
  auto r =
      co_await http::fetch(ctx_.get_executor(), w->target(), "GET", "/v1/models", config_.timeout);
  if (r.error != http::CallError::kNone || r.status != 200) co_return;
  if (auto models = parse_model_list(r.body)) w->set_models(std::move(*models));
}

awaitable<void> HealthPlane::probe_loop(WorkerPtr w) {
  auto stop = stop_;
  const std::atomic<bool>* stopped = &stop->stopped;
  Timer timer(ctx_);
  Stop::Waiting waiting(*stop, timer);
  uint32_t fails = 0, goods = 0;
  // A worker another pool already probes (or a rule took back) may be healthy already: it is then
  // probed at the normal interval, and --health-success-threshold applies after a failure.
  bool ever_healthy = w->healthy();
  bool logged_waiting = false;
  while (!stopped->load()) {
    auto r = co_await http::fetch(ctx_.get_executor(), w->target(), "GET", config_.endpoint,
                                  config_.timeout);
    if (stopped->load()) co_return;
    bool ok = r.error == http::CallError::kNone && r.status >= 200 && r.status < 300;
    if (ok) {
      fails = 0;
      ++goods;
      if (!w->healthy() && (!ever_healthy || goods >= config_.success_threshold)) {
        w->set_healthy(true);
        log::info("worker healthy").kv("worker", w->url());
        ever_healthy = true;
      }
      if (w->models().empty() || goods % 8 == 1) co_await refresh_models(w);
      if (stopped->load()) co_return;  // the plane may be gone: touch none of it
      bool kv_due = config_.fetch_kv_events && !w->kv_events();
      bool dp_due = config_.fetch_dp_size && !w->dp_size();
      if (kv_due || dp_due ||
          ((config_.fetch_kv_events || config_.fetch_dp_size) && goods % 8 == 1)) {
        co_await refresh_server_info(w);
        if (stopped->load()) co_return;
      }
    } else {
      goods = 0;
      ++fails;
      std::string why = r.error != http::CallError::kNone
                            ? std::string(http::to_string(r.error)) + ": " + r.detail
                            : "status " + std::to_string(r.status);
      if (w->healthy() && fails >= config_.failure_threshold) {
        w->set_healthy(false);
        log::warn("worker unhealthy").kv("worker", w->url()).kv("probe", why).kv("failures", fails);
      } else if (!ever_healthy && !logged_waiting) {
        log::warn("worker not ready; no traffic until it answers health probes")
            .kv("worker", w->url())
            .kv("probe", why);
        logged_waiting = true;
      }
    }
    auto wait =
        ever_healthy ? config_.interval : std::min(config_.interval, config_.startup_interval);
    timer.expires_after(wait);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(use_awaitable));
    (void)ec;
  }
}

awaitable<void> HealthPlane::load_loop(WorkerPtr w) {
  auto stop = stop_;
  const std::atomic<bool>* stopped = &stop->stopped;
  Timer timer(ctx_);
  Stop::Waiting waiting(*stop, timer);
  auto interval = config_.load_interval;
  uint32_t fails = 0;
  while (!stopped->load()) {
    if (w->healthy()) {
      auto r = co_await http::fetch(
          ctx_.get_executor(), w->target(), "GET", "/get_load",
          std::min(config_.timeout, std::max(interval, std::chrono::milliseconds(200))));
      if (stopped->load()) co_return;
      std::optional<int64_t> load;
      std::vector<int64_t> per_rank;
      if (r.error == http::CallError::kNone && r.status == 200) {
        load = parse_load_report(r.body, &per_rank);
      }
      if (load) {
        fails = 0;
        w->set_reported_load(*load);
        w->set_rank_loads(std::move(per_rank));
      } else {
        // A worker that cannot say its load is often one too busy to answer: it must not look
        // idle. Keep its last report; after a few failures in a row, count it as loaded as the
        // busiest worker.
        if (w->metrics().load_poll_failures) w->metrics().load_poll_failures->inc();
        if (++fails >= kLoadFailuresBeforePessimism) {
          int64_t worst = w->reported_load();
          for (const auto& other : registry_.snapshot()->workers) {
            worst = std::max(worst, other->reported_load());
          }
          w->set_reported_load(worst);
          w->set_rank_loads({});  // its ranks then count as a share of that
        }
        if (fails == 1) {
          log::warn("worker load poll failed; keeping its last load")
              .kv("worker", w->url())
              .kv("why", r.error != http::CallError::kNone ? std::string(http::to_string(r.error))
                                                           : "status " + std::to_string(r.status));
        }
      }
    }
    timer.expires_after(interval);
    auto [ec] = co_await timer.async_wait(asio::as_tuple(use_awaitable));
    (void)ec;
  }
}

}  // namespace kvgate
