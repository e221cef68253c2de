// A main() for the fuzz targets in ordinary builds (no libFuzzer): runs the target on every file
// of its seed corpus, then on deterministic mutations of them (byte flips, truncations, splices,
// inserted bytes), so CI exercises each parser on hostile input even without clang's fuzzer. The
// real fuzzers are built by `make fuzz`.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

uint64_t next(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

void run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS]\n", argv[0]);
    return 2;
  }
  int mutations = argc > 2 ? std::atoi(argv[2]) : 20000;
  std::vector<std::string> seeds;
  for (const auto& e : std::filesystem::directory_iterator(argv[1])) {
    std::ifstream in(e.path(), std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "no seeds in %s\n", argv[1]);
    return 2;
  }
  for (const auto& s : seeds) run(s);
  uint64_t state = 0x2545f4914f6cdd1dull;
  for (int i = 0; i < mutations; ++i) {
    std::string s = seeds[next(state) % seeds.size()];
    int edits = 1 + static_cast<int>(next(state) % 8);
    for (int e = 0; e < edits; ++e) {
      size_t pos = s.empty() ? 0 : next(state) % s.size();
      switch (next(state) % 5) {
        case 0:
          if (!s.empty()) s[pos] = static_cast<char>(next(state));
          break;
        case 1:
          s.resize(pos);
          break;
        case 2:
          s.insert(pos, 1, static_cast<char>(next(state)));
          break;
        case 3: {
          const std::string& o = seeds[next(state) % seeds.size()];
          if (!o.empty()) s.insert(pos, o.substr(next(state) % o.size()));
          break;
        }
        case 4:
          if (!s.empty()) s.erase(pos, 1 + next(state) % 16);
          break;
      }
    }
    run(s);
  }
  std::printf("%zu seeds and %d mutations ran clean\n", seeds.size(), mutations);
  return 0;
}
