// Integration: kvgate's security surface, against the real binaries. The TLS listener (curl is the
// client; a CA and certificates are made by the openssl CLI in a temp dir), https workers behind an
// nginx TLS terminator (the CA that verifies them, the URL's host in the certificate, mutual TLS;
// and a small Python TLS worker that closes idle connections with close_notify), the API key (key
// file, scheme in any case, startup errors, never in the log), the metrics listener (GET/HEAD
// /metrics and /health, nothing else), and client-facing errors that never carry a worker's
// address or a socket or TLS error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "support/cluster.h"
#include "support/temp_dir.h"

namespace kvgate::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const char* kGenerate = R"({"text":"hello","sampling_params":{"max_new_tokens":4}})";
const char* kChatStream =
    R"({"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true})";
const std::vector<std::string> kFast = {"--ttft-ms", "1", "--tpot-ms", "1"};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The absolute path of an executable on PATH (or in the sbin directories, where nginx lives).
// Throws when it is missing: these tests fail, never skip, without their tools.
std::string tool(const std::string& name) {
  const char* env = std::getenv("PATH");
  std::stringstream dirs(std::string(env ? env : "") + ":/usr/local/sbin:/usr/sbin:/sbin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  throw std::runtime_error(name + " is not installed: run scripts/setup");
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// kvgate's command line for a run expected to end at startup: loopback, any free ports, and
// bounded (SIGTERM after 20 s, SIGKILL 5 s later), so a defect that lets it start anyway fails the
// test (status 124) instead of hanging it.
std::vector<std::string> bounded_kvgate(const std::vector<std::string>& args) {
  std::vector<std::string> a = {tool("timeout"),
                                "-k",
                                "5",
                                "20",
                                bin_dir() + "/kvgate",
                                "--host",
                                "127.0.0.1",
                                "--port",
                                "0",
                                "--prometheus-host",
                                "127.0.0.1",
                                "--prometheus-port",
                                "0",
                                "--admin-port",
                                "0"};
  a.insert(a.end(), args.begin(), args.end());
  return a;
}

RunResult run_kvgate(const std::vector<std::string>& args) {
  auto a = bounded_kvgate(args);
  return run(a[0], std::vector<std::string>(a.begin() + 1, a.end()));
}

// run_kvgate on a pseudo-terminal (util-linux's script), where OpenSSL would ask for the pass
// phrase of an encrypted key instead of failing.
RunResult run_kvgate_on_a_terminal(const std::vector<std::string>& args) {
  std::string cmd;
  for (const auto& a : bounded_kvgate(args)) cmd += "'" + a + "' ";  // test paths hold no quotes
  return run(tool("script"), {"-qec", cmd, "/dev/null"});
}

// The certificates of a test, made with the openssl CLI (EC P-256 keys: instant). In `dir`:
//   ca.crt, ca.key          a CA;
//   server.crt, server.key  signed by it for 127.0.0.1 (IP SAN) and localhost;
//   wrong.crt, wrong.key    signed by it for other.example only (the host of no URL here);
//   client.crt, client.key  signed by it for TLS client authentication;
//   other.key               a key of no certificate;
//   encrypted.key           server.key under a pass phrase.
constexpr const char* kOpensslConfig = R"([req]
distinguished_name = dn
prompt = no
[dn]
CN = kvgate test
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[wrong]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:other.example
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
)";

void make_pki(const TempDir& dir) {
  const std::string openssl = tool("openssl");
  const std::string cnf = dir / "openssl.cnf";
  write_file(cnf, kOpensslConfig);
  auto ossl = [&](const std::vector<std::string>& args) {
    auto r = run(openssl, args);
    if (r.status != 0) {
      std::string cmd = "openssl";
      for (const auto& a : args) cmd += " " + a;
      throw std::runtime_error(cmd + " failed:\n" + r.output);
    }
  };
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                                       "-nodes"};
  auto req = [&](std::vector<std::string> head, const std::string& name,
                 const std::string& subject) {
    head.insert(head.end(), ec.begin(), ec.end());
    head.insert(head.end(), {"-config", cnf, "-keyout", dir / (name + ".key"), "-subj", subject});
    ossl(head);
  };
  req({"req", "-x509", "-extensions", "ca", "-days", "2", "-out", dir / "ca.crt"}, "ca",
      "/CN=kvgate test CA");
  int serial = 2;
  for (auto [name, subject] :
       {std::pair{"server", "/CN=127.0.0.1"}, std::pair{"wrong", "/CN=other.example"},
        std::pair{"client", "/CN=kvgate"}}) {
    std::string n = name;
    req({"req", "-new", "-out", dir / (n + ".csr")}, n, subject);
    ossl({"x509", "-req", "-in", dir / (n + ".csr"), "-CA", dir / "ca.crt", "-CAkey",
          dir / "ca.key", "-set_serial", std::to_string(serial++), "-days", "2", "-extfile", cnf,
          "-extensions", n, "-out", dir / (n + ".crt")});
  }
  ossl({"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out",
        dir / "other.key"});
  ossl({"pkey", "-in", dir / "server.key", "-aes256", "-passout", "pass:secret", "-out",
        dir / "encrypted.key"});
}

