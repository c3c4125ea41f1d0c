#pragma once
// A Hugging Face model directory's tokenizer as GGUF metadata (tokenizer.ggml.* and
// tokenizer.chat_template), as llama.cpp's converter writes it (docs/GGUF.md, "The
// tokenizer"): a SentencePiece tokenizer.model as model "llama" with its pieces' scores
// and types, else tokenizer.json's byte-level BPE as model "gpt2" with its merges and
// the pre-tokenizer name llama.cpp splits text by, looked up from tokenizer.json's
// pre_tokenizer (an unknown one refused, naming it: llama.cpp treats a missing name as
// "default" and splits wrongly). Special ids, the add-BOS/EOS flags and the chat template
// come from tokenizer_config.json, tokenizer.json's post_processor and config.json.
// Without tokenizer files: model "none" (llama.cpp then runs token ids only).

#include <cstdint>
#include <string>

#include "kqlora/io/gguf_writer.hpp"

namespace kqlora {

struct GgufTokenizerReport {
  std::string summary;  // one line for the export's log
};

/// Adds the tokenizer of `hf_dir` for a model of `vocab` embedding rows to w (tokens
/// padded to `vocab` with "[PAD<id>]", unused); InputError naming the file and what is
/// wrong (an unknown pre-tokenizer or tokenizer model, a token id past `vocab`, ...).
/// `source` names the checkpoint in messages.
GgufTokenizerReport add_gguf_tokenizer(gguf::Writer& w, const std::string& hf_dir, int64_t vocab,
                                       const std::string& source);

}  // namespace kqlora
