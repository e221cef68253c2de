// tests/unit/discovery/dns_packet: builds DNS answers by hand (RFC 1035 wire format) for the
// parser's tests: the bytes a nameserver would send, record by record.
#pragma once

#include <arpa/inet.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvgate::testing {

class DnsPacket {
 public:
  // A response header: QR set, RD and RA set, `rcode`; counts are filled in by add_*.
  explicit DnsPacket(int rcode = 0, bool truncated = false) {
    u16(0x1234);
    uint16_t flags = 0x8000 | 0x0100 | 0x0080 | static_cast<uint16_t>(rcode & 0xf);
    if (truncated) flags |= 0x0200;
    u16(flags);
    for (int i = 0; i < 4; ++i) u16(0);
  }
  DnsPacket& question(std::string_view name, uint16_t type) {
    bump(4);
    put_name(name);
    u16(type);
    u16(1);
    return *this;
  }
  // section: 0 answer, 1 authority, 2 additional.
  DnsPacket& rr(int section, std::string_view name, uint16_t type, uint32_t ttl,
                const std::string& rdata) {
    bump(6 + 2 * section);
    put_name(name);
    u16(type);
    u16(1);
    u32(ttl);
    u16(static_cast<uint16_t>(rdata.size()));
    bytes_ += rdata;
    return *this;
  }
  DnsPacket& answer(std::string_view name, uint16_t type, uint32_t ttl, const std::string& rdata) {
    return rr(0, name, type, ttl, rdata);
  }
  const std::string& bytes() const { return bytes_; }
  const unsigned char* data() const {
    return reinterpret_cast<const unsigned char*>(bytes_.data());
  }
  size_t size() const { return bytes_.size(); }

  static std::string a(const char* ip) {
    unsigned char b[4];
    inet_pton(AF_INET, ip, b);
    return std::string(reinterpret_cast<char*>(b), 4);
  }
  static std::string aaaa(const char* ip) {
    unsigned char b[16];
    inet_pton(AF_INET6, ip, b);
    return std::string(reinterpret_cast<char*>(b), 16);
  }
  static std::string name(std::string_view n) {
    std::string out;
    while (!n.empty()) {
      size_t dot = n.find('.');
      std::string_view label = n.substr(0, dot);
      out.push_back(static_cast<char>(label.size()));
      out.append(label);
      n = dot == std::string_view::npos ? std::string_view() : n.substr(dot + 1);
    }
    out.push_back('\0');
    return out;
  }
  static std::string be16(uint16_t v) {
    return {static_cast<char>(v >> 8), static_cast<char>(v & 0xff)};
  }
  static std::string be32(uint32_t v) {
    return be16(static_cast<uint16_t>(v >> 16)) + be16(v & 0xffff);
  }
  static std::string srv(uint16_t priority, uint16_t weight, uint16_t port,
                         std::string_view target) {
    return be16(priority) + be16(weight) + be16(port) + name(target);
  }
  static std::string soa(uint32_t minimum) {
    return name("ns.test") + name("admin.test") + be32(1) + be32(3600) + be32(600) + be32(86400) +
           be32(minimum);
  }

 private:
  void u16(uint16_t v) { bytes_ += be16(v); }
  void u32(uint32_t v) { bytes_ += be32(v); }
  void put_name(std::string_view n) {
    if (n == "@q") {  // a compression pointer to the question's name (offset 12)
      bytes_.push_back(static_cast<char>(0xc0));
      bytes_.push_back(12);
      return;
    }
    bytes_ += name(n);
  }
  void bump(size_t at) {
    auto v = static_cast<uint16_t>((static_cast<uint8_t>(bytes_[at]) << 8) |
                                   static_cast<uint8_t>(bytes_[at + 1]));
    ++v;
    bytes_[at] = static_cast<char>(v >> 8);
    bytes_[at + 1] = static_cast<char>(v & 0xff);
  }
  std::string bytes_;
};

}  // namespace kvgate::testing
