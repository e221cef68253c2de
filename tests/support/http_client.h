// tests/support/http_client: a small blocking HTTP/1.1 client for tests (one keep-alive
// connection, Content-Length or chunked bodies, streaming callbacks, raw bytes). Not Beast, on
// purpose: the tests check kvgate's HTTP with an independent implementation.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::testing {

struct Response {
  int status = 0;                              // 0: no response (connection failed or closed)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  bool closed = false;     // the server closed the connection after this response
  bool truncated = false;  // the body ended early (connection closed mid-body)
  std::string header(const std::string& name) const;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

class HttpClient {
 public:
  explicit HttpClient(int port, std::string host = "127.0.0.1");
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  Response get(const std::string& path, const Headers& headers = {});
  Response post(const std::string& path, const std::string& body, const Headers& headers = {});
  Response request(const std::string& method, const std::string& path, const std::string& body,
                   const Headers& headers = {});
  // Like request(), calling on_data for each body piece as it arrives; return false to stop
  // reading (the connection is then closed).
  Response stream(const std::string& method, const std::string& path, const std::string& body,
                  const Headers& headers, const std::function<bool(std::string_view)>& on_data);
  // Sends raw bytes and reads until the server closes or `wait` passes; returns what came back.
  std::string raw(std::string_view bytes, std::chrono::milliseconds wait);
  void close();
  bool connected() const { return fd_ >= 0; }

 private:
  bool ensure_connected();
  bool send_all(std::string_view data);
  // Reads more bytes into buf_; false on EOF/error/timeout.
  bool fill();
  bool read_line(std::string& line);
  Response read_response(const std::function<bool(std::string_view)>* on_data, bool head);

  int port_;
  std::string host_;
  int fd_ = -1;
  std::string buf_;
  std::chrono::milliseconds timeout_{10000};
};

// Splits an SSE body into the payloads of its "data:" lines.
std::vector<std::string> sse_data(std::string_view body);

}  // namespace kvgate::testing
