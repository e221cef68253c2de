// Unit tests of tokenizer/jinja: every case of jinja_cases.inc (rendered by Python's jinja2 as
// transformers sets it up) must render identically here; load-time errors name what is
// unsupported; values convert to and from JSON as Python's json module does.
#include "tokenizer/jinja.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/chat_template.h"
#include "util/json_parser.h"

namespace kvgate::tokenizer::jinja {
namespace {

struct Case {
  const char* tmpl;
  const char* vars;
  const char* expected;
  bool raises;
};

const Case kCases[] = {
#include "tests/unit/tokenizer/jinja_cases.inc"
};

std::vector<std::pair<std::string, Value>> vars_of(const char* json) {
  Value v;
  std::string err;
  EXPECT_TRUE(from_json(json, v, err)) << err;
  std::vector<std::pair<std::string, Value>> out;
  for (const auto& kv : v.obj().items) out.push_back(kv);
  return out;
}

TEST(Jinja, MatchesPythonJinja2) {
  int n = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.tmpl);
    std::string err;
    auto t = Template::parse(c.tmpl, err);
    ASSERT_TRUE(t) << err;
    std::string out;
    bool ok = t->render(vars_of(c.vars), out, err);
    if (c.raises) {
      EXPECT_FALSE(ok) << "rendered: " << out;
    } else {
      EXPECT_TRUE(ok) << err;
      EXPECT_EQ(out, c.expected);
    }
    ++n;
  }
  EXPECT_GT(n, 60);
}

TEST(Jinja, RaiseExceptionMessageIsTheError) {
  std::string err;
  auto t = Template::parse("{{ raise_exception('Conversation roles must alternate') }}", err);
  ASSERT_TRUE(t);
  std::string out;
  EXPECT_FALSE(t->render({}, out, err));
  EXPECT_NE(err.find("Conversation roles must alternate"), std::string::npos) << err;
}

TEST(Jinja, NamespacesHoldingEachOtherAreFreedAfterTheRender) {
  // Reference cycles through namespace attributes; the ASan build's leak check fails without the
  // render breaking them (on success and on error alike).
  std::string err;
  auto t = Template::parse(
      "{% set ns = namespace(n=0) %}{% set ns.me = ns %}{% set a = namespace() %}"
      "{% set b = namespace(a=a) %}{% set a.b = b %}{{ ns.me.me.n }}"
      "{% if fail %}{{ raise_exception('stop') }}{% endif %}",
      err);
  ASSERT_TRUE(t) << err;
  std::string out;
  EXPECT_TRUE(t->render({}, out, err)) << err;
  EXPECT_EQ(out, "0");
  EXPECT_FALSE(t->render({{"fail", Value(true)}}, out, err));
}

TEST(Jinja, NamespaceInsideItselfPrintsAsPythonDoes) {
  // As Python's jinja2 prints them (its dict repr shows a dict met again inside itself as {...}).
  const std::pair<const char*, const char*> cases[] = {
      {"{% set ns = namespace(n=0) %}{% set ns.me = ns %}{{ ns }}",
       "<Namespace {'n': 0, 'me': <Namespace {...}>}>"},
      {"{% set ns = namespace() %}{% set ns.d = {'a': ns} %}{{ ns }}",
       "<Namespace {'d': {'a': <Namespace {...}>}}>"},
      {"{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ a }}|{{ b }}",
       "<Namespace {'b': <Namespace {'a': <Namespace {...}>}>}>|"
       "<Namespace {'a': <Namespace {'b': <Namespace {...}>}>}>"},
  };
  for (const auto& [tmpl, expected] : cases) {
    std::string err, out;
    auto t = Template::parse(tmpl, err);
    ASSERT_TRUE(t) << err;
    EXPECT_TRUE(t->render({}, out, err)) << err;
    EXPECT_EQ(out, expected);
  }
}

