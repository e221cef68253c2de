// sim/info: see info.h.
#include "sim/info.h"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <utility>
#include <vector>

#include "sim/kv_events.h"
#include "sim/responses.h"
#include "util/json.h"

namespace kvgate::sim {
namespace {

void key(std::string& out, std::string_view k) {
  if (out.back() != '{' && out.back() != '[') out.push_back(',');
  json::append_string(out, k);
  out.push_back(':');
}
void kv(std::string& out, std::string_view k, std::string_view v) {
  key(out, k);
  json::append_string(out, v);
}
void kv(std::string& out, std::string_view k, int64_t v) {
  key(out, k);
  append_int(out, v);
}
void kv(std::string& out, std::string_view k, double v) {
  key(out, k);
  append_double(out, v);
}
void kv(std::string& out, std::string_view k, bool v) {
  key(out, k);
  out.append(v ? "true" : "false");
}
void kv_null(std::string& out, std::string_view k) {
  key(out, k);
  out.append("null");
}
void kv_string_or_null(std::string& out, std::string_view k, std::string_view v) {
  if (v.empty()) {
    kv_null(out, k);
  } else {
    kv(out, k, v);
  }
}

// SGLang's ServerArgs: tokenizer_path defaults to model_path.
std::string_view tokenizer_path(const SimConfig& c) {
  return c.tokenizer_path.empty() ? std::string_view(c.model_path)
                                  : std::string_view(c.tokenizer_path);
}

void append_server_args(std::string& out, const SimConfig& c) {
  kv(out, "model_path", std::string_view(c.model_path));
  kv(out, "tokenizer_path", tokenizer_path(c));
  kv(out, "served_model_name", std::string_view(c.served_model_name));
  kv(out, "host", std::string_view(c.host));
  kv(out, "port", c.port);
  kv(out, "page_size", c.page_size);
  kv(out, "dp_size", c.dp_size);
  kv(out, "tp_size", int64_t{1});
  kv(out, "pp_size", int64_t{1});
  kv(out, "context_length", c.context_length);
  kv(out, "max_total_tokens", c.max_total_tokens);
  kv(out, "random_seed", c.seed);
  kv(out, "load_balance_method", std::string_view("round_robin"));
  kv(out, "enable_cache_report", c.enable_cache_report);
  kv(out, "enable_metrics", c.enable_metrics);
  kv(out, "incremental_streaming_output", c.incremental_streaming_output);
  kv(out, "stream_response_default_include_usage", c.stream_response_default_include_usage);
  kv(out, "enable_response_store", c.enable_response_store);
  kv(out, "chunked_prefill_size", c.chunked_prefill_size);
  kv(out, "max_running_requests", c.max_running_requests);
  if (c.max_queued_requests > 0) {
    kv(out, "max_queued_requests", c.max_queued_requests);
  } else {
    kv_null(out, "max_queued_requests");
  }
  kv(out, "schedule_policy", std::string_view("fcfs"));
  kv(out, "disaggregation_mode", std::string_view(c.disaggregation_mode));
  kv(out, "disaggregation_bootstrap_port", c.disaggregation_bootstrap_port);
  kv_string_or_null(out, "kv_events_config", c.kv_events_config);
  kv(out, "enable_lora", c.enable_lora);
  if (c.lora_paths.empty()) {
    kv_null(out, "lora_paths");
  } else {
    key(out, "lora_paths");
    out.push_back('[');
    for (size_t i = 0; i < c.lora_paths.size(); ++i) {
      if (i) out.push_back(',');
      json::append_string(out, c.lora_paths[i]);
    }
    out.push_back(']');
  }
  kv(out, "log_level", std::string_view(c.log_level));
  // kvgate-sim's own knobs, flat like the others.
  kv(out, "scheduler", std::string_view(c.scheduler));
  kv(out, "time_scale", c.time_scale);
  kv(out, "step_fixed_ms", c.step_fixed_ms);
  kv(out, "step_prefill_token_us", c.step_prefill_token_us);
  kv(out, "step_running_request_us", c.step_running_request_us);
  kv(out, "ttft_ms", c.ttft_ms);
  kv(out, "tpot_ms", c.tpot_ms);
  kv(out, "kv_events_format", std::string_view(c.kv_events_format));
  kv(out, "kv_events_per_page", c.kv_events_per_page);
  kv(out, "pd_transfer_fixed_ms", c.pd_transfer_fixed_ms);
  kv(out, "pd_transfer_token_us", c.pd_transfer_token_us);
  kv(out, "pd_room_timeout_secs", c.pd_room_timeout_secs);
  kv(out, "default_max_new_tokens", c.default_max_new_tokens);
  kv(out, "instant", c.instant);
}

void append_internal_state(std::string& out, const SimConfig& c, const RankLoad& l) {
  out.push_back('{');
  kv(out, "dp_rank", int64_t{l.dp_rank});
  kv(out, "page_size", c.page_size);
  kv(out, "max_total_num_tokens", c.max_total_tokens);
  kv(out, "max_req_input_len", max_req_input_len(c));
  kv(out, "num_running_reqs", l.running);
  kv(out, "num_waiting_reqs", l.waiting);
  kv(out, "num_used_tokens", l.used_tokens);
  kv(out, "num_cached_tokens", l.cached_tokens);
  kv(out, "cache_hit_rate", l.cache_hit_rate);
  kv(out, "last_gen_throughput", 0.0);
  key(out, "memory_usage");
  out.push_back('{');
  kv(out, "token_capacity", c.max_total_tokens);
  out.push_back('}');
  out.push_back('}');
}

// Python's datetime.now(timezone.utc).isoformat(): 2026-01-02T03:04:05.678901+00:00
std::string iso8601(double unix_seconds) {
  auto secs = static_cast<std::time_t>(std::floor(unix_seconds));
  auto micros = static_cast<int>((unix_seconds - static_cast<double>(secs)) * 1e6);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06d+00:00", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, micros);
  return buf;
}

}  // namespace

std::string server_info_json(const SimConfig& c, std::span<const RankLoad> loads, bool healthy) {
  std::string out = "{";
  append_server_args(out, c);
  kv(out, "status", std::string_view(healthy ? "ready" : "starting"));
  kv(out, "max_total_num_tokens", c.max_total_tokens);
  kv(out, "max_req_input_len", max_req_input_len(c));
  kv(out, "version", kSimVersion);
  key(out, "internal_states");
  out.push_back('[');
  for (size_t i = 0; i < loads.size(); ++i) {
    if (i) out.push_back(',');
    append_internal_state(out, c, loads[i]);
  }
  out.push_back(']');
  key(out, "kv_events");
  KvEventsSettings events;
  if (!c.kv_events_config.empty() && parse_kv_events_config(c.kv_events_config, events).empty()) {
    out.append(kv_events_descriptor(events, c.page_size, c.dp_size));
  } else {
    out.append("null");
  }
  out.push_back('}');
  return out;
}

std::string model_info_json(const SimConfig& c) {
  std::string out = "{";
  kv(out, "model_path", std::string_view(c.model_path));
  kv(out, "tokenizer_path", tokenizer_path(c));
  kv(out, "is_generation", true);
  kv_null(out, "preferred_sampling_params");
  kv(out, "weight_version", kWeightVersion);
  kv(out, "has_image_understanding", false);
  kv(out, "has_audio_understanding", false);
  kv(out, "model_type", std::string_view("kvgate_sim"));
  key(out, "architectures");
  out.append(R"(["KvgateSimForCausalLM"])");
  out.push_back('}');
  return out;
}

std::string get_load_json(std::span<const RankLoad> loads, double monotonic_seconds) {
  std::string out = "[";
  for (size_t i = 0; i < loads.size(); ++i) {
    const RankLoad& l = loads[i];
    if (i) out.push_back(',');
    out.push_back('{');
    kv(out, "dp_rank", int64_t{l.dp_rank});
    kv(out, "num_reqs", l.running + l.waiting);
    kv(out, "num_waiting_reqs", l.waiting);
    kv(out, "num_tokens", l.total_tokens());
    kv(out, "num_pending_tokens", l.total_tokens() - l.used_tokens);
    kv(out, "ts_tic", monotonic_seconds);
    out.push_back('}');
  }
  out.push_back(']');
  return out;
}

namespace {

constexpr std::string_view kSections[] = {"all",    "core",   "disagg", "lora",
                                          "memory", "queues", "spec"};

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && hex_digit(s[i + 1]) >= 0 &&
               hex_digit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// One rank's load as SGLang's LoadSnapshot.to_dict: the core scalars, then the sections asked for.
// Fields the sim has no model of (throughput, utilization, memory in GB, busy time) are 0.
void append_load(std::string& out, const SimConfig& c, const RankLoad& l, double unix_seconds,
                 bool all, const std::vector<std::string>& include) {
  auto wants = [&](std::string_view s) {
    return all || std::find(include.begin(), include.end(), s) != include.end();
  };
  out.push_back('{');
  kv(out, "timestamp", unix_seconds);
  kv(out, "dp_rank", int64_t{l.dp_rank});
  kv(out, "num_running_reqs", l.running);
  kv(out, "num_waiting_reqs", l.waiting);
  kv(out, "num_waiting_uncached_tokens", l.waiting_uncached_tokens);
  kv(out, "num_used_tokens", l.used_tokens);
  kv(out, "num_total_tokens", l.total_tokens());
  kv(out, "num_active_tokens", l.total_tokens());
  kv(out, "max_total_num_tokens", l.max_total_tokens);
  kv(out, "max_running_requests", l.max_running_requests);
  kv(out, "token_usage", l.token_usage());
  kv(out, "gen_throughput", 0.0);
  kv(out, "cache_hit_rate", l.cache_hit_rate);
  kv(out, "utilization", 0.0);
  kv(out, "total_prefill_uncached_tokens", l.prefilled_tokens);
  kv(out, "total_prefill_busy_us", int64_t{0});
  kv_null(out, "decode_moments");
  if (wants("memory")) {
    key(out, "memory");
    out.push_back('{');
    kv(out, "weight_gb", 0.0);
    kv(out, "kv_cache_gb", 0.0);
    kv(out, "graph_gb", 0.0);
    kv(out, "token_capacity", l.max_total_tokens);
    out.push_back('}');
  }
  if (wants("disagg") && c.disaggregation_mode != "null") {
    key(out, "disaggregation");
    out.push_back('{');
    kv(out, "mode", std::string_view(c.disaggregation_mode));
    kv(out, "prefill_bootstrap_queue_reqs", int64_t{0});
    kv(out, "prefill_inflight_queue_reqs", l.prefill_inflight);
    kv(out, "decode_prealloc_queue_reqs", l.decode_prealloc);
    kv(out, "decode_transfer_queue_reqs", l.decode_transfer);
    kv(out, "decode_retracted_queue_reqs", int64_t{0});
    kv(out, "kv_transfer_speed_gb_s", 0.0);
    kv(out, "kv_transfer_latency_ms", 0.0);
    out.push_back('}');
  }
  if (wants("queues")) {
    key(out, "queues");
    out.push_back('{');
    kv(out, "waiting", l.waiting);
    kv(out, "grammar", int64_t{0});
    kv(out, "paused", int64_t{0});
    kv(out, "retracted", int64_t{0});
    out.push_back('}');
  }
  out.push_back('}');
}

// _format_loads_prometheus: every numeric field of every load as a gauge sglang_<field> (sections
// as sglang_<prefix>_<field>, spec and disagg abbreviated), labelled with the rank, grouped by
// metric in first-seen order.
std::string loads_prometheus(std::string_view loads_json) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  std::vector<std::pair<std::string, std::string>> samples;  // metric, line
  std::vector<std::string> order;
  if (parser.parse(loads_json).get(doc)) return "\n";
  simdjson::dom::array loads;
  if (doc["loads"].get_array().get(loads)) return "\n";
  auto number = [](simdjson::dom::element v, std::string& text) {
    int64_t i = 0;
    double d = 0;
    if (v.is_int64() && !v.get_int64().get(i)) {
      text = std::to_string(i);
      return true;
    }
    if (v.is_double() && !v.get_double().get(d)) {
      text.clear();
      append_double(text, d);
      return true;
    }
    return false;
  };
  auto add = [&](const std::string& metric, const std::string& rank, const std::string& value) {
    if (std::find(order.begin(), order.end(), metric) == order.end()) order.push_back(metric);
    samples.emplace_back(metric, metric + "{dp_rank=\"" + rank + "\"} " + value);
  };
  for (simdjson::dom::element load : loads) {
    simdjson::dom::object o;
    if (load.get_object().get(o)) continue;
    int64_t rank = 0;
    if (o["dp_rank"].get_int64().get(rank)) continue;
    const std::string r = std::to_string(rank);
    for (auto [k, v] : o) {
      if (k == "dp_rank") continue;
      std::string text;
      simdjson::dom::object section;
      if (!v.get_object().get(section)) {
        std::string prefix = k == "speculative"      ? "spec"
                             : k == "disaggregation" ? "disagg"
                                                     : std::string(k);
        for (auto [sk, sv] : section) {
          if (number(sv, text)) add("sglang_" + prefix + "_" + std::string(sk), r, text);
        }
      } else if (number(v, text)) {
        add("sglang_" + std::string(k), r, text);
      }
    }
  }
  std::string out;
  for (const auto& metric : order) {
    out += "# TYPE " + metric + " gauge\n";
    for (const auto& [m, line] : samples) {
      if (m == metric) out += line + "\n";
    }
  }
  if (out.empty()) out = "\n";
  return out;
}

}  // namespace

