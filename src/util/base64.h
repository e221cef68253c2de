// util/base64: RFC 4648 base64, standard alphabet (etcd's JSON gateway carries keys and values in
// it; the tokenizer conformance tool's input lines carry text in it).
#pragma once

#include <string>
#include <string_view>

namespace kvgate {

std::string base64_encode(std::string_view in);
// Strict: the standard alphabet, padding optional but only at the end (at most two '=', and a
// padded input a multiple of 4 long). False on anything else; `out` is cleared first.
bool base64_decode(std::string_view in, std::string& out);

}  // namespace kvgate