// Values nested far deeper than anything real, built by template source in a loop: ns.x and ns.y
// are two distinct lists 100,000 deep (dicts and namespaces with `inner`).
std::string deep_values(std::string_view wrap, std::string_view tail) {
  std::string w(wrap);
  auto at = w.find('@');
  std::string x = w.substr(0, at) + "ns.x" + w.substr(at + 1);
  std::string y = w.substr(0, at) + "ns.y" + w.substr(at + 1);
  return "{% set ns = namespace(x=[], y=[]) %}{% for i in range(100000) %}{% set ns.x = " + x +
         " %}{% set ns.y = " + y + " %}{% endfor %}" + std::string(tail);
}

TEST(Jinja, DeepValuesAreFreedWithoutRecursion) {
  // Freed one level at a time: recursive destructors overflowed the stack here.
  for (const char* wrap : {"[@]", "{'k': @}", "(@,)", "namespace(inner=@)", "[@, [1, 'a']]"}) {
    SCOPED_TRACE(wrap);
    std::string err, out;
    auto t = Template::parse(deep_values(wrap, "done"), err);
    ASSERT_TRUE(t) << err;
    EXPECT_TRUE(t->render({}, out, err)) << err;
    EXPECT_EQ(out, "done");
  }
  // And so are values built through the C++ interface.
  Value v = Value::array({});
  for (int i = 0; i < 1000000; ++i) v = Value::array({v, Value("s")});
  Value d = Value::object();
  for (int i = 0; i < 1000000; ++i) {
    Value outer = Value::object();
    outer.obj_mut().set("k", std::move(d));
    d = std::move(outer);
  }
  v = Value();
  d = Value();
}

TEST(Jinja, DeepValuesFailToPrintCompareOrSerializeWithAnError) {
  // Python raises RecursionError here; the render fails with a message (a 400, as SGLang answers).
  const std::pair<const char*, bool> cases[] = {
      // {template, orders values: dicts fail it at once, unorderable in Python too}
      {"{{ ns.x }}", false},
      {"{{ ns.x | string }}", false},
      {"{{ 'a' ~ ns.x }}", false},
      {"{{ [ns.x] }}", false},
      {"{{ '%s' | format(ns.x) }}", false},
      {"{{ '%r' | format(ns.x) }}", false},
      {"{{ '{}'.format(ns.x) }}", false},
      {"{{ {'a': 1}[ns.x] }}", false},  // the error message prints the key
      {"{{ ns.x == ns.y }}", false},
      {"{{ ns.x != ns.y }}", false},
      {"{{ ns.x is eq ns.y }}", false},
      {"{{ ns.x in [ns.y] }}", false},
      {"{{ [ns.x, ns.y] | unique | list | length }}", false},
      {"{{ ns.x | tojson }}", false},
      {"{{ ns.x | tojson(indent=2) }}", false},
      {"{{ ns.x < ns.y }}", true},
      {"{{ ns.x >= ns.y }}", true},
      {"{{ [ns.x, ns.y] | sort | length }}", true},
      {"{{ [ns.x, ns.y] | max | length }}", true},
  };
  for (const char* wrap : {"[@]", "{'k': @}", "(@,)"}) {
    for (const auto& [tail, orders] : cases) {
      SCOPED_TRACE(std::string(wrap) + " " + tail);
      std::string err, out;
      auto t = Template::parse(deep_values(wrap, tail), err);
      ASSERT_TRUE(t) << err;
      EXPECT_FALSE(t->render({}, out, err)) << out.substr(0, 100);
      bool dict = wrap[0] == '{';
      EXPECT_NE(err.find(orders && dict ? "not supported between" : "too deeply"),
                std::string::npos)
          << err;
    }
  }
  // A namespace prints its attributes, so nesting namespaces is nesting values too.
  std::string err, out;
  auto t = Template::parse(deep_values("namespace(inner=@)", "{{ ns.x }}"), err);
  ASSERT_TRUE(t) << err;
  EXPECT_FALSE(t->render({}, out, err));
  EXPECT_NE(err.find("too deeply"), std::string::npos) << err;
  // The same list compares equal to itself without looking inside, as in Python.
  t = Template::parse(deep_values("[@]", "{{ ns.x == ns.x }} {{ ns.x in [ns.x] }}"), err);
  ASSERT_TRUE(t) << err;
  out.clear();
  EXPECT_TRUE(t->render({}, out, err)) << err;
  EXPECT_EQ(out, "True True");
}

