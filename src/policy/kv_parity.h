// policy/kv_parity: tokenizer parity between kvgate and an engine, measured on the engine's own
// KV events. kv_exact keys the pages of the token ids it computes (chat template + tokenizer);
// they match the engine's only when both produce the same ids. A probe chat, unique by its
// nonce and several pages long, is sent straight to one (endpoint, rank); the BlockStored events
// it causes carry the engine's ids. Equal ids: the probe's pages show up in the inventory under
// kvgate's own keys. Different ids (another chat template, a BOS token added or not, another
// tokenizer build): the event carrying the nonce is found and compared with kvgate's ids, and
// the first differing position is reported with both tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::tokenizer {
class Tokenizer;
class ChatTemplate;
}  // namespace kvgate::tokenizer

namespace kvgate::kv_parity {

struct Probe {
  std::string nonce;         // in the probe's text, to find its events again
  std::string body;          // the /v1/chat/completions body (max_tokens 1, the rank pinned)
  std::vector<int32_t> ids;  // kvgate's ids of the rendered probe
};

// Builds the probe for `page_size`-token pages: at least 4 full pages (at most ~2,000 tokens),
// the rank pinned (`dp_rank_field`: routed_dp_rank, or data_parallel_rank for older builds) when
// `dp_rank` >= 0. The nonce opens the message, so the probe's pages are its own from the first
// one that holds it (a warm engine holds nothing of it, whatever probes ran before). False with
// `error` when the template or tokenizer fails on it.
bool make_probe(const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& tmpl,
                size_t page_size, uint64_t nonce, int dp_rank, Probe& out, std::string& error,
                std::string_view dp_rank_field = "routed_dp_rank");

// A BlockStored seen on the probed (endpoint, rank) while the probe ran.
struct Stored {
  bool root = false;               // no parent: its tokens start the sequence
  std::optional<uint64_t> parent;  // the engine's id of the block before it
  std::vector<uint64_t> hashes;    // the engine's ids of its blocks
  std::vector<int32_t> tokens;
};

struct Verdict {
  enum Kind {
    kMatch,     // the engine's ids for the probe are kvgate's
    kMismatch,  // they differ at `position`
    kNotFound,  // no stored event carried the probe's text, or it could not be placed
  };
  Kind kind = kNotFound;
  size_t position = 0;             // first differing token (in the probe's ids)
  int32_t ours = -1, theirs = -1;  // the ids there (-1: that side ended first)
  std::string detail;              // one line for logs and the inventory view
};

// Judges the probe from the events captured on its (endpoint, rank). `matched_pages`: the leading
// pages of the probe's keys the inventory holds there (all of its full pages: a match).
Verdict judge(const Probe& probe, size_t page_size, size_t matched_pages,
              std::span<const Stored> captured, const tokenizer::Tokenizer& tok);

}  // namespace kvgate::kv_parity
