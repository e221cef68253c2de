// sim/pd: see pd.h.
#include "sim/pd.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <charconv>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

#include "http/client.h"
#include "http/server.h"
#include "sim/info.h"
#include "util/json.h"
#include "util/log.h"

namespace kvgate::sim {
namespace {

using Json = nlohmann::json;
constexpr auto kTuple = asio::as_tuple(use_awaitable);
constexpr size_t kMaxRetained = 100000;
constexpr std::string_view kRoomPath = "/kvgate_sim/room/";

// aiohttp's web.Response(text=...) and web.json_response content types.
constexpr http::Header kText[] = {{"content-type", "text/plain; charset=utf-8"}};
constexpr http::Header kJson[] = {{"content-type", "application/json; charset=utf-8"}};

// Python's int() of a query string: surrounding whitespace, an optional sign, digits.
std::optional<int64_t> python_int(std::string_view v) {
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
  bool negative = false;
  if (!v.empty() && (v.front() == '+' || v.front() == '-')) {
    negative = v.front() == '-';
    v.remove_prefix(1);
  }
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return negative ? -out : out;
}

// An integer JSON value, as Python's int() takes it (also from a string of digits).
std::optional<int64_t> json_int(const Json& j) {
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_string()) return python_int(j.get<std::string>());
  return std::nullopt;
}

std::string_view query_of(std::string_view target) {
  size_t q = target.find('?');
  return q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
}

// What aiohttp answers for an exception in a handler (a KeyError, a bad int()...).
awaitable<void> internal_error(http::Exchange& ex) {
  co_await ex.respond(500, kText, "500 Internal Server Error\n\nServer got itself in trouble");
}

awaitable<void> method_not_allowed(http::Exchange& ex, std::string_view allow) {
  const http::Header h[] = {{"content-type", "text/plain; charset=utf-8"}, {"allow", allow}};
  co_await ex.respond(405, h, "405: Method Not Allowed");
}

std::string format_secs(double secs) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", secs);
  return buf;
}

}  // namespace

// --- SGLang's messages ---

