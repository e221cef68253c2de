// gateway/stream_check: see stream_check.h.
#include "gateway/stream_check.h"

#include <simdjson.h>

namespace kvgate {
namespace {

bool is_abort_reason(simdjson::dom::element reason, StreamAbort& out) {
  std::string_view s;
  out.finish_abort = true;
  if (!reason.get_string().get(s)) return s == "abort";
  simdjson::dom::object o;
  if (reason.get_object().get(o)) return false;
  std::string_view type;
  if (o["type"].get_string().get(type) || type != "abort") return false;
  std::string_view msg;
  if (!o["message"].get_string().get(msg)) out.message = std::string(msg);
  int64_t code = 0;
  if (!o["status_code"].get_int64().get(code)) out.status = static_cast<int>(code);
  return true;
}

}  // namespace

std::string event_data(std::string_view event) {
  std::string data;
  bool first = true;
  while (!event.empty()) {
    size_t eol = event.find('\n');
    std::string_view line = event.substr(0, eol);
    event = eol == std::string_view::npos ? std::string_view{} : event.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.starts_with("data:")) continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (!first) data.push_back('\n');
    data.append(line);
    first = false;
  }
  return data;
}

std::optional<size_t> first_event_end(std::string_view buf) {
  for (size_t i = 0; i + 1 < buf.size(); ++i) {
    if (buf[i] != '\n') continue;
    if (buf[i + 1] == '\n') return i + 2;
    if (buf[i + 1] == '\r' && i + 2 < buf.size() && buf[i + 2] == '\n') return i + 3;
  }
  return std::nullopt;
}

std::optional<StreamAbort> event_abort(std::string_view event) {
  std::string data = event_data(event);
  if (data.empty() || data.front() != '{') return std::nullopt;
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(data).get(doc)) return std::nullopt;
  simdjson::dom::object o;
  if (doc.get_object().get(o)) return std::nullopt;
  StreamAbort out;
  simdjson::dom::element err;
  if (!o["error"].get(err) && !err.is_null()) {
    simdjson::dom::object eo;
    std::string_view msg;
    if (!err.get_object().get(eo)) {
      if (!eo["message"].get_string().get(msg)) out.message = std::string(msg);
      int64_t code = 0;
      if (!eo["code"].get_int64().get(code)) out.status = static_cast<int>(code);
    } else if (!err.get_string().get(msg)) {
      out.message = std::string(msg);
    }
    return out;
  }
  simdjson::dom::element reason;
  if (!o["meta_info"]["finish_reason"].get(reason) && is_abort_reason(reason, out)) return out;
  simdjson::dom::array choices;
  if (!o["choices"].get_array().get(choices)) {
    for (auto c : choices) {
      if (!c["finish_reason"].get(reason) && is_abort_reason(reason, out)) return out;
    }
  }
  return std::nullopt;
}

int abort_status(const StreamAbort& a) {
  return a.status == 0 && a.finish_abort ? 503 : a.status;
}

bool request_error_status(int status) {
  return status == 0 || (status >= 400 && status < 500 && status != 408 && status != 429);
}

bool kv_transfer_failure(std::string_view message) {
  return message.find("KVTransferError") != std::string_view::npos ||
         message.find("Decode transfer failed") != std::string_view::npos ||
         message.find("Decode handshake failed") != std::string_view::npos;
}

}  // namespace kvgate
