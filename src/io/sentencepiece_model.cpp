// A minimal protobuf wire-format reader, enough for ModelProto's repeated pieces: varints,
// fixed32, fixed64 and length-delimited fields; unknown fields skipped by wire type.
#include "kqlora/io/sentencepiece_model.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kqlora/core/error.hpp"

namespace kqlora {

namespace {

struct Wire {
  const uint8_t* p;
  const uint8_t* end;
  const uint8_t* start;
  const std::string& path;

  int64_t offset() const { return p - start; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KQLORA_INPUT_CHECK(p < end, path << ": truncated varint at byte " << offset()
                                       << " (not a SentencePiece tokenizer.model?)");
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    KQLORA_INPUT_CHECK(false, path << ": malformed varint at byte " << offset());
    return 0;
  }
  /// Skips `n` bytes, or the caller's value `n` bytes long.
  const uint8_t* take(uint64_t n) {
    KQLORA_INPUT_CHECK(n <= static_cast<uint64_t>(end - p),
                       path << ": a field at byte " << offset() << " runs past the end of the file"
                            << " (not a SentencePiece tokenizer.model?)");
    const uint8_t* at = p;
    p += n;
    return at;
  }
  /// A length-delimited field's bytes (a string, or a message to read with the result).
  Wire field() {
    const uint64_t n = varint();
    const uint8_t* at = take(n);
    return Wire{at, at + n, start, path};
  }
  /// The rest of the bytes as a string.
  std::string text() const {
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(end - p));
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        return;
      case 1:
        take(8);
        return;
      case 2:
        take(varint());
        return;
      case 5:
        take(4);
        return;
      default:
        KQLORA_INPUT_CHECK(false, path << ": unsupported protobuf wire type " << wire_type
                                       << " at byte " << offset()
                                       << " (not a SentencePiece tokenizer.model?)");
    }
  }
};

SentencePiece read_piece(Wire w) {
  SentencePiece s;
  while (w.p < w.end) {
    const uint64_t tag = w.varint();
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = tag & 7;
    if (field == 1 && type == 2) {
      s.piece = w.field().text();
    } else if (field == 2 && type == 5) {
      std::memcpy(&s.score, w.take(4), 4);  // (little-endian, as the hosts kqlora runs on)
    } else if (field == 3 && type == 0) {
      const uint64_t t = w.varint();
      KQLORA_INPUT_CHECK(t >= 1 && t <= 6, w.path << ": piece '" << s.piece << "' has type " << t
                                                  << " at byte " << w.offset()
                                                  << " (expected 1-6)");
      s.type = static_cast<SentencePiece::Type>(t);
    } else {
      w.skip(type);
    }
  }
  return s;
}

}  // namespace

SentencePieceModel read_sentencepiece_model(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KQLORA_INPUT_CHECK(f.good(), path << ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  Wire w{data, data + bytes.size(), data, path};
  SentencePieceModel m;
  std::vector<SentencePiece>& pieces = m.pieces;
  while (w.p < w.end) {
    const uint64_t tag = w.varint();
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = tag & 7;
    if (field == 1 && type == 2) {
      pieces.push_back(read_piece(w.field()));
    } else if ((field == 2 || field == 3) && type == 2) {  // TrainerSpec, NormalizerSpec
      Wire spec = w.field();
      while (spec.p < spec.end) {
        const uint64_t t = spec.varint();
        const uint32_t f = static_cast<uint32_t>(t >> 3), wt = t & 7;
        if (field == 2 && f == 3 && wt == 0) {
          m.model_type = static_cast<int>(spec.varint());
        } else if (field == 3 && f == 1 && wt == 2) {
          m.normalizer = spec.field().text();
        } else if (field == 3 && f == 3 && wt == 0) {
          m.add_dummy_prefix = spec.varint() != 0;
        } else if (field == 3 && f == 4 && wt == 0) {
          m.remove_extra_whitespaces = spec.varint() != 0;
        } else {
          spec.skip(wt);
        }
      }
    } else {
      w.skip(type);
    }
  }
  KQLORA_INPUT_CHECK(!pieces.empty(), path << ": no pieces (not a SentencePiece tokenizer.model?)");
  return m;
}

}  // namespace kqlora