TEST(Jinja, ValuesAsDeepAsJsonAllowsStillRender) {
  // Request JSON is at most kMaxValueDepth deep (simdjson's limit): whatever parses, renders.
  std::string deepest = std::string(kMaxValueDepth, '[') + std::string(kMaxValueDepth, ']');
  Value v;
  std::string err;
  ASSERT_TRUE(from_json(deepest, v, err)) << err;
  std::string too_deep = "[" + deepest + "]";
  Value v2;
  EXPECT_FALSE(from_json(too_deep, v2, err));
  EXPECT_EQ(to_str(v), deepest);
  std::string json;
  ASSERT_TRUE(to_json(v, JsonOptions{}, json, err)) << err;
  EXPECT_EQ(json, deepest);

  auto t = Template::parse("{{ x }}|{{ x | tojson }}|{{ x == y }}|{{ x < y }}", err);
  ASSERT_TRUE(t) << err;
  Value y;
  ASSERT_TRUE(from_json(deepest, y, err)) << err;
  std::string out;
  ASSERT_TRUE(t->render({{"x", v}, {"y", y}}, out, err)) << err;
  EXPECT_EQ(out, deepest + "|" + deepest + "|True|False");

  // One level more is an error, whichever way it is walked.
  Value deeper = Value::array({v});
  EXPECT_THROW(to_str(deeper), RenderError);
  json.clear();
  EXPECT_FALSE(to_json(deeper, JsonOptions{}, json, err));
  EXPECT_NE(err.find("too deeply"), std::string::npos) << err;
  for (const char* tmpl : {"{{ [x] }}", "{{ [x] | tojson }}", "{{ [x] == [y] }}"}) {
    SCOPED_TRACE(tmpl);
    t = Template::parse(tmpl, err);
    ASSERT_TRUE(t) << err;
    EXPECT_FALSE(t->render({{"x", v}, {"y", y}}, out, err));
    EXPECT_NE(err.find("too deeply"), std::string::npos) << err;
  }
}

std::string repeat(std::string_view s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out.append(s);
  return out;
}

TEST(Jinja, DeeplyNestedSourceIsALoadError) {
  // Each of these is 100,000 levels deep in the syntax tree; parsing, evaluating or freeing it
  // recursively would overflow the stack.
  const int n = 100000;
  const std::string cases[] = {
      "{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}",
      "{{ " + repeat("[", n) + repeat("]", n) + " }}",
      "{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " }}",
      "{{ " + repeat("not ", n) + "x }}",
      "{{ " + repeat("-", n) + "1 }}",
      "{{ 1" + repeat(" + 1", n) + " }}",
      "{{ 'a'" + repeat(" ~ 'a'", n) + " }}",
      "{{ 2" + repeat(" * 2", n) + " }}",
      "{{ 2" + repeat(" ** 2", n) + " }}",
      "{{ x" + repeat(" or x", n) + " }}",
      "{{ x" + repeat(" and x", n) + " }}",
      "{{ x" + repeat(" if x", n) + " }}",
      "{{ x" + repeat(" if x else x", n) + " }}",
      "{{ x" + repeat(".a", n) + " }}",
      "{{ x" + repeat("[0]", n) + " }}",
      "{{ x" + repeat("[0:1]", n) + " }}",
      "{{ x" + repeat("()", n) + " }}",
      "{{ x" + repeat(" | trim", n) + " }}",
      "{{ x" + repeat(" is defined", n) + " }}",
      "{% set y | trim" + repeat(" | trim", n) + " %}{% endset %}",
      "{% filter trim" + repeat(" | trim", n) + " %}{% endfilter %}",
      repeat("{% if x %}", n) + repeat("{% endif %}", n),
      repeat("{% for x in y %}", n) + repeat("{% endfor %}", n),
      "{% if x %}" + repeat("{% elif x %}", n) + "{% endif %}",
      repeat("{% macro m() %}", n) + repeat("{% endmacro %}", n),
  };
  for (const auto& src : cases) {
    SCOPED_TRACE(src.substr(0, 40));
    std::string err;
    EXPECT_FALSE(Template::parse(src, err));
    EXPECT_NE(err.find("nested too deeply"), std::string::npos) << err;
  }
}