std::string python_repr(std::string_view s) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char quote = dq ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == '\\' || c == quote) {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (const auto u = static_cast<unsigned char>(c); u < 0x20 || u == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out.append("\\x");
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back(quote);
  return out;
}

std::string kv_transfer_error(uint64_t room, std::string_view reason) {
  return "KVTransferError(bootstrap_room=" + std::to_string(room) + "): " + std::string(reason);
}

std::string decode_failure(bool handshake, std::string_view rid, uint64_t room,
                           std::string_view reason) {
  return std::string(handshake ? "Decode handshake failed" : "Decode transfer failed") +
         " for request rank=0 decode_req.req.rid=" + python_repr(rid) +
         " decode_req.req.bootstrap_room=" + std::to_string(room) + " with exception " +
         kv_transfer_error(room, reason);
}

std::string prefill_bootstrap_failure(std::string_view rid, uint64_t room,
                                      std::string_view reason) {
  return "Prefill bootstrap failed for request rank=0 req.rid=" + python_repr(rid) +
         " req.bootstrap_room=" + std::to_string(room) + " with exception " +
         kv_transfer_error(room, reason);
}

std::string follow_bootstrap_room_conflict(int64_t dispatched, uint64_t room, int dp_size) {
  return "follow_bootstrap_room conflict: dispatched to dp_rank " + std::to_string(dispatched) +
         " but bootstrap_room " + std::to_string(room) + " implies dp_rank " +
         std::to_string(room % static_cast<uint64_t>(dp_size)) +
         ". Set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed routing.";
}

std::string waiting_timeout_reason(uint64_t room, double elapsed_secs) {
  return "Request " + std::to_string(room) + " timed out after " + format_secs(elapsed_secs) +
         "s in KVPoll.WaitingForInput";
}

std::string missing_room_message(std::string_view rid) {
  return "Invalid request: Disaggregated request received without bootstrap room id. req.rid=" +
         python_repr(rid);
}

// --- the bootstrap server ---

namespace {

struct RankAddr {
  std::string ip;
  int64_t port = 0;
};

using RoomKey = std::pair<uint64_t, int64_t>;  // (room, prefill DP rank)

std::string rank_json(const RankAddr& a) {
  // dataclasses.asdict(PrefillRankInfo) through json.dumps.
  std::string out = "{\"rank_ip\": ";
  json::append_string(out, a.ip);
  out += ", \"rank_port\": " + std::to_string(a.port) + "}";
  return out;
}

}  // namespace

struct BootstrapServer::Impl {
  explicit Impl(const BootstrapSettings& s) : settings(s) {}

  BootstrapSettings settings;
  uint16_t port = 0;
  // Server thread only. The registered ranks: dp group -> cp rank -> tp rank -> pp rank.
  std::map<int64_t, std::map<int64_t, std::map<int64_t, std::map<int64_t, RankAddr>>>> table;
  int64_t registered = 0;
  int64_t attn_tp_size = 1, attn_cp_size = 1, dp_size = 1, pp_size = 1, page_size = 1;
  std::string kv_cache_dtype = "auto";
  bool follow_bootstrap_room = true;
  std::optional<int64_t> prefill_http_port;
  std::unordered_map<uint64_t, int64_t> room_to_dp_rank;  // /register_dp_rank
  std::deque<uint64_t> room_order;
  // The room rendezvous. A Waiter (its timer an I/O object of `ctx`) is owned by the long poll
  // waiting on it (room(): its coroutine frame and its disconnect watch) and only indexed here:
  // this state outlives `ctx`, and a timer must not outlive its context's services. Whatever is
  // still waiting when the server stops is destroyed with `ctx`'s pending frames and handlers.
  struct Waiter {
    explicit Waiter(asio::io_context& ctx) : timer(ctx, Clock::time_point::max()) {}
    Timer timer;
    std::optional<std::string> answer;
  };
  std::map<RoomKey, std::vector<std::weak_ptr<Waiter>>> waiters;
  std::map<RoomKey, std::string> done;  // answered before anyone asked
  std::deque<std::pair<Clock::time_point, RoomKey>> done_order;

  // Declared last: destroyed first (the server once its context stopped; the context's pending
  // coroutine frames before the state above). Nothing above may own an I/O object of `ctx`.
  asio::io_context ctx{1};
  std::unique_ptr<http::Server> server;
  std::thread thread;

  bool ready() const { return registered >= dp_size * attn_cp_size * attn_tp_size * pp_size; }

  awaitable<void> handle(http::Exchange& ex);
  awaitable<void> route_put(http::Exchange& ex);
  awaitable<void> route_get(http::Exchange& ex);
  awaitable<void> register_dp_rank(http::Exchange& ex);
  awaitable<void> query_dp_ranks(http::Exchange& ex);
  awaitable<void> room(http::Exchange& ex);
  std::string info_json() const;
  void deliver(RoomKey key, std::string answer);
};

std::string BootstrapServer::Impl::info_json() const {
  // dataclasses.asdict(PrefillServerInfo) through json.dumps (the rank mapping fields are the
  // decode's own, null here).
  std::string out = "{";
  auto num = [&out](std::string_view k, int64_t v) {
    out += "\"" + std::string(k) + "\": " + std::to_string(v) + ", ";
  };
  num("attn_tp_size", attn_tp_size);
  num("attn_cp_size", attn_cp_size);
  num("dp_size", dp_size);
  num("pp_size", pp_size);
  num("page_size", page_size);
  out += "\"kv_cache_dtype\": ";
  json::append_string(out, kv_cache_dtype);
  out += ", \"follow_bootstrap_room\": ";
  out += follow_bootstrap_room ? "true" : "false";
  out += ", \"enable_dsa_cache_layer_split\": false, \"prefill_http_port\": ";
  out += prefill_http_port ? std::to_string(*prefill_http_port) : "null";
  out +=
      ", \"target_tp_rank\": null, \"target_tp_ranks\": null, \"target_cp_ranks\": null, "
      "\"target_pp_ranks\": null, \"required_dst_info_num\": null, "
      "\"required_prefill_response_num\": null}";
  return out;
}

awaitable<void> BootstrapServer::Impl::handle(http::Exchange& ex) {
  const std::string_view path = ex.path();
  const std::string_view m = ex.method();
  const bool get = m == "GET" || m == "HEAD";
  if (path == "/health") {
    if (get) {
      co_await ex.respond(200, kText, "OK");
    } else {
      co_await method_not_allowed(ex, "GET,HEAD");
    }
  } else if (path == "/route") {
    if (m == "PUT") {
      co_await route_put(ex);
    } else if (m == "GET") {
      co_await route_get(ex);
    } else {
      // CommonKVBootstrapServer._handle_route answers other methods itself.
      const http::Header h[] = {{"content-type", "application/json"}};
      co_await ex.respond(405, h, "Method not allowed");
    }
  } else if (path == "/register_dp_rank" || path == "/query_dp_ranks") {
    if (m != "POST") {
      co_await method_not_allowed(ex, "POST");
    } else if (path == "/register_dp_rank") {
      co_await register_dp_rank(ex);
    } else {
      co_await query_dp_ranks(ex);
    }
  } else if (path.starts_with(kRoomPath)) {
    if (get) {
      co_await room(ex);
    } else {
      co_await method_not_allowed(ex, "GET,HEAD");
    }
  } else {
    co_await ex.respond(404, kText, "404: Not Found");
  }
}

awaitable<void> BootstrapServer::Impl::route_put(http::Exchange& ex) {
  // A prefill rank registers (CommonKVManager.register_to_bootstrap's payload).
  Json j = Json::parse(ex.body(), nullptr, false);
  std::optional<int64_t> v[10];
  static constexpr const char* kKeys[] = {
      "attn_tp_size", "attn_tp_rank", "attn_cp_size", "attn_cp_rank",   "attn_dp_size",
      "attn_dp_rank", "pp_size",      "pp_rank",      "system_dp_size", "system_dp_rank"};
  bool ok = j.is_object() && j.contains("rank_ip") && j["rank_ip"].is_string() &&
            j.contains("rank_port") && j.contains("page_size") && j.contains("kv_cache_dtype");
  for (size_t i = 0; ok && i < std::size(kKeys); ++i) {
    ok = j.contains(kKeys[i]);
    if (ok) v[i] = json_int(j[kKeys[i]]);
    ok = ok && v[i].has_value();
  }
  std::optional<int64_t> rank_port = ok ? json_int(j["rank_port"]) : std::nullopt;
  std::optional<int64_t> page = ok ? json_int(j["page_size"]) : std::nullopt;
  if (!ok || !rank_port || !page) {
    co_await internal_error(ex);
    co_return;
  }
  const int64_t system_dp_size = *v[8];
  const int64_t dp_group = system_dp_size == 1 ? *v[5] : *v[9];
  table[dp_group][*v[3]][*v[1]][*v[7]] =
      RankAddr{.ip = j["rank_ip"].get<std::string>(), .port = *rank_port};
  ++registered;
  co_await ex.respond(200, kText, "OK");
}

awaitable<void> BootstrapServer::Impl::route_get(http::Exchange& ex) {
  const std::string_view query = query_of(ex.target());
  auto dp = query_param(query, "prefill_dp_rank");
  auto cp = query_param(query, "prefill_cp_rank");
  auto tp = query_param(query, "target_tp_rank");
  auto pp = query_param(query, "target_pp_rank");
  auto engine_rank = query_param(query, "engine_rank");
  auto dp_group = query_param(query, "target_dp_group");
  const bool old_form = !dp && !cp && !tp && !pp && (engine_rank || dp_group);
  if (old_form) {
    // Builds before sgl-project/sglang#19168 asked GET /route?engine_rank=&target_dp_group=.
    if (!engine_rank || engine_rank->empty() || !dp_group || dp_group->empty()) {
      co_await ex.respond(400, kText, "Missing inputs for bootstrap server.");
      co_return;
    }
    auto e = python_int(*engine_rank);
    auto g = python_int(*dp_group);
    std::string answer;
    if (e && g && *e == -1 && *g == -1) {
      answer = "{\"prefill_tp_size\": " + std::to_string(attn_tp_size) +
               ", \"prefill_dp_size\": " + std::to_string(dp_size) +
               ", \"prefill_pp_size\": " + std::to_string(pp_size) + "}";
    } else if (e && g) {
      auto a = table.find(*g);
      if (a != table.end() && a->second.count(0) && a->second.at(0).count(*e) &&
          a->second.at(0).at(*e).count(0)) {
        answer = rank_json(a->second.at(0).at(*e).at(0));
      }
    }
    if (answer.empty()) {
      co_await internal_error(ex);  // int() of a bad value, or the old handler's KeyError
    } else {
      co_await ex.respond(200, kJson, answer);
    }
    co_return;
  }
  if (!dp || dp->empty() || !cp || cp->empty() || !tp || tp->empty() || !pp || pp->empty()) {
    co_await ex.respond(400, kText, "Missing inputs for bootstrap server.");
    co_return;
  }
  auto d = python_int(*dp);
  auto c = python_int(*cp);
  auto t = python_int(*tp);
  auto p = python_int(*pp);
  if (!d || !c || !t || !p) {
    co_await internal_error(ex);
    co_return;
  }
  if (!ready()) {
    co_await ex.respond(503, kText,
                        "Prefill server not fully registered yet (" + std::to_string(registered) +
                            " workers registered).");
    co_return;
  }
  if (*d == -1 && *c == -1 && *t == -1 && *p == -1) {
    co_await ex.respond(200, kJson, info_json());
    co_return;
  }
  const RankAddr* found = nullptr;
  if (auto a = table.find(*d); a != table.end()) {
    if (auto b = a->second.find(*c); b != a->second.end()) {
      if (auto e = b->second.find(*t); e != b->second.end()) {
        if (auto f = e->second.find(*p); f != e->second.end()) found = &f->second;
      }
    }
  }
  if (!found) {
    co_await ex.respond(404, kText,
                        "Bootstrap info not found for dp_rank=" + *dp + " cp_rank=" + *cp +
                            " tp_rank=" + *tp + " pp_rank=" + *pp);
    co_return;
  }
  co_await ex.respond(200, kJson, rank_json(*found));
}

awaitable<void> BootstrapServer::Impl::register_dp_rank(http::Exchange& ex) {
  Json j = Json::parse(ex.body(), nullptr, false);
  std::optional<int64_t> room, rank;
  if (j.is_object() && j.contains("bootstrap_room") && j.contains("dp_rank")) {
    room = json_int(j["bootstrap_room"]);
    rank = json_int(j["dp_rank"]);
  }
  if (!room || !rank || *room < 0) {
    co_await internal_error(ex);
    co_return;
  }
  auto r = static_cast<uint64_t>(*room);
  if (room_to_dp_rank.emplace(r, *rank).second) {
    room_order.push_back(r);
  } else {
    room_to_dp_rank[r] = *rank;
  }
  while (room_order.size() > kMaxRetained) {
    room_to_dp_rank.erase(room_order.front());
    room_order.pop_front();
  }
  co_await ex.respond(200, kText, "OK");
}

awaitable<void> BootstrapServer::Impl::query_dp_ranks(http::Exchange& ex) {
  Json j = Json::parse(ex.body(), nullptr, false);
  if (!j.is_object() || !j.contains("bootstrap_rooms") || !j["bootstrap_rooms"].is_array()) {
    co_await internal_error(ex);
    co_return;
  }
  std::string out = "{";
  for (const auto& item : j["bootstrap_rooms"]) {
    auto room = json_int(item);
    if (!room) {
      co_await internal_error(ex);
      co_return;
    }
    auto it = room_to_dp_rank.find(static_cast<uint64_t>(*room));
    if (*room < 0 || it == room_to_dp_rank.end()) continue;
    if (out.size() > 1) out += ", ";
    out += "\"" + std::to_string(*room) + "\": " + std::to_string(it->second);
  }
  out += "}";
  co_await ex.respond(200, kJson, out);
}

awaitable<void> BootstrapServer::Impl::room(http::Exchange& ex) {
  // Sim-only: the KV transfer of SGLang's Mooncake/NIXL backends, as one long poll.
  std::string_view rest = ex.path().substr(kRoomPath.size());
  uint64_t room = 0;
  auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), room);
  auto rank_text = query_param(query_of(ex.target()), "prefill_dp_rank");
  std::optional<int64_t> rank = rank_text ? python_int(*rank_text) : std::optional<int64_t>(0);
  if (rest.empty() || ec != std::errc() || p != rest.data() + rest.size() || !rank) {
    co_await ex.respond(400, kText, "expected /kvgate_sim/room/<room>?prefill_dp_rank=<rank>");
    co_return;
  }
  const RoomKey key{room, *rank};
  if (auto it = done.find(key); it != done.end()) {
    std::string answer = std::move(it->second);
    done.erase(it);
    co_await ex.respond(200, kJson, answer);
    co_return;
  }
  auto w = std::make_shared<Waiter>(ctx);
  waiters[key].push_back(w);
  ex.watch_disconnect([w] { w->timer.cancel(); });
  co_await w->timer.async_wait(kTuple);
  if (!w->answer) {
    // The decode side gave up (timeout, abort) or went away.
    if (auto it = waiters.find(key); it != waiters.end()) {
      std::erase_if(it->second, [&](const std::weak_ptr<Waiter>& other) {
        auto o = other.lock();
        return !o || o == w;
      });
      if (it->second.empty()) waiters.erase(it);
    }
    co_return;
  }
  co_await ex.respond(200, kJson, *w->answer);
}

