// Dataset formats and chat templates: every format reads into the same conversation,
// malformed records name file and line/index, templates mark only assistant text trainable.
#include <gtest/gtest.h>

#include <fstream>

#include "common/test_util.h"
#include "loom/data/chat_template.h"
#include "loom/data/conversation.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using data::ChatTemplate;
using data::Conversation;

fs::path write(const test::TempDir& d, const std::string& name, const std::string& text) {
  fs::path p = d.path / name;
  std::ofstream(p) << text;
  return p;
}

std::string error_of(const fs::path& p, const std::string& fmt = "auto") {
  try {
    data::read_conversations(p, fmt, data::OnError::Stop);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Conversation, AllFormatsGiveTheSameMessages) {
  test::TempDir d;
  const std::vector<std::pair<std::string, std::string>> files = {
      {"pr.json", R"([{"prompt": "你好", "response": "您好！", "system": "S"}])"},
      {"alpaca.json",
       R"([{"instruction": "你", "input": "好", "output": "您好！", "system": "S"}])"},
      {"sg.jsonl",
       R"({"system": "S", "conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "您好！"}]})"},
      {"msg.jsonl",
       "\n"
       R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "你好"}, {"role": "assistant", "content": "您好！"}]})"
       "\n"},
  };
  for (auto& [name, text] : files) {
    data::ReadStats st;
    auto c = data::read_conversations(write(d, name, text), "auto", data::OnError::Stop, &st);
    ASSERT_EQ(c.size(), 1u) << name;
    ASSERT_EQ(c[0].messages.size(), 3u) << name;
    EXPECT_EQ(c[0].messages[0].role, "system");
    EXPECT_EQ(c[0].messages[1].role, "user");
    EXPECT_EQ(c[0].messages[1].content, name == "alpaca.json" ? "你\n好" : "你好") << name;
    EXPECT_EQ(c[0].messages[2].content, "您好！");
  }
}

TEST(Conversation, HistoryBecomesEarlierTurns) {
  test::TempDir d;
  auto c = data::read_conversations(
      write(d, "h.json", R"([{"prompt": "q2", "response": "a2", "history": [["q1", "a1"]]}])"),
      "prompt_response", data::OnError::Stop);
  ASSERT_EQ(c[0].messages.size(), 4u);
  EXPECT_EQ(c[0].messages[0].content, "q1");
  EXPECT_EQ(c[0].messages[3].content, "a2");
}

TEST(Conversation, SeedDataReads) {
  const fs::path p = test::source_dir() / ".." / "shared" / "data" / "zh_dialogue.json";
  if (!fs::exists(p)) GTEST_SKIP() << p << " not present";
  data::ReadStats st;
  auto c = data::read_conversations(p, "auto", data::OnError::Stop, &st);
  EXPECT_EQ(st.format, "prompt_response");
  EXPECT_EQ(c.size(), 1000u);
}

