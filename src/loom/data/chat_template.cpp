#include "loom/data/chat_template.h"

#include "loom/util/error.h"

namespace loom::data {

ChatTemplate parse_template_name(const std::string& name) {
  if (name == "chatml") return ChatTemplate::ChatML;
  if (name == "qwen2.5") return ChatTemplate::Qwen25;
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "plain") return ChatTemplate::Plain;
  throw Error("unknown chat template '" + name + "' (chatml, qwen2.5, llama3, plain)");
}

const char* template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return "chatml";
    case ChatTemplate::Qwen25:
      return "qwen2.5";
    case ChatTemplate::Llama3:
      return "llama3";
    case ChatTemplate::Plain:
      return "plain";
  }
  return "?";
}

bool renders_tools(ChatTemplate t) { return t == ChatTemplate::Qwen25; }

ChatTemplate template_from_jinja(const std::string& jinja, std::string* default_system) {
  if (default_system) default_system->clear();
  if (jinja.find("<|im_start|>") != std::string::npos) {
    // ChatML that renders tools the Qwen2.5 way (its <tool_call> blocks).
    const ChatTemplate chatml = jinja.find("<tool_call>") != std::string::npos
                                    ? ChatTemplate::Qwen25
                                    : ChatTemplate::ChatML;
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
          return chatml;
        }
      }
    }
    return chatml;
  }
  if (jinja.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::Llama3;
  return ChatTemplate::Plain;
}

std::string generation_prompt(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
    case ChatTemplate::Qwen25:
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
    case ChatTemplate::Qwen25:
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
  if (uses_tools(c) && !renders_tools(t))
    throw Error(std::string("chat template ") + template_name(t) +
                " cannot render tools or tool calls (templates that can: qwen2.5)");
  const bool has_system = !c.messages.empty() && c.messages[0].role == "system";
  std::vector<Message> msgs;
  if (!has_system && !o.default_system.empty() && t != ChatTemplate::Plain)
    msgs.push_back({"system", o.default_system});
  msgs.insert(msgs.end(), c.messages.begin(), c.messages.end());
  size_t first = 0;
  if (!c.tools.empty()) {
    // Qwen2.5: the tools' schemas close the system turn (its own, or the default).
    std::string sys = "<|im_start|>system\n";
    if (!msgs.empty() && msgs[0].role == "system") sys += msgs[first++].content;
    sys +=
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const std::string& tool : c.tools) sys += "\n" + tool;
    sys +=
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
    emit(sys, o.train_on_prompt);
  }
  if (t == ChatTemplate::Llama3) emit("<|begin_of_text|>", false);
  for (size_t i = first; i < msgs.size(); ++i) {
    const Message& m = msgs[i];
    const bool assistant = m.role == "assistant";
    const bool train = assistant || o.train_on_prompt;
    switch (t) {
      case ChatTemplate::ChatML:
      case ChatTemplate::Qwen25:
        if (m.role == "tool") {  // consecutive results share one user turn
          if (i == 0 || msgs[i - 1].role != "tool") emit("<|im_start|>user", o.train_on_prompt);
          emit("\n<tool_response>\n" + m.content + "\n</tool_response>", o.train_on_prompt);
          if (i + 1 == msgs.size() || msgs[i + 1].role != "tool")
            emit("<|im_end|>\n", o.train_on_prompt);
        } else if (!m.tool_calls.empty()) {
          emit("<|im_start|>assistant", o.train_on_prompt);
          std::string said = m.content.empty() ? "" : "\n" + m.content;
          for (const ToolCall& call : m.tool_calls)
            said += "\n<tool_call>\n{\"name\": \"" + call.name +
                    "\", \"arguments\": " + call.arguments + "}\n</tool_call>";
          emit(said + "<|im_end|>", train);
          emit("\n", o.train_on_prompt);
        } else {
          emit("<|im_start|>" + m.role + "\n", o.train_on_prompt);
          emit(m.content + "<|im_end|>", train);
          emit("\n", o.train_on_prompt);
        }
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