void BootstrapServer::Impl::deliver(RoomKey key, std::string answer) {
  if (auto it = waiters.find(key); it != waiters.end()) {
    bool given = false;
    for (auto& weak : it->second) {
      if (auto w = weak.lock()) {
        w->answer = answer;
        w->timer.cancel();
        given = true;
      }
    }
    waiters.erase(it);
    if (given) return;
  }
  // Nobody asked yet: keep the answer for a while.
  const auto now = Clock::now();
  while (!done_order.empty() &&
         (done_order.front().first < now || done_order.size() >= kMaxRetained)) {
    done.erase(done_order.front().second);
    done_order.pop_front();
  }
  done[key] = std::move(answer);
  done_order.emplace_back(now + settings.retention, key);
}

BootstrapServer::BootstrapServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<BootstrapServer> BootstrapServer::start(const BootstrapSettings& settings,
                                                        std::string& error) {
  auto impl = std::make_unique<Impl>(settings);
  Impl* s = impl.get();
  s->dp_size = std::max(1, settings.dp_size);
  s->page_size = settings.page_size;
  http::ServerConfig sc;
  sc.host = settings.host == "localhost" ? "127.0.0.1" : settings.host;
  sc.port = settings.port;
  sc.reuse_port = false;  // the bootstrap port is this server's alone
  try {
    s->server = std::make_unique<http::Server>(std::vector<asio::io_context*>{&s->ctx}, sc,
                                               [s](http::Exchange& ex) { return s->handle(ex); });
  } catch (const std::exception& e) {
    error = std::string("--disaggregation-bootstrap-port: ") + e.what();
    return nullptr;
  }
  s->port = s->server->port();
  // The sim's own prefill ranks register at start, as each SGLang prefill rank PUTs /route (one
  // rank per DP group; no TP, CP or PP). rank_port is this port: the sim has no per-rank socket.
  const std::string ip =
      sc.host == "0.0.0.0" ? "127.0.0.1" : (sc.host == "::" ? std::string("::1") : sc.host);
  for (int64_t r = 0; r < s->dp_size; ++r) {
    s->table[r][0][0][0] = RankAddr{.ip = ip, .port = s->port};
    ++s->registered;
  }
  s->server->start();
  s->thread = std::thread([s] {
    auto guard = asio::make_work_guard(s->ctx);
    s->ctx.run();
  });
  return std::unique_ptr<BootstrapServer>(new BootstrapServer(std::move(impl)));
}

