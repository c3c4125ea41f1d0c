#pragma once
// The pieces of a SentencePiece model file (tokenizer.model: a protobuf ModelProto whose
// field 1 repeats SentencePiece {1: piece, 2: score, 3: type}); its other fields (trainer
// spec) are skipped but the normalizer's add_dummy_prefix. Read for the GGUF tokenizer (docs/GGUF.md).

#include <string>
#include <vector>

namespace kqlora {

struct SentencePiece {
  // sentencepiece_model.proto's SentencePiece.Type (GGUF's token types use the same numbers).
  enum class Type { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };
  std::string piece;  // UTF-8, U+2581 for a space
  float score = 0.0f;
  Type type = Type::normal;
};

struct SentencePieceModel {
  std::vector<SentencePiece> pieces;  // in id order
  bool add_dummy_prefix = true;       // NormalizerSpec's: a space put before the text
};

/// The pieces of `path` and its normalizer's add_dummy_prefix; InputError naming the file
/// and the byte offset of anything that is not a well-formed ModelProto.
SentencePieceModel read_sentencepiece_model(const std::string& path);

}  // namespace kqlora
