// Chat templates: a Conversation rendered to text segments, each marked trainable or not.
// By default only what the assistant says (its content and the template's end-of-turn
// marker) is trained on, as in HF TRL's assistant-only loss.
//   chatml : <|im_start|>{role}\n{content}<|im_end|>\n         (SmolLM2, Qwen)
//   qwen2.5: chatml, and tools as Qwen2.5's template renders them: the schemas in the system
//            turn, each call as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//            in the assistant's turn (trained on), results as <tool_response> blocks in a
//            user turn (not trained on). Any model can be fine-tuned for tools with it.
//   llama3 : <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//   llama3.1: llama3 with Llama 3.1's system turn (knowledge and today dates) and tools: the
//            schemas in the first user turn, a call as {"name", "parameters"} in the
//            assistant's turn (one per turn, trained on), results in ipython turns
//   plain  : {user}\n{assistant}{eos}                           (GPT-2: no chat markup)
#pragma once

#include <string>
#include <vector>

#include "loom/data/conversation.h"

namespace loom::data {

enum class ChatTemplate { ChatML, Qwen25, Llama3, Llama31, Plain };

struct TemplateOptions {
  std::string default_system;  // inserted when a conversation has no system message
  std::string eos_text;        // plain template's end of a sample (e.g. "<|endoftext|>")
  bool train_on_prompt = false;
};

struct Segment {
  std::string text;
  bool train;
};

// chatml | qwen2.5 | llama3 | llama3.1 | plain
ChatTemplate parse_template_name(const std::string& name);
const char* template_name(ChatTemplate t);
bool renders_tools(ChatTemplate t);  // can render tools, calls and results

// Guesses the template from a model's Jinja chat_template string (empty: plain; ChatML with
// <tool_call> is qwen2.5), and the
// default system prompt it inserts when there is none (e.g. SmolLM2's, Qwen's).
ChatTemplate template_from_jinja(const std::string& jinja, std::string* default_system);

std::vector<Segment> render_chat(ChatTemplate t, const Conversation& c, const TemplateOptions& o);
// The text that opens an assistant turn, appended after the last user message to generate.
std::string generation_prompt(ChatTemplate t);
// The text that ends an assistant turn (a stop string for generation).
std::string end_of_turn(ChatTemplate t, const TemplateOptions& o);

}  // namespace loom::data
