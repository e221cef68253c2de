// discovery/source: see source.h.
#include "discovery/source.h"

#include <charconv>

#include "discovery/dns.h"
#include "discovery/etcd.h"

namespace kvgate::discovery {
namespace {

constexpr std::string_view kEtcdExample = "etcd://127.0.0.1:2379 or etcd://etcd.local:2379/llama";

std::string parse_etcd(std::string_view uri, Spec& out) {
  std::string_view rest = uri.substr(std::string_view("etcd://").size());
  const size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  std::string_view model = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  while (!model.empty() && model.back() == '/') model.remove_suffix(1);
  const size_t colon = hostport.rfind(':');
  if (hostport.empty() || colon == std::string_view::npos || colon == 0 ||
      colon + 1 == hostport.size()) {
    return "'" + std::string(uri) + "' needs HOST:PORT of etcd's client URL (e.g. " +
           std::string(kEtcdExample) + ")";
  }
  int port = 0;
  std::string_view p = hostport.substr(colon + 1);
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  if (ec != std::errc() || end != p.data() + p.size() || port < 1 || port > 65535) {
    return "'" + std::string(p) + "' is not a port (1-65535) in '" + std::string(uri) + "' (e.g. " +
           std::string(kEtcdExample) + ")";
  }
  if (!model.empty()) {
    if (std::string e = check_worker_key_parts(model, "x"); !e.empty()) {
      return "the model in '" + std::string(uri) + "': " + e;
    }
  }
  out.kind = Spec::Kind::kEtcd;
  out.uri = std::string(uri);
  out.etcd_url = "http://" + std::string(hostport);
  out.etcd_prefix = std::string(kWorkersPrefix) + (model.empty() ? "" : std::string(model) + "/");
  return "";
}

class DnsSource final : public Source {
 public:
  DnsSource(const DnsTarget& target, Options options, OnChange on_change)
      : watcher_(target,
                 DnsWatcher::Options{.min_interval = options.dns_min_interval,
                                     .max_interval = options.dns_max_interval},
                 [cb = std::move(on_change)](std::vector<std::string> urls) {
                   std::vector<FoundEndpoint> found;
                   found.reserve(urls.size());
                   for (auto& u : urls) found.push_back(FoundEndpoint{.url = std::move(u)});
                   cb(std::move(found));
                 }) {
    watcher_.start();
  }
  ~DnsSource() override { watcher_.stop(); }
  Stats stats() const override {
    const auto& s = watcher_.stats();
    return {s.resolutions.load(), s.errors.load(), s.changes.load()};
  }
  void stop() override { watcher_.stop(); }

 private:
  DnsWatcher watcher_;
};

class EtcdSource final : public Source {
 public:
  EtcdSource(const Spec& spec, OnChange on_change)
      : watcher_(spec.etcd_url, spec.etcd_prefix, EtcdWatcher::Options{},
                 [cb = std::move(on_change)](std::vector<WorkerRecord> records) {
                   std::vector<FoundEndpoint> found;
                   found.reserve(records.size());
                   for (auto& r : records) {
                     FoundEndpoint e{.url = std::move(r.url)};
                     if (r.role == "prefill") e.role = FoundEndpoint::Role::kPrefill;
                     if (r.role == "decode") e.role = FoundEndpoint::Role::kDecode;
                     if (r.bootstrap_port > 0) e.bootstrap_port = r.bootstrap_port;
                     found.push_back(std::move(e));
                   }
                   cb(std::move(found));
                 }) {}
  std::string begin() { return watcher_.start(); }
  ~EtcdSource() override { watcher_.stop(); }
  Stats stats() const override {
    const auto& s = watcher_.stats();
    return {s.ranges.load() + s.events.load(), s.errors.load(), s.changes.load()};
  }
  void stop() override { watcher_.stop(); }

 private:
  EtcdWatcher watcher_;
};

}  // namespace

std::string parse_spec(std::string_view uri, Spec& out) {
  if (uri.starts_with("dns://")) {
    DnsTarget t;
    if (std::string e = parse_dns_uri(uri, t); !e.empty()) return e;
    out.kind = Spec::Kind::kDns;
    out.uri = std::string(uri);
    return "";
  }
  if (uri.starts_with("etcd://")) return parse_etcd(uri, out);
  return "'" + std::string(uri) +
         "' is not a discovery URI: use dns://NAME:PORT (A/AAAA records), "
         "dns://_service._tcp.NAME (SRV records) or etcd://HOST:PORT[/MODEL] (e.g. "
         "dns://workers.default.svc.cluster.local:8000)";
}

std::unique_ptr<Source> Source::start(const Spec& spec, Options options, OnChange on_change,
                                      std::string& error) {
  if (spec.kind == Spec::Kind::kDns) {
    DnsTarget t;
    if (error = parse_dns_uri(spec.uri, t); !error.empty()) return nullptr;
    return std::make_unique<DnsSource>(t, options, std::move(on_change));
  }
  auto s = std::make_unique<EtcdSource>(spec, std::move(on_change));
  if (error = s->begin(); !error.empty()) return nullptr;
  return s;
}

}  // namespace kvgate::discovery
