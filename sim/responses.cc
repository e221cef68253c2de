// sim/responses: see responses.h.
#include "sim/responses.h"

#include <charconv>
#include <cmath>

#include "util/json.h"

namespace kvgate::sim {
namespace {

void append_ids(std::string& out, std::span<const int32_t> ids) {
  out.push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(',');
    append_int(out, ids[i]);
  }
  out.push_back(']');
}

// {"type":"length","length":N} | {"type":"stop","matched":...} | {"type":"abort","message":...}
void append_generate_finish(std::string& out, const FinishReason* f) {
  if (!f) {
    out.append("null");
    return;
  }
  switch (f->kind) {
    case FinishReason::Kind::kLength:
      out.append(R"({"type":"length","length":)");
      append_int(out, f->length);
      break;
    case FinishReason::Kind::kStop:
      out.append(R"({"type":"stop","matched":)");
      if (f->matched_token >= 0) {
        append_int(out, f->matched_token);
      } else {
        json::append_string(out, f->matched_text);
      }
      break;
    case FinishReason::Kind::kAbort:
      // SGLang's FINISH_ABORT.to_json(): err_type None but for the scheduler's 400 aborts
      // (set_finish_with_abort: "BadRequestError").
      out.append(R"({"type":"abort","message":)");
      json::append_string(out, f->message);
      out.append(R"(,"status_code":)");
      if (f->status_code > 0) {
        append_int(out, f->status_code);
      } else {
        out.append("null");
      }
      out.append(R"(,"err_type":)");
      if (f->err_type.empty()) {
        out.append("null");
      } else {
        json::append_string(out, f->err_type);
      }
      break;
  }
  out.push_back('}');
}

std::string_view openai_finish(const FinishReason& f) {
  switch (f.kind) {
    case FinishReason::Kind::kLength:
      return "length";
    case FinishReason::Kind::kStop:
      return "stop";
    case FinishReason::Kind::kAbort:
      return "abort";
  }
  return "stop";
}

// "finish_reason":...,"matched_stop":...
void append_openai_finish(std::string& out, const FinishReason* f) {
  out.append(R"("finish_reason":)");
  if (!f) {
    out.append(R"(null,"matched_stop":null)");
    return;
  }
  json::append_string(out, openai_finish(*f));
  out.append(R"(,"matched_stop":)");
  if (f->kind != FinishReason::Kind::kStop) {
    out.append("null");
  } else if (f->matched_token >= 0) {
    append_int(out, f->matched_token);
  } else {
    json::append_string(out, f->matched_text);
  }
}

// {"id","object","created","model","choices":[
void append_openai_head(std::string& out, const OpenAIContext& c, std::string_view object) {
  out.append(R"({"id":)");
  json::append_string(out, c.id);
  out.append(R"(,"object":)");
  json::append_string(out, object);
  out.append(R"(,"created":)");
  append_int(out, c.created);
  out.append(R"(,"model":)");
  json::append_string(out, c.model);
  out.append(R"(,"choices":[)");
}

// "usage":{...}; details omitted (not null) when `omit_null_details`.
void append_usage(std::string& out, const OpenAIContext& c, std::span<const OutputView> outputs,
                  bool omit_null_details) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const auto& o : outputs) {
    prompt += o.prompt_tokens;
    completion += o.completion_tokens;
    cached += o.cached_tokens;
  }
  out.append(R"("usage":{"prompt_tokens":)");
  append_int(out, prompt);
  out.append(R"(,"total_tokens":)");
  append_int(out, prompt + completion);
  out.append(R"(,"completion_tokens":)");
  append_int(out, completion);
  if (c.cache_report && cached > 0) {
    out.append(R"(,"prompt_tokens_details":{"cached_tokens":)");
    append_int(out, cached);
    out.push_back('}');
  } else if (!omit_null_details) {
    out.append(R"(,"prompt_tokens_details":null)");
  }
  out.append(R"(,"reasoning_tokens":0})");
}

