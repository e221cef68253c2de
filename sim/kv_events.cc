// sim/kv_events: see kv_events.h.
#include "sim/kv_events.h"

#include <simdjson.h>

#include <charconv>
#include <chrono>
#include <utility>
#include <vector>

#include "util/json.h"

namespace kvgate::sim {
namespace {

constexpr std::string_view kFlag = "--kv-events-config: ";
constexpr std::string_view kKnown =
    "publisher, endpoint, replay_endpoint, snapshot_endpoint, topic, buffer_steps, hwm, "
    "max_queue_size";

std::string field_error(std::string_view key, std::string_view what) {
  return std::string(kFlag) + "\"" + std::string(key) + "\" " + std::string(what);
}

std::string get_string(simdjson::dom::element v, std::string_view key, std::string& out) {
  std::string_view s;
  if (v.get_string().get(s)) return field_error(key, "must be a string");
  out.assign(s);
  return "";
}

std::string get_count(simdjson::dom::element v, std::string_view key, int64_t min, int64_t& out) {
  int64_t n = 0;
  if (v.get_int64().get(n)) return field_error(key, "must be an integer");
  if (n < min) return field_error(key, "must be at least " + std::to_string(min));
  out = n;
  return "";
}

std::string check_endpoint(std::string_view key, std::string_view endpoint) {
  std::string host;
  int64_t port = 0;
  if (!split_tcp_endpoint(endpoint, host, port)) {
    return field_error(key, "must be a tcp://HOST:PORT endpoint (e.g. tcp://*:5557), got '" +
                                std::string(endpoint) + "'");
  }
  if (port < 1 || port > 65535) {
    return field_error(key, "has port " + std::to_string(port) + "; it must be 1..65535");
  }
  return "";
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool split_tcp_endpoint(std::string_view endpoint, std::string& host, int64_t& port) {
  constexpr std::string_view kTcp = "tcp://";
  if (!endpoint.starts_with(kTcp)) return false;
  std::string_view rest = endpoint.substr(kTcp.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view port_text = rest.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size()) return false;
  host.assign(rest.substr(0, colon));
  return true;
}

std::string parse_kv_events_config(std::string_view json, KvEventsSettings& out) {
  out = KvEventsSettings{};
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto err = parser.parse(json.data(), json.size()).get(doc); err) {
    return std::string(kFlag) + "not valid JSON (" + simdjson::error_message(err) + ")";
  }
  simdjson::dom::object o;
  if (doc.get_object().get(o)) return std::string(kFlag) + "must be a JSON object";
  for (auto [key, value] : o) {
    std::string err;
    if (key == "publisher") {
      err = get_string(value, key, out.publisher);
      if (err.empty() && out.publisher != "zmq" && out.publisher != "null") {
        err = field_error(key, "must be \"zmq\" or \"null\", got \"" + out.publisher + "\"");
      }
    } else if (key == "endpoint") {
      err = get_string(value, key, out.endpoint);
      if (err.empty()) err = check_endpoint(key, out.endpoint);
    } else if (key == "replay_endpoint") {
      if (!value.is_null()) {
        err = get_string(value, key, out.replay_endpoint);
        if (err.empty()) err = check_endpoint(key, out.replay_endpoint);
      }
    } else if (key == "snapshot_endpoint") {
      if (!value.is_null()) {
        err = get_string(value, key, out.snapshot_endpoint);
        if (err.empty()) err = check_endpoint(key, out.snapshot_endpoint);
      }
    } else if (key == "topic") {
      err = get_string(value, key, out.topic);
    } else if (key == "buffer_steps") {
      err = get_count(value, key, 0, out.buffer_steps);
    } else if (key == "hwm") {
      err = get_count(value, key, 0, out.hwm);
      if (err.empty() && out.hwm > 2147483647) err = field_error(key, "is too large");
    } else if (key == "max_queue_size") {
      err = get_count(value, key, 1, out.max_queue_size);
    } else if (key == "enable_kv_cache_events") {
      bool b = false;
      if (value.get_bool().get(b)) err = field_error(key, "must be true or false");
    } else {
      err = std::string(kFlag) + "unknown key \"" + std::string(key) +
            "\" (known: " + std::string(kKnown) + ")";
    }
    if (!err.empty()) return err;
  }
  return "";
}

std::string check_kv_events(const KvEventsSettings& s, int64_t dp_size) {
  if (!s.enabled()) return "";
  std::string host;
  int64_t pub = 0;
  split_tcp_endpoint(s.endpoint, host, pub);
  if (pub + dp_size - 1 > 65535) {
    return std::string(kFlag) + "\"endpoint\" port " + std::to_string(pub) + " + " +
           std::to_string(dp_size - 1) + " (one port per DP rank) is past 65535";
  }
  // Every socket kind takes the ports base..base+dp_size-1; no two kinds may overlap.
  struct Range {
    std::string_view name;
    int64_t base;
  };
  std::vector<Range> ranges{{"PUB", pub}};
  for (auto [key, endpoint] :
       {std::pair<std::string_view, const std::string*>{"replay_endpoint", &s.replay_endpoint},
        {"snapshot_endpoint", &s.snapshot_endpoint}}) {
    if (endpoint->empty()) continue;
    int64_t base = 0;
    split_tcp_endpoint(*endpoint, host, base);
    if (base + dp_size - 1 > 65535) {
      return std::string(kFlag) + "\"" + std::string(key) + "\" port " + std::to_string(base) +
             " + " + std::to_string(dp_size - 1) + " (one port per DP rank) is past 65535";
    }
    ranges.push_back({key == "replay_endpoint" ? "replay" : "snapshot", base});
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    for (size_t j = i + 1; j < ranges.size(); ++j) {
      const int64_t a = ranges[i].base, b = ranges[j].base;
      if (a < b + dp_size && b < a + dp_size) {
        return std::string(kFlag) + "the " + std::string(ranges[i].name) + " ports " +
               std::to_string(a) + ".." + std::to_string(a + dp_size - 1) + " and the " +
               std::string(ranges[j].name) + " ports " + std::to_string(b) + ".." +
               std::to_string(b + dp_size - 1) + " overlap; each DP rank needs one of each";
      }
    }
  }
  return "";
}

std::string kv_events_descriptor(const KvEventsSettings& s, int64_t page_size, int64_t dp_size) {
  if (!s.enabled()) return "null";
  std::string host;
  int64_t port = 0;
  split_tcp_endpoint(s.endpoint, host, port);
  std::string out = R"({"publisher":"zmq","endpoint_host":)";
  json::append_string(out, host);
  out += ",\"endpoint_port_base\":" + std::to_string(port);
  out += ",\"topic\":";
  json::append_string(out, s.topic);
  out += ",\"block_size\":" + std::to_string(page_size);
  out += ",\"dp_size\":" + std::to_string(dp_size);
  int64_t replay = 0;
  std::string replay_host;
  if (!s.replay_endpoint.empty() && split_tcp_endpoint(s.replay_endpoint, replay_host, replay)) {
    out += ",\"replay_endpoint_port_base\":" + std::to_string(replay);
  }
  out.push_back('}');
  return out;
}

RankEventSink::RankEventSink(std::unique_ptr<kv::Publisher> publisher, kv::WireFormat format,
                             int dp_rank)
    : publisher_(std::move(publisher)), format_(format), dp_rank_(dp_rank) {}

void RankEventSink::publish(std::vector<kv::Event> events) {
  if (events.empty()) return;
  events_.fetch_add(events.size(), std::memory_order_relaxed);
  kv::EventBatch batch;
  batch.ts = unix_now();
  batch.events = std::move(events);
  batch.dp_rank = dp_rank_;
  std::string payload;
  payload.reserve(256);
  kv::encode_batch(batch, format_, payload);
  publisher_->publish(std::move(payload), batch.events);
}

std::string open_rank_sinks(const KvEventsSettings& s, int64_t dp_size, kv::WireFormat format,
                            std::vector<std::unique_ptr<RankEventSink>>& out) {
  out.clear();
  if (!s.enabled()) return "";
  for (int r = 0; r < dp_size; ++r) {
    kv::PublisherOptions o;
    std::string error;
    if (!kv::offset_endpoint(s.endpoint, r, o.endpoint, error)) return error;
    if (!s.replay_endpoint.empty() &&
        !kv::offset_endpoint(s.replay_endpoint, r, o.replay_endpoint, error)) {
      return error;
    }
    if (!s.snapshot_endpoint.empty() &&
        !kv::offset_endpoint(s.snapshot_endpoint, r, o.snapshot_endpoint, error)) {
      return error;
    }
    o.topic = s.topic;
    o.dp_rank = r;  // each rank's publisher draws its own epoch, as SGLang's do
    o.buffer_steps = static_cast<size_t>(s.buffer_steps);
    o.hwm = static_cast<int>(s.hwm);
    auto p = kv::Publisher::create(o, error);
    if (!p) return "KV events of DP rank " + std::to_string(r) + ": " + error;
    out.push_back(std::make_unique<RankEventSink>(std::move(p), format, r));
  }
  return "";
}

}  // namespace kvgate::sim
