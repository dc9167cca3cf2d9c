#!/usr/bin/env python3
"""Make the tool-calling chat template fixtures that tests/unit/test_tool_calls.cpp checks
Loom's `qwen2.5` rendering against.

What it writes, in tests/fixtures/chat_templates/ (files overwritten):

  qwen2.5_tools_tokenizer_config.json   a tokenizer_config.json whose chat_template is a
      ChatML template with Qwen2.5's tool format (tools' schemas in the system turn,
      <tool_call> blocks in the assistant's turn, <tool_response> blocks in a user turn),
      written for these tests; default system "You are a helpful assistant."
  tool_conversations.json   conversations in transformers' form (messages with tool_calls
      whose arguments are objects, role "tool", and a "tools" list of function schemas)
  qwen2.5_tools_expected.json   what transformers' apply_chat_template(messages, tools=tools,
      tokenize=False) renders for each conversation with that template
  llama3.1_tools_tokenizer_config.json, llama3.1_tools_expected.json   the same for a
      template with Llama 3.1's tool format (system turn with "Environment: ipython" and the
      knowledge/today dates, the schemas as json indent 4 in the first user turn, a call as
      {"name", "parameters"}, results in ipython turns as JSON), on the conversations with at
      most one call per assistant turn (LLAMA31_CONVERSATIONS); tokenizer llama3_style.json

Run with the reference environment (scripts/ref_venv.sh):
  ~/.cache/loom/ref-venv/bin/python scripts/make_chat_template_fixtures.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat_templates")
TOKENIZER = os.path.join(HERE, "..", "tests", "fixtures", "tokenizers", "gpt2_style.json")

JINJA = r"""{%- set default_system = 'You are a helpful assistant.' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- messages[0].content -}}{%- else -%}{{- default_system -}}{%- endif -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- elif m.role == 'assistant' and m.tool_calls -%}
{{- '<|im_start|>assistant' -}}
{%- if m.content -%}{{- '\n' + m.content -}}{%- endif -%}
{%- for call in m.tool_calls -%}
{%- set f = call.function if call.function is defined else call -%}
{{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' + (f.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"""


LLAMA31_JINJA = r"""{{- bos_token -}}
{%- set knowledge = 'Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n' -%}
{%- if messages[0].role == 'system' -%}
{%- set system = messages[0].content | trim -%}{%- set rest = messages[1:] -%}
{%- else -%}
{%- set system = '' -%}{%- set rest = messages -%}
{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if tools -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{{- knowledge + system + '<|eot_id|>' -}}
{%- if tools -%}
{{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' -}}
{%- for t in tools -%}{{- (t | tojson(indent=4)) + '\n\n' -}}{%- endfor -%}
{{- (rest[0].content | trim) + '<|eot_id|>' -}}
{%- set rest = rest[1:] -%}
{%- endif -%}
{%- for m in rest -%}
{%- if m.role == 'tool' -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + (m.content | tojson) + '<|eot_id|>' -}}
{%- elif m.tool_calls -%}
{%- set f = m.tool_calls[0].function -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + f.name + '", "parameters": ' + (f.arguments | tojson) + '}<|eot_id|>' -}}
{%- else -%}
{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + (m.content | trim) + '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"""


def fn(name, description, properties, required):
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


def call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = fn("get_weather", "查询城市的天气 (weather of a city)",
             {"city": {"type": "string", "description": "城市名"},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])
CONVERT = fn("convert_currency", "Convert an amount",
             {"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
             ["amount", "from", "to"])

CONVERSATIONS = [
    {"tools": [WEATHER, CONVERT], "messages": [
        {"role": "system", "content": "你是一个有用的助手。"},
        {"role": "user", "content": "北京今天天气怎么样？"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("get_weather", {"city": "北京", "unit": "celsius"})]},
        {"role": "tool", "content": "{\"temperature\": 21, \"condition\": \"晴\"}"},
        {"role": "assistant", "content": "北京今天晴，21°C。"}]},
    {"tools": [CONVERT], "messages": [
        {"role": "user", "content": "How much is 100 USD in EUR and in JPY?"},
        {"role": "assistant", "content": "Let me convert both.", "tool_calls": [
            call("convert_currency", {"amount": 100, "from": "USD", "to": "EUR"}),
            call("convert_currency", {"amount": 100.5, "from": "USD", "to": "JPY",
                                      "note": "tab\there \"quoted\""})]},
        {"role": "tool", "content": "92.1"},
        {"role": "tool", "content": "15600"},
        {"role": "assistant", "content": "100 USD is 92.1 EUR or 15600 JPY."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."}]},
    {"messages": [
        {"role": "user", "content": "没有工具的对话"},
        {"role": "assistant", "content": "好的。"}]},
]


# Llama 3.1 renders one call per assistant turn: conversations 0 and 2, and one more.
LLAMA31_CONVERSATIONS = [CONVERSATIONS[0], CONVERSATIONS[2], {"tools": [CONVERT], "messages": [
    {"role": "user", "content": "  Convert 5 GBP to USD, please.  "},
    {"role": "assistant", "content": None,
     "tool_calls": [call("convert_currency", {"amount": 5, "from": "GBP", "to": "USD"})]},
    {"role": "tool", "content": "6.3"},
    {"role": "assistant", "content": "5 GBP is 6.3 USD."},
    {"role": "user", "content": "And back?"},
    {"role": "assistant", "content": "6.3 USD is 5 GBP."}]}]


def render(tokenizer_file, jinja, conversations, **special):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, **special)
    tok.chat_template = jinja
    return [tok.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=False)
            for c in conversations]


def main():
    os.makedirs(OUT, exist_ok=True)
    config = {"chat_template": JINJA, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    with open(os.path.join(OUT, "qwen2.5_tools_tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, "tool_conversations.json"), "w") as f:
        json.dump(CONVERSATIONS, f, ensure_ascii=False, indent=1)
    expected = render(TOKENIZER, JINJA, CONVERSATIONS)
    with open(os.path.join(OUT, "qwen2.5_tools_expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
    llama = {"chat_template": LLAMA31_JINJA, "bos_token": "<|begin_of_text|>",
             "eos_token": "<|end_of_text|>"}
    with open(os.path.join(OUT, "llama3.1_tools_tokenizer_config.json"), "w") as f:
        json.dump(llama, f, ensure_ascii=False, indent=1)
    llama_expected = render(TOKENIZER.replace("gpt2_style", "llama3_style"), LLAMA31_JINJA,
                            LLAMA31_CONVERSATIONS, bos_token="<|begin_of_text|>")
    with open(os.path.join(OUT, "llama3.1_tools_expected.json"), "w") as f:
        json.dump({"conversations": LLAMA31_CONVERSATIONS, "expected": llama_expected}, f,
                  ensure_ascii=False, indent=1)
    print(f"wrote {len(expected)} renderings to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
