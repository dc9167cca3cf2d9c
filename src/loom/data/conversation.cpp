#include "loom/data/conversation.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/data/python_json.h"
#include "loom/util/error.h"

namespace loom::data {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // keys keep their order: tools and arguments are rendered

namespace {

const std::string& str_field(const json& r, const char* key, bool required,
                             const std::string& empty) {
  if (!r.contains(key) || r[key].is_null()) {
    if (required) throw Error(std::string("missing string field '") + key + "'");
    return empty;
  }
  if (!r[key].is_string()) throw Error(std::string("field '") + key + "' must be a string");
  return r[key].get_ref<const std::string&>();
}

// A value that may be given as JSON or as JSON text (a string holding it).
json as_json(const json& v, const std::string& what) {
  if (!v.is_string()) return v;
  try {
    return json::parse(v.get_ref<const std::string&>());
  } catch (const json::exception& e) {
    throw Error(what + " is not valid JSON: " + e.what());
  }
}

// One call: {"name", "arguments"} or OpenAI's {"type": "function", "function": {...}}.
ToolCall tool_call(const json& c) {
  const json& f = c.is_object() && c.contains("function") ? c["function"] : c;
  if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
    throw Error("a tool call must be an object with a string 'name'");
  json args = f.contains("arguments")
                  ? as_json(f["arguments"],
                            "the arguments of tool call '" + f["name"].get<std::string>() + "'")
                  : json::object();
  if (!args.is_object())
    throw Error("the arguments of tool call '" + f["name"].get<std::string>() +
                "' must be a JSON object");
  return {f["name"].get<std::string>(), python_json(args)};
}

std::vector<ToolCall> tool_calls(const json& v) {
  const json calls = as_json(v, "a function_call's value");
  std::vector<ToolCall> out;
  if (calls.is_array()) {
    for (const json& c : calls) out.push_back(tool_call(c));
  } else {
    out.push_back(tool_call(calls));
  }
  if (out.empty()) throw Error("an empty list of tool calls");
  return out;
}

// "tools": function schemas, each wrapped as transformers expects when it has no "type".
std::vector<std::string> tools(const json& r) {
  if (!r.contains("tools") || r["tools"].is_null()) return {};
  if (r["tools"].is_string() && r["tools"].get_ref<const std::string&>().empty()) return {};
  const json list = as_json(r["tools"], "field 'tools'");
  if (!list.is_array()) throw Error("field 'tools' must be a list of function schemas");
  std::vector<std::string> out;
  for (const json& t : list) {
    if (!t.is_object()) throw Error("each entry of 'tools' must be a JSON object");
    out.push_back(
        python_json(t.contains("type") ? t : json{{"type", "function"}, {"function", t}}));
  }
  return out;
}

std::string detect(const json& r) {
  if (!r.is_object()) throw Error("a record must be a JSON object");
  if (r.contains("messages")) return "messages";
  if (r.contains("conversations")) return "sharegpt";
  if (r.contains("instruction")) return "alpaca";
  if (r.contains("prompt")) return "prompt_response";
  if (r.contains("text")) return "text";
  throw Error(
      "cannot tell the format from the keys (expected prompt/response, "
      "instruction/output, conversations, messages or text)");
}

Conversation convert(const json& r, const std::string& format) {
  if (!r.is_object()) throw Error("a record must be a JSON object");
  const std::string none;
  Conversation c;
  auto add = [&](const std::string& role, const std::string& content) {
    c.messages.push_back({role, content});
  };
  if (format == "text") {  // a pre-training document; other keys ("meta", "id") are ignored
    add("text", str_field(r, "text", true, none));
    return c;
  }
  if (format == "prompt_response" || format == "alpaca") {
    const std::string& sys = str_field(r, "system", false, none);
    if (!sys.empty()) add("system", sys);
    if (format == "prompt_response" && r.contains("history") && !r["history"].is_null()) {
      const json& h = r["history"];
      if (!h.is_array()) throw Error("field 'history' must be a list of [prompt, response]");
      for (const auto& turn : h) {
        if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string())
          throw Error("each 'history' entry must be [prompt, response] strings");
        add("user", turn[0].get<std::string>());
        add("assistant", turn[1].get<std::string>());
      }
    }
    if (format == "prompt_response") {
      add("user", str_field(r, "prompt", true, none));
      add("assistant", str_field(r, "response", true, none));
    } else {
      std::string user = str_field(r, "instruction", true, none);
      const std::string& input = str_field(r, "input", false, none);
      if (!input.empty()) user += "\n" + input;
      add("user", user);
      add("assistant", str_field(r, "output", true, none));
    }
  } else if (format == "sharegpt" || format == "messages") {
    const bool sg = format == "sharegpt";
    const char* list = sg ? "conversations" : "messages";
    const char* rk = sg ? "from" : "role";
    const char* ck = sg ? "value" : "content";
    if (sg) {
      const std::string& sys = str_field(r, "system", false, none);
      if (!sys.empty()) add("system", sys);
    }
    if (!r.contains(list) || !r[list].is_array() || r[list].empty())
      throw Error(std::string("field '") + list + "' must be a non-empty list");
    c.tools = tools(r);
    for (const auto& m : r[list]) {
      if (!m.is_object()) throw Error(std::string("entries of '") + list + "' must be objects");
      std::string role = str_field(m, rk, true, none);
      if (role == "human") role = "user";
      if (role == "gpt") role = "assistant";
      if (role == "observation" || role == "function") role = "tool";
      if (sg && role == "function_call") {
        if (!m.contains(ck)) throw Error("a function_call entry needs '" + std::string(ck) + "'");
        c.messages.push_back({"assistant", "", tool_calls(m[ck])});
        continue;
      }
      if (role != "system" && role != "user" && role != "assistant" && role != "tool")
        throw Error("unknown role '" + role + "'");
      Message msg{role, ""};
      if (!sg && role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        if (!m["tool_calls"].is_array()) throw Error("field 'tool_calls' must be a list of calls");
        for (const json& tc : m["tool_calls"]) msg.tool_calls.push_back(tool_call(tc));
        msg.content = str_field(m, ck, false, none);  // content may be null beside calls
      } else {
        msg.content = str_field(m, ck, true, none);
      }
      c.messages.push_back(std::move(msg));
    }
  } else {
    throw Error("unknown data format '" + format + "'");
  }
  bool has_assistant = false;
  for (auto& m : c.messages) has_assistant |= m.role == "assistant";
  if (!has_assistant) throw Error("no assistant message to learn from");
  return c;
}

// Line number (1-based) of byte offset `at` in text.
size_t line_of(const std::string& text, size_t at) {
  size_t line = 1;
  for (size_t i = 0; i < at && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

}  // namespace

bool uses_tools(const Conversation& c) {
  bool uses = !c.tools.empty();
  for (const Message& m : c.messages) uses |= m.role == "tool" || !m.tool_calls.empty();
  return uses;
}

std::vector<Conversation> read_conversations(const fs::path& path, const std::string& format_in,
                                             OnError on_error, ReadStats* stats) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), path.string() + ": cannot open data file");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  ReadStats local;
  ReadStats& st = stats ? *stats : local;
  st = ReadStats{};
  std::vector<Conversation> out;

  const size_t first = text.find_first_not_of(" \t\r\n\xef\xbb\xbf");
  const bool looks_json = first != std::string::npos && (text[first] == '[' || text[first] == '{');
  std::string format = format_in;
  // A .txt file is text even where it begins with '[' or '{'.
  const bool plain = !looks_json || path.extension() == ".txt";
  if (plain && (format == "text" || format == "auto")) {  // plain text: one document
    st.format = "text";
    st.records = 1;
    LOOM_CHECK(first != std::string::npos, path.string() + ": no text");
    return {Conversation{{{"text", text}}}};
  }

  // Records with where-they-came-from, for error messages.
  std::vector<std::pair<json, std::string>> records;
  if (first != std::string::npos && text[first] == '[') {  // npos: blank file, named format
    json arr;
    try {
      arr = json::parse(text);
    } catch (const json::parse_error& e) {
      throw Error(path.string() + ":" + std::to_string(line_of(text, e.byte)) +
                  ": malformed JSON: " + e.what());
    } catch (const json::exception& e) {  // e.g. out_of_range: a number too large for a double
      throw Error(path.string() + ": malformed JSON: " + e.what());
    }
    LOOM_CHECK(arr.is_array(), path.string() + ": expected a JSON array of records");
    for (size_t i = 0; i < arr.size(); ++i)
      records.emplace_back(std::move(arr[i]), path.string() + ": record " + std::to_string(i));
  } else {
    size_t pos = 0, line = 0;
    while (pos <= text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      ++line;
      const std::string where = path.string() + ":" + std::to_string(line);
      const std::string_view l(text.data() + pos, nl - pos);
      if (l.find_first_not_of(" \t\r") != std::string_view::npos) {
        try {
          records.emplace_back(json::parse(l), where);
        } catch (const json::exception& e) {  // parse_error, or out_of_range (number overflow)
          const std::string msg = where + ": malformed JSON line: " + e.what();
          if (on_error == OnError::Stop) throw Error(msg);
          ++st.skipped;
          if (st.first_errors.size() < 5) st.first_errors.push_back(msg);
        }
      }
      pos = nl + 1;
    }
  }
  LOOM_CHECK(!records.empty(),
             path.string() + (st.skipped > 0 ? ": every line was malformed JSON (" +
                                                   std::to_string(st.skipped) + " skipped)"
                                             : std::string(": no records")));
  if (format == "auto") {
    try {
      format = detect(records.at(0).first);
    } catch (const Error& e) {
      throw Error(records.at(0).second + ": " + e.what());
    }
  }
  st.format = format;
  for (auto& [r, where] : records) {
    try {
      out.push_back(convert(r, format));
      ++st.records;
    } catch (const Error& e) {
      const std::string msg = where + ": " + e.what();
      if (on_error == OnError::Stop) throw Error(msg + " (format " + format + ")");
      ++st.skipped;
      if (st.first_errors.size() < 5) st.first_errors.push_back(msg);
    }
  }
  LOOM_CHECK(!out.empty(), path.string() + ": every record was malformed (" +
                               std::to_string(st.skipped) + " skipped)");
  return out;
}

}  // namespace loom::data