BootstrapServer::~BootstrapServer() {
  impl_->ctx.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->server.reset();
}

uint16_t BootstrapServer::port() const {
  return impl_->port;
}

void BootstrapServer::set_http_port(int64_t port) {
  asio::post(impl_->ctx, [s = impl_.get(), port] { s->prefill_http_port = port; });
}

void BootstrapServer::room_ready(uint64_t room, int dp_rank, RoomInfo info) {
  std::string body = "{\"status\": \"success\", \"bootstrap_room\": " + std::to_string(room) +
                     ", \"prefill_dp_rank\": " + std::to_string(dp_rank) +
                     ", \"prompt_tokens\": " + std::to_string(info.prompt_tokens) +
                     ", \"cached_tokens\": " + std::to_string(info.cached_tokens) + "}";
  asio::post(impl_->ctx, [s = impl_.get(), key = RoomKey{room, dp_rank}, b = std::move(body)] {
    s->deliver(key, b);
  });
}

void BootstrapServer::room_failed(uint64_t room, int dp_rank, std::string reason) {
  std::string body = "{\"status\": \"failed\", \"bootstrap_room\": " + std::to_string(room) +
                     ", \"prefill_dp_rank\": " + std::to_string(dp_rank) + ", \"reason\": ";
  json::append_string(body, reason);
  body += "}";
  asio::post(impl_->ctx, [s = impl_.get(), key = RoomKey{room, dp_rank}, b = std::move(body)] {
    s->deliver(key, b);
  });
}

