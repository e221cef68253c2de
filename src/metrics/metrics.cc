// metrics: see metrics.h.
#include "metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace kvgate::metrics {
namespace {

void append_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out.append("NaN");
  } else if (std::isinf(v)) {
    out.append(v > 0 ? "+Inf" : "-Inf");
  } else if (v == std::floor(v) && std::fabs(v) < 1e15) {
    out.append(std::to_string(static_cast<int64_t>(v)));
  } else {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    out.append(buf);
  }
}

std::string join_key(std::initializer_list<std::string_view> values) {
  std::string key;
  for (auto v : values) {
    key.append(v);
    key.push_back('\x1f');
  }
  return key;
}

}  // namespace

void append_escaped(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\')
      out.append("\\\\");
    else if (c == '"')
      out.append("\\\"");
    else if (c == '\n')
      out.append("\\n");
    else
      out.push_back(c);
  }
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  const auto& b = *bounds_;
  size_t i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), v) - b.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

void Histogram::observe_n(double v, uint64_t n) {
  if (n == 0) return;
  const auto& b = *bounds_;
  size_t i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), v) - b.begin());
  counts_[i].fetch_add(n, std::memory_order_relaxed);
  count_.fetch_add(n, std::memory_order_relaxed);
  if (v != 0) sum_.fetch_add(v * static_cast<double>(n), std::memory_order_relaxed);
}

FamilyBase::FamilyBase(std::string name, std::string help, Type type,
                       std::vector<std::string> labels, std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(labels)),
      bounds_(std::move(bounds)) {}

void* FamilyBase::find_or_create(std::initializer_list<std::string_view> values) {
  if (values.size() != label_names_.size()) {
    throw std::logic_error("metric " + name_ + ": wrong number of label values");
  }
  thread_local std::string key;
  key.clear();
  for (auto v : values) {
    key.append(v);
    key.push_back('\x1f');
  }
  {
    std::shared_lock lock(mu_);
    auto it = cells_.find(key);
    if (it != cells_.end()) return it->second.cell;
  }
  std::unique_lock lock(mu_);
  auto it = cells_.find(key);
  if (it != cells_.end()) return it->second.cell;
  Entry e{std::vector<std::string>(values.begin(), values.end()), make_cell()};
  void* cell = e.cell;
  cells_.emplace(key, std::move(e));
  return cell;
}

void FamilyBase::remove(std::initializer_list<std::string_view> values) {
  std::string key = join_key(values);
  std::unique_lock lock(mu_);
  auto it = cells_.find(key);
  if (it == cells_.end()) return;
  delete_cell(it->second.cell);
  cells_.erase(it);
}

void FamilyBase::remove_where(std::string_view label, std::string_view value) {
  auto at = std::find(label_names_.begin(), label_names_.end(), label);
  if (at == label_names_.end()) return;
  auto i = static_cast<size_t>(at - label_names_.begin());
  std::unique_lock lock(mu_);
  for (auto it = cells_.begin(); it != cells_.end();) {
    if (it->second.values[i] == value) {
      delete_cell(it->second.cell);
      it = cells_.erase(it);
    } else {
      ++it;
    }
  }
}

void FamilyBase::destroy_cells() {
  std::unique_lock lock(mu_);
  for (auto& [key, entry] : cells_) delete_cell(entry.cell);
  cells_.clear();
}

void FamilyBase::for_each_cell(
    const std::function<void(const std::vector<std::string>& values, const void* cell)>& fn) const {
  std::shared_lock lock(mu_);
  for (const auto& [key, entry] : cells_) fn(entry.values, entry.cell);
}

void FamilyBase::expose(std::string& out) const {
  expose_as(out, name_, help_);
}

void FamilyBase::expose_as(std::string& out, std::string_view name, std::string_view help) const {
  const char* type = type_ == Type::kCounter ? "counter"
                     : type_ == Type::kGauge ? "gauge"
                                             : "histogram";
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  std::shared_lock lock(mu_);
  for (const auto& [key, entry] : cells_) {
    std::string labels;
    for (size_t i = 0; i < label_names_.size(); ++i) {
      if (i) labels.push_back(',');
      labels.append(label_names_[i]).append("=\"");
      append_escaped(labels, entry.values[i]);
      labels.push_back('"');
    }
    expose_cell(out, name, labels, entry.cell);
  }
}

template <>
void* Family<Counter>::make_cell() const {
  return new Counter();
}
template <>
void* Family<Gauge>::make_cell() const {
  return new Gauge();
}
template <>
void* Family<Histogram>::make_cell() const {
  return new Histogram(&bounds_);
}

