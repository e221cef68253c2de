// sim/stream_writer: see stream_writer.h.
#include "sim/stream_writer.h"

#include "sim/openai_responses.h"

namespace kvgate::sim {

bool Track::update(const Tokenizer& tok) {
  size_t before = ids.size();
  bool was_finished = finished();
  seq->read(before, ids, p);
  size_t visible_end = ids.size();
  if (p.finish && p.finish->hides_last_token() && visible_end > before) --visible_end;
  for (size_t i = before; i < visible_end; ++i) tok.decode_token(ids[i], text);
  if (p.finish) e2e = std::chrono::duration<double>(p.finished_at - seq->arrival()).count();
  return ids.size() != before || finished() != was_finished;
}

OutputView Track::view() const {
  OutputView v{.id = id,
               .ids = ids,
               .text = text,
               .prompt_tokens = prompt_tokens,
               .completion_tokens = static_cast<int64_t>(ids.size()),
               .cached_tokens = p.cached_tokens,
               .dp_rank = dp_rank,
               .finish = p.finish ? &*p.finish : nullptr,
               .e2e_latency = finished() ? e2e : -1};
  if (logprobs.model) {
    v.logprobs = logprobs;
    v.logprobs.output = ids;
  }
  return v;
}

namespace {

class GenerateStream final : public StreamWriter {
 public:
  GenerateStream(bool incremental, bool batch) : incremental_(incremental), batch_(batch) {}
  void on_update(Track& t, int index, Emitter& em) override {
    if (t.p.finish && t.p.finish->kind == FinishReason::Kind::kAbort) {
      em.event([&](std::string& out) { append_generate_error(out, t.p.finish->message); });
      return;
    }
    OutputView v = t.view();
    if (incremental_) {
      // SGLang's _slice_streaming_output_meta_info cuts the output logprob lists the same way.
      v.ids = v.ids.subspan(t.sent_ids);
      v.text = v.text.substr(t.sent_text);
      v.logprobs.output_from = t.sent_ids;
    }
    em.event([&](std::string& out) { append_generate_object(out, v, batch_ ? index : -1); });
    t.sent_ids = t.ids.size();
    t.sent_text = t.text.size();
  }
  void on_end(std::vector<Track>&, Emitter&) override {}

 private:
  bool incremental_;
  bool batch_;
};

void emit_usage(const OpenAIContext& c, bool chat, const std::vector<Track>& tracks, Emitter& em) {
  std::vector<OutputView> views;
  views.reserve(tracks.size());
  for (const auto& t : tracks) views.push_back(t.view());
  em.event([&](std::string& out) { append_usage_chunk(out, c, chat, views); });
}

class ChatStream final : public StreamWriter {
 public:
  ChatStream(const OpenAIContext& c, bool include_usage) : c_(c), include_usage_(include_usage) {}
  void on_update(Track& t, int index, Emitter& em) override {
    if (!t.announced) {
      em.event([&](std::string& out) { append_chat_role_chunk(out, c_, index); });
      t.announced = true;
    }
    std::string_view delta = std::string_view(t.text).substr(t.sent_text);
    if (!delta.empty()) {
      em.event([&](std::string& out) { append_chat_content_chunk(out, c_, index, delta); });
    }
    t.sent_text = t.text.size();
  }
  void on_end(std::vector<Track>& tracks, Emitter& em) override {
    for (size_t i = 0; i < tracks.size(); ++i) {
      const FinishReason& f = *tracks[i].p.finish;
      if (f.kind == FinishReason::Kind::kAbort) {
        em.event([&](std::string& out) { append_openai_stream_error(out, f.message, 500); });
        return;
      }
      em.event(
          [&](std::string& out) { append_chat_finish_chunk(out, c_, static_cast<int>(i), f); });
    }
    if (include_usage_) emit_usage(c_, true, tracks, em);
  }

 private:
  const OpenAIContext& c_;
  bool include_usage_;
};

class CompletionStream final : public StreamWriter {
 public:
  CompletionStream(const OpenAIContext& c, bool include_usage)
      : c_(c), include_usage_(include_usage) {}
  void on_update(Track& t, int index, Emitter& em) override {
    const FinishReason* f = t.p.finish ? &*t.p.finish : nullptr;
    if (f && f->kind == FinishReason::Kind::kAbort) {
      em.event([&](std::string& out) { append_openai_stream_error(out, f->message, 500); });
      return;
    }
    std::string_view delta = std::string_view(t.text).substr(t.sent_text);
    if (delta.empty() && !f) return;
    em.event([&](std::string& out) { append_completion_chunk(out, c_, index, delta, f); });
    t.sent_text = t.text.size();
  }
  void on_end(std::vector<Track>& tracks, Emitter& em) override {
    if (include_usage_) emit_usage(c_, false, tracks, em);
  }