// --- the decode side ---

namespace {

// One bootstrap address's HTTP calls, with the interruption of the request.
class BootstrapClient {
 public:
  BootstrapClient(Executor ex, std::shared_ptr<RequestControl> control)
      : ex_(std::move(ex)), control_(std::move(control)), sleep_(ex_) {
    control_->set_interrupt([this] {
      if (active_) active_->abort();
      sleep_.cancel();
    });
  }
  ~BootstrapClient() { control_->set_interrupt(nullptr); }
  BootstrapClient(const BootstrapClient&) = delete;
  BootstrapClient& operator=(const BootstrapClient&) = delete;

  // Resolves host:port (false when it cannot: no host, no port, an unknown name).
  awaitable<bool> open(const std::string& host, std::optional<int64_t> port) {
    if (host.empty() || !port || *port <= 0 || *port > 65535) co_return false;
    const bool v6 = host.find(':') != std::string::npos;
    if (!http::parse_url("http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(*port),
                         target_)
             .empty()) {
      co_return false;
    }
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(target_.host, ec);
    if (!ec) {
      target_.endpoints.emplace_back(addr, target_.port);
      co_return true;
    }
    asio::ip::tcp::resolver resolver(ex_);
    auto [rec, results] =
        co_await resolver.async_resolve(target_.host, std::to_string(target_.port), kTuple);
    if (rec) co_return false;
    for (const auto& r : results) target_.endpoints.push_back(r.endpoint());
    co_return !target_.endpoints.empty();
  }