template <>
void Family<Counter>::expose_cell(std::string& out, std::string_view name,
                                  const std::string& labels, const void* cell) const {
  out.append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.push_back(' ');
  append_number(out, static_cast<double>(static_cast<const Counter*>(cell)->value()));
  out.push_back('\n');
}

template <>
void Family<Gauge>::expose_cell(std::string& out, std::string_view name, const std::string& labels,
                                const void* cell) const {
  out.append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.push_back(' ');
  append_number(out, static_cast<const Gauge*>(cell)->value());
  out.push_back('\n');
}

template <>
void Family<Histogram>::expose_cell(std::string& out, std::string_view name,
                                    const std::string& labels, const void* cell) const {
  const auto* h = static_cast<const Histogram*>(cell);
  std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  const auto& b = h->bounds();
  for (size_t i = 0; i <= b.size(); ++i) {
    cumulative += h->bucket(i);
    out.append(name).append("_bucket{").append(labels).append(sep).append("le=\"");
    if (i < b.size())
      append_number(out, b[i]);
    else
      out.append("+Inf");
    out.append("\"} ");
    append_number(out, static_cast<double>(cumulative));
    out.push_back('\n');
  }
  std::string lb = labels.empty() ? "" : "{" + labels + "}";
  out.append(name).append("_sum").append(lb).push_back(' ');
  append_number(out, h->sum());
  out.push_back('\n');
  out.append(name).append("_count").append(lb).push_back(' ');
  append_number(out, static_cast<double>(h->count()));
  out.push_back('\n');
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// A family registered again under the same name is the one already there (each pool's policy
// registers its own metrics: two pools share them), when its type and labels agree; anything
// else is a programming error.
template <class F>
F* Registry::existing(const std::string& name, Type type, const std::vector<std::string>& labels) {
  for (const auto& f : families_) {
    if (f->name() != name) continue;
    if (f->type() != type || f->label_names() != labels) {
      std::fprintf(stderr, "kvgate: metric %s registered twice with different shapes\n",
                   name.c_str());
      std::abort();
    }
    return static_cast<F*>(f.get());
  }
  return nullptr;
}

CounterFamily& Registry::counter(std::string name, std::string help,
                                 std::vector<std::string> labels) {
  std::lock_guard lock(mu_);
  if (auto* f = existing<CounterFamily>(name, Type::kCounter, labels)) return *f;
  auto f = std::make_unique<CounterFamily>(std::move(name), std::move(help), Type::kCounter,
                                           std::move(labels), std::vector<double>{});
  auto& ref = *f;
  families_.push_back(std::move(f));
  return ref;
}

GaugeFamily& Registry::gauge(std::string name, std::string help, std::vector<std::string> labels) {
  std::lock_guard lock(mu_);
  if (auto* f = existing<GaugeFamily>(name, Type::kGauge, labels)) return *f;
  auto f = std::make_unique<GaugeFamily>(std::move(name), std::move(help), Type::kGauge,
                                         std::move(labels), std::vector<double>{});
  auto& ref = *f;
  families_.push_back(std::move(f));
  return ref;
}

HistogramFamily& Registry::histogram(std::string name, std::string help,
                                     std::vector<std::string> labels, std::vector<double> bounds) {
  std::lock_guard lock(mu_);
  if (auto* f = existing<HistogramFamily>(name, Type::kHistogram, labels)) return *f;
  std::sort(bounds.begin(), bounds.end());
  auto f = std::make_unique<HistogramFamily>(std::move(name), std::move(help), Type::kHistogram,
                                             std::move(labels), std::move(bounds));
  auto& ref = *f;
  families_.push_back(std::move(f));
  return ref;
}

void Registry::add_collector(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  collectors_.push_back(std::move(fn));
}

void Registry::alias(const FamilyBase& family, std::string name, std::string help) {
  std::lock_guard lock(mu_);
  aliases_.push_back({&family, std::move(name), std::move(help)});
}

void Registry::remove_series(std::string_view label, std::string_view value) {
  std::lock_guard lock(mu_);
  for (const auto& f : families_) f->remove_where(label, value);
}

std::string Registry::expose() const {
  std::string out;
  out.reserve(16384);
  std::lock_guard lock(mu_);
  for (const auto& c : collectors_) c();
  for (const auto& f : families_) f->expose(out);
  for (const auto& a : aliases_) a.family->expose_as(out, a.name, a.help);
  return out;
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
          2.5,   5,      10,    30,   60,    120,  300, 600,  1800};
}

std::vector<double> short_latency_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015,
          0.02,   0.025,   0.03,   0.04,  0.05,   0.075, 0.1,    0.15, 0.2,
          0.3,    0.5,     0.75,   1,     2.5,    5,     10};
}

}  // namespace kvgate::metrics