TEST(Jinja, NestingWellPastRealTemplatesStillWorks) {
  // Real chat templates nest a dozen levels; these are far beyond that and within the limits.
  const std::pair<std::string, std::string> cases[] = {
      {"{{ " + repeat("(", 60) + "1" + repeat(")", 60) + " }}", "1"},
      {"{{ 'a'" + repeat(" ~ 'a'", 150) + " }}", repeat("a", 151)},
      {"{{ 0" + repeat(" + 1", 150) + " }}", "150"},
      {"{{ x" + repeat(" | trim", 150) + " }}", "s"},
      {"{% if x == 0 %}0" + repeat("{% elif x == 1 %}1", 150) + "{% else %}s{% endif %}", "s"},
      {repeat("{% if x %}", 150) + "s" + repeat("{% endif %}", 150), "s"},
  };
  for (const auto& [src, expected] : cases) {
    SCOPED_TRACE(src.substr(0, 40));
    std::string err, out;
    auto t = Template::parse(src, err);
    ASSERT_TRUE(t) << err;
    EXPECT_TRUE(t->render({{"x", Value("s")}}, out, err)) << err;
    EXPECT_EQ(out, expected);
  }
}

TEST(Jinja, DeepEvaluationThroughMacrosIsARenderError) {
  // Macro recursion multiplies the depth of what each level evaluates: the render counts every
  // level of evaluation and stops at kMaxEvalDepth instead of running out of stack.
  std::string nested = repeat("{% if true %}", 150) + "{{ m(n - 1) }}" + repeat("{% endif %}", 150);
  std::string err, out;
  auto t = Template::parse(
      "{% macro m(n) %}{% if n > 0 %}" + nested + "{% endif %}{% endmacro %}{{ m(60) }}", err);
  ASSERT_TRUE(t) << err;
  EXPECT_FALSE(t->render({}, out, err));
  EXPECT_NE(err.find("nested too deeply"), std::string::npos) << err;
  // Plain macro recursion keeps its own limit.
  t = Template::parse("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", err);
  ASSERT_TRUE(t) << err;
  EXPECT_FALSE(t->render({}, out, err));
  EXPECT_NE(err.find("macro recursion too deep"), std::string::npos) << err;
}