  struct Answer {
    http::CallError error = http::CallError::kConnect;
    int status = 0;
    std::string body;
  };
  awaitable<Answer> get(const std::string& path, Clock::time_point deadline) {
    Answer a;
    if (target_.endpoints.empty()) co_return a;
    if (control_->interrupted()) {
      a.error = http::CallError::kAborted;
      co_return a;
    }
    http::UpstreamCall call(ex_, pool_, target_, 0);
    call.set_deadline(deadline);
    active_ = &call;
    a.error = co_await call.start("GET", path, {}, {});
    if (a.error == http::CallError::kNone) {
      a.status = call.status();
      a.error = co_await call.read_all(a.body, 1 << 20);
    }
    active_ = nullptr;
    co_return a;
  }

  // Sleeps `d`; false when interrupted.
  awaitable<bool> sleep(std::chrono::milliseconds d) {
    if (control_->interrupted()) co_return false;
    sleep_.expires_after(d);
    co_await sleep_.async_wait(kTuple);
    co_return !control_->interrupted();
  }

 private:
  Executor ex_;
  std::shared_ptr<RequestControl> control_;
  Timer sleep_;
  http::Target target_;
  http::ConnectionPool pool_;
  http::UpstreamCall* active_ = nullptr;
};

std::optional<PrefillInfo> parse_info(const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  PrefillInfo info;
  if (j.contains("dp_size")) {
    auto v = json_int(j["dp_size"]);
    if (!v || *v < 1) return std::nullopt;
    info.dp_size = *v;
  } else if (j.contains("prefill_dp_size")) {  // builds before sglang#19168
    auto v = json_int(j["prefill_dp_size"]);
    if (!v || *v < 1) return std::nullopt;
    info.dp_size = *v;
  } else {
    return std::nullopt;
  }
  if (j.contains("follow_bootstrap_room") && j["follow_bootstrap_room"].is_boolean()) {
    info.follow_bootstrap_room = j["follow_bootstrap_room"].get<bool>();
  }
  return info;
}

}  // namespace

