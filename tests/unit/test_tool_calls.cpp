// Tool-calling conversations: read in the OpenAI `messages` form and LLaMA-Factory's sharegpt
// form (function_call / observation, "tools" as JSON text), rendered with the qwen2.5
// template exactly as transformers' apply_chat_template(..., tools=...) renders them with a
// Qwen2.5-style template (fixtures by scripts/make_chat_template_fixtures.py); loss on the
// assistant's text and calls only; bad calls named by file:line.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "loom/data/chat_template.h"
#include "loom/data/conversation.h"
#include "loom/train/data_setup.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // the fixtures' key order is what is rendered

fs::path fixtures() { return test::fixture_dir() / "chat_templates"; }

json load(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// A fixture tokenizer in a folder with a tool-capable tokenizer_config.json (Qwen2.5-style
// on the GPT-2-style tokenizer by default, or Llama 3.1-style on the Llama-3-style one).
struct ToolModel {
  test::TempDir dir;
  train::TextCodec codec;
  explicit ToolModel(const std::string& tokenizer = "gpt2_style",
                     const std::string& config = "qwen2.5_tools") {
    fs::copy_file(test::fixture_dir() / "tokenizers" / (tokenizer + ".json"),
                  dir.path / "tokenizer.json");
    fs::copy_file(fixtures() / (config + "_tokenizer_config.json"),
                  dir.path / "tokenizer_config.json");
    codec = train::model_codec(dir.path.string());
  }
};

std::string render(const data::Conversation& c, const train::TextCodec& codec) {
  data::TemplateOptions o;
  o.default_system = codec.default_system;
  std::string text;
  for (const data::Segment& s : data::render_chat(codec.chat_template, c, o)) text += s.text;
  return text;
}

TEST(ToolCalls, Qwen25RenderingEqualsTransformers) {
  ToolModel m;
  EXPECT_EQ(m.codec.chat_template, data::ChatTemplate::Qwen25);  // detected from the Jinja
  EXPECT_EQ(m.codec.default_system, "You are a helpful assistant.");
  const json convs = load(fixtures() / "tool_conversations.json");
  const json want = load(fixtures() / "qwen2.5_tools_expected.json");
  ASSERT_EQ(convs.size(), want.size());
  // As JSONL records in the messages form.
  std::string lines;
  for (const json& c : convs) lines += c.dump() + "\n";
  write(m.dir.path / "tools.jsonl", lines);
  data::ReadStats st;
  const auto got =
      data::read_conversations(m.dir.path / "tools.jsonl", "auto", data::OnError::Stop, &st);
  EXPECT_EQ(st.format, "messages");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(render(got[i], m.codec), want[i].get<std::string>()) << "conversation " << i;
}

TEST(ToolCalls, Llama31RenderingEqualsTransformers) {
  ToolModel m("llama3_style", "llama3.1_tools");
  EXPECT_EQ(m.codec.chat_template, data::ChatTemplate::Llama31);
  const json fx = load(fixtures() / "llama3.1_tools_expected.json");
  std::string lines;
  for (const json& c : fx["conversations"]) lines += c.dump() + "\n";
  write(m.dir.path / "tools.jsonl", lines);
  const auto got =
      data::read_conversations(m.dir.path / "tools.jsonl", "messages", data::OnError::Stop);
  ASSERT_EQ(got.size(), fx["expected"].size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(render(got[i], m.codec), fx["expected"][i].get<std::string>())
        << "conversation " << i;
  // Loss on the call and the answers only.
  std::string trained;
  for (const data::Segment& s : data::render_chat(m.codec.chat_template, got[2], {}))
    if (s.train) trained += s.text;
  EXPECT_EQ(trained,
            "{\"name\": \"convert_currency\", \"parameters\": {\"amount\": 5, \"from\": \"GBP\", "
            "\"to\": \"USD\"}}<|eot_id|>5 GBP is 6.3 USD.<|eot_id|>6.3 USD is 5 GBP.<|eot_id|>");
  // Two calls in one turn: Llama 3.1's format has no way to say it.
  const auto two = data::read_conversations(
      [&] {
        write(m.dir.path / "two.jsonl",
              load(fixtures() / "tool_conversations.json")[1].dump() + "\n");
        return m.dir.path / "two.jsonl";
      }(),
      "messages", data::OnError::Stop);
  EXPECT_NE(test::error_of([&] {
              data::render_chat(data::ChatTemplate::Llama31, two[0], {});
            }).find("llama3.1 renders one tool call per assistant turn, this one has 2"),
            std::string::npos);
}

TEST(ToolCalls, ShareGptFormRendersTheSame) {
  // Conversation 0 as LLaMA-Factory keeps glaive-style tool data: tools as JSON text of bare
  // schemas, the call as JSON text with arguments as JSON text too, the result an observation.
  ToolModel m;
  const json conv = load(fixtures() / "tool_conversations.json")[0];
  json bare = json::array();
  for (const json& t : conv["tools"]) bare.push_back(t["function"]);
  const json& call = conv["messages"][2]["tool_calls"][0]["function"];
  const json record = {
      {"system", conv["messages"][0]["content"]},
      {"tools", bare.dump()},
      {"conversations",
       {{{"from", "human"}, {"value", conv["messages"][1]["content"]}},
        {{"from", "function_call"},
         {"value", json{{"name", call["name"]}, {"arguments", call["arguments"].dump()}}.dump()}},
        {{"from", "observation"}, {"value", conv["messages"][3]["content"]}},
        {{"from", "gpt"}, {"value", conv["messages"][4]["content"]}}}}};
  write(m.dir.path / "glaive.json", json::array({record}).dump());
  data::ReadStats st;
  const auto got =
      data::read_conversations(m.dir.path / "glaive.json", "auto", data::OnError::Stop, &st);
  EXPECT_EQ(st.format, "sharegpt");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(render(got[0], m.codec),
            load(fixtures() / "qwen2.5_tools_expected.json")[0].get<std::string>());
}

TEST(ToolCalls, LossOnTheAssistantsTextAndCallsOnly) {
  ToolModel m;
  std::ofstream(m.dir.path / "one.jsonl")
      << load(fixtures() / "tool_conversations.json")[0].dump() << "\n";
  const auto convs =
      data::read_conversations(m.dir.path / "one.jsonl", "messages", data::OnError::Stop);
  std::string trained, untrained;
  data::TemplateOptions o;
  o.default_system = m.codec.default_system;
  for (const data::Segment& s : data::render_chat(m.codec.chat_template, convs.at(0), o))
    (s.train ? trained : untrained) += s.text;
  EXPECT_EQ(trained,
            "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"北京\", "
            "\"unit\": \"celsius\"}}\n</tool_call><|im_end|>北京今天晴，21°C。<|im_end|>");
  EXPECT_NE(untrained.find("<tool_response>"), std::string::npos);
  EXPECT_NE(untrained.find("# Tools"), std::string::npos);
}

TEST(ToolCalls, BadCallsAndTemplatesAreNamed) {
  ToolModel m;
  const fs::path f = m.dir.path / "bad.jsonl";
  write(
      f,
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{city: 北京"}}]}]})"
      "\n"
      R"({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "[1, 2]"}]})"
      "\n");
  std::string e =
      test::error_of([&] { data::read_conversations(f, "messages", data::OnError::Stop); });
  EXPECT_NE(e.find("bad.jsonl:2: the arguments of tool call 'get_weather' is not valid JSON"),
            std::string::npos)
      << e;
  data::ReadStats st;
  const auto kept = data::read_conversations(f, "messages", data::OnError::Skip, &st);
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_EQ(st.skipped, 2);
  e = test::error_of([&] { data::read_conversations(f, "sharegpt", data::OnError::Stop); });
  EXPECT_NE(e.find("bad.jsonl:1: field 'conversations' must be a non-empty list"),
            std::string::npos)
      << e;
  write(
      f,
      R"({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "[1, 2]"}]})"
      "\n");
  e = test::error_of([&] { data::read_conversations(f, "auto", data::OnError::Stop); });
  EXPECT_NE(e.find("bad.jsonl:1: a tool call must be an object with a string 'name'"),
            std::string::npos)
      << e;
  write(
      f,
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": "[{\"name\": \"f\"}"})"
      "\n");
  e = test::error_of([&] { data::read_conversations(f, "auto", data::OnError::Stop); });
  EXPECT_NE(e.find("bad.jsonl:1: field 'tools' is not valid JSON"), std::string::npos) << e;

  // A template that cannot render tools: auto on a model without tool use names the model.
  write(f, load(fixtures() / "tool_conversations.json")[0].dump() + "\n");
  train::DataConfig c;
  c.sources = {{f.string(), "auto", 1.0}};
  c.seq_len = 1024;
  c.cache_dir = (m.dir.path / "cache").string();
  train::TextCodec chatml = m.codec;
  chatml.chat_template = data::ChatTemplate::ChatML;  // a ChatML model without tool use
  e = test::error_of([&] { train::build_train_data(c, chatml, 1); });
  EXPECT_NE(e.find(f.string() +
                   ": conversations with tools or tool calls, and the chat "
                   "template chatml (the model's, from " +
                   m.dir.path.string() +
                   ") cannot render them: set data.template to one "
                   "that can (qwen2.5, llama3.1)"),
            std::string::npos)
      << e;
  c.chat_template = "qwen2.5";  // named: any model can be tuned for tools with it
  const train::TrainData d = train::build_train_data(c, chatml, 1);
  EXPECT_NE(d.summary.find("template qwen2.5"), std::string::npos) << d.summary;
}

}  // namespace
}  // namespace loom
