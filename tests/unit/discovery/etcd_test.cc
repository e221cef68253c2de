// discovery/etcd and register_cli without a server: base64, prefix ranges, worker keys and
// records, watch-stream lines, URL checks, and `kvgate register`'s flags.
#include "discovery/etcd.h"

#include <gtest/gtest.h>

#include "discovery/register_cli.h"

namespace kvgate::discovery {
namespace {

TEST(Base64, RoundTripsEveryLengthAndByte) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64_encode("/a/b"), "L2EvYg==");  // as etcd answered it
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); n += 7) {
    std::string in = all.substr(0, n), out;
    ASSERT_TRUE(base64_decode(base64_encode(in), out)) << n;
    EXPECT_EQ(out, in);
  }
}

TEST(Base64, DecodeIsStrict) {
  std::string out;
  EXPECT_TRUE(base64_decode("Zm8", out));  // unpadded
  EXPECT_EQ(out, "fo");
  EXPECT_TRUE(base64_decode("", out));
  EXPECT_EQ(out, "");
  EXPECT_FALSE(base64_decode("Zm9v!", out));
  EXPECT_FALSE(base64_decode("Z", out));       // 6 bits are not a byte
  EXPECT_FALSE(base64_decode("Zm8==", out));   // padded to 5
  EXPECT_FALSE(base64_decode("Zg=a", out));    // padding in the middle
  EXPECT_FALSE(base64_decode("Zm9v\n", out));  // no whitespace
  EXPECT_FALSE(base64_decode("Zm9v-_", out));  // the URL alphabet is not etcd's
}

