// discovery/etcd: base64, the worker record, etcd's JSON gateway over a blocking HTTP/1.1 client,
// and the watcher thread.
#include "discovery/etcd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "http/parser.h"
#include "util/log.h"

namespace kvgate::discovery {

using Json = nlohmann::json;

std::string prefix_range_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto last = static_cast<uint8_t>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

// ---- The worker record ----

namespace {

bool printable_no_space(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

bool host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

// "" or what is wrong with "host:port" (host a name, an IPv4 address or a bracketed IPv6 one).
std::string check_host_port(std::string_view hp, std::string_view example) {
  std::string_view host, port;
  if (!hp.empty() && hp.front() == '[') {
    size_t close = hp.find(']');
    if (close == std::string_view::npos) return "an IPv6 address without its closing ']'";
    host = hp.substr(1, close - 1);
    std::string h(host);
    in6_addr a{};
    if (::inet_pton(AF_INET6, h.c_str(), &a) != 1) return "'" + h + "' is not an IPv6 address";
    if (close + 1 >= hp.size() || hp[close + 1] != ':') {
      return "the port is missing (e.g. " + std::string(example) + ")";
    }
    port = hp.substr(close + 2);
  } else {
    size_t colon = hp.rfind(':');
    if (colon == std::string_view::npos) {
      return "the port is missing (e.g. " + std::string(example) + ")";
    }
    host = hp.substr(0, colon);
    port = hp.substr(colon + 1);
    if (host.empty()) return "the host is empty (e.g. " + std::string(example) + ")";
    if (host == "*" || host == "0.0.0.0") {
      return "'" + std::string(host) + "' is a bind address: give the address others reach (e.g. " +
             std::string(example) + ")";
    }
    if (host.size() > 253 || !std::all_of(host.begin(), host.end(), host_char)) {
      return "'" + std::string(host) + "' is not a host name or IPv4 address";
    }
  }
  uint32_t v = 0;
  bool digits = !port.empty() && port.size() <= 5 &&
                std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) {
    for (char c : port) v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  if (!digits || v == 0 || v > 65535) {
    return "the port '" + std::string(port) + "' is not a number from 1 to 65535";
  }
  return "";
}

std::string check_worker_url(std::string_view url) {
  constexpr std::string_view kExample = "http://10.0.0.5:30000";
  std::string_view rest;
  if (url.starts_with("http://")) {
    rest = url.substr(7);
  } else if (url.starts_with("https://")) {
    rest = url.substr(8);
  } else {
    return "\"url\" must be http://host:port or https://host:port, got '" +
           std::string(url.substr(0, 200)) + "'";
  }
  if (rest.find_first_of("/?#") != std::string_view::npos) {
    return "\"url\" is http(s)://host:port without a path, got '" +
           std::string(url.substr(0, 200)) + "'";
  }
  if (std::string e = check_host_port(rest, kExample); !e.empty()) return "\"url\": " + e;
  return "";
}

// Reads an int64 field that etcd's gateway writes as a string ("123") and clients may write as a
// number. Absent: `out` stays. False when present but not an integer.
bool get_i64(const Json& obj, const char* key, int64_t& out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return true;
  if (it->is_number_integer()) {
    out = it->get<int64_t>();
    return true;
  }
  if (it->is_number_unsigned()) {
    uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!it->is_string()) return false;
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return false;
  out = v;
  return true;
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

std::string worker_key(std::string_view model, std::string_view id) {
  std::string key(kWorkersPrefix);
  key.append(model).append("/").append(id);
  return key;
}

std::string check_worker_key_parts(std::string_view model, std::string_view id) {
  if (model.empty()) return "the model name is empty";
  if (model.size() > kMaxKeyPartBytes) return "the model name is longer than 256 bytes";
  if (!printable_no_space(model)) return "the model name holds a space or a control character";
  if (model.front() == '/' || model.back() == '/') return "the model name starts or ends with '/'";
  if (id.empty()) return "the id is empty";
  if (id.size() > kMaxKeyPartBytes) return "the id is longer than 256 bytes";
  if (!printable_no_space(id)) return "the id holds a space or a control character";
  if (id.find('/') != std::string_view::npos) return "the id holds a '/'";
  return "";
}

std::string split_worker_key(std::string_view key, std::string& model, std::string& id) {
  return split_record_key(key, kWorkersPrefix, model, id);
}

std::string split_record_key(std::string_view key, std::string_view root, std::string& model,
                             std::string& id) {
  if (!key.starts_with(root)) {
    return "the key is not under " + std::string(root);
  }
  std::string_view rest = key.substr(root.size());
  size_t slash = rest.rfind('/');
  if (slash == std::string_view::npos) return "the key has no <model>/<id> after the prefix";
  std::string_view m = rest.substr(0, slash), i = rest.substr(slash + 1);
  if (std::string e = check_worker_key_parts(m, i); !e.empty()) return e;
  model = std::string(m);
  id = std::string(i);
  return "";
}

std::string parse_worker_record(std::string_view value, WorkerRecord& out) {
  if (value.size() > kMaxWorkerRecordBytes) return "the record is larger than 64 KiB";
  Json j = Json::parse(value, nullptr, false);
  if (j.is_discarded()) return "the record is not valid JSON";
  if (!j.is_object()) return "the record is not a JSON object";
  std::vector<std::string> errors;
  WorkerRecord r;
  r.model = out.model;
  r.id = out.id;
  auto url = j.find("url");
  if (url == j.end()) {
    errors.emplace_back("\"url\" is required (e.g. \"url\": \"http://10.0.0.5:30000\")");
  } else if (!url->is_string()) {
    errors.emplace_back("\"url\" must be a string");
  } else if (std::string e = check_worker_url(url->get_ref<const std::string&>()); !e.empty()) {
    errors.push_back(e);
  } else {
    r.url = url->get<std::string>();
  }
  if (auto role = j.find("role"); role != j.end()) {
    if (!role->is_string() || (*role != "regular" && *role != "prefill" && *role != "decode")) {
      errors.emplace_back("\"role\" is one of \"regular\", \"prefill\", \"decode\"");
    } else {
      r.role = role->get<std::string>();
    }
  }
  struct IntField {
    const char* name;
    int64_t WorkerRecord::*field;
    int64_t max;
  };
  for (const IntField& f : {IntField{"dp_size", &WorkerRecord::dp_size, 1024},
                            IntField{"page_size", &WorkerRecord::page_size, 1 << 20},
                            IntField{"bootstrap_port", &WorkerRecord::bootstrap_port, 65535}}) {
    auto it = j.find(f.name);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > f.max) {
      errors.push_back("\"" + std::string(f.name) + "\" must be an integer from 1 to " +
                       std::to_string(f.max));
      continue;
    }
    r.*f.field = it->get<int64_t>();
  }
  if (auto kv = j.find("kv_events"); kv != j.end() && !kv->is_null()) {
    if (!kv->is_object()) {
      errors.emplace_back(
          "\"kv_events\" must be an object (e.g. {\"endpoint\": \"tcp://10.0.0.5:5557\"})");
    } else {
      r.kv_events_json = dump(*kv);
      if (auto ep = kv->find("endpoint"); ep != kv->end()) {
        const std::string* s = ep->is_string() ? &ep->get_ref<const std::string&>() : nullptr;
        if (s == nullptr || !s->starts_with("tcp://")) {
          errors.emplace_back("\"kv_events.endpoint\" must be tcp://host:port");
        } else if (std::string e =
                       check_host_port(std::string_view(*s).substr(6), "tcp://10.0.0.5:5557");
                   !e.empty()) {
          errors.push_back("\"kv_events.endpoint\": " + e);
        } else {
          r.kv_events_endpoint = *s;
        }
      }
    }
  }
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
    return all;
  }
  out = std::move(r);
  return "";
}

std::string serialize_worker_record(const WorkerRecord& record) {
  Json j = Json::object();
  j["url"] = record.url;
  j["role"] = record.role;
  if (record.dp_size > 0) j["dp_size"] = record.dp_size;
  if (record.page_size > 0) j["page_size"] = record.page_size;
  if (record.bootstrap_port > 0) j["bootstrap_port"] = record.bootstrap_port;
  if (!record.kv_events_json.empty()) {
    Json kv = Json::parse(record.kv_events_json, nullptr, false);
    if (kv.is_object()) j["kv_events"] = std::move(kv);
  }
  if (!record.kv_events_endpoint.empty()) {
    if (!j.contains("kv_events")) j["kv_events"] = Json::object();
    j["kv_events"]["endpoint"] = record.kv_events_endpoint;
  }
  return dump(j);
}

// ---- etcd messages ----

namespace {

// `{"error": "msg", "message": "msg", "code": N}` (a unary call) or `{"error": {"message": ...}}`
// (a stream): etcd's message, or "".
std::string etcd_error_message(const Json& j) {
  if (!j.is_object()) return "";
  for (const char* k : {"message", "error"}) {
    auto it = j.find(k);
    if (it == j.end()) continue;
    if (it->is_string()) return it->get<std::string>().substr(0, 500);
    if (it->is_object()) {
      if (std::string m = etcd_error_message(*it); !m.empty()) return m;
    }
  }
  return "";
}

std::string parse_kv(const Json& j, EtcdKeyValue& out) {
  if (!j.is_object()) return "a kv is not an object";
  for (auto [name, field] :
       {std::pair{"key", &EtcdKeyValue::key}, std::pair{"value", &EtcdKeyValue::value}}) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string() || !base64_decode(it->get_ref<const std::string&>(), out.*field)) {
      return std::string("a kv's ") + name + " is not base64";
    }
  }
  if (!get_i64(j, "create_revision", out.create_revision) ||
      !get_i64(j, "mod_revision", out.mod_revision) || !get_i64(j, "version", out.version) ||
      !get_i64(j, "lease", out.lease)) {
    return "a kv's revision, version or lease is not an integer";
  }
  return "";
}

bool header_revision(const Json& j, int64_t& out) {
  auto h = j.find("header");
  if (h == j.end() || h->is_null()) return true;
  return h->is_object() && get_i64(*h, "revision", out);
}

}  // namespace

