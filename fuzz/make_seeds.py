#!/usr/bin/env python3
"""Writes tiny valid inputs as seed corpora for the fuzz targets: fuzz/make_seeds.py OUT_DIR.
Uses only the standard library (no torch), so `make fuzz` runs anywhere."""
import json, os, shutil, struct, sys

out = sys.argv[1]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def seed(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


seed("safetensors", "f32", safetensors({"a": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))}, {"format": "pt"}))
seed("safetensors", "mixed", safetensors({
    "h": ("F16", [3], struct.pack("<3H", 0x3C00, 0x8001, 0x7C00)),
    "b": ("BF16", [2], struct.pack("<2H", 0x3F80, 0xFF80)),
    "i": ("I64", [1], struct.pack("<q", -5)), "z": ("F32", [0, 3], b"")}))
seed("safetensors", "empty", safetensors({}))

seed("dataset", "pr.json", json.dumps([{"prompt": "你好", "response": "您好", "system": "s",
                                        "history": [["q", "a"]]}], ensure_ascii=False))
seed("dataset", "alpaca.json", json.dumps([{"instruction": "i", "input": "x", "output": "o"}]))
seed("dataset", "sharegpt.jsonl", json.dumps({"conversations": [{"from": "human", "value": "h"},
                                                                {"from": "gpt", "value": "g"}]}) + "\n")
seed("dataset", "messages.jsonl", json.dumps({"messages": [{"role": "user", "content": "u"},
                                                           {"role": "assistant", "content": "😀"}]}) + "\n")
seed("dataset", "text.txt", "plain text line\nanother line\n")
seed("dataset", "text.jsonl", json.dumps({"text": "文档", "meta": {"id": 1}}, ensure_ascii=False) + "\n")
# Tool calls in both forms: OpenAI messages with a tool role, LLaMA-Factory's sharegpt with
# function_call / observation and the tools as JSON text.
_tool = {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {
    "x": {"type": "number"}}, "required": ["x"]}}
seed("dataset", "tools_messages.jsonl", json.dumps({"tools": [{"type": "function", "function": _tool}],
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
                 {"role": "tool", "content": "2"}, {"role": "assistant", "content": "a"}]}) + "\n")
seed("dataset", "tools_sharegpt.json", json.dumps([{"tools": json.dumps([_tool]), "conversations": [
    {"from": "human", "value": "h"},
    {"from": "function_call", "value": json.dumps([{"name": "f", "arguments": {"x": 1.5}}])},
    {"from": "observation", "value": "o"}, {"from": "gpt", "value": "g"}]}]))


def crc32c(data):  # Castagnoli, reflected 0x82F63B78
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def tfrecord(payloads):
    mask = lambda c: ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    out = b""
    for p in payloads:
        n = struct.pack("<Q", len(p))
        out += n + struct.pack("<I", mask(crc32c(n))) + p + struct.pack("<I", mask(crc32c(p)))
    return out


# Events by hand (protobuf wire format): file_version, then a scalar summary at step 8
# {wall_time=1: double, step=2: varint, file_version=3 / summary=5: length-delimited;
# Summary.value=1 {tag=1, simple_value=2: float}}.
_version = b"\x09" + struct.pack("<d", 1.0) + b"\x1a\x0d" + b"brain.Event:2"
_value = b"\x0a\x05loss/" + b"\x15" + struct.pack("<f", 2.5)
_summary = b"\x0a" + bytes([len(_value)]) + _value
_scalar = b"\x09" + struct.pack("<d", 2.0) + b"\x10\x08" + b"\x2a" + bytes([len(_summary)]) + _summary
seed("tfrecord", "events", tfrecord([_version, _scalar]))

# Targets whose seeds are fixtures other parts of the test suite make.
for target, rel in [("gguf", "tests/fixtures/gguf/tiny.gguf"),
                    ("tokenizer", "tests/fixtures/tokenizers/gpt2_style.json"),
                    ("tokenizer", "tests/fixtures/tokenizers/llama3_style.json")]:
    src = os.path.join(root, rel)
    if os.path.exists(src):
        os.makedirs(os.path.join(out, target), exist_ok=True)
        shutil.copy(src, os.path.join(out, target, os.path.basename(rel)))
print("fuzz seeds in", out)
