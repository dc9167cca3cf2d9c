// A conversation with a model: each user turn is rendered with the model's chat template
// and fed after everything said before (the KV cache keeps the history), then the reply
// is sampled until the template's end of turn or eos. Replies stream as decoded text,
// cut only at UTF-8 character boundaries (Chinese and emoji print whole).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "loom/models/generate.h"
#include "loom/train/data_setup.h"

namespace loom::train {

class ChatSession {
 public:
  // system: empty uses the template's default system prompt (if any).
  ChatSession(models::CausalLM& model, TextCodec codec, models::SampleOptions opt,
              std::string system = "");
  std::string reply(const std::string& user,
                    const std::function<void(const std::string&)>& on_text = {});
  void reset();
  int64_t context_len() const { return gen_->context_len(); }

 private:
  models::CausalLM& model_;
  TextCodec codec_;
  models::SampleOptions opt_;
  std::string system_;
  std::unique_ptr<models::Generator> gen_;
  bool first_turn_ = true;
};

// Bytes of s up to its last complete UTF-8 character.
size_t utf8_complete_prefix(const std::string& s);

}  // namespace loom::train