std::optional<std::string> query_param(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    size_t eq = part.find('=');
    std::string name = percent_decode(part.substr(0, eq));
    if (name != key) continue;
    return eq == std::string_view::npos ? std::string() : percent_decode(part.substr(eq + 1));
  }
  return std::nullopt;
}

LoadsAnswer v1_loads(const SimConfig& c, std::span<const RankLoad> loads, std::string_view query,
                     double unix_seconds) {
  LoadsAnswer a;
  // include: comma-separated, stripped; absent or empty means all. FastAPI answers a bad one 400.
  std::vector<std::string> include;
  bool all = true;
  if (auto inc = query_param(query, "include"); inc && !inc->empty()) {
    all = false;
    std::string_view rest = *inc;
    std::vector<std::string> invalid;
    for (;;) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) {
        item.remove_prefix(1);
      }
      while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) {
        item.remove_suffix(1);
      }
      include.emplace_back(item);
      if (std::find(std::begin(kSections), std::end(kSections), item) == std::end(kSections) &&
          std::find(invalid.begin(), invalid.end(), item) == invalid.end()) {
        invalid.emplace_back(item);
      }
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
    if (!invalid.empty()) {
      // Python's repr of the set of invalid names, and the sorted valid options.
      std::string message = "Invalid include sections: {";
      for (size_t i = 0; i < invalid.size(); ++i) {
        if (i) message += ", ";
        message += "'" + invalid[i] + "'";
      }
      message += "}. Valid options: [";
      for (size_t i = 0; i < std::size(kSections); ++i) {
        if (i) message += ", ";
        message += "'" + std::string(kSections[i]) + "'";
      }
      message += "]";
      a.status = 400;
      a.body = R"({"detail":)";
      json::append_string(a.body, message);
      a.body.push_back('}');
      return a;
    }
    all = std::find(include.begin(), include.end(), "all") != include.end();
  }
  std::optional<int64_t> only;
  if (auto r = query_param(query, "dp_rank"); r) {
    int64_t v = 0;
    std::string_view t = *r;
    const bool negative = !t.empty() && t.front() == '-';
    if (negative || (!t.empty() && t.front() == '+')) t.remove_prefix(1);
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || ec != std::errc() || ptr != t.data() + t.size()) {
      // FastAPI's validation error for a query parameter that is not an integer.
      a.status = 422;
      a.body =
          R"({"detail":[{"type":"int_parsing","loc":["query","dp_rank"],"msg":"Input should be a valid integer, unable to parse string as an integer","input":)";
      json::append_string(a.body, *r);
      a.body.append("}]}");
      return a;
    }
    only = negative ? -v : v;
  }
  std::string out = "{";
  kv(out, "timestamp", std::string_view(iso8601(unix_seconds)));
  kv(out, "version", kSimVersion);
  kv_null(out, "accelerator");  // no accelerator behind the sim (SGLang: None when unknown)
  kv(out, "num_accelerators", int64_t{1});
  key(out, "loads");
  out.push_back('[');
  bool first = true;
  for (const RankLoad& l : loads) {
    if (only && *only != l.dp_rank) continue;
    if (!first) out.push_back(',');
    first = false;
    append_load(out, c, l, unix_seconds, all, include);
  }
  out.append("]}");
  if (query_param(query, "format") == std::optional<std::string>("prometheus")) {
    a.prometheus = true;
    a.body = loads_prometheus(out);
    return a;
  }
  a.body = std::move(out);
  return a;
}

std::string models_json(const SimConfig& c, int64_t created) {
  std::string out = R"({"object":"list","data":[{)";
  kv(out, "id", std::string_view(c.served_model_name));
  kv(out, "object", std::string_view("model"));
  kv(out, "created", created);
  kv(out, "owned_by", std::string_view("sglang"));
  kv(out, "root", std::string_view(c.model_path));
  kv_null(out, "parent");
  kv(out, "max_model_len", c.context_length);
  out.append("}]}");
  return out;
}

}  // namespace kvgate::sim
