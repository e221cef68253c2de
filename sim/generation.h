// sim/generation: the generation routes (/generate, /v1/completions, /v1/chat/completions, and
// /v1/responses through sim/openai_responses)
// for one HTTP exchange: parse the body, apply injected faults, then either answer at once
// (--instant) or submit the prompts to the Engine and relay their progress as one JSON answer or
// as SSE events in SGLang's shapes. A client disconnect cancels the request's sequences; so does
// /abort_request with one of the request's rids. On a PD decode server a request first waits for
// its prompt's KV from the prefill server (sim/pd.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "http/server.h"
#include "sim/abort.h"
#include "sim/chat_template.h"
#include "sim/config.h"
#include "sim/engine.h"
#include "sim/faults.h"
#include "sim/openai_responses.h"
#include "sim/pd.h"
#include "sim/request.h"
#include "sim/responses.h"

namespace kvgate::sim {

// The short fixed completion of --instant: kWords tokens of pseudo-text, then EOS.
struct InstantCompletion {
  static constexpr size_t kWords = 8;
  std::vector<int32_t> ids;      // kWords word tokens + EOS
  std::vector<size_t> text_end;  // visible text length after i tokens (i = 0..kWords)
  std::string text;
};
InstantCompletion make_instant_completion(const PseudoText& model, const Tokenizer& tokenizer);

// The instant completion cut to a request's max_new_tokens: its word tokens, plus EOS when the
// completion ended by itself (finish "stop"), else finish "length".
struct InstantShape {
  size_t words;
  size_t total;
  FinishReason finish;
};

class Emitter;

class GenerationHandler {
 public:
  GenerationHandler(const SimConfig& config, Engine& engine, FaultInjector& faults,
                    const ChatTemplate& chat_template);
  awaitable<void> handle(http::Exchange& ex, Route route);
  // SGLang's /abort_request: ends the requests in flight with that rid (all with abort_all).
  size_t abort(std::string_view rid, bool abort_all) { return registry_.abort(rid, abort_all); }
  // GET /v1/responses/{id} and POST /v1/responses/{id}/cancel (sim/openai_responses).
  ResponsesError retrieve(std::string_view id) const {
    return retrieve_response(id, config_.enable_response_store, response_store_);
  }
  ResponsesError cancel(std::string_view id) const {
    return cancel_response(id, config_.enable_response_store, response_store_);
  }

 private:
  // Timed generation through the engine. `drop_after`: a drop fault (events before the cut).
  awaitable<void> run(http::Exchange& ex, ParsedRequest req, std::optional<int64_t> drop_after);
  // --instant: the fixed completion at once, with the same shapes and events.
  awaitable<void> answer_instant(http::Exchange& ex, const ParsedRequest& req,
                                 std::optional<int64_t> drop_after);
  void instant_outputs(const ParsedRequest& req, const InstantShape& shape,
                       std::vector<std::string>& ids, std::vector<OutputView>& views);
  void instant_events(const ParsedRequest& req, const OpenAIContext& c,
                      std::span<const OutputView> views, const InstantShape& shape, Emitter& em);

  const SimConfig& config_;
  Engine& engine_;
  FaultInjector& faults_;
  const ChatTemplate& chat_template_;
  RequestLimits limits_;
  InstantCompletion instant_;
  std::vector<std::string> lora_adapters_;  // --lora-paths names
  RequestRegistry registry_;                // requests in flight, by rid (/abort_request)
  PrefillInfoTable prefill_infos_;          // PD decode: what each prefill server reported
  ResponseStore response_store_;            // /v1/responses with --enable-response-store
  ResponsesOptions responses_options_;
};

// Error answers in the shape of each route (OpenAI flat error, or /generate's {"error":{}}).
awaitable<void> respond_error(http::Exchange& ex, Route route, int status,
                              std::string_view message);

}  // namespace kvgate::sim
