// request/body_rewrite: see body_rewrite.h.
#include "request/body_rewrite.h"

#include "util/json.h"

namespace kvgate {

std::string add_fields(std::string_view body, std::span<const BodyField> fields) {
  size_t end = body.size();
  while (end > 0 && (body[end - 1] == ' ' || body[end - 1] == '\t' || body[end - 1] == '\n' ||
                     body[end - 1] == '\r')) {
    --end;
  }
  if (end == 0 || body[end - 1] != '}') return "";
  size_t close = end - 1;
  // Whether the object has members: anything but whitespace between '{' and '}'. The body is a
  // parsed object, so its first non-space byte is '{'.
  size_t open = body.find('{');
  bool empty = true;
  for (size_t i = open + 1; i < close; ++i) {
    char c = body[i];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
      empty = false;
      break;
    }
  }
  std::string out;
  size_t extra = 0;
  for (const auto& f : fields) extra += f.name.size() + f.value.size() + 8;
  out.reserve(body.size() + extra);
  out.append(body.substr(0, close));
  for (const auto& f : fields) {
    if (!empty) out.push_back(',');
    empty = false;
    json::append_string(out, f.name);
    out.push_back(':');
    out.append(f.value);
  }
  out.append(body.substr(close));
  return out;
}

}  // namespace kvgate