std::optional<PrefillInfo> PrefillInfoTable::find(const std::string& addr) const {
  std::lock_guard lock(mu_);
  auto it = by_addr_.find(addr);
  if (it == by_addr_.end()) return std::nullopt;
  return it->second;
}

void PrefillInfoTable::put(const std::string& addr, PrefillInfo info) {
  std::lock_guard lock(mu_);
  by_addr_[addr] = info;
}

void PrefillInfoTable::erase(const std::string& addr) {
  std::lock_guard lock(mu_);
  by_addr_.erase(addr);
}

awaitable<RoomWait> wait_for_room(RoomRequest r, PrefillInfoTable& infos,
                                  std::shared_ptr<RequestControl> control) {
  auto ex = co_await asio::this_coro::executor;
  const std::string addr =
      (r.host.empty() ? std::string("None") : r.host) + ":" +
      (r.port ? std::to_string(*r.port) : std::string("None"));  // Python's f"{host}:{port}"
  RoomWait out;
  // The request sits in the rank's prealloc queue, then (once the handshake is done) in its
  // transfer queue.
  struct Queued {
    explicit Queued(DecodeQueues* queues) : q(queues) {}
    DecodeQueues* q;
    std::atomic<int64_t>* in = nullptr;
    void enter(std::atomic<int64_t>* c) {
      if (!q) return;
      leave();
      in = c;
      in->fetch_add(1, std::memory_order_relaxed);
    }
    void leave() {
      if (in) in->fetch_sub(1, std::memory_order_relaxed);
      in = nullptr;
    }
    Queued(const Queued&) = delete;
    Queued& operator=(const Queued&) = delete;
    ~Queued() { leave(); }
  } queued(r.queues);
  if (r.queues) queued.enter(&r.queues->prealloc);
  auto handshake_failed = [&](std::string_view reason) {
    out.error = decode_failure(true, r.rid, r.room, reason);
    return out;
  };
  BootstrapClient client(ex, control);
  const bool opened = co_await client.open(r.host, r.port);
  if (control->gone()) co_return out;
  if (control->aborted()) co_return handshake_failed("Aborted by AbortReq.");

  // The prefill's parallel info (cached per address, as SGLang's prefill_info_table).
  std::optional<PrefillInfo> info = infos.find(addr);
  for (int attempt = 1; !info && attempt <= kEnsureInfoAttempts; ++attempt) {
    if (opened) {
      auto a = co_await client.get(
          "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1",
          Clock::now() + std::chrono::seconds(5));
      if (a.error == http::CallError::kNone && a.status == 200) info = parse_info(a.body);
    }
    if (control->gone()) co_return out;
    if (control->aborted()) co_return handshake_failed("Aborted by AbortReq.");
    if (info) {
      infos.put(addr, *info);
      break;
    }
    if (attempt == kEnsureInfoAttempts) {
      // _ensure_prefill_info gives up and aborts the request's receiver.
      log::warn("Could not fetch prefill parallel info")
          .kv("bootstrap_addr", addr)
          .kv("attempts", kEnsureInfoAttempts);
      co_return handshake_failed("Aborted by AbortReq.");
    }
    bool slept = co_await client.sleep(r.retry_interval);
    if (!slept) {
      if (control->gone()) co_return out;
      co_return handshake_failed("Aborted by AbortReq.");
    }
  }

  // The prefill DP rank that holds the room (DecodePreallocQueue._resolve_prefill_dp_rank).
  int64_t rank = 0;
  if (r.prefill_dp_rank) {
    rank = *r.prefill_dp_rank;
  } else if (info->dp_size > 1) {
    rank = static_cast<int64_t>(r.room % static_cast<uint64_t>(info->dp_size));
  }
  const std::string rank_text = std::to_string(rank);
  auto where = co_await client.get("/route?prefill_dp_rank=" + rank_text +
                                       "&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
                                   Clock::now() + std::chrono::seconds(5));
  if (control->gone()) co_return out;
  if (control->aborted()) co_return handshake_failed("Aborted by AbortReq.");
  if (where.error != http::CallError::kNone || where.status != 200) {
    co_return handshake_failed("Could not fetch bootstrap info for: prefill_dp_rank: " + rank_text +
                               " prefill_cp_rank: 0 target_tp_rank: 0 and target_pp_rank 0");
  }

  // KVPoll.WaitingForInput until the prefill rank sends the room's KV.
  if (r.queues) queued.enter(&r.queues->transfer);
  const auto start = Clock::now();
  auto a = co_await client.get(
      std::string(kRoomPath) + std::to_string(r.room) + "?prefill_dp_rank=" + rank_text,
      start + r.timeout);
  if (control->gone()) co_return out;
  auto transfer_failed = [&](std::string_view reason) {
    out.error = decode_failure(false, r.rid, r.room, reason);
    return out;
  };
  if (control->aborted()) co_return transfer_failed("Aborted by AbortReq.");
  if (a.error == http::CallError::kTimeout) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    co_return transfer_failed(waiting_timeout_reason(r.room, elapsed));
  }
  Json j = a.error == http::CallError::kNone && a.status == 200
               ? Json::parse(a.body, nullptr, false)
               : Json();
  if (!j.is_object() || !j.contains("status") || !j["status"].is_string()) {
    // The prefill server went away (SGLang's heartbeat finds it dead).
    infos.erase(addr);
    co_return transfer_failed("Lost connection with prefill instance (bootstrap_addr: " + addr +
                              ")");
  }
  if (j["status"].get<std::string>() != "success") {
    co_return transfer_failed("Failed to get kvcache from prefill instance, it might be dead");
  }
  out.ok = true;
  out.info.prompt_tokens = json_int(j.value("prompt_tokens", Json(0))).value_or(0);
  out.info.cached_tokens = json_int(j.value("cached_tokens", Json(0))).value_or(0);
  co_return out;
}

}  // namespace kvgate::sim
