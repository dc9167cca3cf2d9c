// Fuzzes the dataset reader (every format, JSON array / JSONL / text, tool calls, stop and
// skip modes) and the chat templates on whatever it reads.
#include "fuzz_input.h"
#include "loom/data/chat_template.h"
#include "loom/data/conversation.h"
#include "loom/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::input_file(data, size, ".jsonl");
  for (const char* fmt : {"auto", "text", "prompt_response", "alpaca", "sharegpt", "messages"}) {
    for (auto mode : {loom::data::OnError::Stop, loom::data::OnError::Skip}) {
      try {
        auto convs = loom::data::read_conversations(path, fmt, mode);
        loom::data::TemplateOptions o{"sys", "<eos>", false};
        for (const auto& c : convs)
          for (auto t : {loom::data::ChatTemplate::ChatML, loom::data::ChatTemplate::Qwen25,
                         loom::data::ChatTemplate::Llama3, loom::data::ChatTemplate::Llama31,
                         loom::data::ChatTemplate::Plain})
            loom::data::render_chat(t, c, o);
      } catch (const loom::Error&) {
      }
    }
  }
  return 0;
}
