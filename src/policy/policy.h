// policy/policy: the routing policy interface. A policy picks one worker among those available
// (healthy, breaker closed or half-open) for a request, and says why (the branch: a metric label
// and the x-kvgate-route debug header). Hooks let stateful policies learn from dispatch and
// completion.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "request/request_info.h"
#include "workers/worker.h"

namespace kvgate {

// Everything a policy may look at for one request.
struct RouteContext {
  const RequestInfo* request = nullptr;
  // Request header lookup (case-insensitive); empty when absent.
  std::string_view (*header_fn)(const void* self, std::string_view name) = nullptr;
  const void* header_self = nullptr;
  std::string_view header(std::string_view name) const {
    return header_fn ? header_fn(header_self, name) : std::string_view{};
  }
};

struct Decision {
  Worker* worker = nullptr;
  std::optional<int> dp_rank;
  std::string_view branch;  // static string: why this worker
  size_t predicted_cached_tokens = 0;
};

struct Outcome {
  int status = 0;
  bool ok = false;
  std::optional<int64_t> cached_tokens;  // as the worker reported it, when it did
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // `available` is never empty.
  virtual Decision select(std::span<Worker* const> available, RouteContext& ctx) = 0;
  virtual void on_dispatched(const Decision&, RouteContext&) {}
  virtual void on_completed(const Decision&, const Outcome&) {}
  virtual void on_workers_changed(const WorkerSet&) {}
  // True when the policy compares the load workers report (the health plane then polls /get_load).
  virtual bool uses_reported_load() const { return false; }
};

}  // namespace kvgate
