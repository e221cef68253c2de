// sim/stream_writer: how a request's progress becomes response bytes. Track is the consumer's
// view of one generation (tokens and visible text read so far, what a stream already carried);
// StreamWriter turns track updates into each route's SSE events (SGLang's sequence: /generate
// chunks, chat role/content/finish/usage chunks, completion chunks); Emitter frames the events and
// applies the drop-after-K fault; append_whole writes a non-stream answer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sim/request.h"
#include "sim/responses.h"
#include "sim/sequence.h"

namespace kvgate::sim {

struct Track {
  std::shared_ptr<Sequence> seq;  // null for --instant answers
  std::string id;
  int64_t prompt_tokens = 0;
  int dp_rank = 0;
  std::vector<int32_t> ids;
  std::string text;
  Progress p;
  double e2e = -1;
  size_t sent_ids = 0;
  size_t sent_text = 0;
  bool announced = false;  // chat: the role chunk went out
  // /generate with return_logprob: the model, the request's parameters, its prompt and PD role
  // (model null: no logprobs). view() adds the output so far.
  LogprobRows logprobs;

  bool finished() const { return p.finish.has_value(); }
  // Reads the sequence's progress; true when tokens arrived or it finished. A matched stop token
  // counts as output but never reaches the text.
  bool update(const Tokenizer& tok);
  OutputView view() const;
};

// The SSE events of one response; with a drop fault, takes no event after the K-th.
class Emitter {
 public:
  explicit Emitter(std::optional<int64_t> drop_after)
      : drop_after_(drop_after), cut_(drop_after && *drop_after <= 0) {}
  template <class Fn>
  void event(Fn&& fn) {
    if (cut_) return;
    append_sse(buf_, fn);
    if (drop_after_ && ++events_ >= *drop_after_) cut_ = true;
  }
  // An event framed by `fn` itself (/v1/responses: "event: T\ndata: ...\n\n").
  template <class Fn>
  void raw(Fn&& fn) {
    if (cut_) return;
    fn(buf_);
    if (drop_after_ && ++events_ >= *drop_after_) cut_ = true;
  }
  void done() {
    event([](std::string& out) { out.append("[DONE]"); });
  }
  bool cut() const { return cut_; }
  std::string& buffer() { return buf_; }

 private:
  std::optional<int64_t> drop_after_;
  bool cut_;
  int64_t events_ = 0;
  std::string buf_;
};

class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // Before any output (/v1/responses: response.created and response.in_progress).
  virtual void on_start(Emitter&) {}
  // Track `index` moved (new tokens or its finish).
  virtual void on_update(Track& t, int index, Emitter& em) = 0;
  // Every track finished; called once, before [DONE].
  virtual void on_end(std::vector<Track>& tracks, Emitter& em) = 0;
  // Whether the stream ends with "data: [DONE]" (not /v1/responses).
  virtual bool sse_done() const { return true; }
};

// The writer of `req`'s route. `c` must outlive it.
std::unique_ptr<StreamWriter> make_stream_writer(const ParsedRequest& req, const OpenAIContext& c,
                                                 bool incremental_streaming_output);

// The whole (non-stream) answer of `req`'s route: a /generate object (an array for a batch), an
// OpenAI response with one choice per output, or a Response object (/v1/responses; stored when
// the request asked).
void append_whole(std::string& out, const ParsedRequest& req, const OpenAIContext& c,
                  std::span<const OutputView> views);

}  // namespace kvgate::sim