// The value of one sample line ("name{labels}") of the /metrics text at `metrics_port`, or -1.
double scrape(int metrics_port, const std::string& series) {
  HttpClient c(metrics_port);
  std::istringstream in(c.get("/metrics").body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::atof(line.c_str() + series.size() + 1);
  }
  return -1;
}

// kvgate on free loopback ports, up once its metrics listener answers (the inference listener may
// speak TLS, which the test's plain client cannot). Stopped, and its clean exit checked, at the
// end.
class Gate {
 public:
  explicit Gate(const std::vector<std::string>& args) {
    std::vector<std::string> a = {"--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(port),
                                  "--prometheus-host",
                                  "127.0.0.1",
                                  "--prometheus-port",
                                  std::to_string(metrics_port),
                                  "--admin-port",
                                  "0",
                                  "--shutdown-grace-period-secs",
                                  "2"};
    a.insert(a.end(), args.begin(), args.end());
    process = std::make_unique<Process>("kvgate", a);
    bool up = wait_until([&] {
      if (!process->running()) return true;
      HttpClient c(metrics_port);
      c.set_timeout(500ms);
      return c.get("/health").status == 200;
    });
    if (!up || !process->running()) throw std::runtime_error("kvgate did not start:\n" + log());
  }
  ~Gate() {
    int status = process->stop(20s);
    if (status != 0) ADD_FAILURE() << "kvgate exited with status " << status << ":\n" << log();
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  double metric(const std::string& series) const { return scrape(metrics_port, series); }
  double worker_health(const std::string& url) const {
    return metric("kvgate_worker_health{worker=\"" + url + "\"}");
  }
  std::string log() const { return process->log(); }

  const int port = free_port();
  const int metrics_port = free_port();
  std::unique_ptr<Process> process;
};

// One curl call (the HTTPS client of these tests): exit code, status (0 without an answer),
// response headers and body, and curl's own error message.
struct CurlResult {
  int exit = 0;
  int status = 0;
  std::string headers;  // as received, lower-cased
  std::string body;
  std::string error;
};

CurlResult curl(const TempDir& dir, std::vector<std::string> args) {
  static int calls = 0;
  std::string tag = std::to_string(++calls);
  std::string body = dir / ("curl-body-" + tag), head = dir / ("curl-head-" + tag),
              err = dir / ("curl-err-" + tag);
  std::vector<std::string> a = {"-sS", "--max-time", "30", "--stderr", err,           "-o",
                                body,  "-D",         head, "-w",       "%{http_code}"};
  a.insert(a.end(), args.begin(), args.end());
  auto r = run(tool("curl"), a);
  CurlResult c;
  c.exit = r.status;
  c.status = std::atoi(r.output.c_str());
  c.headers = read_file(head);
  for (auto& ch : c.headers) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  c.body = read_file(body);
  c.error = read_file(err);
  return c;
}

// nginx as the TLS terminator of a sim (kvgate-sim speaks plain HTTP only): one TLS server per
// port, each proxying to the sim unbuffered (streams pass as they come). One foreground process,
// every file in the test's temp dir.
struct TlsSite {
  int port = 0;
  std::string cert, key;
  std::string client_ca;  // set: ssl_verify_client on, clients need a certificate from this CA
};

class Nginx {
 public:
  Nginx(const TempDir& dir, int upstream_port, const std::vector<TlsSite>& sites) {
    std::string d = dir.path();
    std::string conf = "daemon off;\nmaster_process off;\nworker_processes 1;\npid " + d +
                       "/nginx.pid;\nerror_log " + d + "/nginx-error.log info;\n" +
                       "events { worker_connections 256; }\nhttp {\n  access_log off;\n";
    for (std::string t : {"client_body", "proxy", "fastcgi", "uwsgi", "scgi"}) {
      conf += "  " + t + "_temp_path " + d + "/nginx-" + t + ";\n";
    }
    for (const auto& s : sites) {
      conf += "  server {\n    listen 127.0.0.1:" + std::to_string(s.port) + " ssl;\n" +
              "    ssl_certificate " + s.cert + ";\n    ssl_certificate_key " + s.key + ";\n";
      if (!s.client_ca.empty()) {
        conf += "    ssl_client_certificate " + s.client_ca + ";\n    ssl_verify_client on;\n";
      }
      conf +=
          "    location / {\n      proxy_pass http://127.0.0.1:" + std::to_string(upstream_port) +
          ";\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n" +
          "      proxy_buffering off;\n    }\n  }\n";
    }
    conf += "}\n";
    std::string path = dir / ("nginx-" + std::to_string(sites.front().port) + ".conf");
    write_file(path, conf);
    error_log_ = dir / "nginx-error.log";
    process_ = std::make_unique<Process>(
        tool("nginx"), std::vector<std::string>{"-p", d, "-e", error_log_, "-c", path});
    // Up once every port answers (a plain HTTP request to a TLS port gets nginx's 400).
    bool up = wait_until([&] {
      if (!process_->running()) return true;
      for (const auto& s : sites) {
        HttpClient c(s.port);
        c.set_timeout(500ms);
        if (c.get("/").status == 0) return false;
      }
      return true;
    });
    if (!up || !process_->running()) {
      throw std::runtime_error("nginx did not start:\n" + process_->log() + read_file(error_log_));
    }
  }
  ~Nginx() { stop(); }
  Nginx(const Nginx&) = delete;
  Nginx& operator=(const Nginx&) = delete;
  void stop() { process_->stop(); }

