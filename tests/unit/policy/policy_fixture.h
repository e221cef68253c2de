// Shared helpers for policy tests: a pool of workers with controllable loads and a request.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gateway/knobs.h"
#include "policy/registry.h"

namespace kvgate::testing {

struct Pool {
  explicit Pool(int n, int first_id = 1) {
    for (int i = 0; i < n; ++i) add(first_id + i);
  }
  Worker* add(int id) {
    http::Target t;
    http::parse_url("http://10.0.0." + std::to_string(id) + ":30000", t);
    owned.push_back(
        std::make_shared<Worker>(static_cast<uint64_t>(id), t, breaker_config(GatewayConfig{})));
    ptrs.push_back(owned.back().get());
    return ptrs.back();
  }
  void remove(Worker* w) {
    std::erase(ptrs, w);
    std::erase_if(owned, [w](const WorkerPtr& p) { return p.get() == w; });
  }
  WorkerSet set() const { return WorkerSet{owned}; }
  void set_inflight(Worker* w, int64_t n) {
    while (w->inflight() < n) w->begin_request();
    while (w->inflight() > n) w->end_request();
  }
  std::vector<WorkerPtr> owned;
  std::vector<Worker*> ptrs;
};

inline std::unique_ptr<Policy> make(PolicyConfig c, const Pool& pool) {
  std::string err;
  auto p = make_policy(c, err);
  if (p) p->on_workers_changed(pool.set());
  return p;
}

// A request context with text and headers for a policy test.
struct Req {
  RequestInfo info;
  std::vector<std::pair<std::string, std::string>> headers;
  RouteContext ctx;
  explicit Req(std::string text = "", std::string model = "m") {
    info.text = std::move(text);
    info.model = std::move(model);
    ctx.request = &info;
    ctx.header_self = this;
    ctx.header_fn = [](const void* self, std::string_view name) -> std::string_view {
      for (const auto& [k, v] : static_cast<const Req*>(self)->headers) {
        if (k == name) return v;
      }
      return {};
    };
  }
  Req(const Req&) = delete;
};

}  // namespace kvgate::testing
