// A train_gpt checkpoint's vocabulary: the character-level tokenizer
// (minigrad/data/char_tokenizer.h) written into the safetensors metadata beside the model,
// so that the checkpoint alone decodes its samples (--sample-only), and a --resume on a
// corpus whose characters differ is refused instead of training token ids that now mean
// other characters.
//
// The metadata's "vocab" entry holds each token's byte as two lowercase hex digits, in
// token order ("0a2021..." : token 0 is '\n', token 1 ' ', ...); in Python,
// bytes.fromhex(metadata["vocab"]) is the list of characters.
#pragma once

#include <string>

#include <minigrad/data/char_tokenizer.h>

namespace mg::samples {

inline constexpr const char* kVocabularyKey = "vocab";

// The metadata value of `tokenizer`'s vocabulary.
std::string vocabulary_metadata(const data::CharTokenizer& tokenizer);

// The tokenizer a "vocab" value stands for; an mg::Error naming `source` (the checkpoint)
// for anything but 1 to 256 strictly increasing bytes as hex digit pairs.
data::CharTokenizer tokenizer_from_metadata(const std::string& value, const std::string& source);

// A short description for messages: "34 characters: \n, space, %, ,, ., 0, 1, ..."
std::string describe_vocabulary(const data::CharTokenizer& tokenizer);

// mg::Error unless `corpus` is the checkpoint's vocabulary, naming both and where they part.
void check_same_vocabulary(const data::CharTokenizer& checkpoint, const data::CharTokenizer& corpus,
                           const std::string& source);

}  // namespace mg::samples
