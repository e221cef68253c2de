// metrics: lock-free counters, gauges and histograms with labels, exposed in the Prometheus text
// format (version 0.0.4). Families are created once at startup; a labelled cell is resolved once
// and then updated with relaxed atomics, so the request path never takes a lock after warm-up.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvgate::metrics {

class Counter {
 public:
  void inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }
  // For collectors mirroring a count kept elsewhere (which only grows).
  void mirror(uint64_t total) { v_.store(total, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double d) { v_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void observe(double v);
  // `n` observations of `v` at once (one update of each atomic instead of n).
  void observe_n(double v, uint64_t n);
  const std::vector<double>& bounds() const { return *bounds_; }
  uint64_t bucket(size_t i) const { return counts_[i].load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // one per bound (not cumulative)
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

enum class Type { kCounter, kGauge, kHistogram };

// A metric name with its label names; cells per distinct label values.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, Type type, std::vector<std::string> labels,
             std::vector<double> bounds);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  Type type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  void expose(std::string& out) const;
  // The same cells under another name and help (an alias: a second name for the same series).
  void expose_as(std::string& out, std::string_view name, std::string_view help) const;
  // Calls fn(label values, cell) for every cell, under the family's shared lock (collectors
  // summing a family at scrape time; fn must not touch this family).
  void for_each_cell(const std::function<void(const std::vector<std::string>& values,
                                              const void* cell)>& fn) const;
  // Drops the cell with these label values (e.g. a removed worker). Cell references die with it.
  void remove(std::initializer_list<std::string_view> values);
  // Drops every cell whose label `label` has `value` (a removed worker's series of every kind).
  void remove_where(std::string_view label, std::string_view value);

 protected:
  // Deletes every cell; the most derived destructor calls it while delete_cell is still callable.
  void destroy_cells();
  void* find_or_create(std::initializer_list<std::string_view> values);
  virtual void* make_cell() const = 0;
  virtual void delete_cell(void* cell) const = 0;
  virtual void expose_cell(std::string& out, std::string_view name, const std::string& labels,
                           const void* cell) const = 0;

  std::string name_;
  std::string help_;
  Type type_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;

 private:
  struct Entry {
    std::vector<std::string> values;
    void* cell;
  };
  mutable std::shared_mutex mu_;
  std::map<std::string, Entry, std::less<>> cells_;  // key: values joined by '\x1f'
};

template <class Cell>
class Family final : public FamilyBase {
 public:
  using FamilyBase::FamilyBase;
  ~Family() override { destroy_cells(); }
  Cell& with(std::initializer_list<std::string_view> values) {
    return *static_cast<Cell*>(find_or_create(values));
  }
  // Calls fn(label values, cell) for every cell (see FamilyBase::for_each_cell).
  template <class Fn>
  void for_each(Fn&& fn) const {
    for_each_cell([&](const std::vector<std::string>& values, const void* cell) {
      fn(values, *static_cast<const Cell*>(cell));
    });
  }

 private:
  void* make_cell() const override;
  void delete_cell(void* cell) const override { delete static_cast<Cell*>(cell); }
  void expose_cell(std::string& out, std::string_view name, const std::string& labels,
                   const void* cell) const override;
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  CounterFamily& counter(std::string name, std::string help, std::vector<std::string> labels = {});
  GaugeFamily& gauge(std::string name, std::string help, std::vector<std::string> labels = {});
  HistogramFamily& histogram(std::string name, std::string help, std::vector<std::string> labels,
                             std::vector<double> bounds);
  // Exposes `family` a second time under `name` (same labels, same cells: nothing is counted
  // twice and a series removed from the family leaves the alias too), after every family.
  void alias(const FamilyBase& family, std::string name, std::string help);
  // Runs `fn` before every exposition (to copy values kept elsewhere into gauges and counters).
  // `fn` must not call back into the registry's family creation.
  void add_collector(std::function<void()> fn);
  // Text exposition of every family, in registration order.
  std::string expose() const;
  // Drops, in every family with label `label`, the cells where it is `value` (a removed worker's
  // series, whoever registered them).
  void remove_series(std::string_view label, std::string_view value);

 private:
  template <class F>
  F* existing(const std::string& name, Type type, const std::vector<std::string>& labels);

  mutable std::mutex mu_;
  std::vector<std::function<void()>> collectors_;
  std::vector<std::unique_ptr<FamilyBase>> families_;
  struct Alias {
    const FamilyBase* family;
    std::string name;
    std::string help;
  };
  std::vector<Alias> aliases_;
};

// Buckets for request latencies in seconds: 1 ms .. 30 min (time to first token, end to end,
// admission queue).
std::vector<double> latency_buckets();
// Buckets for short latencies in seconds: 100 us .. 10 s (inter-token latency, upstream connect).
std::vector<double> short_latency_buckets();

// Escapes a label value for the text format (backslash, double quote, newline).
void append_escaped(std::string& out, std::string_view v);

}  // namespace kvgate::metrics