 private:
  std::string error_log_;
  std::unique_ptr<Process> process_;
};

std::string https_url(int port) {
  return "https://127.0.0.1:" + std::to_string(port);
}

// ---------------------------------------------------------------------------------------------
// The TLS listener (--tls-cert-path, --tls-key-path).

TEST(SecurityTlsListener, ServesHttpsAndStreamsAndRefusesPlaintextCleanly) {
  TempDir dir;
  make_pki(dir);
  Sim sim;
  sim.port = free_port();
  sim.args = kFast;
  sim.start();
  Gate g({"--policy", "round_robin", "--debug-headers", "--tls-cert-path", dir / "server.crt",
          "--tls-key-path", dir / "server.key", "--worker-urls", sim.url()});
  ASSERT_TRUE(wait_until([&] { return g.worker_health(sim.url()) == 1; })) << g.log();
  const std::string base = "https://127.0.0.1:" + std::to_string(g.port);
  const std::vector<std::string> json = {"--cacert", dir / "ca.crt", "-H",
                                         "content-type: application/json"};

  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = json;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto r = curl(dir, with({"-d", kGenerate, base + "/generate"}));
  ASSERT_EQ(r.exit, 0) << r.error;
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(contains(r.body, "\"text\"")) << r.body;
  EXPECT_TRUE(contains(r.headers, "x-kvgate-worker: " + sim.url())) << r.headers;

  // The certificate names localhost too (resolved to 127.0.0.1 only: loopback IPv4 here).
  std::string port = std::to_string(g.port);
  r = curl(dir, {"--cacert", dir / "ca.crt", "--resolve", "localhost:" + port + ":127.0.0.1",
                 "https://localhost:" + port + "/readiness"});
  EXPECT_EQ(r.exit, 0) << r.error;
  EXPECT_EQ(r.status, 200) << r.body;

  // A stream over TLS arrives whole: every event, then [DONE].
  r = curl(dir, with({"-N", "-d", kChatStream, base + "/v1/chat/completions"}));
  ASSERT_EQ(r.exit, 0) << r.error;
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(contains(r.headers, "content-type: text/event-stream")) << r.headers;
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");

  // Plain HTTP to the TLS port: no HTTP answer, the connection closed, the failure counted, and
  // kvgate still serving.
  HttpClient plain(g.port);
  std::string back = plain.raw("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 5s);
  EXPECT_FALSE(contains(back, "HTTP/")) << back;
  EXPECT_TRUE(wait_until([&] {
    return g.metric("kvgate_http_rejected_total{reason=\"tls_handshake\"}") == 1;
  })) << g.log();
  EXPECT_TRUE(g.process->running());
  // Two requests on one kept-alive TLS connection (the second waits in the idle state first).
  double accepted = g.metric("kvgate_connections_accepted_total");
  r = curl(dir, {"--cacert", dir / "ca.crt", base + "/health", "-o", dir / "second-body",
                 base + "/liveness"});
  EXPECT_EQ(r.exit, 0) << r.error;
  EXPECT_EQ(r.body, R"({"status":"ok"})");
  EXPECT_EQ(read_file(dir / "second-body"), R"({"status":"ok"})");
  EXPECT_EQ(g.metric("kvgate_connections_accepted_total"), accepted + 1);
}

TEST(SecurityTlsListener, BadCertificateOrKeyIsAStartupErrorNamingTheFlag) {
  TempDir dir;
  make_pki(dir);
  write_file(dir / "garbage.pem", "not a certificate\n");
  const std::vector<std::string> base = {"--worker-urls", "http://127.0.0.1:1"};
  auto start = [&](const std::string& cert, const std::string& key) {
    std::vector<std::string> a = base;
    if (!cert.empty()) a.insert(a.end(), {"--tls-cert-path", cert});
    if (!key.empty()) a.insert(a.end(), {"--tls-key-path", key});
    return run_kvgate(a);
  };
  struct Case {
    std::string cert, key, expected;
  } cases[] = {
      {dir / "missing.crt", dir / "server.key",
       "--tls-cert-path " + dir / "missing.crt" + ": cannot load the certificate chain"},
      {dir / "garbage.pem", dir / "server.key",
       "--tls-cert-path " + dir / "garbage.pem" + ": cannot load the certificate chain"},
      {dir / "server.crt", dir / "missing.key",
       "--tls-key-path " + dir / "missing.key" + ": cannot load the private key"},
      {dir / "server.crt", dir / "garbage.pem",
       "--tls-key-path " + dir / "garbage.pem" + ": cannot load the private key"},
      {dir / "server.crt", "", "TLS needs both --tls-cert-path and --tls-key-path"},
      {"", dir / "server.key", "TLS needs both --tls-cert-path and --tls-key-path"},
  };
  for (const auto& c : cases) {
    auto r = start(c.cert, c.key);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "kvgate: " + c.expected)) << r.output;
  }
  // A key of another certificate: named, with what it must match.
  auto r = start(dir / "server.crt", dir / "other.key");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--tls-key-path " + dir / "other.key")) << r.output;
  EXPECT_TRUE(contains(r.output, "match")) << r.output;
  // An encrypted key fails the same way, even with a terminal to ask a pass phrase on.
  r = run_kvgate_on_a_terminal({"--worker-urls", "http://127.0.0.1:1", "--tls-cert-path",
                                dir / "server.crt", "--tls-key-path", dir / "encrypted.key"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "--tls-key-path " + dir / "encrypted.key" + ": cannot load the private key"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "pass phrase")) << r.output;
}