std::string parse_watch_line(std::string_view line, EtcdWatchMessage& out) {
  out = EtcdWatchMessage{};
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return "a watch message is not a JSON object";
  auto result = j.find("result");
  if (result == j.end()) {
    std::string m = etcd_error_message(j);
    return m.empty() ? "a watch message has no \"result\"" : "etcd: " + m;
  }
  const Json& r = *result;
  if (!r.is_object()) return "a watch message's result is not an object";
  if (!header_revision(r, out.revision)) return "a watch message's revision is not an integer";
  auto flag = [&](const char* k) {
    auto it = r.find(k);
    return it != r.end() && it->is_boolean() && it->get<bool>();
  };
  out.created = flag("created");
  out.canceled = flag("canceled");
  if (!get_i64(r, "compact_revision", out.compact_revision)) {
    return "a watch message's compact_revision is not an integer";
  }
  if (auto it = r.find("cancel_reason"); it != r.end() && it->is_string()) {
    out.cancel_reason = it->get<std::string>().substr(0, 500);
  }
  auto events = r.find("events");
  if (events == r.end() || events->is_null()) return "";
  if (!events->is_array()) return "a watch message's events are not a list";
  out.events.reserve(std::min(events->size(), kMaxWatchEvents));
  for (const Json& e : *events) {
    if (out.events.size() >= kMaxWatchEvents) break;
    if (!e.is_object()) return "a watch event is not an object";
    EtcdWatchEvent ev;
    // The gateway leaves out fields at their zero value: an event without "type" is a PUT.
    if (auto t = e.find("type"); t != e.end() && !t->is_null()) {
      if (*t == "DELETE") {
        ev.type = EtcdWatchEvent::Type::kDelete;
      } else if (*t != "PUT") {
        return "a watch event's type is neither PUT nor DELETE";
      }
    }
    auto kv = e.find("kv");
    if (kv == e.end()) return "a watch event has no kv";
    if (std::string err = parse_kv(*kv, ev.kv); !err.empty()) return err;
    out.events.push_back(std::move(ev));
  }
  return "";
}

