// gateway/admin_ui: the dashboard's routes of the admin API (see admin.h): its page and assets,
// the session a browser opens with /ui?token=KEY, and what a browser without one is told.
#include <algorithm>

#include "gateway/admin.h"
#include "gateway/ui_assets.h"

namespace kvgate {
namespace {

// What every dashboard answer carries: nothing runs but the page's own files, it cannot be
// framed (clickjacking), and no URL (a token in one) leaks as a referrer.
constexpr std::string_view kCsp =
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

constexpr std::string_view kLoginPage = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>kvgate: sign in</title></head>
<body>
<h1>kvgate dashboard</h1>
<p>This page needs the admin key (the contents of <code>--admin-api-key-file</code>).
Open <code>/ui?token=YOUR_ADMIN_KEY</code> once: kvgate answers with a session cookie
(12 hours) and takes the key out of the address.</p>
<p>Scripts can read the same figures with
<code>curl -H "Authorization: Bearer $KEY" http://HOST:PORT/v1/stats</code>.</p>
</body></html>
)";

// What a navigation from another site gets (see ui_unauthorized). Both pages name an empty icon:
// a browser would otherwise ask for /favicon.ico, which the admin API refuses to browsers.
constexpr std::string_view kBouncePage = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url=/ui?bounced=1">
<link rel="icon" href="data:,">
<title>kvgate</title></head><body><p><a href="/ui">Continue to the kvgate dashboard</a></p>
</body></html>
)";

}  // namespace

bool is_ui_path(std::string_view path) {
  return path == "/ui" || path.starts_with("/ui/");
}

std::string AdminApi::session_cookie(const http::Exchange& ex) {
  return std::string(http::kSessionCookiePrefix) + "_" + std::to_string(ex.local_port());
}

bool AdminApi::session_valid(const http::Exchange& ex, Clock::time_point now) {
  std::erase_if(sessions_, [&](const Session& s) { return s.expires <= now; });
  if (sessions_.empty()) return false;
  // Every pair of the name: another site of this host may have set one that comes first.
  bool found = false;
  // (Each value hashed once, then compared with every session's digest in constant time.)
  for (std::string_view value : http::cookie_values(ex.header("cookie"), session_cookie(ex))) {
    const BearerKey::Digest presented = BearerKey::digest_of(value);
    for (const Session& s : sessions_) found = s.key.matches_digest(presented) || found;
  }
  return found;
}

awaitable<void> AdminApi::ui_login(http::Exchange& ex, Clock::time_point now) {
  std::string cookie;
  if (key_.set()) {
    std::erase_if(sessions_, [&](const Session& s) { return s.expires <= now; });
    if (sessions_.size() >= kMaxSessions) {
      sessions_.erase(std::min_element(
          sessions_.begin(), sessions_.end(),
          [](const Session& a, const Session& b) { return a.expires < b.expires; }));
    }
    std::string token = random_key_hex() + random_key_hex();
    sessions_.push_back(Session{BearerKey(token), now + kSessionTtl});
    cookie = session_cookie(ex) + "=" + token +
             "; Path=/; Max-Age=" + std::to_string(std::chrono::seconds(kSessionTtl).count()) +
             "; HttpOnly; SameSite=Strict";
    if (ex.secure()) cookie += "; Secure";
  }
  std::vector<http::Header> h{{"location", "/ui"},
                              {"cache-control", "no-store"},
                              {"referrer-policy", "no-referrer"},
                              {"content-type", "text/plain; charset=utf-8"}};
  if (!cookie.empty()) h.push_back({"set-cookie", cookie});
  co_await ex.respond(303, h, "signed in; continue at /ui\n");
}

awaitable<void> AdminApi::ui_unauthorized(http::Exchange& ex, bool stats, bool bounce) {
  if (stats) {
    const http::Header h[] = {{"content-type", "application/json"},
                              {"cache-control", "no-store"},
                              {"www-authenticate", "Bearer"}};
    co_await ex.respond(401, h,
                        R"({"error":{"type":"authentication_error","code":"no_session",)"
                        R"("message":"no dashboard session (or it expired): open )"
                        R"(/ui?token=YOUR_ADMIN_KEY, or send 'Authorization: Bearer KEY'"}})"
                        "\n");
    co_return;
  }
  if (bounce) {
    // Loads /ui again from this origin: that navigation carries the SameSite=Strict cookie (a
    // meta refresh: the CSP allows no script). Without a session it gets the page below.
    const std::string bounce_csp(kCsp);
    const http::Header b[] = {
        {"content-type", "text/html; charset=utf-8"}, {"cache-control", "no-store"},
        {"content-security-policy", bounce_csp},      {"x-frame-options", "DENY"},
        {"x-content-type-options", "nosniff"},        {"referrer-policy", "no-referrer"}};
    co_await ex.respond(200, b, kBouncePage);
    co_return;
  }
  const std::string csp(kCsp);
  const http::Header h[] = {{"content-type", "text/html; charset=utf-8"},
                            {"cache-control", "no-store"},
                            {"content-security-policy", csp},
                            {"x-frame-options", "DENY"},
                            {"x-content-type-options", "nosniff"},
                            {"referrer-policy", "no-referrer"},
                            {"www-authenticate", "Bearer"}};
  co_await ex.respond(401, h, kLoginPage);
}

awaitable<void> AdminApi::ui_route(http::Exchange& ex) {
  std::string_view path = ex.path();
  if (path == "/ui" || path == "/ui/") path = "/ui/index.html";
  if (path == "/ui/logout") {
    // Ends this browser's session (its cookie cleared); back to the sign-in page. Only from the
    // page itself or the address bar (another site of this host is "same-site": its links carry
    // the cookie), and not on HEAD.
    std::string_view site = ex.header("sec-fetch-site");
    if (ex.method() != "GET" || !(site.empty() || site == "same-origin" || site == "none")) {
      const http::Header h[] = {{"content-type", "text/plain; charset=utf-8"}};
      co_await ex.respond(403, h, "sign out from the dashboard itself (GET /ui/logout)\n");
      co_return;
    }
    for (std::string_view value : http::cookie_values(ex.header("cookie"), session_cookie(ex))) {
      const BearerKey::Digest presented = BearerKey::digest_of(value);
      std::erase_if(sessions_, [&](const Session& s) { return s.key.matches_digest(presented); });
    }
    const std::string clear =
        session_cookie(ex) + "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict";
    const http::Header h[] = {
        {"location", "/ui"}, {"cache-control", "no-store"}, {"set-cookie", clear}};
    co_await ex.respond(303, h, "");
    co_return;
  }
  for (const UiAsset& a : ui_assets()) {
    if (a.path != path) continue;
    const std::string csp(kCsp);
    const std::string type(a.content_type);
    const http::Header h[] = {{"content-type", type},
                              {"cache-control", "no-cache"},
                              {"content-security-policy", csp},
                              {"x-frame-options", "DENY"},
                              {"x-content-type-options", "nosniff"},
                              {"referrer-policy", "no-referrer"}};
    co_await ex.respond(200, h, a.body);  // (HEAD: the server sends the head only)
    co_return;
  }
  std::string names;
  for (const UiAsset& a : ui_assets()) names += (names.empty() ? "" : ", ") + std::string(a.path);
  const http::Header h[] = {{"content-type", "text/plain; charset=utf-8"},
                            {"x-content-type-options", "nosniff"}};
  std::string body = "no such dashboard file (files: " + names + ")\n";
  co_await ex.respond(404, h, body);
}

}  // namespace kvgate
