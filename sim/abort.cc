// sim/abort: see abort.h.
#include "sim/abort.h"

#include <boost/asio/post.hpp>
#include <unordered_set>

#include "sim/sequence.h"

namespace kvgate::sim {

void RequestControl::abort() {
  asio::post(ex_, [self = shared_from_this()] { self->on_abort(); });
}

void RequestControl::client_gone() {
  if (gone_) return;
  gone_ = true;
  fire();
}

void RequestControl::on_abort() {
  if (aborted_) return;
  aborted_ = true;
  fire();
  // A running request: SGLang's scheduler sets to_finish = FINISH_ABORT() (message "Aborted", no
  // status), so the answer ends with that finish reason.
  for (auto& s : seqs_) {
    if (s->finished()) continue;
    s->abort("Aborted");
    s->cancel();
  }
}

void RequestControl::fire() {
  if (!interrupt_) return;
  auto fn = std::move(interrupt_);
  interrupt_ = nullptr;
  fn();
}

RequestRegistry::Entry::~Entry() {
  std::lock_guard lock(registry_.mu_);
  for (const auto& rid : rids_) {
    auto [b, e] = registry_.by_rid_.equal_range(rid);
    for (auto it = b; it != e; ++it) {
      if (it->second.get() == control_) {
        registry_.by_rid_.erase(it);
        break;
      }
    }
  }
}

std::unique_ptr<RequestRegistry::Entry> RequestRegistry::add(
    std::vector<std::string> rids, const std::shared_ptr<RequestControl>& control) {
  const RequestControl* raw = control.get();
  {
    std::lock_guard lock(mu_);
    for (const auto& rid : rids) by_rid_.emplace(rid, control);
  }
  return std::make_unique<Entry>(*this, std::move(rids), raw);
}

bool RequestRegistry::live(std::string_view rid) const {
  std::lock_guard lock(mu_);
  return by_rid_.find(std::string(rid)) != by_rid_.end();
}

size_t RequestRegistry::abort(std::string_view rid, bool abort_all) {
  std::vector<std::shared_ptr<RequestControl>> hit;
  {
    std::lock_guard lock(mu_);
    if (abort_all) {
      std::unordered_set<const RequestControl*> seen;
      for (const auto& [k, c] : by_rid_) {
        if (seen.insert(c.get()).second) hit.push_back(c);
      }
    } else {
      auto [b, e] = by_rid_.equal_range(std::string(rid));
      for (auto it = b; it != e; ++it) hit.push_back(it->second);
    }
  }
  for (auto& c : hit) c->abort();
  return hit.size();
}

size_t RequestRegistry::size() const {
  std::lock_guard lock(mu_);
  return by_rid_.size();
}

}  // namespace kvgate::sim
