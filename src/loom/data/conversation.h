// Data as users have it, read into one form: a Conversation of role/content messages
// (roles system | user | assistant), or for pre-training text one "text" message.
// Formats (JSON array or JSONL, detected from the first non-space byte):
//   prompt_response : {"prompt", "response", optional "system", "history": [[q, a], ...]}
//   alpaca          : {"instruction", optional "input", "output", optional "system"}
//   sharegpt        : {"conversations": [{"from": human|user|gpt|assistant|system, "value"}]}
//   messages        : {"messages": [{"role", "content"}]}   (OpenAI style)
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

struct Message {
  std::string role;
  std::string content;
};

struct Conversation {
  std::vector<Message> messages;
};

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
