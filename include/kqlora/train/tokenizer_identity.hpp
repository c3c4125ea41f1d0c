#pragma once
// Which tokenizer a token file was made with (docs/MODELS.md, "Data files"): the SHA-256 of
// the file that maps text to ids -- tokenizer.json, or tokenizer.model where there is no
// tokenizer.json -- the hash tools/tokenize_sft.py stores as tokenizer_sha256.

#include <string>

namespace kqlora {

struct TokenizerIdentity {
  std::string sha256;  // empty: the directory has neither file
  std::string file;    // the file hashed
};

/// The identity of `model_dir`'s tokenizer.
TokenizerIdentity tokenizer_identity(const std::string& model_dir);

}  // namespace kqlora
