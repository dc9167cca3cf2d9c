#include "loom/data/chat_template.h"

#include "loom/util/error.h"

namespace loom::data {

ChatTemplate parse_template_name(const std::string& name) {
  if (name == "chatml") return ChatTemplate::ChatML;
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "plain") return ChatTemplate::Plain;
  throw Error("unknown chat template '" + name + "' (chatml, llama3, plain)");
}

const char* template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return "chatml";
    case ChatTemplate::Llama3:
      return "llama3";
    case ChatTemplate::Plain:
      return "plain";
  }
  return "?";
}

ChatTemplate template_from_jinja(const std::string& jinja, std::string* default_system) {
  if (default_system) default_system->clear();
  if (jinja.find("<|im_start|>") != std::string::npos) {
    // A literal default system turn, e.g. '<|im_start|>system\nYou are ...<|im_end|>\n',
    // written without template expressions inside. The newline may be a real one or the
    // two characters of Jinja's escape, depending on how the template was stored.
    const std::string close = "<|im_end|>";
    for (const std::string open : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
      for (size_t at = jinja.find(open); at != std::string::npos; at = jinja.find(open, at + 1)) {
        const size_t from = at + open.size(), to = jinja.find(close, from);
        if (to == std::string::npos) break;
        const std::string body = jinja.substr(from, to - from);
        if (!body.empty() && body.find_first_of("{}'\"") == std::string::npos && default_system) {
          *default_system = body;
          return ChatTemplate::ChatML;
        }
      }
    }
    return ChatTemplate::ChatML;
  }
  if (jinja.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::Llama3;
  return ChatTemplate::Plain;
}

std::string generation_prompt(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return "<|im_start|>assistant\n";
    case ChatTemplate::Llama3:
      return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::Plain:
      return "";
  }
  return "";
}

std::string end_of_turn(ChatTemplate t, const TemplateOptions& o) {
  switch (t) {
    case ChatTemplate::ChatML:
      return "<|im_end|>";
    case ChatTemplate::Llama3:
      return "<|eot_id|>";
    case ChatTemplate::Plain:
      return o.eos_text;
  }
  return "";
}

std::vector<Segment> render_chat(ChatTemplate t, const Conversation& c, const TemplateOptions& o) {
  std::vector<Segment> out;
  auto emit = [&](std::string text, bool train) {
    if (text.empty()) return;
    if (!out.empty() && out.back().train == train) {
      out.back().text += text;
    } else {
      out.push_back({std::move(text), train});
    }
  };
  const bool has_system = !c.messages.empty() && c.messages[0].role == "system";
  std::vector<Message> msgs;
  if (!has_system && !o.default_system.empty() && t != ChatTemplate::Plain)
    msgs.push_back({"system", o.default_system});
  msgs.insert(msgs.end(), c.messages.begin(), c.messages.end());
  if (t == ChatTemplate::Llama3) emit("<|begin_of_text|>", false);
  for (const Message& m : msgs) {
    const bool assistant = m.role == "assistant";
    const bool train = assistant || o.train_on_prompt;
    switch (t) {
      case ChatTemplate::ChatML:
        emit("<|im_start|>" + m.role + "\n", o.train_on_prompt);
        emit(m.content + "<|im_end|>", train);
        emit("\n", o.train_on_prompt);
        break;
      case ChatTemplate::Llama3:
        emit("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", o.train_on_prompt);
        emit(m.content + "<|eot_id|>", train);
        break;
      case ChatTemplate::Plain:
        emit(assistant ? m.content + o.eos_text : m.content + "\n", train);
        break;
    }
  }
  return out;
}

}  // namespace loom::data
