// SHA-256 (FIPS 180-4), used for row digests, row-set digests and plan fingerprints.
#pragma once

#include <string>
#include <string_view>

namespace kcp {
std::string sha256_hex(std::string_view data);  // 64 lowercase hex characters
}
