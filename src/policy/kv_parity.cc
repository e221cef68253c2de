// policy/kv_parity: see kv_parity.h.
#include "policy/kv_parity.h"

#include <algorithm>
#include <cstdio>
#include <string_view>
#include <unordered_map>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/json.h"

namespace kvgate::kv_parity {
namespace {

// Text that exercises what tokenizers and templates disagree on: digits, runs of spaces,
// punctuation, accents, CJK, emoji, a newline.
constexpr const char* kFiller[] = {
    "The gateway routes each request to the server that already holds its prefix.",
    " Order #48213 shipped on 2024-03-17 for $1,299.99 (3 items).",
    "  Two  spaces, a tab\tand café, naïve, Zürich.",
    " 東京の天気は晴れです。人工智能正在改变世界。",
    " Emoji: 🎉 👍🏽 and symbols <> {} [] \\ / | ~ ^.",
    "\nfor (int i = 0; i < n; ++i) sum += v[i];",
};

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A token as text for a log line (its bytes, control characters escaped).
std::string show(const tokenizer::Tokenizer& tok, int32_t id) {
  if (id < 0) return "(end)";
  std::string text = tok.decode(std::span<const int32_t>(&id, 1));
  std::string out = std::to_string(id) + " '";
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20) {
      out += '?';
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

}  // namespace

bool make_probe(const tokenizer::Tokenizer& tok, const tokenizer::ChatTemplate& tmpl,
                size_t page_size, uint64_t nonce, int dp_rank, Probe& out, std::string& error,
                std::string_view dp_rank_field) {
  out = Probe{};
  // The random part opens the message: no page holding any of it can be cached already.
  out.nonce = hex16(nonce);
  const size_t want = std::max<size_t>(4 * std::max<size_t>(page_size, 1), 64);
  std::string text = out.nonce + ": a kvgate tokenizer parity probe. Please answer with one word.";
  std::string rendered;
  for (size_t round = 0; round < 64; ++round) {
    std::string messages = "[{\"role\":\"user\",\"content\":";
    json::append_string(messages, text);
    messages += "}]";
    rendered.clear();
    if (!tmpl.render_request_json(messages, "", true, "", rendered, error)) {
      error.insert(0, "the chat template rejected the probe: ");
      return false;
    }
    out.ids.clear();
    if (!tok.encode(rendered, false, out.ids)) {
      error = "the tokenizer failed on the probe";
      return false;
    }
    if (out.ids.size() >= want || out.ids.size() >= 2048) {
      out.body =
          "{\"messages\":" + messages + ",\"max_tokens\":1,\"temperature\":0,\"stream\":false";
      if (dp_rank >= 0) {
        out.body += ',';
        json::append_string(out.body, dp_rank_field);
        out.body += ':' + std::to_string(dp_rank);
      }
      out.body += "}";
      return true;
    }
    text += kFiller[round % std::size(kFiller)];
  }
  error = "the probe stays shorter than " + std::to_string(want) + " tokens";
  return false;
}

Verdict judge(const Probe& probe, size_t page_size, size_t matched_pages,
              std::span<const Stored> captured, const tokenizer::Tokenizer& tok) {
  Verdict v;
  const size_t page = std::max<size_t>(page_size, 1);
  const size_t full = probe.ids.size() / page;
  if (full > 0 && matched_pages >= full) {
    v.kind = Verdict::kMatch;
    v.detail = "the engine cached all " + std::to_string(full) +
               " pages of the probe under kvgate's keys: same token ids";
    return v;
  }
  // Chains of the captured stores (a store continues the one whose last block is its parent):
  // the probe's tokens may come in one merged event or one event per page.
  std::unordered_map<uint64_t, size_t> by_last;  // last block id -> event index
  for (size_t i = 0; i < captured.size(); ++i) {
    if (!captured[i].hashes.empty()) by_last.emplace(captured[i].hashes.back(), i);
  }
  std::vector<bool> continues(captured.size(), false);
  std::unordered_map<size_t, size_t> next;  // event -> the event continuing it
  for (size_t i = 0; i < captured.size(); ++i) {
    if (!captured[i].parent) continue;
    auto it = by_last.find(*captured[i].parent);
    if (it == by_last.end() || it->second == i) continue;
    continues[i] = true;
    next.emplace(it->second, i);
  }
  for (size_t head = 0; head < captured.size(); ++head) {
    if (continues[head]) continue;
    std::vector<int32_t> tokens;
    size_t guard = 0;
    for (size_t i = head;; ++guard) {
      tokens.insert(tokens.end(), captured[i].tokens.begin(), captured[i].tokens.end());
      auto it = next.find(i);
      if (it == next.end() || guard > captured.size()) break;
      i = it->second;
    }
    if (tok.decode(tokens).find(probe.nonce) == std::string::npos) continue;
    // Where the probe's stores start: a chain under the root at token 0; one under a parent the
    // engine already held (the template's start; kvgate may not know it: a restarted kvgate, a
    // pruned inventory) at the page after the pages kvgate's keys matched when they did, else
    // at the page boundary where the two agree longest.
    auto agree = [&](size_t offset) {
      size_t i = 0;
      while (offset + i < probe.ids.size() && i < tokens.size() &&
             probe.ids[offset + i] == tokens[i]) {
        ++i;
      }
      return i;
    };
    // Equal ids: the engine's chain agrees up to the end of the probe's full pages (it stores
    // whole pages only, and may store the answer's after them).
    auto equal = [&](size_t offset, size_t i) { return offset + i >= full * page; };
    size_t offset = 0, i = agree(0);
    const bool placed = captured[head].root || matched_pages > 0;
    if (!captured[head].root) {
      offset = matched_pages * page;
      i = agree(offset);
    }
    if (!placed) {
      for (size_t k = 1; k * page < probe.ids.size() && !equal(offset, i); ++k) {
        size_t j = agree(k * page);
        if (j > i) {
          offset = k * page;
          i = j;
        }
      }
      if (!equal(offset, i) && i < page) {
        // No page boundary lines the two up. At another offset the engine's prompt before the
        // probe's text has another length (a BOS token, a default system prompt): a mismatch.
        // The longest run of equal ids starting at kvgate's token o and the engine's token t,
        // one of them 0 (bounded: the probe is at most ~2,000 tokens, captures 256K).
        auto run = [&](size_t o, size_t t) {
          size_t j = 0;
          while (o + j < probe.ids.size() && t + j < tokens.size() &&
                 probe.ids[o + j] == tokens[t + j]) {
            ++j;
          }
          return j;
        };
        size_t best_o = 0, best_t = 0, best = 0;
        for (size_t o = 0; o < probe.ids.size(); ++o) {
          if (size_t j = run(o, 0); j > best) {
            best = j;
            best_o = o;
            best_t = 0;
          }
        }
        for (size_t t = 1; t < std::min<size_t>(tokens.size(), 4 * probe.ids.size()); ++t) {
          if (size_t j = run(0, t); j > best) {
            best = j;
            best_o = 0;
            best_t = t;
          }
        }
        v.kind = Verdict::kNotFound;
        v.detail =
            "the engine's stores for the probe continue a prefix kvgate has not seen and agree "
            "with kvgate's ids at no page boundary";
        if (best >= page) {
          v.kind = Verdict::kMismatch;
          v.position = best_o;
          v.ours = probe.ids[best_o];
          v.theirs = tokens[best_t];
          v.detail =
              "the engine's token ids line up with kvgate's only off a page boundary (kvgate's "
              "token " +
              std::to_string(best_o) + " is the engine's " + std::to_string(best_t) +
              " tokens into its stores): the prompt before the probe's text has another length "
              "(a BOS token, a default system prompt, another chat template); set the rule's "
              "tokenizerPath to the served model's directory";
        }
        return v;
      }
    }
    if (equal(offset, i)) {
      v.kind = Verdict::kMatch;
      v.detail = "the engine's ids for the probe are kvgate's (" + std::to_string(tokens.size()) +
                 " tokens compared from token " + std::to_string(offset) + ")";
      return v;
    }
    if (i == tokens.size()) {
      // Agreeing as far as the engine's chain goes, which ends early: events missed.
      v.kind = Verdict::kNotFound;
      v.detail = "the engine's stores for the probe agree with kvgate's ids but end at token " +
                 std::to_string(offset + i) + " of " + std::to_string(full * page) +
                 " (events missed?)";
      return v;
    }
    v.kind = Verdict::kMismatch;
    v.position = offset + i;
    v.ours = probe.ids[v.position];
    v.theirs = tokens[i];
    v.detail = "the engine's token ids differ from kvgate's at token " +
               std::to_string(v.position) + " of the probe: kvgate " + show(tok, v.ours) +
               ", the engine " + show(tok, v.theirs) +
               (v.position == 0 ? " (a BOS token or the start of the chat template differs)"
                                : " (the chat template, special tokens or tokenizer differ)") +
               "; set the rule's tokenizerPath to the served model's directory";
    return v;
  }
  v.kind = Verdict::kNotFound;
  v.detail = "no stored event carried the probe (" + probe.nonce + ", " +
             std::to_string(captured.size()) +
             " stores seen): its events did not arrive, or the engine's tokenizer is another "
             "vocabulary (its ids do not decode to the probe's text with kvgate's tokenizer)";
  return v;
}

}  // namespace kvgate::kv_parity