// ---- The client ----

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxHeadBytes = size_t{64} * 1024;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Waits until `fd` has `events`, the deadline passes, or `cancel_fd` turns readable. "" or why not.
std::string wait_fd(int fd, short events, int cancel_fd,
                    std::optional<Clock::time_point> deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
      if (left.count() <= 0) return "timed out";
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count() + 1, INT32_MAX));
    }
    pollfd p[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    int n = ::poll(p, cancel_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::string("poll: ") + std::strerror(errno);
    }
    if (cancel_fd >= 0 && (p[1].revents & POLLIN) != 0) return "interrupted";
    if (p[0].revents != 0) return "";
  }
}

}  // namespace

struct EtcdClient::Conn {
  Fd fd;
};

EtcdClient::EtcdClient(std::string_view url) : EtcdClient(url, Options{}) {}

EtcdClient::EtcdClient(std::string_view url, Options options) : options_(options) {
  cancel_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::string_view rest;
  while (!url.empty() && url.back() == '/') url.remove_suffix(1);
  if (url.starts_with("https://")) {
    url_error_ = "etcd over https:// is not supported yet: give its http:// client URL (" +
                 std::string(url) + ")";
    return;
  }
  if (!url.starts_with("http://")) {
    url_error_ = "the etcd URL must be http://host:port (e.g. http://127.0.0.1:2379), got '" +
                 std::string(url) + "'";
    return;
  }
  rest = url.substr(7);
  if (rest.find_first_of("/?#") != std::string_view::npos) {
    url_error_ = "the etcd URL is http://host:port without a path, got '" + std::string(url) + "'";
    return;
  }
  if (std::string e = check_host_port(rest, "http://127.0.0.1:2379"); !e.empty()) {
    url_error_ = "etcd URL '" + std::string(url) + "': " + e;
    return;
  }
  size_t colon = rest.rfind(':');
  host_ = std::string(rest.substr(0, colon));
  if (host_.size() >= 2 && host_.front() == '[') host_ = host_.substr(1, host_.size() - 2);
  port_ = static_cast<uint16_t>(std::stoi(std::string(rest.substr(colon + 1))));
  host_header_ = std::string(rest);
  if (cancel_fd_ < 0) url_error_ = std::string("eventfd: ") + std::strerror(errno);
}

