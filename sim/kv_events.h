// sim/kv_events: the sim's side of KV events. Parses --kv-events-config (SGLang's KVEventsConfig
// JSON), derives each DP rank's endpoints (port base + rank), writes the `kv_events` descriptor of
// /server_info, and publishes one rank's event batches through a kv::Publisher in the configured
// wire format.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kv/events.h"
#include "kv/publisher.h"

namespace kvgate::sim {

struct KvEventsSettings {
  std::string publisher = "null";  // "zmq" publishes; "null" is SGLang's disabled publisher
  std::string endpoint = "tcp://*:5557";
  std::string replay_endpoint;    // "" = no replay socket
  std::string snapshot_endpoint;  // "" = no snapshot socket (and no epoch in the topic)
  std::string topic;
  int64_t buffer_steps = 10000;
  int64_t hwm = 100000;
  int64_t max_queue_size = 100000;  // accepted (SGLang's queue before its publisher thread)
  bool enabled() const { return publisher == "zmq"; }
};

// Parses the JSON of --kv-events-config into `out`. Returns "" or an error naming the problem.
std::string parse_kv_events_config(std::string_view json, KvEventsSettings& out);
// Checks that every DP rank's endpoints are valid (ports base..base+dp_size-1 within range, the
// PUB and replay ranges disjoint). Returns "" or the error.
std::string check_kv_events(const KvEventsSettings& s, int64_t dp_size);

// "tcp://HOST:PORT" -> host ("*" stays "*") and port. False for anything else.
bool split_tcp_endpoint(std::string_view endpoint, std::string& host, int64_t& port);

// The `kv_events` object of /server_info (newer SGLang builds):
// {"publisher","endpoint_host","endpoint_port_base","topic","block_size","dp_size"
//  [,"replay_endpoint_port_base"]}, or "null" when events are off. "topic" is the configured topic,
// without the epoch a snapshot endpoint adds to the live topic frame (SGLang's
// describe_kv_events_publisher reports cfg.topic; subscribers filter by prefix).
std::string kv_events_descriptor(const KvEventsSettings& s, int64_t page_size, int64_t dp_size);

// One DP rank's publisher: batches of events become msgpack payloads in `format`, sent with the
// rank's sequence numbers. Thread-safe (kv::Publisher is).
class RankEventSink {
 public:
  RankEventSink(std::unique_ptr<kv::Publisher> publisher, kv::WireFormat format, int dp_rank);
  // Publishes `events` as one batch stamped now. Nothing is sent for an empty list.
  void publish(std::vector<kv::Event> events);
  kv::WireFormat format() const { return format_; }
  // Batches (= the next sequence number) and events published so far.
  uint64_t published() const { return publisher_->published(); }
  uint64_t events_published() const { return events_.load(std::memory_order_relaxed); }

 private:
  std::unique_ptr<kv::Publisher> publisher_;
  std::atomic<uint64_t> events_{0};
  kv::WireFormat format_;
  int dp_rank_;
};

// Opens one publisher per DP rank. Returns "" or the error naming the endpoint that failed.
std::string open_rank_sinks(const KvEventsSettings& s, int64_t dp_size, kv::WireFormat format,
                            std::vector<std::unique_ptr<RankEventSink>>& out);

}  // namespace kvgate::sim
