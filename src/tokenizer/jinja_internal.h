// tokenizer/jinja_internal: the syntax tree shared by the Jinja parser (jinja_parse.cc) and the
// interpreter (jinja_eval.cc). Not part of the public interface.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja.h"

namespace kvgate::tokenizer::jinja {

enum class NodeKind : uint8_t {
  // statements
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kBreak,
  kContinue,
  kFilterBlock,
  kWith,
  // expressions
  kConst,
  kName,
  kAttr,
  kItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNot,
  kNeg,
  kPos,
  kBinary,
  kAnd,
  kOr,
  kCompare,
  kCondExpr,
  kList,
  kTuple,
  kDict,
};

enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Param {
  uint32_t sym = 0;
  std::string name;
  NodePtr dflt;  // may be null
};

struct Node {
  NodeKind kind;
  uint8_t op = 0;     // BinOp / negated test / filter-or-test id
  bool flag = false;  // kTest: negated; kFor: has loop filter
  uint32_t line = 0;
  uint32_t sym = 0;  // kName, kMacro
  int id = -1;       // filter / test / method id
  std::string name;  // attribute, filter, test, macro name
  Value value;       // kConst, kText
  NodePtr x, y, z;   // operands (see jinja_parse.cc)
  NodeList a, b;     // bodies, arguments, items
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<CmpOp> cmp;
  std::vector<Param> params;  // kMacro
  explicit Node(NodeKind k, uint32_t l = 0) : kind(k), line(l) {}
  bool owns_value = false;  // kConst/kText made by the parser: `value` is its immortal constant
  // Frees the subtree without recursing (the parser may build a deep one before rejecting it).
  ~Node();
  // Moves every child of this node to the end of `out`.
  void take_children(std::vector<NodePtr>& out);
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
};

// Deepest syntax tree a template may have, counting statements in statements and operands of
// operands (jinja_parse.cc: a deeper one fails to load). The interpreter recurses per level.
inline constexpr int kMaxSyntaxDepth = 256;

// Filter, test and method names the interpreter implements (ids index these tables).
const std::vector<std::string_view>& filter_names();
const std::vector<std::string_view>& test_names();
bool is_known_method(std::string_view name);
// Which kinds of value have a method of this name (kMethod* bits), computed once per attribute.
enum : int {
  kMethodDict = 1,
  kMethodStr = 2,
  kMethodList = 4,
  kMethodUnsafe = 8,
  kMethodLoop = 16
};
int method_mask(std::string_view name);
int find_name(const std::vector<std::string_view>& names, std::string_view name);

struct Template::Impl {
  NodeList body;
  std::unordered_map<std::string, uint32_t> symbols;  // name -> symbol id
  std::vector<std::string> symbol_names;
  uint32_t sym_loop = 0;
  uint32_t intern(std::string_view name) {
    auto it = symbols.find(std::string(name));
    if (it != symbols.end()) return it->second;
    auto id = static_cast<uint32_t>(symbol_names.size());
    symbols.emplace(std::string(name), id);
    symbol_names.emplace_back(name);
    return id;
  }
};

// Python float repr, shared by str() and json.
void append_float(double d, std::string& out);
void append_repr_of(const Value& v, std::string& out);

}  // namespace kvgate::tokenizer::jinja