EtcdClient::~EtcdClient() {
  if (cancel_fd_ >= 0) ::close(cancel_fd_);
}

void EtcdClient::interrupt() {
  uint64_t one = 1;
  if (cancel_fd_ >= 0) {
    [[maybe_unused]] ssize_t n = ::write(cancel_fd_, &one, sizeof one);
  }
}

std::string EtcdClient::post(std::string_view path, const std::string& body, int& status,
                             const Sink& sink, bool deadline_body) {
  status = 0;
  if (!url_error_.empty()) return url_error_;
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  // Connect: each address of the host in turn.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string port = std::to_string(port_);
  if (int rc = ::getaddrinfo(host_.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return "cannot resolve " + host_ + ": " + ::gai_strerror(rc);
  }
  Conn conn;
  std::string connect_error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    conn.fd.reset(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (conn.fd.get() < 0) {
      connect_error = std::strerror(errno);
      continue;
    }
    if (::connect(conn.fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) {
      connect_error.clear();
      break;
    }
    if (errno != EINPROGRESS) {
      connect_error = std::strerror(errno);
      continue;
    }
    connect_error = wait_fd(conn.fd.get(), POLLOUT, cancel_fd_, deadline);
    if (connect_error.empty()) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(conn.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) break;
      connect_error = std::strerror(err);
    }
    if (connect_error == "interrupted") break;
  }
  ::freeaddrinfo(found);
  if (!connect_error.empty()) {
    if (connect_error == "interrupted") return connect_error;
    return "cannot connect to etcd at " + host_header_ + ": " + connect_error;
  }
  int one = 1;
  ::setsockopt(conn.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A watch waits for events without a deadline: keepalive probes notice a peer that vanished
  // (a host gone, a partition) within about 20 s.
  int idle = 10, interval = 5, count = 2;
  ::setsockopt(conn.fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(conn.fd.get(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(conn.fd.get(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(conn.fd.get(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);

  std::string request = "POST ";
  request.append(path)
      .append(" HTTP/1.1\r\nHost: ")
      .append(host_header_)
      .append("\r\nContent-Type: application/json\r\nContent-Length: ")
      .append(std::to_string(body.size()))
      .append("\r\nConnection: close\r\n\r\n")
      .append(body);
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(conn.fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (std::string e = wait_fd(conn.fd.get(), POLLOUT, cancel_fd_, deadline); !e.empty()) {
        return e == "interrupted" ? e : "sending to etcd: " + e;
      }
      continue;
    }
    return std::string("sending to etcd: ") + std::strerror(errno);
  }

  // Reads more bytes into `buf`; "" (0 bytes read: the peer closed), or an error.
  std::string buf;
  bool eof = false;
  auto read_more = [&](std::optional<Clock::time_point> until) -> std::string {
    char chunk[16384];
    for (;;) {
      ssize_t n = ::recv(conn.fd.get(), chunk, sizeof chunk, 0);
      if (n > 0) {
        buf.append(chunk, static_cast<size_t>(n));
        return "";
      }
      if (n == 0) {
        eof = true;
        return "";
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return std::string("reading from etcd: ") + std::strerror(errno);
      }
      if (std::string e = wait_fd(conn.fd.get(), POLLIN, cancel_fd_, until); !e.empty()) {
        return e == "interrupted" ? e : "reading from etcd: " + e;
      }
    }
  };

  http::HeadParser head(http::HeadParser::Kind::kResponse);
  for (;;) {
    http::ParseStatus st = head.parse(buf.data(), buf.size(), kMaxHeadBytes);
    if (st == http::ParseStatus::kError) {
      return "etcd's answer is not valid HTTP: " + std::string(http::describe(head.error()));
    }
    if (st == http::ParseStatus::kDone) {
      if (head.status() >= 100 && head.status() < 200) {  // interim: the real answer follows
        buf.erase(0, head.head_size());
        head.reset();
        continue;
      }
      break;
    }
    if (eof) return "etcd closed the connection before answering";
    if (std::string e = read_more(deadline); !e.empty()) return e;
  }
  status = head.status();
  http::BodyFraming framing = head.framing(false);
  std::optional<uint64_t> length = head.content_length();
  buf.erase(0, head.head_size());
  std::optional<Clock::time_point> body_deadline;
  if (deadline_body) body_deadline = deadline;

  switch (framing) {
    case http::BodyFraming::kNone:
      return "";
    case http::BodyFraming::kLength: {
      uint64_t left = length.value_or(0);
      for (;;) {
        size_t take = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
        if (take > 0) {
          if (!sink(std::string_view(buf.data(), take))) return "";
          left -= take;
          buf.erase(0, take);
        }
        if (left == 0) return "";
        if (eof) return "etcd closed the connection in the middle of its answer";
        if (std::string e = read_more(body_deadline); !e.empty()) return e;
      }
    }
    case http::BodyFraming::kUntilClose:
      for (;;) {
        if (!buf.empty()) {
          if (!sink(buf)) return "";
          buf.clear();
        }
        if (eof) return "";
        if (std::string e = read_more(body_deadline); !e.empty()) return e;
      }
    case http::BodyFraming::kChunked: {
      http::ChunkedDecoder decoder;
      size_t off = 0;
      for (;;) {
        size_t used = 0;
        std::string_view data;
        http::ParseStatus st =
            decoder.decode(buf.data() + off, buf.size() - off, SIZE_MAX, used, data);
        if (!data.empty() && !sink(data)) return "";
        off += used;
        if (st == http::ParseStatus::kDone) return "";
        if (st == http::ParseStatus::kError) {
          return "etcd's chunked answer is malformed: " +
                 std::string(http::describe(decoder.error()));
        }
        if (used == 0) {
          buf.erase(0, off);
          off = 0;
          if (eof) return "the stream ended";
          if (std::string e = read_more(body_deadline); !e.empty()) return e;
        }
      }
    }
  }
  return "";
}

std::string EtcdClient::call(std::string_view what, std::string_view path, const std::string& body,
                             std::string& answer) {
  answer.clear();
  bool too_large = false;
  int status = 0;
  std::string err = post(
      path, body, status,
      [&](std::string_view piece) {
        if (answer.size() + piece.size() > options_.max_response_bytes) {
          too_large = true;
          return false;
        }
        answer.append(piece);
        return true;
      },
      true);
  std::string prefix = "etcd " + std::string(what) + ": ";
  if (err == "interrupted") return err;
  if (!err.empty()) return prefix + err;
  if (too_large)
    return prefix + "the answer is larger than " + std::to_string(options_.max_response_bytes) +
           " bytes";
  if (status != 200) {
    Json j = Json::parse(answer, nullptr, false);
    std::string m = etcd_error_message(j);
    return prefix + "HTTP " + std::to_string(status) + (m.empty() ? "" : ": " + m);
  }
  return "";
}

namespace {

// Parses a unary answer's JSON (or a stream's first line, unwrapping its "result"). "" or error.
std::string parse_answer(std::string_view what, const std::string& answer, Json& out,
                         bool stream = false) {
  std::string_view text = answer;
  if (stream) text = text.substr(0, text.find('\n'));
  out = Json::parse(text, nullptr, false);
  if (out.is_discarded() || !out.is_object()) {
    return "etcd " + std::string(what) + ": the answer is not a JSON object";
  }
  if (stream) {
    auto r = out.find("result");
    if (r == out.end() || !r->is_object()) {
      std::string m = etcd_error_message(out);
      return "etcd " + std::string(what) + ": " + (m.empty() ? "no result in the answer" : m);
    }
    Json inner = *r;
    out = std::move(inner);
  }
  return "";
}

}  // namespace

std::string EtcdClient::range(std::string_view prefix, EtcdRange& out) {
  out = EtcdRange{};
  Json req = {{"key", base64_encode(prefix)},
              {"range_end", base64_encode(prefix_range_end(prefix))}};
  std::string answer;
  if (std::string e = call("range", "/v3/kv/range", req.dump(), answer); !e.empty()) return e;
  Json j;
  if (std::string e = parse_answer("range", answer, j); !e.empty()) return e;
  if (!header_revision(j, out.revision)) return "etcd range: the revision is not an integer";
  if (auto more = j.find("more"); more != j.end() && more->is_boolean())
    out.more = more->get<bool>();
  auto kvs = j.find("kvs");
  if (kvs == j.end() || kvs->is_null()) return "";
  if (!kvs->is_array()) return "etcd range: \"kvs\" is not a list";
  out.kvs.reserve(kvs->size());
  for (const Json& kv : *kvs) {
    EtcdKeyValue item;
    if (std::string e = parse_kv(kv, item); !e.empty()) return "etcd range: " + e;
    out.kvs.push_back(std::move(item));
  }
  return "";
}

std::string EtcdClient::put(std::string_view key, std::string_view value, int64_t lease) {
  Json req = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  std::string answer;
  return call("put", "/v3/kv/put", req.dump(), answer);
}

std::string EtcdClient::delete_key(std::string_view key) {
  Json req = {{"key", base64_encode(key)}};
  std::string answer;
  return call("delete", "/v3/kv/deleterange", req.dump(), answer);
}

std::string EtcdClient::lease_grant(int64_t ttl_secs, int64_t& id) {
  id = 0;
  Json req = {{"TTL", std::to_string(ttl_secs)}};
  std::string answer;
  if (std::string e = call("lease grant", "/v3/lease/grant", req.dump(), answer); !e.empty()) {
    return e;
  }
  Json j;
  if (std::string e = parse_answer("lease grant", answer, j); !e.empty()) return e;
  if (auto err = j.find("error");
      err != j.end() && err->is_string() && !err->get_ref<const std::string&>().empty()) {
    return "etcd lease grant: " + err->get<std::string>();
  }
  if (!get_i64(j, "ID", id) || id == 0) return "etcd lease grant: no lease ID in the answer";
  return "";
}

std::string EtcdClient::lease_keepalive(int64_t id, int64_t& ttl_left) {
  ttl_left = 0;
  Json req = {{"ID", std::to_string(id)}};
  std::string answer;
  if (std::string e = call("lease keepalive", "/v3/lease/keepalive", req.dump(), answer);
      !e.empty()) {
    return e;
  }
  Json j;
  if (std::string e = parse_answer("lease keepalive", answer, j, true); !e.empty()) return e;
  // A lease etcd does not know is answered with no TTL (the gateway leaves out zeros).
  if (!get_i64(j, "TTL", ttl_left)) return "etcd lease keepalive: the TTL is not an integer";
  if (ttl_left < 0) ttl_left = 0;
  return "";
}

std::string EtcdClient::lease_revoke(int64_t id) {
  Json req = {{"ID", std::to_string(id)}};
  std::string answer;
  return call("lease revoke", "/v3/lease/revoke", req.dump(), answer);
}

std::string EtcdClient::watch(std::string_view prefix, int64_t start_revision,
                              const std::function<bool(const EtcdWatchMessage&)>& on_message) {
  Json create = {{"key", base64_encode(prefix)},
                 {"range_end", base64_encode(prefix_range_end(prefix))}};
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  Json req = {{"create_request", create}};
  std::string line;
  std::string error;
  bool stopped = false;
  int status = 0;
  std::string body_if_error;
  std::string err = post(
      "/v3/watch", req.dump(), status,
      [&](std::string_view piece) {
        if (status != 200) {  // an error answer: keep its start for the message
          body_if_error.append(
              piece.substr(0, 4096 - std::min<size_t>(4096, body_if_error.size())));
          return body_if_error.size() < 4096;
        }
        while (!piece.empty()) {
          size_t nl = piece.find('\n');
          std::string_view part = piece.substr(0, nl);
          if (line.size() + part.size() > options_.max_response_bytes) {
            error = "etcd watch: a message is larger than " +
                    std::to_string(options_.max_response_bytes) + " bytes";
            return false;
          }
          line.append(part);
          if (nl == std::string_view::npos) break;
          piece.remove_prefix(nl + 1);
          if (line.find_first_not_of(" \t\r") == std::string::npos) {
            line.clear();
            continue;
          }
          EtcdWatchMessage m;
          if (std::string e = parse_watch_line(line, m); !e.empty()) {
            error = "etcd watch: " + e;
            return false;
          }
          line.clear();
          if (!on_message(m)) {
            stopped = true;
            return false;
          }
        }
        return true;
      },
      false);
  if (err == "interrupted") return err;
  if (!err.empty()) return "etcd watch: " + err;
  if (!error.empty()) return error;
  if (status != 200) {
    Json j = Json::parse(body_if_error, nullptr, false);
    std::string m = etcd_error_message(j);
    return "etcd watch: HTTP " + std::to_string(status) + (m.empty() ? "" : ": " + m);
  }
  if (stopped) return "";
  return "etcd watch: the watch stream ended";
}

// ---- The watcher ----

EtcdWatcher::EtcdWatcher(std::string etcd_url, std::string prefix, Options options,
                         OnChange on_change)
    : url_(std::move(etcd_url)),
      prefix_(std::move(prefix)),
      options_(std::move(options)),
      on_change_(std::move(on_change)),
      client_(url_, options_.client) {}

EtcdWatcher::~EtcdWatcher() {
  stop();
}

std::string EtcdWatcher::start() {
  if (!client_.url_error().empty()) return client_.url_error();
  if (!prefix_.starts_with(options_.root)) {
    return "the etcd prefix must be under " + options_.root + " (e.g. " + options_.root +
           "llama/), got '" + prefix_ + "'";
  }
  std::lock_guard lock(mu_);
  if (thread_.joinable() || stopping_) return "";
  thread_ = std::thread([this] { run(); });
  return "";
}

void EtcdWatcher::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  client_.interrupt();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void EtcdWatcher::wait(std::chrono::milliseconds d) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, d, [this] { return stopping_; });
}

bool EtcdWatcher::apply(const EtcdKeyValue& kv, bool deleted) {
  static log::RateLimit invalid_limit(5, std::chrono::seconds(60));
  auto it = workers_.find(kv.key);
  if (deleted) {
    if (it == workers_.end()) return false;
    workers_.erase(it);
    return true;
  }
  WorkerRecord r;
  std::string err = split_record_key(kv.key, options_.root, r.model, r.id);
  if (err.empty()) err = parse_worker_record(kv.value, r);
  if (!err.empty()) {
    stats_.invalid_records.fetch_add(1, std::memory_order_relaxed);
    if (auto l = log::warn(invalid_limit, "etcd discovery: ignoring a malformed worker record")) {
      l.kv("key", kv.key.substr(0, 300)).kv("error", err);
    }
    // A key whose new value is malformed is no longer a worker kvgate can use.
    if (it == workers_.end()) return false;
    workers_.erase(it);
    return true;
  }
  if (it == workers_.end()) {
    if (workers_.size() >= options_.max_workers) {
      stats_.invalid_records.fetch_add(1, std::memory_order_relaxed);
      if (auto l = log::warn(invalid_limit, "etcd discovery: too many workers, ignoring one")) {
        l.kv("key", kv.key.substr(0, 300)).kv("max_workers", options_.max_workers);
      }
      return false;
    }
    workers_.emplace(kv.key, std::move(r));
    return true;
  }
  if (it->second == r) return false;
  it->second = std::move(r);
  return true;
}

void EtcdWatcher::report() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;  // stopped: what it found goes nowhere (the owner may be gone)
  }
  std::vector<WorkerRecord> now;
  now.reserve(workers_.size());
  for (const auto& [key, r] : workers_) now.push_back(r);
  if (reported_once_ && now == reported_) return;
  reported_ = now;
  reported_once_ = true;
  stats_.changes.fetch_add(1, std::memory_order_relaxed);
  log::info("etcd discovery: workers changed").kv("count", now.size()).kv("prefix", prefix_);
  try {
    on_change_(std::move(now));
  } catch (...) {
    log::error("etcd discovery: on_change threw");
  }
}

void EtcdWatcher::run() {
  // An exception (memory, a bug) must not end discovery for good: logged, and after a pause the
  // loop starts again from a full read.
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;
    }
    if (run_loop()) return;
    wait(options_.max_backoff);
  }
}

bool EtcdWatcher::run_loop() {
  static log::RateLimit error_limit(5, std::chrono::seconds(60));
  auto stopping = [this] {
    std::lock_guard lock(mu_);
    return stopping_;
  };
  auto backoff = options_.min_backoff;
  auto failed = [&](const std::string& err) {
    stats_.errors.fetch_add(1, std::memory_order_relaxed);
    if (auto l = log::warn(error_limit, "etcd discovery failed, keeping the last workers")) {
      l.kv("error", err).kv("retry_ms", backoff.count());
    }
    wait(backoff);
    backoff = std::min(backoff * 2, std::max(options_.max_backoff, options_.min_backoff));
  };
  try {
    while (!stopping()) {
      EtcdRange range;
      std::string err = client_.range(prefix_, range);
      if (stopping()) break;
      if (!err.empty()) {
        failed(err);
        continue;
      }
      stats_.ranges.fetch_add(1, std::memory_order_relaxed);
      workers_.clear();
      for (const auto& kv : range.kvs) apply(kv, false);
      if (range.more) log::warn("etcd discovery: etcd returned part of the prefix only");
      report();

      auto started = Clock::now();
      bool compacted = false;
      std::string cancel;
      err = client_.watch(prefix_, range.revision + 1, [&](const EtcdWatchMessage& m) {
        if (m.canceled) {
          compacted = m.compact_revision > 0;
          cancel = m.cancel_reason.empty() ? "the watch was canceled" : m.cancel_reason;
          return false;
        }
        bool changed = false;
        for (const auto& e : m.events) {
          stats_.events.fetch_add(1, std::memory_order_relaxed);
          changed = apply(e.kv, e.type == EtcdWatchEvent::Type::kDelete) || changed;
        }
        if (changed) report();
        return true;
      });
      if (stopping()) break;
      stats_.watch_restarts.fetch_add(1, std::memory_order_relaxed);
      if (compacted) {
        // The revision after our range was compacted away: a fresh range sees what changed.
        log::info("etcd discovery: watch revision compacted, reading the prefix again");
        continue;
      }
      // A stream that lived a while ended normally (etcd restarted, a proxy's timeout): read the
      // prefix again at once. One that ended quickly backs off, so a failing etcd is not spun on.
      if (Clock::now() - started >= std::chrono::seconds(1)) backoff = options_.min_backoff;
      failed(err.empty() ? cancel : err);
    }
  } catch (const std::exception& e) {
    log::error("etcd discovery failed; starting again").kv("error", e.what());
    return false;
  }
  return true;
}

}  // namespace kvgate::discovery
