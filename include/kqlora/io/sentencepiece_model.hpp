#pragma once
// The pieces of a SentencePiece model file (tokenizer.model: a protobuf ModelProto whose
// field 1 repeats SentencePiece {1: piece, 2: score, 3: type}); its other fields (trainer
// spec and normalizer) are read for the few fields that change how text is split. Read for the GGUF
// tokenizer (docs/GGUF.md).

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
  std::vector<SentencePiece> pieces;     // in id order
  int model_type = 1;                    // TrainerSpec's: 1 unigram (the default), 2 BPE, ...
  std::string normalizer;                // NormalizerSpec's name ("identity", "nmt_nfkc", ...)
  bool add_dummy_prefix = true;          // NormalizerSpec's: a space put before the text
  bool remove_extra_whitespaces = true;  // NormalizerSpec's: runs of spaces collapsed
};

/// The pieces of `path` and the trainer's and normalizer's fields above; InputError naming the file
/// and the byte offset of anything that is not a well-formed ModelProto.
SentencePieceModel read_sentencepiece_model(const std::string& path);

}  // namespace kqlora
