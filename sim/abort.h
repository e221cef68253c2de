// sim/abort: SGLang's POST /abort_request {"rid", "abort_all"} for kvgate-sim. Every generation
// request registers its rids (the body's, or the ones the server made up) with a RequestControl;
// an abort finds the request by rid and ends it as SGLang's scheduler does: a PD decode request
// waiting for its KV stops waiting (its client gets the transfer failure "Aborted by AbortReq."),
// a running one finishes with finish_reason {"type":"abort","message":"Aborted"}.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "http/io.h"

namespace kvgate::sim {

class Sequence;

// The interruptible state of one generation request. Everything but abort() runs on the request's
// executor.
class RequestControl : public std::enable_shared_from_this<RequestControl> {
 public:
  explicit RequestControl(Executor ex) : ex_(std::move(ex)) {}
  // Any thread: ends the request (posted to its executor).
  void abort();
  // The client went away.
  void client_gone();
  bool aborted() const { return aborted_; }
  bool gone() const { return gone_; }
  bool interrupted() const { return aborted_ || gone_; }
  // While the request waits for something: how to end that wait (null: nothing to interrupt).
  // Called at most once per interruption, on the executor.
  void set_interrupt(std::function<void()> fn) { interrupt_ = std::move(fn); }
  // A sequence the engine runs for this request (aborted with it).
  void add_sequence(std::shared_ptr<Sequence> seq) { seqs_.push_back(std::move(seq)); }
  const Executor& executor() const { return ex_; }

 private:
  void on_abort();
  void fire();

  Executor ex_;
  bool aborted_ = false;
  bool gone_ = false;
  std::function<void()> interrupt_;
  std::vector<std::shared_ptr<Sequence>> seqs_;
};

// The requests in flight, by rid. Thread-safe.
class RequestRegistry {
 public:
  // Keeps `control` findable under each of `rids` until the Entry is destroyed.
  class Entry {
   public:
    Entry(RequestRegistry& r, std::vector<std::string> rids, const RequestControl* control)
        : registry_(r), rids_(std::move(rids)), control_(control) {}
    ~Entry();
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

   private:
    RequestRegistry& registry_;
    std::vector<std::string> rids_;
    const RequestControl* control_;
  };
  [[nodiscard]] std::unique_ptr<Entry> add(std::vector<std::string> rids,
                                           const std::shared_ptr<RequestControl>& control);
  // SGLang's abort: the requests whose rid is `rid` (every one with `abort_all`); SGLang's
  // tokenizer manager ignores a rid it does not know. Returns how many were aborted.
  size_t abort(std::string_view rid, bool abort_all);
  // Whether a request in flight has this rid (SGLang refuses a second one: "Duplicate request ID
  // detected").
  bool live(std::string_view rid) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_multimap<std::string, std::shared_ptr<RequestControl>> by_rid_;
};

}  // namespace kvgate::sim
