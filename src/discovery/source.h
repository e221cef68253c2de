// discovery/source: a rule's `discovery` URI (or --discovery) as one watcher of either kind, and
// what it finds as endpoints of the rule:
//
//   dns://NAME:PORT[?server=IP[:PORT]][&scheme=https]    A/AAAA records (discovery/dns.h)
//   dns://_service._proto.NAME[?...]                      SRV records
//   etcd://HOST:PORT[/MODEL]                              etcd's v3 JSON gateway at
//                                                         http://HOST:PORT: the workers registered
//                                                         under /kvgate/v1/workers/[MODEL/]
//                                                         (discovery/etcd.h, `kvgate register`)
//
// A Source runs its watcher's thread and calls `on_change` with the whole set each time it
// changes (from that thread). DNS endpoints have no role; etcd records carry theirs (regular,
// prefill, decode) and a prefill server's bootstrap port.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::discovery {

struct Spec {
  enum class Kind : uint8_t { kDns, kEtcd };
  Kind kind = Kind::kDns;
  std::string uri;
  std::string etcd_url;     // kEtcd: http://HOST:PORT
  std::string etcd_prefix;  // kEtcd: /kvgate/v1/workers/[MODEL/]
};

// Parses a discovery URI; returns "" or what is wrong with it, with a valid example.
std::string parse_spec(std::string_view uri, Spec& out);

struct FoundEndpoint {
  std::string url;
  enum class Role : uint8_t { kNone, kPrefill, kDecode } role = Role::kNone;
  std::optional<int64_t> bootstrap_port;
  bool operator==(const FoundEndpoint&) const = default;
};

class Source {
 public:
  // Built by discovery_options() (gateway/knobs.h) from the knob table.
  struct Options {
    std::chrono::milliseconds dns_min_interval{0};
    std::chrono::milliseconds dns_max_interval{0};
    bool operator==(const Options&) const = default;
  };
  struct Stats {
    uint64_t lookups = 0;  // resolutions (DNS) or reads and watch events (etcd)
    uint64_t errors = 0;
    uint64_t changes = 0;
  };
  using OnChange = std::function<void(std::vector<FoundEndpoint>)>;
  // Starts watching at once; "" or why it cannot (a bad URI was refused before).
  static std::unique_ptr<Source> start(const Spec& spec, Options options, OnChange on_change,
                                       std::string& error);
  virtual ~Source() = default;
  virtual Stats stats() const = 0;
  virtual void stop() = 0;
};

}  // namespace kvgate::discovery
