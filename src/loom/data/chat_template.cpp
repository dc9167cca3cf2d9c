#include "loom/data/chat_template.h"

#include "loom/data/python_json.h"
#include "loom/util/error.h"

namespace loom::data {

ChatTemplate parse_template_name(const std::string& name) {
  if (name == "chatml") return ChatTemplate::ChatML;
  if (name == "qwen2.5") return ChatTemplate::Qwen25;
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "llama3.1") return ChatTemplate::Llama31;
  if (name == "plain") return ChatTemplate::Plain;
  throw Error("unknown chat template '" + name + "' (chatml, qwen2.5, llama3, llama3.1, plain)");
}

const char* template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return "chatml";
    case ChatTemplate::Qwen25:
      return "qwen2.5";
    case ChatTemplate::Llama3:
      return "llama3";
    case ChatTemplate::Llama31:
      return "llama3.1";
    case ChatTemplate::Plain:
      return "plain";
  }
  return "?";
}

bool renders_tools(ChatTemplate t) {
  return t == ChatTemplate::Qwen25 || t == ChatTemplate::Llama31;
}

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
  if (jinja.find("<|start_header_id|>") != std::string::npos)
    return jinja.find("Cutting Knowledge Date") != std::string::npos ? ChatTemplate::Llama31
                                                                     : ChatTemplate::Llama3;
  return ChatTemplate::Plain;
}

std::string generation_prompt(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
    case ChatTemplate::Qwen25:
      return "<|im_start|>assistant\n";
    case ChatTemplate::Llama3:
    case ChatTemplate::Llama31:
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
    case ChatTemplate::Llama31:
      return "<|eot_id|>";
    case ChatTemplate::Plain:
      return o.eos_text;
  }
  return "";
}

namespace {

// Python's str.strip() on ASCII whitespace (Jinja's `trim`).
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t a = s.find_first_not_of(ws);
  return a == std::string::npos ? "" : s.substr(a, s.find_last_not_of(ws) - a + 1);
}

// Llama 3.1: the system turn always carries the knowledge and today dates (the template's
// defaults), and "Environment: ipython" when tools are offered; the tools' schemas (as
// json.dumps indent 4) go into the first user turn with the template's instructions; a call
// is the assistant's turn {"name": ..., "parameters": {...}} (one per turn); a result is an
// ipython turn holding its content as JSON (a string is quoted, as the template's tojson
// does). Contents are trimmed.
template <typename Emit>
void render_llama31(const Conversation& c, const TemplateOptions& o, Emit& emit) {
  const bool p = o.train_on_prompt;
  size_t i = 0;
  std::string system;
  if (!c.messages.empty() && c.messages[0].role == "system") system = trim(c.messages[i++].content);
  const bool tools = !c.tools.empty();
  emit("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
           std::string(tools ? "Environment: ipython\n" : "") +
           "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + system +
           "<|eot_id|>",
       p);
  if (tools) {
    if (i >= c.messages.size() || c.messages[i].role != "user")
      throw Error("llama3.1 puts the tools into the first user message, and there is none");
    std::string turn =
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers "
        "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n";
    for (const std::string& tool : c.tools)
      turn += python_json(nlohmann::ordered_json::parse(tool), 4) + "\n\n";
    emit(turn + trim(c.messages[i++].content) + "<|eot_id|>", p);
  }
  for (; i < c.messages.size(); ++i) {
    const Message& m = c.messages[i];
    if (m.role == "tool") {
      emit("<|start_header_id|>ipython<|end_header_id|>\n\n" +
               nlohmann::ordered_json(m.content).dump() + "<|eot_id|>",
           p);
    } else if (!m.tool_calls.empty()) {
      if (m.tool_calls.size() != 1)
        throw Error("llama3.1 renders one tool call per assistant turn, this one has " +
                    std::to_string(m.tool_calls.size()));
      emit("<|start_header_id|>assistant<|end_header_id|>\n\n", p);
      emit("{\"name\": \"" + m.tool_calls[0].name +
               "\", \"parameters\": " + m.tool_calls[0].arguments + "}<|eot_id|>",
           true);
    } else {
      emit("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", p);
      emit(trim(m.content) + "<|eot_id|>", m.role == "assistant" || p);
    }
  }
}

}  // namespace

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
                " cannot render tools or tool calls (templates that can: qwen2.5, llama3.1)");
  if (t == ChatTemplate::Llama31) {
    render_llama31(c, o, emit);
    return out;
  }
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
      case ChatTemplate::Llama31:  // rendered above
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
