// kv/publisher: a KV event publisher on ZeroMQ, as SGLang's and vLLM's ZmqEventPublisher behave on
// the wire. A PUB socket sends each batch as [topic, sequence (8 bytes big-endian, from 0),
// payload]; an optional ROUTER socket answers replay requests [identity, "", start_seq] with every
// buffered batch from start_seq as [identity, "", seq, payload], then [identity, "", -1, ""]. One
// publisher per data-parallel rank, its endpoints offset by the rank (offset_endpoint).
//
// Placement snapshots (SGLang's snapshot_endpoint, disaggregation/kv_events.py): with a snapshot
// endpoint the live topic becomes topic + "\0sgl-kv-epoch=" + epoch (a uuid4 hex per publisher,
// i.e. per DP rank and lifetime), and a second ROUTER answers [identity, "", "snapshot-v1"] with a
// barrier batch on the PUB socket (an empty batch whose topic adds "\0sgl-kv-snapshot=" + barrier
// id, taking the next sequence number), then [identity, "", "header", msgpack [version 1, epoch,
// replica_rank, resume_seq, barrier_seq, barrier_id, record_count]], [identity, "", "chunk",
// msgpack [[parent_block_hash, [block_hash]], ...]] per 4096 blocks, and [identity, "", "end", ""];
// a bad request gets [identity, "", "error", message].
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kv/events.h"

namespace kvgate::kv {

struct PublisherOptions {
  std::string endpoint;           // PUB endpoint of this rank (already offset)
  std::string replay_endpoint;    // ROUTER endpoint of this rank; "" = no replay
  std::string snapshot_endpoint;  // ROUTER endpoint of this rank; "" = no snapshots
  std::string topic;
  std::string epoch;            // with snapshots: "" = a fresh uuid4 hex
  int dp_rank = 0;              // the rank's number in snapshot headers and barrier batches
  size_t buffer_steps = 10000;  // batches kept for replay
  int hwm = 100000;             // PUB send high-water mark
};

// SGLang's live topic of a snapshot-capable publisher: topic + "\0sgl-kv-epoch=" + epoch.
std::string epoch_topic(std::string_view topic, std::string_view epoch);
// A uuid4 as 32 lowercase hex digits (Python's uuid.uuid4().hex).
std::string uuid4_hex();

// SGLang's offset_endpoint_port: "tcp://host:P" -> "tcp://host:P+rank"; "inproc://x" ->
// "inproc://x_dp<rank>"; rank 0 returns the endpoint unchanged. False (with `error`) for a tcp
// endpoint without a numeric port, a port past 65535, or another transport with rank > 0.
bool offset_endpoint(std::string_view endpoint, int rank, std::string& out, std::string& error);
// The engines' heuristic: bind when the endpoint holds "*", "::" or "0.0.0.0" (SGLang binds the
// IPv4 wildcard too, as /server_info advertises it) or is ipc/inproc, else connect.
bool endpoint_binds(std::string_view endpoint);

class Publisher {
 public:
  // Opens (binds or connects) the sockets. nullptr with `error` naming the endpoint on failure.
  static std::unique_ptr<Publisher> create(const PublisherOptions& options, std::string& error);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Sends one batch payload with the next sequence number (returned) and keeps it for replay.
  // `events` are the batch's events, which keep the snapshot's placement view (needed only with a
  // snapshot endpoint). Thread-safe; never blocks (PUB drops messages past the high-water mark, as
  // the engines do).
  uint64_t publish(std::string payload, std::span<const Event> events = {});
  // Batches published so far (= the next sequence number).
  uint64_t published() const;
  const PublisherOptions& options() const { return options_; }
  // The topic frame of live batches (the topic, plus the epoch with a snapshot endpoint).
  const std::string& live_topic() const;

  struct Impl;

 private:
  explicit Publisher(PublisherOptions options);
  PublisherOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::kv