// ---------------------------------------------------------------------------------------------
// https workers (--worker-ca-cert-path, --worker-client-cert-path, --worker-client-key-path).

class SecurityWorkerTls : public ::testing::Test {
 protected:
  void SetUp() override {
    make_pki(dir_);
    sim_.port = free_port();
    sim_.args = kFast;
    sim_.start();
  }
  TlsSite site(int port, const std::string& name = "server", bool verify_client = false) const {
    return {port, dir_ / (name + ".crt"), dir_ / (name + ".key"),
            verify_client ? dir_ / "ca.crt" : ""};
  }
  // The first health probe of `url` failed and was logged with its reason.
  static bool probe_failed(const Gate& g, const std::string& url) {
    std::istringstream log(g.log());
    std::string line;
    while (std::getline(log, line)) {
      if (contains(line, "worker not ready") && contains(line, "worker=" + url + " ")) return true;
    }
    return false;
  }

  TempDir dir_;
  Sim sim_;
};

TEST_F(SecurityWorkerTls, RoutesThroughTheWorkersTlsWithItsCa) {
  int port = free_port();
  Nginx nginx(dir_, sim_.port, {site(port)});
  std::string url = https_url(port);
  Gate g({"--policy", "round_robin", "--debug-headers", "--worker-ca-cert-path", dir_ / "ca.crt",
          "--worker-urls", url});
  // Health probes pass over TLS.
  ASSERT_TRUE(wait_until([&] { return g.worker_health(url) == 1; }, 15s)) << g.log();
  HttpClient client(g.port);
  for (int i = 0; i < 3; ++i) {  // the second and third reuse a pooled TLS connection
    auto r = client.post("/generate", kGenerate);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-kvgate-worker"), url);
  }
  auto r = client.post("/v1/chat/completions", kChatStream);
  EXPECT_EQ(r.status, 200) << r.body;
  auto events = sse_data(r.body);
  ASSERT_GE(events.size(), 3u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(client.get("/readiness").status, 200);
}

TEST_F(SecurityWorkerTls, WithoutItsCaTheWorkerNeverTurnsHealthy) {
  int port = free_port();
  Nginx nginx(dir_, sim_.port, {site(port)});
  std::string url = https_url(port);
  // No --worker-ca-cert-path: the system's CAs, which did not sign the test CA's certificate.
  Gate g({"--policy", "round_robin", "--worker-urls", url});
  ASSERT_TRUE(wait_until([&] { return probe_failed(g, url); }, 15s)) << g.log();
  EXPECT_TRUE(contains(g.log(), "certificate verify failed")) << g.log();
  EXPECT_EQ(g.worker_health(url), 0);
  HttpClient client(g.port);
  EXPECT_EQ(client.get("/readiness").status, 503);
  auto r = client.post("/generate", kGenerate);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_TRUE(contains(r.body, "no_available_workers")) << r.body;
  for (const char* secret : {"127.0.0.1", "certificate", "verify", "SSL", "https"}) {
    EXPECT_FALSE(contains(r.body, secret)) << secret << " in " << r.body;
  }
}

TEST_F(SecurityWorkerTls, TheCertificateMustNameTheUrlsHost) {
  int good = free_port(), wrong = free_port();
  Nginx nginx(dir_, sim_.port, {site(good), site(wrong, "wrong")});
  // Both certificates come from the trusted CA; only one names 127.0.0.1.
  Gate g({"--policy", "round_robin", "--debug-headers", "--worker-ca-cert-path", dir_ / "ca.crt",
          "--worker-urls", https_url(good), https_url(wrong)});
  ASSERT_TRUE(wait_until([&] { return g.worker_health(https_url(good)) == 1; }, 15s)) << g.log();
  ASSERT_TRUE(wait_until([&] { return probe_failed(g, https_url(wrong)); }, 15s)) << g.log();
  EXPECT_EQ(g.worker_health(https_url(wrong)), 0);
  HttpClient client(g.port);
  for (int i = 0; i < 4; ++i) {
    auto r = client.post("/generate", kGenerate);
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-kvgate-worker"), https_url(good));
  }
}

TEST_F(SecurityWorkerTls, MutualTlsNeedsTheClientCertificate) {
  int port = free_port();
  Nginx nginx(dir_, sim_.port, {site(port, "server", true)});
  std::string url = https_url(port);
  {
    // Without a client certificate nginx answers every request 400: never healthy, never used.
    Gate g({"--policy", "round_robin", "--worker-ca-cert-path", dir_ / "ca.crt", "--worker-urls",
            url});
    ASSERT_TRUE(wait_until([&] { return probe_failed(g, url); }, 15s)) << g.log();
    EXPECT_TRUE(contains(g.log(), "probe=\"status 400\"")) << g.log();
    HttpClient client(g.port);
    EXPECT_EQ(client.post("/generate", kGenerate).status, 503);
  }
  Gate g({"--policy", "round_robin", "--worker-ca-cert-path", dir_ / "ca.crt",
          "--worker-client-cert-path", dir_ / "client.crt", "--worker-client-key-path",
          dir_ / "client.key", "--worker-urls", url});
  ASSERT_TRUE(wait_until([&] { return g.worker_health(url) == 1; }, 15s)) << g.log();
  HttpClient client(g.port);
  auto r = client.post("/generate", kGenerate);
  EXPECT_EQ(r.status, 200) << r.body;
}

// A TLS worker with a keep-alive timeout of 0.2 s after a /generate (everything else it answers
// 200 and keeps alive): it ends the idle connection with a close_notify, then its FIN, as Go,
// Envoy and others do (nginx sends no close_notify), and writes "closed" to a file once it has.
// Python's ssl module: the test needs a peer that sends close_notify on an idle connection.
constexpr const char* kClosingTlsWorker = R"(import socket, ssl, sys, threading
port, cert, key, marker = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
lock = threading.Lock()
def note(line):
    with lock, open(marker, "a") as f:
        f.write(line + "\n")
def close_idle(conn):
    conn.setblocking(False)  # send the close_notify; do not wait for the peer's
    try:
        conn.unwrap()
    except (ssl.SSLWantReadError, ssl.SSLError):
        pass
    conn.close()
    note("closed")
def serve(raw):
    try:
        conn = ctx.wrap_socket(raw, server_side=True)
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                try:
                    data = conn.recv(65536)
                except socket.timeout:
                    return close_idle(conn)
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                buf += conn.recv(65536)
            buf = buf[length:]
            body = b'{"text":"ok"}'
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            if head.split(b" ")[1].startswith(b"/generate"):
                conn.settimeout(0.2)
    except (OSError, ValueError):
        pass
listener = socket.create_server(("127.0.0.1", port))
note("listening")
while True:
    raw, _ = listener.accept()
    threading.Thread(target=serve, args=(raw,), daemon=True).start()
)";