void append_metadata(std::string& out) {
  out.append(R"("metadata":{"weight_version":)");
  json::append_string(out, kWeightVersion);
  out.push_back('}');
}

void append_stream_choice_tail(std::string& out, const FinishReason* f) {
  out.append(R"(,"logprobs":null,)");
  append_openai_finish(out, f);
  out.append("}]}");
}

}  // namespace

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<size_t>(end - buf));
}

void append_double(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out.append("null");
    return;
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, static_cast<size_t>(end - buf));
  if (std::string_view(buf, static_cast<size_t>(end - buf)).find_first_of(".eE") ==
      std::string_view::npos) {
    out.append(".0");  // keep it a float, as Python prints it
  }
}

void append_generate_object(std::string& out, const OutputView& o, int index) {
  out.append(R"({"text":)");
  json::append_string(out, o.text);
  out.append(R"(,"output_ids":)");
  append_ids(out, o.ids);
  out.append(R"(,"meta_info":{"id":)");
  json::append_string(out, o.id);
  out.append(R"(,"finish_reason":)");
  append_generate_finish(out, o.finish);
  out.append(R"(,"prompt_tokens":)");
  append_int(out, o.prompt_tokens);
  out.append(R"(,"weight_version":)");
  json::append_string(out, kWeightVersion);
  out.append(R"(,"total_retractions":0)");
  append_logprob_keys(out, o.logprobs);
  out.append(R"(,"completion_tokens":)");
  append_int(out, o.completion_tokens);
  out.append(R"(,"cached_tokens":)");
  append_int(out, o.cached_tokens);
  out.append(R"(,"cached_tokens_details":null,"dp_rank":)");
  if (o.dp_rank < 0) {
    out.append("null");
  } else {
    append_int(out, o.dp_rank);
  }
  if (o.e2e_latency >= 0) {
    out.append(R"(,"e2e_latency":)");
    append_double(out, o.e2e_latency);
  }
  out.push_back('}');
  if (index >= 0) {
    out.append(R"(,"index":)");
    append_int(out, index);
  }
  out.push_back('}');
}

void append_generate_error(std::string& out, std::string_view message) {
  out.append(R"({"error":{"message":)");
  json::append_string(out, message);
  out.append("}}");
}

void append_chat_completion(std::string& out, const OpenAIContext& c,
                            std::span<const OutputView> outputs) {
  append_openai_head(out, c, "chat.completion");
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) out.push_back(',');
    out.append(R"({"index":)");
    append_int(out, static_cast<int64_t>(i));
    out.append(R"(,"message":{"role":"assistant","content":)");
    json::append_string(out, outputs[i].text);
    out.append(R"(,"reasoning_content":null,"tool_calls":null},"logprobs":null,)");
    append_openai_finish(out, outputs[i].finish);
    out.push_back('}');
  }
  out.append("],");
  append_usage(out, c, outputs, false);
  out.push_back(',');
  append_metadata(out);
  out.push_back('}');
}

void append_completion(std::string& out, const OpenAIContext& c,
                       std::span<const OutputView> outputs) {
  append_openai_head(out, c, "text_completion");
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (i) out.push_back(',');
    out.append(R"({"index":)");
    append_int(out, static_cast<int64_t>(i));
    out.append(R"(,"text":)");
    json::append_string(out, outputs[i].text);
    out.append(R"(,"logprobs":null,)");
    append_openai_finish(out, outputs[i].finish);
    out.push_back('}');
  }
  out.append("],");
  append_usage(out, c, outputs, false);
  out.push_back(',');
  append_metadata(out);
  out.push_back('}');
}

void append_chat_role_chunk(std::string& out, const OpenAIContext& c, int index) {
  append_openai_head(out, c, "chat.completion.chunk");
  out.append(R"({"index":)");
  append_int(out, index);
  out.append(R"(,"delta":{"role":"assistant","content":""})");
  append_stream_choice_tail(out, nullptr);
}