TEST(Conversation, MalformedRecordsNameFileAndPlace) {
  test::TempDir d;
  fs::path jl =
      write(d, "bad.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": 3}\n");
  std::string e = error_of(jl);
  EXPECT_NE(e.find("bad.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("prompt"), std::string::npos) << e;
  fs::path arr = write(d, "bad.json", R"([{"prompt": "a", "response": "b"}, {"prompt": "a"}])");
  e = error_of(arr);
  EXPECT_NE(e.find("bad.json: record 1"), std::string::npos) << e;
  EXPECT_NE(e.find("response"), std::string::npos) << e;
  fs::path syntax = write(d, "syntax.json", "[\n{\"prompt\": \"a\",\n \"response\": }\n]");
  EXPECT_NE(error_of(syntax).find("syntax.json:3"), std::string::npos) << error_of(syntax);
  fs::path badline = write(d, "line.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n{oops\n");
  EXPECT_NE(error_of(badline).find("line.jsonl:2"), std::string::npos);
  EXPECT_NE(error_of(d.path / "missing.json").find("missing.json"), std::string::npos);
}

TEST(Conversation, SkipModeCountsBadRecords) {
  test::TempDir d;
  fs::path jl = write(d, "mixed.jsonl",
                      "{\"prompt\": \"a\", \"response\": \"b\"}\n{oops\n{\"prompt\": \"c\"}\n"
                      "{\"prompt\": \"d\", \"response\": \"e\"}\n");
  data::ReadStats st;
  auto c = data::read_conversations(jl, "auto", data::OnError::Skip, &st);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(st.skipped, 2);
  EXPECT_EQ(st.first_errors.size(), 2u);
}

TEST(Conversation, AllLinesMalformedInSkipModeIsAnError) {
  // Found by fuzz_dataset: skip mode with no parseable line once reached past the end.
  test::TempDir d;
  fs::path p = write(d, "junk.jsonl", "{\"messages\":ssistant\"}\n{also bad\n");
  data::ReadStats st;
  try {
    data::read_conversations(p, "messages", data::OnError::Skip, &st);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("junk.jsonl"), std::string::npos) << e.what();
  }
}

TEST(Conversation, NumberTooLargeForADoubleIsAMalformedRecord) {
  // Found by fuzz_dataset: nlohmann throws out_of_range (406, not parse_error) on a number
  // literal that overflows a double, and it escaped read_conversations uncaught.
  test::TempDir d;
  fs::path jl = write(d, "big.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n1e999\n");
  std::string e = error_of(jl);
  EXPECT_NE(e.find("big.jsonl:2"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
  data::ReadStats st;
  EXPECT_EQ(data::read_conversations(jl, "auto", data::OnError::Skip, &st).size(), 1u);
  EXPECT_EQ(st.skipped, 1);
  fs::path arr = write(d, "big.json", R"([{"prompt": "a", "response": 8e888888}])");
  e = error_of(arr);
  EXPECT_NE(e.find("big.json: malformed JSON"), std::string::npos) << e;
}

TEST(Conversation, BlankFileWithANamedFormatIsAnError) {
  // Found by fuzz_dataset (clang UBSan): an empty or whitespace-only file read as a JSON
  // format indexed the text at npos, the byte before it (GCC's UBSan does not flag that).
  // Here, the error it must give instead.
  test::TempDir d;
  for (const char* text : {"", " \n\t\r\n"}) {
    fs::path p = write(d, "blank.jsonl", text);
    for (const char* fmt : {"messages", "sharegpt", "alpaca", "prompt_response"}) {
      const std::string e = error_of(p, fmt);
      EXPECT_NE(e.find("blank.jsonl: no records"), std::string::npos) << fmt << ": " << e;
    }
  }
}

TEST(ChatTemplates, ChatMLTrainsOnlyAssistantText) {
  Conversation c{{{"user", "hi"}, {"assistant", "hello"}}};
  data::TemplateOptions o;
  o.default_system = "SYS";
  auto segs = data::render_chat(ChatTemplate::ChatML, c, o);
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0].text,
            "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_FALSE(segs[0].train);
  EXPECT_EQ(segs[1].text, "hello<|im_end|>");
  EXPECT_TRUE(segs[1].train);
  EXPECT_EQ(segs[2].text, "\n");
}

TEST(ChatTemplates, Llama3AndPlain) {
  Conversation c{{{"system", "S"}, {"user", "hi"}, {"assistant", "yo"}}};
  data::TemplateOptions o;
  o.eos_text = "<|endoftext|>";
  auto l3 = data::render_chat(ChatTemplate::Llama3, c, o);
  ASSERT_EQ(l3.size(), 2u);
  EXPECT_EQ(l3[0].text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(l3[1].text, "yo<|eot_id|>");
  auto pl = data::render_chat(ChatTemplate::Plain, c, o);
  ASSERT_EQ(pl.size(), 2u);
  EXPECT_EQ(pl[0].text, "S\nhi\n");
  EXPECT_EQ(pl[1].text, "yo<|endoftext|>");
}

TEST(ChatTemplates, DetectedFromJinjaWithDefaultSystem) {
  const std::string smol =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
  std::string sys;
  EXPECT_EQ(data::template_from_jinja(smol, &sys), ChatTemplate::ChatML);
  EXPECT_EQ(sys, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(data::template_from_jinja("{{ '<|start_header_id|>' }}", &sys), ChatTemplate::Llama3);
  EXPECT_EQ(data::template_from_jinja("", &sys), ChatTemplate::Plain);
  EXPECT_THROW(data::parse_template_name("vicuna"), Error);
}

}  // namespace
}  // namespace loom