TEST(Jinja, DeepestRenderFitsTheStack) {
  // The most stack a render can take: evaluation kMaxEvalDepth deep through the largest frames
  // on its way (macro calls, filters and methods with their arguments, loops, filter blocks),
  // then printing, serializing and comparing a value kMaxValueDepth deep at the bottom. Run with
  // the default 8 MiB stack in every build; by hand with `ulimit -s` lowered, it shows the margin
  // (docs/reliability.md).
  std::string deepest = std::string(kMaxValueDepth, '[') + std::string(kMaxValueDepth, ']');
  Value x, y;
  std::string err;
  ASSERT_TRUE(from_json(deepest, x, err)) << err;
  ASSERT_TRUE(from_json(deepest, y, err)) << err;
  const std::string bottom = "{{ x }}{{ x | tojson(indent=1) }}{{ x == y }}{{ x < y }}";
  auto t = Template::parse(bottom, err);
  ASSERT_TRUE(t) << err;
  std::string expected;
  ASSERT_TRUE(t->render({{"x", x}, {"y", y}}, expected, err)) << err;
  // Each level of macro recursion nests k of these around the next call.
  const std::pair<std::string, std::string> shapes[] = {
      {"{{ '{}'.format(nothing | default(", ")) }}"},
      {"{{ '' ~ (", ") }}"},
      {"{% for i in [1] %}", "{% endfor %}"},
      {"{% filter trim %}", "{% endfilter %}"},
  };
  for (const auto& [open, close] : shapes) {
    int rendered = 0;
    for (int k = 1; k < 40; ++k) {
      SCOPED_TRACE(open + " " + std::to_string(k));
      std::string nest;
      if (open.starts_with("{{")) {  // nested in one expression
        nest = "{{ " + repeat(open.substr(3), k) + "m(n - 1)" +
               repeat(close.substr(0, close.size() - 3), k) + " }}";
      } else {
        nest = repeat(open, k) + "{{ m(n - 1) }}" + repeat(close, k);
      }
      t = Template::parse("{% macro m(n) %}{% if n > 0 %}" + nest + "{% else %}" + bottom +
                              "{% endif %}{% endmacro %}{{ m(60) }}",
                          err);
      ASSERT_TRUE(t) << err;
      std::string out;
      if (!t->render({{"x", x}, {"y", y}}, out, err)) {
        EXPECT_NE(err.find("nested too deeply"), std::string::npos) << err;
        break;
      }
      EXPECT_EQ(out, expected);
      rendered = k;
    }
    EXPECT_GT(rendered, 0) << open;  // the deepest evaluation that renders was reached
  }
}

// The fuzz target's regression inputs for deep nesting (tests/fuzz/corpus/chat_template/
// regress_deep_*: template source after a first byte that selects it) fail as they should.
TEST(Jinja, DeepNestingFuzzInputsFailCleanly) {
  const std::pair<const char*, const char*> inputs[] = {
      {"regress_deep_value_print.j2", "value nested too deeply to print"},
      {"regress_deep_value_compare.j2", "value nested too deeply to compare"},
      {"regress_deep_value_tojson.j2", "value nested too deeply for JSON"},
      {"regress_deep_value_free.j2", nullptr},  // renders "freed"
      {"regress_deep_source_attr.j2", "nested too deeply"},
      {"regress_deep_source_filter.j2", "nested too deeply"},
  };
  for (const auto& [file, message] : inputs) {
    SCOPED_TRACE(file);
    std::ifstream in(
        std::filesystem::path(KVGATE_SOURCE_DIR) / "tests/fuzz/corpus/chat_template" / file,
        std::ios::binary);
    std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(src.size(), 1u);
    std::string err, out;
    auto t = Template::parse(std::string_view(src).substr(1), err);
    if (t) t->render({}, out, err);
    if (message) {
      EXPECT_NE(err.find(message), std::string::npos) << err;
    } else {
      EXPECT_EQ(out, "freed") << err;
    }
  }
}

TEST(Jinja, GrowingStringsAndListsFailInsteadOfFillingMemory) {
  // A handful of steps that would build a terabyte: each operator that grows a value is capped.
  for (const char* grow : {"ns.s ~ ns.s", "ns.s + ns.s", "[ns.s, ns.s] | join"}) {
    SCOPED_TRACE(grow);
    std::string err, out;
    auto t = Template::parse(
        std::string(
            "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ") +
            grow + " %}{% endfor %}{{ ns.s | length }}",
        err);
    ASSERT_TRUE(t) << err;
    EXPECT_FALSE(t->render({}, out, err));
    EXPECT_NE(err.find("string too large"), std::string::npos) << err;
  }
  std::string err, out;
  auto t = Template::parse(
      "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}",
      err);
  ASSERT_TRUE(t) << err;
  EXPECT_FALSE(t->render({}, out, err));
  EXPECT_NE(err.find("list too large"), std::string::npos) << err;
  t = Template::parse("{% set s = 'x' * 60000000 %}{% for i in range(10) %}{{ s }}{% endfor %}",
                      err);
  ASSERT_TRUE(t) << err;
  EXPECT_FALSE(t->render({}, out, err));
  EXPECT_NE(err.find("output too large"), std::string::npos) << err;
}

