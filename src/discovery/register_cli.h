// discovery/register_cli: `kvgate register`, the sidecar that keeps one worker registered in etcd
// for as long as it runs: a lease, the worker's record under it (etcd.h), keepalives every third
// of the lease's TTL, and the lease revoked at SIGTERM/SIGINT so the key goes at once. When the
// sidecar dies without revoking, the lease expires and etcd removes the key after the TTL.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "discovery/etcd.h"

namespace kvgate::discovery {

struct RegisterOptions {
  std::string etcd;
  WorkerRecord record;  // model, id and the value's fields
  int64_t ttl_secs = 10;
};

// Parses the arguments after "register". "" (options filled; `help` set when --help asked for
// the help text, which `help_text` then holds) or an error naming the flag and the fix.
std::string parse_register_args(std::span<const std::string> args, RegisterOptions& out, bool& help,
                                std::string& help_text);

// `kvgate register ...`: argv holds the arguments after "register". Returns the exit status: 0
// after a signal (lease revoked), 2 on a usage error.
int register_main(int argc, char** argv);

}  // namespace kvgate::discovery
