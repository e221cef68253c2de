// gateway/ui_assets: the dashboard's files (the repository's ui/), embedded in the binary at
// build time (cmake/embed_ui.cmake), so the page needs nothing at run time: no install folder,
// no CDN.
#pragma once

#include <span>
#include <string_view>

namespace kvgate {

struct UiAsset {
  std::string_view path;  // "/ui/index.html", "/ui/app.js", ...
  std::string_view content_type;
  std::string_view body;
};

std::span<const UiAsset> ui_assets();

}  // namespace kvgate