TEST(Jinja, StepLimitStopsALongRender) {
  // What fuzz targets set (per thread); kvgate sets none.
  std::thread t([] {
    std::string err, out;
    auto loops = Template::parse(
        "{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", err);
    ASSERT_TRUE(loops) << err;
    set_render_step_limit(10000);
    EXPECT_FALSE(loops->render({}, out, err));
    EXPECT_NE(err.find("template ran too long (more than 10000 steps)"), std::string::npos) << err;
    auto small = Template::parse("{% for i in range(100) %}{{ i }}{% endfor %}", err);
    ASSERT_TRUE(small) << err;
    EXPECT_TRUE(small->render({}, out, err)) << err;
    set_render_step_limit(0);
    EXPECT_TRUE(loops->render({}, out, err)) << err;
  });
  t.join();
}

TEST(Jinja, GenerationTagRendersItsBody) {
  std::string err, out;
  auto t = Template::parse("a{% generation %}b{{ 1 }}{% endgeneration %}c", err);
  ASSERT_TRUE(t) << err;
  ASSERT_TRUE(t->render({}, out, err)) << err;
  EXPECT_EQ(out, "ab1c");
}

TEST(Jinja, UnsupportedConstructsFailAtLoadNamingThem) {
  struct Bad {
    const char* tmpl;
    const char* names;
  };
  const Bad bad[] = {
      {"{% include 'x.j2' %}", "include"},
      {"{% extends 'base' %}", "extends"},
      {"{% import 'm' as m %}", "import"},
      {"{% block body %}{% endblock %}", "block"},
      {"{{ x | wordwrap(10) }}", "wordwrap"},
      {"{{ x | urlencode }}", "urlencode"},
      {"{% if x is divisible %}{% endif %}", "divisible"},
      {"{{ x.encode('utf-8') }}", "encode"},
      {"{% for x in y recursive %}{% endfor %}", "recursive"},
      {"{{ f(*args) }}", "unpacking"},
      {"{% if x %}unclosed", "endif"},
      {"{{ 'unterminated }}", "unterminated"},
      {"{% break %}", "outside of a loop"},
  };
  for (const auto& b : bad) {
    std::string err;
    EXPECT_FALSE(Template::parse(b.tmpl, err)) << b.tmpl;
    EXPECT_NE(err.find(b.names), std::string::npos) << b.tmpl << " -> " << err;
  }
}

TEST(Jinja, JsonRoundTripKeepsOrderTypesAndUnicode) {
  Value v;
  std::string err;
  ASSERT_TRUE(from_json(
      R"({"z":1,"a":[1.0,2.5,-0.0,1e300,"é\u0001"],"n":null,"t":true,"big":123456789012345678901234})",
      v, err))
      << err;
  std::string out;
  ASSERT_TRUE(to_json(v, JsonOptions{}, out, err)) << err;
  EXPECT_EQ(out,
            "{\"z\": 1, \"a\": [1.0, 2.5, -0.0, 1e+300, \"é\\u0001\"], \"n\": null, \"t\": true, "
            "\"big\": 1.2345678901234569e+23}");
  EXPECT_EQ(to_str(v),
            "{'z': 1, 'a': [1.0, 2.5, -0.0, 1e+300, 'é\\x01'], 'n': None, 't': True, "
            "'big': 1.2345678901234569e+23}");
  EXPECT_FALSE(from_json("{\"unterminated\": ", v, err));
}

// Chat requests' messages go through from_json: after an outsized one the thread's parser gives
// its memory back.
TEST(Jinja, FromJsonParserMemoryReturnsAfterAnOutsizedDocument) {
  std::thread t([] {
    Value v;
    std::string err;
    ASSERT_TRUE(from_json(R"([{"role":"user","content":"hi"}])", v, err)) << err;
    EXPECT_LE(from_json_parser_capacity(), kvgate::json::kParserRetainedBytes);
    std::string content(3 * kvgate::json::kParserRetainedBytes, 'c');
    ASSERT_TRUE(from_json(R"([{"role":"user","content":")" + content + R"("}])", v, err)) << err;
    EXPECT_EQ(v.arr().items.at(0).obj().find("content")->str().size(), content.size());
    EXPECT_LE(from_json_parser_capacity(), kvgate::json::kParserRetainedBytes);
  });
  t.join();
}

