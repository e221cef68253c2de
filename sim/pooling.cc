// sim/pooling: see pooling.h.
#include "sim/pooling.h"

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "sim/pseudo_text.h"
#include "sim/responses.h"
#include "util/json.h"

namespace kvgate::sim {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

int bad_request(std::string& out, std::string_view message) {
  out.clear();
  append_openai_error(out, message, 400);
  return 400;
}

std::string parse_object(std::string& body, object& o) {
  thread_local simdjson::dom::parser parser;
  element doc;
  if (auto err = parser.parse(body).get(doc)) {
    return std::string("malformed JSON body: ") + simdjson::error_message(err);
  }
  if (doc.get_object().get(o)) return "the request body must be a JSON object";
  return "";
}

// Inputs as token id lists: a string, a list of strings, a list of ids or a list of id lists.
std::string parse_inputs(const element& e, const Tokenizer& tok,
                         std::vector<std::vector<int32_t>>& out) {
  std::string_view s;
  if (!e.get_string().get(s)) {
    tok.encode(s, out.emplace_back());
    return "";
  }
  array a;
  if (e.get_array().get(a) || a.size() == 0) return "'input' must be a string or a non-empty list";
  int64_t id = 0;
  bool ids = a.at(0).get_int64().get(id) == simdjson::SUCCESS;
  if (ids) out.emplace_back();
  for (element item : a) {
    array inner;
    if (ids) {
      if (item.get_int64().get(id) || id < 0 || id >= tok.vocab_size()) {
        return "'input' holds an invalid token id";
      }
      out.back().push_back(static_cast<int32_t>(id));
    } else if (!item.get_string().get(s)) {
      tok.encode(s, out.emplace_back());
    } else if (!item.get_array().get(inner)) {
      auto& v = out.emplace_back();
      for (element t : inner) {
        if (t.get_int64().get(id) || id < 0 || id >= tok.vocab_size()) {
          return "'input' holds an invalid token id";
        }
        v.push_back(static_cast<int32_t>(id));
      }
    } else {
      return "'input' must be a string, a list of strings, or token ids";
    }
  }
  return "";
}

}  // namespace

void append_embedding(std::string& out, std::span<const int32_t> ids) {
  Rng rng(PseudoText::prompt_hash(ids, 0x656d62));
  double v[kEmbeddingDim], norm = 0;
  for (double& x : v) {
    x = rng.uniform() * 2 - 1;
    norm += x * x;
  }
  norm = std::sqrt(norm);
  out.push_back('[');
  for (size_t i = 0; i < kEmbeddingDim; ++i) {
    if (i) out.push_back(',');
    append_double(out, std::round(v[i] / norm * 1e6) / 1e6);
  }
  out.push_back(']');
}

namespace {

// |A ∩ B| / |A ∪ B| over the distinct token ids.
double overlap(std::vector<int32_t> a, std::vector<int32_t> b) {
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  std::vector<int32_t> common;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
  size_t all = a.size() + b.size() - common.size();
  return all == 0 ? 0 : static_cast<double>(common.size()) / static_cast<double>(all);
}

}  // namespace

int embeddings_response(std::string& body, const Tokenizer& tok, std::string& out) {
  object o;
  if (auto err = parse_object(body, o); !err.empty()) return bad_request(out, err);
  element input;
  if (o.at_key("input").get(input) || input.is_null())
    return bad_request(out, "'input' is required");
  std::vector<std::vector<int32_t>> inputs;
  if (auto err = parse_inputs(input, tok, inputs); !err.empty()) return bad_request(out, err);
  std::string_view model;
  if (o.at_key("model").get_string().get(model) != simdjson::SUCCESS) model = "default";
  int64_t tokens = 0;
  out.assign(R"({"data":[)");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) out.push_back(',');
    out.append(R"({"embedding":)");
    append_embedding(out, inputs[i]);
    out.append(R"(,"index":)");
    append_int(out, static_cast<int64_t>(i));
    out.append(R"(,"object":"embedding"})");
    tokens += static_cast<int64_t>(inputs[i].size());
  }
  out.append(R"(],"model":)");
  json::append_string(out, model);
  out.append(R"(,"object":"list","usage":{"prompt_tokens":)");
  append_int(out, tokens);
  out.append(R"(,"total_tokens":)");
  append_int(out, tokens);
  out.append(R"(,"completion_tokens":0,"prompt_tokens_details":null,"reasoning_tokens":0}})");
  return 200;
}

int rerank_response(std::string& body, const Tokenizer& tok, std::string& out) {
  object o;
  if (auto err = parse_object(body, o); !err.empty()) return bad_request(out, err);
  std::string_view query;
  array docs;
  if (o.at_key("query").get_string().get(query))
    return bad_request(out, "'query' must be a string");
  if (o.at_key("documents").get_array().get(docs)) {
    return bad_request(out, "'documents' must be a list of strings");
  }
  bool return_documents = true;
  if (bool b = true; o.at_key("return_documents").get_bool().get(b) == simdjson::SUCCESS) {
    return_documents = b;
  }
  int64_t top_n = static_cast<int64_t>(docs.size());
  if (int64_t n = 0; o.at_key("top_n").get_int64().get(n) == simdjson::SUCCESS) top_n = n;
  if (top_n < 1) return bad_request(out, "Value error, parameter top_n should be larger than 0.");
  std::vector<int32_t> q;
  tok.encode(query, q);
  struct Scored {
    double score;
    size_t index;
    std::string_view doc;
  };
  std::vector<Scored> scored;
  for (element d : docs) {
    std::string_view doc;
    if (d.get_string().get(doc)) return bad_request(out, "'documents' must be a list of strings");
    std::vector<int32_t> ids;
    tok.encode(doc, ids);
    scored.push_back({overlap(q, std::move(ids)), scored.size(), doc});
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const Scored& a, const Scored& b) { return a.score > b.score; });
  scored.resize(std::min(scored.size(), static_cast<size_t>(top_n)));
  out.assign("[");
  for (size_t i = 0; i < scored.size(); ++i) {
    if (i) out.push_back(',');
    out.append(R"({"score":)");
    append_double(out, scored[i].score);
    if (return_documents) {
      out.append(R"(,"document":)");
      json::append_string(out, scored[i].doc);
    }
    out.append(R"(,"index":)");
    append_int(out, static_cast<int64_t>(scored[i].index));
    out.append(R"(,"meta_info":null})");
  }
  out.push_back(']');
  return 200;
}

}  // namespace kvgate::sim
