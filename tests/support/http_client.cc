// tests/support/http_client: see http_client.h.
#include "support/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace kvgate::testing {

std::string Response::header(const std::string& name) const {
  std::string low = name;
  std::transform(low.begin(), low.end(), low.begin(), ::tolower);
  auto it = headers.find(low);
  return it == headers.end() ? "" : it->second;
}

HttpClient::HttpClient(int port, std::string host) : port_(port), host_(std::move(host)) {}
HttpClient::~HttpClient() {
  close();
}

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
}

bool HttpClient::ensure_connected() {
  if (fd_ >= 0) return true;
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  ::inet_pton(AF_INET, host_.c_str(), &a.sin_addr);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close();
    return false;
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return true;
}

bool HttpClient::send_all(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool HttpClient::fill() {
  pollfd p{fd_, POLLIN, 0};
  int r = ::poll(&p, 1, static_cast<int>(timeout_.count()));
  if (r <= 0) return false;
  char tmp[16384];
  ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
  if (n <= 0) return false;
  buf_.append(tmp, static_cast<size_t>(n));
  return true;
}

bool HttpClient::read_line(std::string& line) {
  for (;;) {
    auto pos = buf_.find("\r\n");
    if (pos != std::string::npos) {
      line = buf_.substr(0, pos);
      buf_.erase(0, pos + 2);
      return true;
    }
    if (!fill()) return false;
  }
}

Response HttpClient::read_response(const std::function<bool(std::string_view)>* on_data,
                                   bool head) {
  Response r;
  std::string line;
  do {  // skip 1xx interim responses
    if (!read_line(line) || line.size() < 12) {
      close();
      return r;
    }
    r.status = std::atoi(line.c_str() + 9);
    r.headers.clear();
    while (read_line(line) && !line.empty()) {
      auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      r.headers[name] = value;
    }
  } while (r.status >= 100 && r.status < 200);
  r.closed = r.header("connection") == "close";
  auto deliver = [&](std::string_view piece) -> bool {
    if (on_data && !(*on_data)(piece)) return false;
    r.body.append(piece);
    return true;
  };
  if (head || r.status == 204 || r.status == 304) return r;
  if (r.header("transfer-encoding").find("chunked") != std::string::npos) {
    for (;;) {
      if (!read_line(line)) {
        r.truncated = true;
        close();
        return r;
      }
      size_t size = std::strtoul(line.c_str(), nullptr, 16);
      if (size == 0) {
        while (read_line(line) && !line.empty()) {
        }
        break;
      }
      while (buf_.size() < size + 2) {
        if (!fill()) {
          r.truncated = true;
          deliver(buf_);
          close();
          return r;
        }
      }
      if (!deliver(std::string_view(buf_).substr(0, size))) {
        close();
        return r;
      }
      buf_.erase(0, size + 2);
    }
  } else if (!r.header("content-length").empty()) {
    size_t len = std::strtoull(r.header("content-length").c_str(), nullptr, 10);
    size_t got = 0;
    while (got < len) {
      if (buf_.empty() && !fill()) {
        r.truncated = true;
        close();
        return r;
      }
      size_t take = std::min(len - got, buf_.size());
      if (!deliver(std::string_view(buf_).substr(0, take))) {
        close();
        return r;
      }
      buf_.erase(0, take);
      got += take;
    }
  } else {
    while (fill()) {
      if (!deliver(buf_)) break;
      buf_.clear();
    }
    r.closed = true;
  }
  if (r.closed) close();
  return r;
}

Response HttpClient::request(const std::string& method, const std::string& path,
                             const std::string& body, const Headers& headers) {
  return stream(method, path, body, headers, nullptr);
}

Response HttpClient::stream(const std::string& method, const std::string& path,
                            const std::string& body, const Headers& headers,
                            const std::function<bool(std::string_view)>& on_data) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool reused = fd_ >= 0;
    if (!ensure_connected()) return Response{};
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host_ + "\r\n";
    bool has_type = false;
    for (const auto& [k, v] : headers) {
      req += k + ": " + v + "\r\n";
      if (strcasecmp(k.c_str(), "content-type") == 0) has_type = true;
    }
    if (!body.empty() || method == "POST") {
      if (!has_type) req += "Content-Type: application/json\r\n";
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n";
    req += body;
    if (!send_all(req)) {
      close();
      if (reused) continue;
      return Response{};
    }
    Response r = read_response(on_data ? &on_data : nullptr, method == "HEAD");
    if (r.status == 0 && reused) continue;  // stale keep-alive connection
    return r;
  }
  return Response{};
}

Response HttpClient::get(const std::string& path, const Headers& headers) {
  return request("GET", path, "", headers);
}

Response HttpClient::post(const std::string& path, const std::string& body,
                          const Headers& headers) {
  return request("POST", path, body, headers);
}

std::string HttpClient::raw(std::string_view bytes, std::chrono::milliseconds wait) {
  if (!ensure_connected()) return "";
  send_all(bytes);
  auto saved = timeout_;
  timeout_ = wait;
  std::string out = buf_;
  buf_.clear();
  while (fill()) {
    out += buf_;
    buf_.clear();
  }
  timeout_ = saved;
  close();
  return out;
}

std::vector<std::string> sse_data(std::string_view body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string_view::npos) end = body.size();
    std::string_view line = body.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with("data:")) {
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      out.emplace_back(line);
    }
    pos = end + 1;
  }
  return out;
}

}  // namespace kvgate::testing