TEST(Jinja, PythonFloatRepr) {
  const std::pair<double, const char*> cases[] = {
      {1.0, "1.0"},
      {0.1, "0.1"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {0.0001, "0.0001"},
      {0.00001, "1e-05"},
      {-2.5, "-2.5"},
      {123.456, "123.456"},
      {1e-300, "1e-300"},
      {3.0e21, "3e+21"},
      {0.30000000000000004, "0.30000000000000004"},
  };
  for (auto [d, s] : cases) EXPECT_EQ(to_str(Value(d)), s);
}

TEST(Jinja, TemplateRendersConcurrently) {
  std::string err;
  auto t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "<{{ m.role }}>{{ m.content | trim }}{% endfor %}{{ ns.n }}",
      err);
  ASSERT_TRUE(t) << err;
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  threads.reserve(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 2000; ++i) {
        Value msgs;
        std::string e, out;
        from_json(R"([{"role":"user","content":" a "},{"role":"assistant","content":"b"}])", msgs,
                  e);
        if (!t->render({{"messages", msgs}}, out, e) || out != "<user>a<assistant>b2") {
          ++failures[static_cast<size_t>(k)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

// The chat template's special-token variables (bos_token, a list of additional tokens) are shared
// by every thread's render: copying them must not race on reference counts (this crashed the
// gateway under load before they were made immortal; ASan/TSan catch it here).
TEST(Jinja, ChatTemplateSpecialsAreSharedSafely) {
  std::string err;
  auto tmpl = ChatTemplate::from_config(
      R"({"bos_token":"<s>","eos_token":{"content":"</s>","special":true},)"
      R"("additional_special_tokens":["<a>","<b>"],)"
      R"("chat_template":"{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ additional_special_tokens | length }}"})",
      err);
  ASSERT_TRUE(tmpl) << err;
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  threads.reserve(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 5000; ++i) {
        std::string out, e;
        if (!tmpl->render_json(R"([{"role":"user","content":"hi"}])", "", true, "", out, e) ||
            out != "<s>hi</s>2") {
          ++failures[static_cast<size_t>(k)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

// As SGLang's OpenAI route prepares messages for the template: nulls dropped, list contents
// joined with spaces for string-content templates, kept as lists (image_url -> image) for templates
// that loop over the content.
TEST(Jinja, RequestMessagesAreNormalizedAsSglangDoes) {
  std::string err;
  auto str_tmpl = ChatTemplate::from_source(
      "{% for m in messages %}[{{ m.role }}:{{ m.content }}|{{ m.tool_calls is defined }}]"
      "{% endfor %}",
      {}, err);
  ASSERT_TRUE(str_tmpl) << err;
  std::string out;
  ASSERT_TRUE(str_tmpl->render_request_json(
      R"([{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}],"tool_calls":null}])",
      "", true, "", out, err))
      << err;
  EXPECT_EQ(out, "[user:Hi there|False]");
  // transformers' semantics (render_json) keep the list and the null.
  out.clear();
  ASSERT_TRUE(str_tmpl->render_json(R"([{"role":"user","content":"a","tool_calls":null}])", "",
                                    true, "", out, err));
  EXPECT_EQ(out, "[user:a|True]");

  auto list_tmpl = ChatTemplate::from_source(
      "{% for message in messages %}{% for c in message['content'] %}<{{ c.type }}>"
      "{% endfor %}{% endfor %}",
      {}, err);
  ASSERT_TRUE(list_tmpl) << err;
  out.clear();
  ASSERT_TRUE(list_tmpl->render_request_json(
      R"([{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}}]}])",
      "", true, "", out, err))
      << err;
  EXPECT_EQ(out, "<text><image>");
}

}  // namespace
}  // namespace kvgate::tokenizer::jinja
