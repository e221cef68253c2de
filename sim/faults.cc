// sim/faults: see faults.h.
#include "sim/faults.h"

#include <simdjson.h>

#include <limits>
#include <optional>

#include "sim/responses.h"

namespace kvgate::sim {
namespace {

int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

bool any_rate(const FaultSettings& s) {
  return s.fail_rate > 0 || s.hang_rate > 0 || s.drop_rate > 0 || s.abort_rate > 0;
}

std::string read_rate(simdjson::dom::object& o, std::string_view key, double& out) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e)) return "";
  if (e.get_double().get(out) || out < 0 || out > 1) {
    return "'" + std::string(key) + "' must be a number between 0 and 1";
  }
  return "";
}

std::string read_count(simdjson::dom::object& o, std::string_view key, int64_t lo, int64_t hi,
                       int64_t& out) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e)) return "";
  if (e.get_int64().get(out) || out < lo || out > hi) {
    return "'" + std::string(key) + "' must be an integer between " + std::to_string(lo) + " and " +
           std::to_string(hi);
  }
  return "";
}

}  // namespace

FaultSettings fault_settings(const SimConfig& c) {
  return FaultSettings{.fail_rate = c.fail_rate,
                       .fail_status = c.fail_status,
                       .hang_rate = c.hang_rate,
                       .drop_rate = c.drop_mid_stream_rate,
                       .drop_after_chunks = c.drop_after_chunks,
                       .abort_rate = c.abort_first_event_rate};
}

FaultInjector::FaultInjector(FaultSettings settings, uint64_t seed,
                             Clock::time_point unhealthy_until)
    : settings_(settings), rng_(seed), unhealthy_until_ns_(to_ns(unhealthy_until)) {
  any_.store(any_rate(settings), std::memory_order_relaxed);
}

Fault FaultInjector::decide() {
  if (!any_.load(std::memory_order_relaxed)) return Fault::kNone;
  std::lock_guard lock(mu_);
  double u = rng_.uniform();
  const auto& s = settings_;
  if (u < s.fail_rate) return Fault::kFail;
  if (u < s.fail_rate + s.hang_rate) return Fault::kHang;
  if (u < s.fail_rate + s.hang_rate + s.drop_rate) return Fault::kDrop;
  if (u < s.fail_rate + s.hang_rate + s.drop_rate + s.abort_rate) return Fault::kAbort;
  return Fault::kNone;
}

FaultSettings FaultInjector::settings() const {
  std::lock_guard lock(mu_);
  return settings_;
}

bool FaultInjector::healthy(Clock::time_point now) const {
  return to_ns(now) >= unhealthy_until_ns_.load(std::memory_order_relaxed);
}

std::string FaultInjector::update(std::string& body) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  simdjson::dom::object o;
  if (auto err = parser.parse(body).get(doc)) {
    return std::string("malformed JSON body: ") + simdjson::error_message(err);
  }
  if (doc.get_object().get(o)) return "the body must be a JSON object";
  FaultSettings s = settings();
  if (auto e = read_rate(o, "fail_rate", s.fail_rate); !e.empty()) return e;
  if (auto e = read_rate(o, "hang_rate", s.hang_rate); !e.empty()) return e;
  if (auto e = read_rate(o, "drop_mid_stream_rate", s.drop_rate); !e.empty()) return e;
  if (auto e = read_rate(o, "abort_first_event_rate", s.abort_rate); !e.empty()) return e;
  if (auto e = read_count(o, "fail_status", 400, 599, s.fail_status); !e.empty()) return e;
  if (auto e = read_count(o, "drop_after_chunks", 0, 1000000000, s.drop_after_chunks); !e.empty()) {
    return e;
  }
  if (s.fail_rate + s.hang_rate + s.drop_rate + s.abort_rate > 1 + 1e-9) {
    return "fail_rate + hang_rate + drop_mid_stream_rate + abort_first_event_rate must add up to "
           "at most 1";
  }
  std::optional<int64_t> until;
  simdjson::dom::element e;
  if (!o.at_key("unhealthy").get(e)) {
    bool b = false;
    if (e.get_bool().get(b)) return "'unhealthy' must be true or false";
    until = b ? std::numeric_limits<int64_t>::max() : 0;
  }
  if (!o.at_key("unhealthy_secs").get(e)) {
    double secs = 0;
    if (e.get_double().get(secs) || secs < 0 || secs > 1e7) {
      return "'unhealthy_secs' must be a number of seconds between 0 and 1e7";
    }
    until = to_ns(Clock::now() +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs)));
  }
  std::lock_guard lock(mu_);
  settings_ = s;
  any_.store(any_rate(s), std::memory_order_relaxed);
  if (until) unhealthy_until_ns_.store(*until, std::memory_order_relaxed);
  return "";
}

std::string FaultInjector::to_json() const {
  FaultSettings s = settings();
  std::string out = R"({"fail_rate":)";
  append_double(out, s.fail_rate);
  out.append(R"(,"fail_status":)");
  append_int(out, s.fail_status);
  out.append(R"(,"hang_rate":)");
  append_double(out, s.hang_rate);
  out.append(R"(,"drop_mid_stream_rate":)");
  append_double(out, s.drop_rate);
  out.append(R"(,"drop_after_chunks":)");
  append_int(out, s.drop_after_chunks);
  out.append(R"(,"abort_first_event_rate":)");
  append_double(out, s.abort_rate);
  out.append(R"(,"unhealthy":)");
  out.append(healthy() ? "false" : "true");
  out.push_back('}');
  return out;
}

}  // namespace kvgate::sim
