// sim/info: see info.h.
#include "sim/info.h"

#include <cmath>
#include <cstdio>
#include <ctime>

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

void append_server_args(std::string& out, const SimConfig& c) {
  kv(out, "model_path", std::string_view(c.model_path));
  kv_string_or_null(out, "tokenizer_path", c.tokenizer_path);
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
  kv_string_or_null(out, "tokenizer_path", c.tokenizer_path);
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

std::string get_load_json(std::span<const RankLoad> loads) {
  std::string out = "[";
  for (size_t i = 0; i < loads.size(); ++i) {
    if (i) out.push_back(',');
    out.push_back('{');
    kv(out, "dp_rank", int64_t{loads[i].dp_rank});
    kv(out, "num_reqs", loads[i].running + loads[i].waiting);
    kv(out, "num_waiting_reqs", loads[i].waiting);
    kv(out, "num_tokens", loads[i].used_tokens);
    out.push_back('}');
  }
  out.push_back(']');
  return out;
}

std::string v1_loads_json(std::span<const RankLoad> loads, double unix_seconds) {
  std::string out = "{";
  kv(out, "timestamp", std::string_view(iso8601(unix_seconds)));
  kv(out, "version", kSimVersion);
  kv(out, "dp_rank_count", static_cast<int64_t>(loads.size()));
  key(out, "loads");
  out.push_back('[');
  for (size_t i = 0; i < loads.size(); ++i) {
    const RankLoad& l = loads[i];
    if (i) out.push_back(',');
    out.push_back('{');
    kv(out, "dp_rank", int64_t{l.dp_rank});
    kv(out, "num_running_reqs", l.running);
    kv(out, "num_waiting_reqs", l.waiting);
    kv(out, "num_used_tokens", l.used_tokens);
    kv(out, "num_total_tokens", l.used_tokens);
    kv(out, "max_total_num_tokens", l.max_total_tokens);
    kv(out, "token_usage", l.token_usage());
    kv(out, "cache_hit_rate", l.cache_hit_rate);
    out.push_back('}');
  }
  out.append("]}");
  return out;
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