TEST_F(SecurityWorkerTls, APooledConnectionTheWorkerClosedWithCloseNotifyIsNotReused) {
  int port = free_port();
  std::string url = https_url(port), marker = dir_ / "closing-worker.log";
  write_file(dir_ / "closing_worker.py", kClosingTlsWorker);
  Process worker(tool("python3"), {dir_ / "closing_worker.py", std::to_string(port),
                                   dir_ / "server.crt", dir_ / "server.key", marker});
  auto count = [&](const std::string& word) {
    std::istringstream in(read_file(marker));
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line == word;
    return n;
  };
  ASSERT_TRUE(wait_until([&] { return count("listening") == 1 || !worker.running(); }));
  ASSERT_TRUE(worker.running()) << worker.log();
  Gate g({"--policy", "round_robin", "--worker-ca-cert-path", dir_ / "ca.crt", "--worker-urls", url,
          "--health-check-interval-secs", "60"});
  ASSERT_TRUE(wait_until([&] { return g.worker_health(url) == 1; }, 15s)) << g.log();
  HttpClient client(g.port);
  for (int i = 1; i <= 3; ++i) {
    // The pooled connection of the previous request was closed by the worker (its close_notify
    // waits unread in the socket): not reused, a fresh one.
    auto r = client.post("/generate", kGenerate);
    EXPECT_EQ(r.status, 200) << r.body << "\n" << g.log();
    ASSERT_TRUE(wait_until([&] { return count("closed") == i; })) << worker.log();
  }
  EXPECT_EQ(g.metric("kvgate_retries_total{route=\"/generate\"}"), -1);  // none was needed
}

