#!/usr/bin/env python3
"""Check that the tokenizer files Loom writes into a checkpoint folder (tokenizer.json +
tokenizer_config.json, made from a GGUF file's tokenizer metadata) load in Hugging Face and
encode as the GGUF's tokenizer does.

DIR is a folder Loom wrote (a checkpoint, adapter or export of a model fine-tuned from
GGUF, or anything with those two files). The script loads it with
transformers.AutoTokenizer.from_pretrained(DIR) and tokenizers.Tokenizer.from_file, and on
the items of scripts/make_tokenizer_fixtures.py (every zh_dialogue.json prompt, response and
ChatML string, every wiki_demo.txt line) compares the ids against:
  1. transformers' own tokenizer from the GGUF (AutoTokenizer with gguf_file=...). Its GGUF
     converter gives "smollm" models a plain ByteLevel pre-tokenizer where SmolLM2's own
     tokenizer.json (and llama.cpp) split digits first, so differences there are reported,
     not failed; the same tokenizer with SmolLM2's Digits + ByteLevel pre-tokenizer put
     back must agree on every item;
  2. the committed HF digests (tests/fixtures/tokenizers/smollm2_digests.json) when --digests
     names them (the default does for the default model).
Also: bos/eos/pad and the chat template equal the GGUF's; apply_chat_template on every
zh_dialogue record (and with add_generation_prompt on its prompt) gives the same text and ids
from the written tokenizer_config.json as from the GGUF; decode(encode(x)) == x.

Prints the counts and "check_hf_tokenizer: OK" (exit 0), or FAIL lines (exit 1).

Usage (from the repository root):
    ~/.cache/loom/ref-venv/bin/python scripts/check_hf_tokenizer.py DIR [--gguf FILE] [--digests FILE|none]
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_fixtures import MODELS, OUT, SMOLLM2_GGUF, ids_digest, load_items  # noqa: E402

from gguf import GGUFReader  # noqa: E402

from tokenizers import Tokenizer, pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"check_hf_tokenizer: FAIL {what}")


def compare(name, got, want, texts):
    """Counts the items whose ids differ; shows the first few."""
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    for i in bad[:3]:
        k = next((k for k, (a, b) in enumerate(zip(got[i], want[i])) if a != b),
                 min(len(got[i]), len(want[i])))
        print(f"  {name}: item {i} first differs at token {k}: written {got[i][k:k + 5]} "
              f"reference {want[i][k:k + 5]} ({texts[i][:60]!r})")
    print(f"{name}: {len(texts)} items, {sum(map(len, want))} reference tokens, {len(bad)} differ")
    return bad


def gguf_tokenizer(gguf):
    hf_logging.set_verbosity_error()  # the GGUF weights' dequantization notes
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf_logging.set_verbosity_warning()
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="folder with tokenizer.json + tokenizer_config.json")
    ap.add_argument("--gguf", type=Path, default=MODELS / SMOLLM2_GGUF,
                    help="the GGUF file the folder's tokenizer came from (default: SmolLM2's)")
    ap.add_argument("--digests", default=str(OUT / "smollm2_digests.json"),
                    help="HF digests of the items to match, or 'none'")
    args = ap.parse_args()

    for f in ("tokenizer.json", "tokenizer_config.json"):
        check((args.dir / f).is_file(), f"{args.dir}: no {f}")
    check(not (args.dir / "tokenizer_source.json").exists(),
          f"{args.dir}: still has tokenizer_source.json")
    if failures:
        sys.exit(1)

    zh, _, items = load_items()
    written = AutoTokenizer.from_pretrained(str(args.dir))
    raw = Tokenizer.from_file(str(args.dir / "tokenizer.json"))
    ref = gguf_tokenizer(args.gguf)
    print(f"written: {type(written).__name__}, vocab {len(written)}; "
          f"GGUF ({args.gguf.name}) through transformers: {type(ref).__name__}, vocab {len(ref)}")

    for attr in ("bos_token", "eos_token", "pad_token"):
        check(getattr(written, attr) == getattr(ref, attr),
              f"{attr}: written {getattr(written, attr)!r}, GGUF {getattr(ref, attr)!r}")
    check(written.chat_template == ref.chat_template, "chat_template differs from the GGUF's")

    ids_written = [written.encode(s, add_special_tokens=False) for s in items]
    ids_raw = [raw.encode(s, add_special_tokens=False).ids for s in items]
    check(not compare("tokenizers.Tokenizer.from_file vs AutoTokenizer(DIR)", ids_raw, ids_written, items),
          "tokenizers and transformers disagree on the written tokenizer.json")
    check(not compare("AutoTokenizer(DIR), add_special_tokens=True vs False + the GGUF's BOS",
                      [written.encode(s) for s in items],
                      [([ref.bos_token_id] if written.add_bos_token else []) + e for e in ids_written], items),
          "add_special_tokens=True adds something other than the GGUF's BOS")
    check(sum(written.decode(e) != s for e, s in zip(ids_written, items)) == 0,
          "decode(encode(x)) != x on some items")

    ids_ref = [ref.encode(s, add_special_tokens=False) for s in items]
    plain = compare("vs transformers' GGUF tokenizer as it converts it", ids_written, ids_ref, items)
    # Decided by the GGUF, not by the written file, so that a file missing the Digits step fails.
    fixed_pre = GGUFReader(str(args.gguf)).fields["tokenizer.ggml.pre"].contents() == "smollm"
    if fixed_pre:
        ref.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        ids_ref = [ref.encode(s, add_special_tokens=False) for s in items]
        check(not compare("vs transformers' GGUF tokenizer with SmolLM2's Digits + ByteLevel",
                          ids_written, ids_ref, items),
              "ids differ from the GGUF's tokenizer (with SmolLM2's pre-tokenizer)")
    else:
        check(not plain, "ids differ from transformers' GGUF tokenizer")

    if args.digests != "none":
        d = json.loads(Path(args.digests).read_text(encoding="utf-8"))
        check(d["items"] == len(items), f"{args.digests}: {d['items']} items, data has {len(items)}")
        if d["items"] == len(items):
            bad = [i for i, e in enumerate(ids_written)
                   if len(e) != d["counts"][i] or ids_digest(e) != d["digests"][i]]
            print(f"vs HF digests {Path(args.digests).name}: {len(items)} items, {d['tokens']} tokens, "
                  f"{len(bad)} differ")
            check(not bad, f"ids differ from {args.digests} on {len(bad)} items")

    # Chat template: the same text and ids from the written config as from the GGUF.
    text_bad = ids_bad = 0
    for r in zh:
        for msgs, gen in (([{"role": "user", "content": r["prompt"]},
                            {"role": "assistant", "content": r["response"]}], False),
                          ([{"role": "user", "content": r["prompt"]}], True)):
            a = written.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            b = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            text_bad += a != b
            ia = written.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=False)
            ib = ref.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=False)
            ids_bad += list(ia) != list(ib)
    print(f"apply_chat_template: {2 * len(zh)} conversations, {text_bad} texts and {ids_bad} id lists differ")
    check(text_bad == 0 and (ids_bad == 0 or not fixed_pre),
          "apply_chat_template differs from the GGUF's")

    if plain and fixed_pre:
        print(f"note: the {len(plain)} items that differ from transformers' own GGUF conversion all match "
              "it once SmolLM2's Digits pre-tokenizer is put back (its converter drops it)")
    print(f"check_hf_tokenizer: {'FAIL' if failures else 'OK'} {args.dir}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
