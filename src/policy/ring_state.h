// policy/ring_state: the hash ring of a ring-based policy over the configured workers, replaced
// as a whole when the worker set changes (a request keeps the ring it took), plus the lookups
// those policies share.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "policy/common.h"
#include "prefix/hash_ring.h"
#include "util/shared_snapshot.h"

namespace kvgate {

struct RingState {
  prefix::HashRing ring;
  std::vector<uint64_t> ids;  // member index -> worker id
};

class RingHolder {
 public:
  explicit RingHolder(int vnodes) : vnodes_(vnodes) {}
  void rebuild(const WorkerSet& set) {
    auto s = std::make_shared<RingState>();
    std::vector<std::string> names;
    for (const auto& w : set.workers) {
      names.push_back(w->url());
      s->ids.push_back(w->id());
    }
    s->ring = prefix::HashRing(names, vnodes_);
    state_.store(std::move(s));
  }
  std::shared_ptr<const RingState> get() const { return state_.load(); }

 private:
  int vnodes_;
  SharedSnapshot<const RingState> state_{std::make_shared<const RingState>()};
};

}  // namespace kvgate