TEST_F(SecurityWorkerTls, WorkerTlsFilesAreCheckedAtStartup) {
  const std::string url = "https://127.0.0.1:1";
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  } cases[] = {
      {{"--worker-ca-cert-path", dir_ / "missing.pem"},
       "--worker-ca-cert-path " + dir_ / "missing.pem" + ": cannot load CA certificates"},
      {{"--worker-client-cert-path", dir_ / "client.crt"},
       "a client certificate needs both --worker-client-cert-path and --worker-client-key-path"},
      {{"--worker-client-key-path", dir_ / "client.key"},
       "a client certificate needs both --worker-client-cert-path and --worker-client-key-path"},
      {{"--worker-client-cert-path", dir_ / "missing.crt", "--worker-client-key-path",
        dir_ / "client.key"},
       "--worker-client-cert-path " + dir_ / "missing.crt" + ": cannot load it"},
      {{"--worker-client-cert-path", dir_ / "client.crt", "--worker-client-key-path",
        dir_ / "other.key"},
       "--worker-client-key-path " + dir_ / "other.key" +
           ": cannot load it or it does not match --worker-client-cert-path"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> a = {"--worker-urls", url};
    a.insert(a.end(), c.args.begin(), c.args.end());
    auto r = run_kvgate(a);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "kvgate: " + c.expected)) << r.output;
  }
  // An encrypted client key fails, even with a terminal to ask a pass phrase on.
  auto r = run_kvgate_on_a_terminal({"--worker-urls", url, "--worker-client-cert-path",
                                     dir_ / "server.crt", "--worker-client-key-path",
                                     dir_ / "encrypted.key"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--worker-client-key-path " + dir_ / "encrypted.key")) << r.output;
  EXPECT_FALSE(contains(r.output, "pass phrase")) << r.output;
}

// What a client sees when a worker's connection or its TLS fails: a gateway error naming neither
// the worker's address nor the socket or TLS error (both are in kvgate's log).
TEST_F(SecurityWorkerTls, ClientErrorsCarryNoWorkerAddressOrSocketError) {
  int port = free_port();
  std::string url = https_url(port);
  auto nginx = std::make_unique<Nginx>(dir_, sim_.port, std::vector<TlsSite>{site(port)});
  // Every attempt on a new connection (--worker-idle-connection-timeout-ms 0): a pooled one the
  // worker closed a moment before may still look open, and a request sent on it is not retried
  // (any keep-alive proxy has that race; it is not what this test is about).
  Gate g({"--policy", "round_robin", "--worker-ca-cert-path", dir_ / "ca.crt", "--worker-urls", url,
          "--health-check-interval-secs", "60", "--retry-max-retries", "2",
          "--retry-initial-backoff-ms", "1", "--cb-failure-threshold", "100",
          "--worker-idle-connection-timeout-ms", "0"});
  ASSERT_TRUE(wait_until([&] { return g.worker_health(url) == 1; }, 15s)) << g.log();
  HttpClient client(g.port);
  ASSERT_EQ(client.post("/generate", kGenerate).status, 200);
  auto clean = [&](const Response& r, const std::vector<std::string>& secrets) {
    EXPECT_EQ(r.status, 502) << r.body;
    EXPECT_TRUE(contains(r.body, "upstream_unreachable")) << r.body;
    EXPECT_EQ(r.header("x-kvgate-worker"), "");
    for (const auto& s : secrets) EXPECT_FALSE(contains(r.body, s)) << s << " in " << r.body;
  };
  const std::vector<std::string> address = {"127.0.0.1", std::to_string(port), "https://"};

  // The worker's port refuses connections (the health plane has not noticed: probes every 60 s).
  nginx->stop();
  auto r = client.post("/generate", kGenerate);
  auto secrets = address;
  secrets.insert(secrets.end(), {"refused", "Connection", "connect"});
  clean(r, secrets);

  // Something else answers there, with a certificate for another host: the TLS handshake fails.
  nginx = std::make_unique<Nginx>(dir_, sim_.port, std::vector<TlsSite>{site(port, "wrong")});
  r = client.post("/generate", kGenerate);
  secrets = address;
  secrets.insert(secrets.end(), {"certificate", "verify", "SSL", "handshake"});
  clean(r, secrets);
  // (The log is written by its own thread: the line may follow the answer by a moment.)
  EXPECT_TRUE(wait_until([&] { return contains(g.log(), "certificate verify failed"); }))
      << g.log();
}

// ---------------------------------------------------------------------------------------------
// The API key (--api-key, --api-key-file).

TEST(SecurityApiKey, KeyFileFirstLineAnySchemeCaseProbesFreeAndNeverLogged) {
  TempDir dir;
  // Its first line is the key (the CRLF of a file written on Windows is not part of it).
  write_file(dir / "key", "k3y-from-file\r\nsecond-line\n");
  Cluster c(1, kFast,
            {"--policy", "round_robin", "--api-key-file", dir / "key", "--log-level", "debug"});
  HttpClient client(c.port());
  for (const char* scheme : {"Bearer", "bearer", "BEARER", "bEaReR"}) {
    auto r = client.post("/generate", kGenerate,
                         {{"Authorization", std::string(scheme) + " k3y-from-file"}});
    EXPECT_EQ(r.status, 200) << scheme << ": " << r.body;
  }
  for (const char* auth : {"Bearer wrong-key-sent", "Bearer second-line", "Bearer k3y-from-fil",
                           "Bearer k3y-from-file2", "Basic k3y-from-file", "Bearerk3y-from-file",
                           "k3y-from-file", "Bearer"}) {
    auto r = client.post("/generate", kGenerate, {{"Authorization", auth}});
    EXPECT_EQ(r.status, 401) << auth << ": " << r.body;
    EXPECT_TRUE(contains(r.body, "invalid_api_key")) << r.body;
  }
  EXPECT_EQ(client.post("/generate", kGenerate).status, 401);
  EXPECT_EQ(client.get("/v1/models").status, 401);
  for (const char* probe : {"/health", "/liveness", "/readiness"}) {
    EXPECT_EQ(client.get(probe).status, 200) << probe;
  }
  // Neither the key nor what clients sent as one reaches the log (read once kvgate has exited, so
  // every line is written).
  EXPECT_EQ(c.gateway().stop(), 0) << c.gateway().log();
  std::string log = c.gateway().log();
  ASSERT_TRUE(contains(log, "kvgate stopped")) << log;
  for (const char* secret : {"k3y-from-file", "second-line", "wrong-key-sent"}) {
    EXPECT_FALSE(contains(log, secret)) << secret << " in:\n" << log;
  }
}

TEST(SecurityApiKey, UnusableKeysAreStartupErrors) {
  TempDir dir;
  write_file(dir / "empty", "");
  write_file(dir / "blank-first-line", "\nkey-on-line-two\n");
  write_file(dir / "key", "a-key\n");
  const std::string w = "http://127.0.0.1:1";
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> expected;  // each in the message
  } cases[] = {
      {{"--api-key-file", dir / "empty"},
       {"--api-key-file " + dir / "empty" + " is empty", "write the key on its first line"}},
      {{"--api-key-file", dir / "blank-first-line"},
       {"--api-key-file " + dir / "blank-first-line" + " is empty",
        "write the key on its first line"}},
      {{"--api-key-file", dir / "missing"},
       {"--api-key-file " + dir / "missing" + ": cannot read it", "No such file",
        "with the key on its first line"}},
      {{"--api-key", ""}, {"--api-key is empty", "leave the flag out"}},
      {{"--api-key", "k", "--api-key-file", dir / "key"},
       {"give --api-key or --api-key-file, not both"}},
      {{"--api-key", "", "--api-key-file", dir / "key"},
       {"give --api-key or --api-key-file, not both"}},
      {{"--admin-api-key-file", dir / "key"},
       {"the admin API key is 5 characters long; use at least 16"}},
  };
  for (const auto& c : cases) {
    std::vector<std::string> a = {"--worker-urls", w};
    a.insert(a.end(), c.args.begin(), c.args.end());
    auto r = run_kvgate(a);
    EXPECT_EQ(r.status, 2) << r.output;
    for (const auto& e : c.expected)
      EXPECT_TRUE(contains(r.output, e)) << e << " not in " << r.output;
  }
}

