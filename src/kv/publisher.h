// kv/publisher: a KV event publisher on ZeroMQ, as SGLang's and vLLM's ZmqEventPublisher behave on
// the wire. A PUB socket sends each batch as [topic, sequence (8 bytes big-endian, from 0),
// payload]; an optional ROUTER socket answers replay requests [identity, "", start_seq] with every
// buffered batch from start_seq as [identity, "", seq, payload], then [identity, "", -1, ""]. One
// publisher per data-parallel rank, its endpoints offset by the rank (offset_endpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kvgate::kv {

struct PublisherOptions {
  std::string endpoint;         // PUB endpoint of this rank (already offset)
  std::string replay_endpoint;  // ROUTER endpoint of this rank; "" = no replay
  std::string topic;
  size_t buffer_steps = 10000;  // batches kept for replay
  int hwm = 100000;             // PUB send high-water mark
};

// SGLang's offset_endpoint_port: "tcp://host:P" -> "tcp://host:P+rank"; "inproc://x" ->
// "inproc://x_dp<rank>"; rank 0 returns the endpoint unchanged. False (with `error`) for a tcp
// endpoint without a numeric port, a port past 65535, or another transport with rank > 0.
bool offset_endpoint(std::string_view endpoint, int rank, std::string& out, std::string& error);
// The engines' heuristic: bind when the endpoint holds "*" or "::" or is ipc/inproc, else connect.
bool endpoint_binds(std::string_view endpoint);

class Publisher {
 public:
  // Opens (binds or connects) the sockets. nullptr with `error` naming the endpoint on failure.
  static std::unique_ptr<Publisher> create(const PublisherOptions& options, std::string& error);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Sends one batch payload with the next sequence number (returned) and keeps it for replay.
  // Thread-safe; never blocks (PUB drops messages past the high-water mark, as the engines do).
  uint64_t publish(std::string payload);
  // Batches published so far (= the next sequence number).
  uint64_t published() const;
  const PublisherOptions& options() const { return options_; }

  struct Impl;

 private:
  explicit Publisher(PublisherOptions options);
  PublisherOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvgate::kv