TEST(PrefixRangeEnd, IncrementsTheLastByteBelowFf) {
  EXPECT_EQ(prefix_range_end("/kvgate/"), "/kvgate0");
  EXPECT_EQ(prefix_range_end("a\xff"), "b");
  EXPECT_EQ(prefix_range_end("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(prefix_range_end(""), std::string(1, '\0'));
}

TEST(WorkerKey, JoinsAndSplitsModelsWithSlashes) {
  EXPECT_EQ(worker_key("llama", "10.0.0.5:30000"), "/kvgate/v1/workers/llama/10.0.0.5:30000");
  std::string model, id;
  ASSERT_EQ(split_worker_key("/kvgate/v1/workers/Qwen/Qwen3-8B/w-1", model, id), "");
  EXPECT_EQ(model, "Qwen/Qwen3-8B");
  EXPECT_EQ(id, "w-1");
  EXPECT_NE(split_worker_key("/other/llama/w", model, id), "");
  EXPECT_NE(split_worker_key("/kvgate/v1/workers/llama", model, id), "");
  EXPECT_NE(split_worker_key("/kvgate/v1/workers/llama/", model, id), "");
  EXPECT_NE(split_worker_key("/kvgate/v1/workers//w", model, id), "");
  EXPECT_NE(split_worker_key("/kvgate/v1/workers/a b/w", model, id), "");
  EXPECT_NE(split_worker_key("/kvgate/v1/workers/m/w\x01", model, id), "");
  EXPECT_NE(check_worker_key_parts(std::string(257, 'm'), "w"), "");
  EXPECT_NE(check_worker_key_parts("m", "a/b").find("'/'"), std::string::npos);
}

TEST(WorkerRecordParse, FullRecord) {
  WorkerRecord r;
  r.model = "llama";
  r.id = "w1";
  ASSERT_EQ(parse_worker_record(R"({"url": "http://10.0.0.5:30000", "role": "prefill",
      "dp_size": 2, "page_size": 16, "bootstrap_port": 8998,
      "kv_events": {"endpoint": "tcp://10.0.0.5:5557", "topic": "kv"}, "future": [1]})",
                                r),
            "");
  EXPECT_EQ(r.model, "llama");  // from the key, untouched
  EXPECT_EQ(r.id, "w1");
  EXPECT_EQ(r.url, "http://10.0.0.5:30000");
  EXPECT_EQ(r.role, "prefill");
  EXPECT_EQ(r.dp_size, 2);
  EXPECT_EQ(r.page_size, 16);
  EXPECT_EQ(r.bootstrap_port, 8998);
  EXPECT_EQ(r.kv_events_endpoint, "tcp://10.0.0.5:5557");
  EXPECT_EQ(r.kv_events_json, R"({"endpoint":"tcp://10.0.0.5:5557","topic":"kv"})");
  // Serialized and read back: the same record.
  WorkerRecord back;
  back.model = r.model;
  back.id = r.id;
  ASSERT_EQ(parse_worker_record(serialize_worker_record(r), back), "");
  EXPECT_EQ(back, r);
}

TEST(WorkerRecordParse, OnlyUrlIsRequired) {
  WorkerRecord r;
  ASSERT_EQ(parse_worker_record(R"({"url":"https://[fd00::5]:443"})", r), "");
  EXPECT_EQ(r.role, "regular");
  EXPECT_EQ(r.dp_size, 0);
  EXPECT_EQ(r.kv_events_json, "");
  EXPECT_EQ(serialize_worker_record(r), R"({"role":"regular","url":"https://[fd00::5]:443"})");
  ASSERT_EQ(parse_worker_record(R"({"url":"http://sglang-0.sglang.ns.svc:30000"})", r), "");
}

TEST(WorkerRecordParse, ErrorsNameTheField) {
  struct Case {
    const char* json;
    const char* says;
  };
  for (const Case& c : {
           Case{"", "not valid JSON"},
           Case{"[1]", "not a JSON object"},
           Case{"{}", "\"url\" is required"},
           Case{R"({"url": 5})", "\"url\" must be a string"},
           Case{R"({"url": "10.0.0.5:30000"})", "http://host:port"},
           Case{R"({"url": "http://10.0.0.5"})", "port is missing"},
           Case{R"({"url": "http://10.0.0.5:0"})", "from 1 to 65535"},
           Case{R"({"url": "http://10.0.0.5:30000/v1"})", "without a path"},
           Case{R"({"url": "http://:30000"})", "host is empty"},
           Case{R"({"url": "http://0.0.0.0:30000"})", "bind address"},
           Case{R"({"url": "http://[zz]:1"})", "not an IPv6 address"},
           Case{R"({"url": "http://a b:1"})", "not a host name"},
           Case{R"({"url": "http://h:1", "role": "both"})", "\"role\" is one of"},
           Case{R"({"url": "http://h:1", "dp_size": 0})", "\"dp_size\" must be an integer from 1"},
           Case{R"({"url": "http://h:1", "dp_size": "2"})", "\"dp_size\""},
           Case{R"({"url": "http://h:1", "page_size": 1.5})", "\"page_size\""},
           Case{R"({"url": "http://h:1", "bootstrap_port": 70000})", "\"bootstrap_port\""},
           Case{R"({"url": "http://h:1", "kv_events": "tcp://h:1"})", "must be an object"},
           Case{R"({"url": "http://h:1", "kv_events": {"endpoint": "ipc:///x"}})",
                "tcp://host:port"},
           Case{R"({"url": "http://h:1", "kv_events": {"endpoint": "tcp://*:5557"}})",
                "bind address"},
       }) {
    WorkerRecord r;
    r.url = "unchanged";
    std::string e = parse_worker_record(c.json, r);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.json << ": " << e;
    EXPECT_EQ(r.url, "unchanged") << "a failed parse leaves the record as it was";
  }
  WorkerRecord r;
  std::string e = parse_worker_record(R"({"role": "x", "dp_size": -1})", r);
  EXPECT_NE(e.find("\"url\""), std::string::npos) << "every error at once: " << e;
  EXPECT_NE(e.find("\"role\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"dp_size\""), std::string::npos) << e;
  EXPECT_NE(parse_worker_record(std::string(kMaxWorkerRecordBytes + 1, ' '), r).find("64 KiB"),
            std::string::npos);
}

TEST(WatchLine, CreatedPutDeleteAndCompaction) {
  EtcdWatchMessage m;
  ASSERT_EQ(parse_watch_line(
                R"({"result":{"header":{"cluster_id":"1","revision":"4"},"created":true}})", m),
            "");
  EXPECT_TRUE(m.created);
  EXPECT_EQ(m.revision, 4);
  EXPECT_TRUE(m.events.empty());
  // As etcd 3.4's gateway writes them: a PUT has no "type" (its zero value is left out).
  ASSERT_EQ(
      parse_watch_line(
          R"({"result":{"header":{"revision":"6"},"events":[)"
          R"({"kv":{"key":"L2EvYg==","create_revision":"5","mod_revision":"6","version":"2","value":"eA==","lease":"77"}},)"
          R"({"type":"DELETE","kv":{"key":"L2Ev","mod_revision":"6"}}]}})",
          m),
      "");
  EXPECT_EQ(m.revision, 6);
  ASSERT_EQ(m.events.size(), 2u);
  EXPECT_EQ(m.events[0].type, EtcdWatchEvent::Type::kPut);
  EXPECT_EQ(m.events[0].kv.key, "/a/b");
  EXPECT_EQ(m.events[0].kv.value, "x");
  EXPECT_EQ(m.events[0].kv.create_revision, 5);
  EXPECT_EQ(m.events[0].kv.mod_revision, 6);
  EXPECT_EQ(m.events[0].kv.version, 2);
  EXPECT_EQ(m.events[0].kv.lease, 77);
  EXPECT_EQ(m.events[1].type, EtcdWatchEvent::Type::kDelete);
  EXPECT_EQ(m.events[1].kv.key, "/a/");
  ASSERT_EQ(
      parse_watch_line(
          R"({"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"4"}})", m),
      "");
  EXPECT_TRUE(m.canceled);
  EXPECT_EQ(m.compact_revision, 4);
  // Numbers where etcd writes strings are read too.
  ASSERT_EQ(parse_watch_line(R"({"result":{"header":{"revision":9}}})", m), "");
  EXPECT_EQ(m.revision, 9);
}

TEST(WatchLine, ErrorsAndMalformedLines) {
  EtcdWatchMessage m;
  EXPECT_EQ(parse_watch_line(R"({"error":{"grpc_code":14,"message":"etcdserver: no leader"}})", m),
            "etcd: etcdserver: no leader");
  EXPECT_EQ(parse_watch_line(R"({"error":"boom","message":"boom","code":2})", m), "etcd: boom");
  for (const char* bad :
       {"", "{", "[]", "{}", R"({"result":1})", R"({"result":{"header":{"revision":"x"}}})",
        R"({"result":{"header":{"revision":"99999999999999999999"}}})",
        R"({"result":{"events":{}}})", R"({"result":{"events":[1]}})",
        R"({"result":{"events":[{"type":"PATCH","kv":{}}]}})",
        R"({"result":{"events":[{"type":"PUT"}]}})",
        R"({"result":{"events":[{"kv":{"key":"!!"}}]}})",
        R"({"result":{"events":[{"kv":{"lease":true}}]}})"}) {
    EXPECT_NE(parse_watch_line(bad, m), "") << bad;
  }
}

TEST(EtcdClientUrl, HttpsAndMalformedUrlsFailClearly) {
  EXPECT_EQ(EtcdClient("http://127.0.0.1:2379").url_error(), "");
  EXPECT_EQ(EtcdClient("http://etcd.ns.svc:2379/").url_error(), "");
  EXPECT_EQ(EtcdClient("http://[::1]:2379").url_error(), "");
  EXPECT_NE(EtcdClient("https://127.0.0.1:2379").url_error().find("not supported yet"),
            std::string::npos);
  EXPECT_NE(EtcdClient("127.0.0.1:2379").url_error().find("http://host:port"), std::string::npos);
  EXPECT_NE(EtcdClient("http://127.0.0.1").url_error().find("port is missing"), std::string::npos);
  EXPECT_NE(EtcdClient("http://127.0.0.1:2379/v3").url_error().find("without a path"),
            std::string::npos);
  EtcdClient bad("https://h:1");
  EtcdRange r;
  EXPECT_NE(bad.range("/", r).find(bad.url_error()), std::string::npos);
}

TEST(EtcdClientCalls, RefusedConnectionAndInterrupt) {
  // A port nothing listens on (bound, never listened): the call fails at once, naming etcd.
  EtcdClient c("http://127.0.0.1:1",
               EtcdClient::Options{.timeout = std::chrono::milliseconds(500)});
  EtcdRange r;
  std::string e = c.range("/kvgate/", r);
  EXPECT_NE(e.find("cannot connect to etcd at 127.0.0.1:1"), std::string::npos) << e;
  c.interrupt();
  EXPECT_EQ(c.put("/k", "v"), "interrupted");
}

std::string parse_args(std::vector<std::string> args, RegisterOptions& out) {
  bool help = false;
  std::string text;
  return parse_register_args(args, out, help, text);
}

TEST(RegisterArgs, DefaultsAndRecord) {
  RegisterOptions o;
  ASSERT_EQ(parse_args({"--etcd", "http://127.0.0.1:2379", "--url", "http://10.0.0.5:30000"}, o),
            "");
  EXPECT_EQ(o.etcd, "http://127.0.0.1:2379");
  EXPECT_EQ(o.record.model, "default");
  EXPECT_EQ(o.record.id, "10.0.0.5:30000");  // host:port of --url
  EXPECT_EQ(o.record.role, "regular");
  EXPECT_EQ(o.ttl_secs, 10);
  ASSERT_EQ(
      parse_args({"--etcd=http://e:2379", "--url=http://w:1", "--model", "Qwen/Qwen3-8B", "--id",
                  "w-1", "--role", "prefill", "--dp-size", "2", "--page-size", "16",
                  "--bootstrap-port", "8998", "--kv-events-endpoint", "tcp://w:5557", "--ttl", "4"},
                 o),
      "");
  EXPECT_EQ(worker_key(o.record.model, o.record.id), "/kvgate/v1/workers/Qwen/Qwen3-8B/w-1");
  EXPECT_EQ(o.record.role, "prefill");
  EXPECT_EQ(o.record.dp_size, 2);
  EXPECT_EQ(o.record.page_size, 16);
  EXPECT_EQ(o.record.bootstrap_port, 8998);
  EXPECT_EQ(o.record.kv_events_endpoint, "tcp://w:5557");
  EXPECT_EQ(o.ttl_secs, 4);
}

TEST(RegisterArgs, ClearErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Case& c : {
           Case{{"--url", "http://w:1"}, "--etcd URL is required"},
           Case{{"--etcd", "http://e:1"}, "--url URL is required"},
           Case{{"--etcd", "https://e:1", "--url", "http://w:1"}, "not supported yet"},
           Case{{"--etcd", "http://e:1", "--url", "w:1"}, "--url: must be http://host:port"},
           Case{{"--etcd", "http://e:1", "--url", "http://w:1", "--role", "x"}, "choose one of"},
           Case{{"--etcd", "http://e:1", "--url", "http://w:1", "--ttl", "1"}, "--ttl"},
           Case{{"--etcd", "http://e:1", "--url", "http://w:1", "--dp-size", "0"}, "--dp-size"},
           Case{{"--etcd", "http://e:1", "--url", "http://w:1", "--id", "a/b"}, "--model/--id"},
           Case{
               {"--etcd", "http://e:1", "--url", "http://w:1", "--kv-events-endpoint", "tcp://*:1"},
               "--kv-events-endpoint: '*' is a bind address"},
           Case{{"--etcd", "http://e:1", "--url", "http://w"}, "--url: the port is missing"},
           Case{{"--etcd", "http://e:1", "--url", "http://w:1", "--bogus"},
                "unknown flag '--bogus'"},
           Case{{"--etcd", "http://e:1", "--url", "http://w:1", "extra"}, "unexpected argument"},
       }) {
    RegisterOptions o;
    std::string e = parse_args(c.args, o);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.args.back() << ": " << e;
  }
}

TEST(RegisterArgs, HelpReadsWell) {
  RegisterOptions o;
  bool help = false;
  std::string text;
  std::vector<std::string> args = {"--help"};
  ASSERT_EQ(parse_register_args(args, o, help, text), "");
  EXPECT_TRUE(help);
  for (const char* s : {"Usage: kvgate register --etcd URL --url URL", "--kv-events-endpoint",
                        "--ttl SECS", "SIGTERM", "/kvgate/v1/workers/", "Example:"}) {
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  }
}

}  // namespace
}  // namespace kvgate::discovery
