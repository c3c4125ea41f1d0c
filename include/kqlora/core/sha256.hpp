#pragma once
// SHA-256 (FIPS 180-4), for identities other tools compute too: the tokenizer_sha256 of a
// token file is Python's hashlib.sha256 of the tokenizer's bytes (docs/MODELS.md, "Data
// files").

#include <cstddef>
#include <cstdint>
#include <string>

namespace kqlora {

/// 64 lowercase hex digits of the SHA-256 of n bytes.
std::string sha256_hex(const void* data, size_t n);
/// ... of a file's bytes; InputError naming it when it cannot be read.
std::string sha256_hex_of_file(const std::string& path);

}  // namespace kqlora