// ---------------------------------------------------------------------------------------------
// The metrics listener (--prometheus-host, --prometheus-port): what a scraper needs, nothing else.

TEST(SecurityMetricsListener, AnswersOnlyGetAndHeadOfMetricsAndHealth) {
  Cluster c(1, kFast, {"--policy", "round_robin"});
  HttpClient m(c.metrics_port());
  auto r = m.get("/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(contains(r.body, "# TYPE kvgate_requests_total counter")) << r.body;
  r = m.get("/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  r = m.request("HEAD", "/metrics", "");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.empty());
  EXPECT_FALSE(r.header("content-length").empty());
  EXPECT_EQ(m.request("HEAD", "/health", "").status, 200);
  for (const char* method : {"POST", "PUT", "DELETE", "OPTIONS"}) {
    r = m.request(method, "/metrics", "");
    EXPECT_EQ(r.status, 405) << method;
    EXPECT_EQ(r.header("allow"), "GET, HEAD") << method;
  }
  EXPECT_EQ(m.post("/health", "{}").status, 405);
  // Nothing of the inference listener, nor anything else, is answered here.
  for (const char* path : {"/anything-else", "/", "/readiness", "/liveness", "/v1/models",
                           "/generate", "/metrics/x", "/get_server_info"}) {
    r = m.get(path);
    EXPECT_EQ(r.status, 404) << path;
    EXPECT_FALSE(contains(r.body, "127.0.0.1")) << r.body;
  }
  EXPECT_EQ(m.post("/generate", kGenerate).status, 404);
  EXPECT_EQ(m.get("/metrics").status, 200);  // every answer above kept the connection
}

}  // namespace
}  // namespace kvgate::testing