 private:
  const OpenAIContext& c_;
  bool include_usage_;
};

ResponseResult response_result(const Track& t, std::string_view message_id) {
  return ResponseResult{.message_id = message_id,
                        .text = t.text,
                        .prompt_tokens = t.prompt_tokens,
                        .completion_tokens = static_cast<int64_t>(t.ids.size()),
                        .cached_tokens = t.p.cached_tokens,
                        .finish = t.p.finish ? &*t.p.finish : nullptr};
}

// serving_responses' _responses_stream_generator_non_harmony for a plain text answer.
class ResponsesStream final : public StreamWriter {
 public:
  explicit ResponsesStream(const ResponsesContext& c) : c_(c) {}
  void on_start(Emitter& em) override {
    em.raw([&](std::string& out) { append_stream_start(out, c_); });
    seq_ = 2;
  }
  void on_update(Track& t, int, Emitter& em) override {
    std::string_view delta = std::string_view(t.text).substr(t.sent_text);
    if (delta.empty()) return;
    if (item_id_.empty()) {
      item_id_ = new_message_id();
      em.raw([&](std::string& out) { append_message_opened(out, item_id_, seq_); });
    }
    em.raw([&](std::string& out) { append_text_delta(out, item_id_, delta, seq_); });
    t.sent_text = t.text.size();
  }
  void on_end(std::vector<Track>& tracks, Emitter& em) override {
    const Track& t = tracks[0];
    const FinishReason* f = t.p.finish ? &*t.p.finish : nullptr;
    if (f && f->kind == FinishReason::Kind::kAbort && f->status_code > 0) {
      // An abort with a status is an exception in SGLang's stream: response.failed, no usage.
      int status = 0;
      std::string all;
      append_exception_failure(all, c_, f->status_code, f->message, true, status);
      // Only the terminal event: the stream has already started.
      const size_t end_of_start = all.find("event: response.failed");
      em.raw([&](std::string& out) { out.append(all, end_of_start); });
      return;
    }
    if (!item_id_.empty()) {
      em.raw([&](std::string& out) { append_message_closed(out, item_id_, t.text, seq_); });
    }
    ResponseResult r = response_result(t, item_id_);
    std::string stored;
    finish_response(stored, c_, r);
    em.raw([&](std::string& out) { append_stream_end(out, c_, r, seq_); });
  }
  bool sse_done() const override { return false; }

 private:
  const ResponsesContext& c_;
  std::string item_id_;
  int64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<StreamWriter> make_stream_writer(const ParsedRequest& req, const OpenAIContext& c,
                                                 bool incremental) {
  switch (req.route) {
    case Route::kGenerate:
      return std::make_unique<GenerateStream>(incremental, req.batch);
    case Route::kChatCompletions:
      return std::make_unique<ChatStream>(c, req.include_usage);
    case Route::kCompletions:
      return std::make_unique<CompletionStream>(c, req.include_usage);
    case Route::kResponses:
      return std::make_unique<ResponsesStream>(*req.responses);
  }
  return nullptr;
}

void append_whole(std::string& out, const ParsedRequest& req, const OpenAIContext& c,
                  std::span<const OutputView> views) {
  switch (req.route) {
    case Route::kGenerate:
      if (req.batch) out.push_back('[');
      for (size_t i = 0; i < views.size(); ++i) {
        if (i) out.push_back(',');
        append_generate_object(out, views[i]);
      }
      if (req.batch) out.push_back(']');
      break;
    case Route::kChatCompletions:
      append_chat_completion(out, c, views);
      break;
    case Route::kCompletions:
      append_completion(out, c, views);
      break;
    case Route::kResponses: {
      const OutputView& v = views[0];
      const std::string message_id = new_message_id();
      finish_response(out, *req.responses,
                      ResponseResult{.message_id = message_id,
                                     .text = v.text,
                                     .prompt_tokens = v.prompt_tokens,
                                     .completion_tokens = v.completion_tokens,
                                     .cached_tokens = v.cached_tokens,
                                     .finish = v.finish});
      break;
    }
  }
}

}  // namespace kvgate::sim
