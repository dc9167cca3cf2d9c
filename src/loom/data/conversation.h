// Data as users have it, read into one form: a Conversation of role/content messages
// (roles system | user | assistant), or for pre-training text one "text" message.
// Formats (JSON array or JSONL, detected from the first non-space byte):
//   prompt_response : {"prompt", "response", optional "system", "history": [[q, a], ...]}
//   alpaca          : {"instruction", optional "input", "output", optional "system"}
//   sharegpt        : {"conversations": [{"from": human|user|gpt|assistant|system|
//                      function_call|observation, "value"}], optional "system", "tools"}
//                     (LLaMA-Factory's: a function_call's value is {"name", "arguments"} or
//                     a list of them as JSON text; an observation is the call's result)
//   messages        : {"messages": [{"role": system|user|assistant|tool, "content",
//                      "tool_calls": [{"type": "function", "function": {"name",
//                      "arguments"}}]}], optional "tools"}   (OpenAI style)
// "tools" is a list of function schemas, or that list as JSON text; a schema without
// "type" is wrapped as {"type": "function", "function": schema}, as transformers expects.
// Arguments may be an object or JSON text of one.
//   text            : {"text", any other keys}, one document per record; or a file that is
//                     not JSON, read whole as one document
//   auto            : chosen from the first record's keys (text when the file is not JSON)
// A malformed record stops with the file and line (JSONL) or index (array) named, or with
// on_error = skip is dropped and counted.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace loom::data {

// A function call an assistant message makes; arguments are JSON text (an object), written
// as Python's json.dumps writes it (", " and ": " separators, keys in their order, UTF-8
// kept), which is how Hugging Face chat templates render them with `tojson`.
struct ToolCall {
  std::string name;
  std::string arguments;
};

struct Message {
  std::string role;  // system | user | assistant | tool (a call's result) | text
  std::string content;
  std::vector<ToolCall> tool_calls{};  // assistant only
};

struct Conversation {
  std::vector<Message> messages;
  std::vector<std::string> tools{};  // function schemas offered, each JSON as above
};

// Does it offer tools, make calls or carry their results?
bool uses_tools(const Conversation& c);

enum class OnError { Stop, Skip };

struct ReadStats {
  std::string format;  // the one used (after auto)
  int64_t records = 0, skipped = 0;
  std::vector<std::string> first_errors;  // up to 5 messages of skipped records
};

std::vector<Conversation> read_conversations(const std::filesystem::path& path,
                                             const std::string& format, OnError on_error,
                                             ReadStats* stats = nullptr);

}  // namespace loom::data
