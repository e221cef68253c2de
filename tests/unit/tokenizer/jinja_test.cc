// Unit tests of tokenizer/jinja: every case of jinja_cases.inc (rendered by Python's jinja2 as
// transformers sets it up) must render identically here; load-time errors name what is
// unsupported; values convert to and from JSON as Python's json module does.
#include "tokenizer/jinja.h"

#include <gtest/gtest.h>

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
