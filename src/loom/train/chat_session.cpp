#include "loom/train/chat_session.h"

#include "loom/data/chat_template.h"
#include "loom/util/error.h"

namespace loom::train {

size_t utf8_complete_prefix(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the lead byte of the last character.
  size_t i = s.size();
  int back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i == 0) return s.size();
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  const int need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return back + 1 >= need ? s.size() : i - 1;
}

ChatSession::ChatSession(models::CausalLM& model, TextCodec codec, models::SampleOptions opt,
                         std::string system)
    : model_(model), codec_(std::move(codec)), opt_(std::move(opt)), system_(std::move(system)) {
  if (system_.empty()) system_ = codec_.default_system;
  if (codec_.eos_id >= 0) opt_.stop_ids.push_back(codec_.eos_id);
  data::TemplateOptions to;
  to.eos_text = codec_.eos_text;
  const std::vector<int32_t> eot = codec_.encode(data::end_of_turn(codec_.chat_template, to));
  if (eot.size() == 1) opt_.stop_ids.push_back(eot[0]);
  reset();
}

void ChatSession::reset() {
  gen_ = std::make_unique<models::Generator>(model_);
  first_turn_ = true;
}

std::string ChatSession::reply(const std::string& user,
                               const std::function<void(const std::string&)>& on_text) {
  data::Conversation c;
  if (first_turn_ && !system_.empty()) c.messages.push_back({"system", system_});
  c.messages.push_back({"user", user});
  data::TemplateOptions to;
  to.eos_text = codec_.eos_text;
  std::string text;
  for (const auto& seg : data::render_chat(codec_.chat_template, c, to)) text += seg.text;
  const data::ChatTemplate t = codec_.chat_template;
  if (!first_turn_) {
    // The history already opened the sequence; the previous reply ended at its end-of-turn
    // token, which ChatML follows with a newline.
    const std::string bot = "<|begin_of_text|>";
    if (t == data::ChatTemplate::Llama3 && text.rfind(bot, 0) == 0) text = text.substr(bot.size());
    if (t == data::ChatTemplate::Llama31) {  // it opens every rendering with its system turn
      const std::string eot = "<|eot_id|>";
      text = text.substr(text.find(eot) + eot.size());
    }
    if (t == data::ChatTemplate::ChatML || t == data::ChatTemplate::Qwen25) text = "\n" + text;
  }
  text += data::generation_prompt(t);
  first_turn_ = false;

  std::vector<int32_t> ids;
  size_t printed = 0;
  std::string reply;
  gen_->continue_with(codec_.encode(text), opt_, [&](int32_t tok) {
    if (std::find(opt_.stop_ids.begin(), opt_.stop_ids.end(), tok) != opt_.stop_ids.end()) return;
    ids.push_back(tok);
    reply = codec_.decode(ids);
    const size_t upto = utf8_complete_prefix(reply);
    if (on_text && upto > printed) on_text(reply.substr(printed, upto - printed));
    printed = std::max(printed, upto);
  });
  // A reply cut by max_new_tokens may end inside a character: it ends before it instead.
  reply.resize(utf8_complete_prefix(reply));
  if (on_text && printed < reply.size()) on_text(reply.substr(printed));
  return reply;
}

}  // namespace loom::train