void append_chat_content_chunk(std::string& out, const OpenAIContext& c, int index,
                               std::string_view delta) {
  append_openai_head(out, c, "chat.completion.chunk");
  out.append(R"({"index":)");
  append_int(out, index);
  out.append(R"(,"delta":{"content":)");
  json::append_string(out, delta);
  out.push_back('}');
  append_stream_choice_tail(out, nullptr);
}

void append_chat_finish_chunk(std::string& out, const OpenAIContext& c, int index,
                              const FinishReason& finish) {
  append_openai_head(out, c, "chat.completion.chunk");
  out.append(R"({"index":)");
  append_int(out, index);
  out.append(R"(,"delta":{})");
  append_stream_choice_tail(out, &finish);
}

void append_completion_chunk(std::string& out, const OpenAIContext& c, int index,
                             std::string_view delta, const FinishReason* finish) {
  append_openai_head(out, c, "text_completion");
  out.append(R"({"index":)");
  append_int(out, index);
  out.append(R"(,"text":)");
  json::append_string(out, delta);
  out.append(R"(,"logprobs":null,)");
  append_openai_finish(out, finish);
  out.append(R"(}],"usage":null})");
}

void append_usage_chunk(std::string& out, const OpenAIContext& c, bool chat,
                        std::span<const OutputView> outputs) {
  append_openai_head(out, c, chat ? "chat.completion.chunk" : "text_completion");
  out.append("],");
  append_usage(out, c, outputs, /*omit_null_details=*/!chat);
  out.push_back('}');
}

std::string_view openai_error_type(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 408:
      return "RequestTimeout";
    case 413:
      return "RequestEntityTooLarge";
    case 429:
      return "RateLimitError";
    case 503:
      return "ServiceUnavailable";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

void append_openai_error(std::string& out, std::string_view message, int status) {
  out.append(R"({"object":"error","message":)");
  json::append_string(out, message);
  out.append(R"(,"type":)");
  json::append_string(out, openai_error_type(status));
  out.append(R"(,"param":null,"code":)");
  append_int(out, status);
  out.push_back('}');
}

void append_openai_stream_error(std::string& out, std::string_view message, int status) {
  out.append(R"({"error":)");
  append_openai_error(out, message, status);
  out.push_back('}');
}

std::string_view http_status_name(int status) {
  switch (status) {
    case 400:
      return "BAD_REQUEST";
    case 404:
      return "NOT_FOUND";
    case 408:
      return "REQUEST_TIMEOUT";
    case 413:
      return "REQUEST_ENTITY_TOO_LARGE";
    case 429:
      return "TOO_MANY_REQUESTS";
    case 500:
      return "INTERNAL_SERVER_ERROR";
    case 502:
      return "BAD_GATEWAY";
    case 503:
      return "SERVICE_UNAVAILABLE";
    case 504:
      return "GATEWAY_TIMEOUT";
    default:
      return status >= 500 ? "INTERNAL_SERVER_ERROR" : "BAD_REQUEST";
  }
}

void append_openai_abort_event(std::string& out, std::string_view message, int status) {
  // Python's json.dumps: ", " and ": " separators (not orjson's compact output).
  out.append(R"({"error": {"object": "error", "message": )");
  json::append_string(out, message);
  out.append(R"(, "type": )");
  json::append_string(out, http_status_name(status));
  out.append(R"(, "param": null, "code": )");
  append_int(out, status);
  out.append("}}");
}

void append_http_exception_error(std::string& out, std::string_view message, int status) {
  out.append(R"({"object":"error","message":)");
  json::append_string(out, message);
  out.append(R"(,"type":")");
  append_int(out, status);
  out.append(R"(","param":null,"code":)");
  append_int(out, status);
  out.push_back('}');
}

}  // namespace kvgate::sim
