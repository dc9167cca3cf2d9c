#!/usr/bin/env python3
"""Golden fixtures for the mixture-of-experts models: DeepseekV3ForCausalLM (MLA with and
without q_lora_rank, sigmoid routing with the correction bias, group-limited choice, shared
experts), DeepseekV2ForCausalLM (softmax routing, group_limited_greedy) and
Qwen2MoeForCausalLM (softmax top-k, a shared expert behind a sigmoid gate, a dense layer by
mlp_only_layers), tiny random models made from transformers' config classes (no download).

For each NAME it writes tests/fixtures/NAME/:
  config.json, model.safetensors   via save_pretrained (per-expert tensor names, as the
                                   published checkpoints); every parameter perturbed, and
                                   V3's e_score_correction_bias random, so routing depends on it
  golden.safetensors               input_ids, targets I64 [3,16] (-100 = ignored), logits F32
                                   [3,16,V], loss F32 [1], grad.<name> for every parameter under
                                   the checkpoint's names (the fused expert tensors split)

It also writes tests/fixtures/gguf/deepseek_v2_tiny.gguf: deepseek_v2_tiny as llama.cpp's
converter lays a DeepSeek model out (architecture deepseek2, F32): the routed experts stacked
into ffn_{gate,up,down}_exps, kv_b_proj split into attn_k_b (each head's key rows
transposed) and attn_v_b, attention.head_count_kv 1 with the MLA sizes in key_length_mla /
value_length_mla, the MoE keys (expert_count, expert_used_count, expert_shared_count,
leading_dense_block_count, expert_weights_scale, expert_gating_func 1 = softmax,
expert_group_count / expert_group_used_count). And deepseek_v2_tiny_q8.gguf, the same with
the stacked experts as a quantized file has them: gate/up in Q8_0 blocks, down (16 columns,
less than one 32-wide block) in F16 (what keep_quantized holds in blocks per expert).

The routing decisions must not sit on a near-tie, or fp32 differences between two correct
implementations would flip them: the script reports the smallest margin of every choice
(the k-th vs the next expert, the kept vs the next group) and moves to the next seed when one is under 1e-4.

Run from the repository root:  ~/.cache/loom/ref-venv/bin/python scripts/make_moe_fixtures.py
(--gguf-only: just the GGUF files, from the committed safetensors fixture; --only NAME:
just that fixture).
"""

import os
import sys

import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
B, T, V = 3, 16, 256
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
              n_routed_experts=8, first_k_dense_replace=1, max_position_embeddings=64,
              rms_norm_eps=1e-6, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
              bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)

CONFIGS = {
    # q_lora_rank, group-limited choice (4 groups of 2, keep 2), interleaved rope, Dv < Dq,
    # yarn (as V3 and V2-Lite ship) with mscale != mscale_all_dim: tables and scores scaled.
    "deepseek_v3_tiny": transformers.DeepseekV3Config(
        **COMMON, q_lora_rank=24, v_head_dim=12, n_shared_experts=1, num_experts_per_tok=2,
        n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
        rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}),
    # A direct q_proj, no groups, rotate-half rope, Dv > Dq, two shared experts, top-3.
    "deepseek_v3_noq_tiny": transformers.DeepseekV3Config(
        **COMMON, q_lora_rank=None, v_head_dim=24, n_shared_experts=2, num_experts_per_tok=3,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.5,
        rope_interleave=False),
    # V2: softmax scores, group_limited_greedy, weights not normalised.
    "deepseek_v2_tiny": transformers.DeepseekV2Config(
        **COMMON, q_lora_rank=None, v_head_dim=16, n_shared_experts=1, num_experts_per_tok=2,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=False,
        routed_scaling_factor=1.5),
    # Qwen2-MoE: GQA with q/k/v biases, layer 1 dense (mlp_only_layers), the others MoE with
    # top-2 normalised weights and a shared expert wider than the routed ones.
    "qwen2_moe_tiny": transformers.Qwen2MoeConfig(
        vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        output_router_logits=False),
}


def routing_margin(cfg, router, x):
    """The smallest gap between a chosen and the best unchosen candidate, over all tokens."""
    logits = x.reshape(-1, cfg.hidden_size).float() @ router.weight.float().t()
    E = getattr(cfg, "n_routed_experts", None) or cfg.num_experts
    G = getattr(cfg, "n_group", None) or 1
    v3 = cfg.model_type == "deepseek_v3"
    s = logits.sigmoid() if v3 else logits.softmax(-1)
    c = s + router.e_score_correction_bias if v3 else s
    margin = float("inf")
    if G > 1:
        per = c.view(-1, G, E // G)
        gs = per.topk(2, -1)[0].sum(-1) if v3 else per.max(-1).values
        top = gs.sort(-1, descending=True).values
        margin = min(margin, (top[:, cfg.topk_group - 1] - top[:, cfg.topk_group]).min().item())
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(cfg.topk_group, -1)[1], 1)
        c = c.masked_fill(~keep.repeat_interleave(E // G, 1).bool(), float("-inf"))
    top = c.sort(-1, descending=True).values
    k = cfg.num_experts_per_tok
    margin = min(margin, (top[:, k - 1] - top[:, k]).min().item())
    return margin


def make(name, cfg, seed):
    """Writes the fixture, or returns False when a routing choice is too close to a tie."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
        for mod in model.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.copy_(0.05 * torch.randn_like(mod.e_score_correction_bias))
    model.eval()

    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)
    for b in range(B):  # a different number of ignored targets per row
        targets[b, torch.randperm(T, generator=g)[: 2 + 2 * b]] = -100

    inputs = {}
    hooks = [mod.register_forward_hook(lambda m, a, o, n=n: inputs.__setitem__(n, a[0].detach()))
             for n, mod in model.named_modules() if n.endswith("mlp.gate")]
    logits = model(ids).logits
    for h in hooks:
        h.remove()
    margin = min(routing_margin(cfg, model.get_submodule(n), x) for n, x in inputs.items())
    if margin < 1e-4:
        print(f"{name}: seed {seed}: a routing choice is within {margin:.2e} of a tie")
        return False

    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids, "targets": targets, "logits": logits.detach().contiguous(),
               "loss": loss.detach().reshape(1)}
    inter = cfg.moe_intermediate_size
    for pname, p in model.named_parameters():
        grad = p.grad.detach()
        if pname.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, C]: gate rows, then up rows
            base = pname[: -len("gate_up_proj")]
            for e in range(grad.shape[0]):
                tensors[f"grad.{base}{e}.gate_proj.weight"] = grad[e, :inter].contiguous()
                tensors[f"grad.{base}{e}.up_proj.weight"] = grad[e, inter:].contiguous()
        elif pname.endswith("mlp.experts.down_proj"):  # [E, C, I]
            base = pname[: -len("down_proj")]
            for e in range(grad.shape[0]):
                tensors[f"grad.{base}{e}.down_proj.weight"] = grad[e].contiguous()
        else:
            tensors["grad." + pname] = grad.contiguous()

    out = os.path.join(ROOT, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    save_file(tensors, os.path.join(out, "golden.safetensors"),
              metadata={"torch": torch.__version__, "transformers": transformers.__version__})
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: loss {loss.item():.6f}, routing margin {margin:.2e}, "
          f"{len(tensors) - 4} gradients, {size / 1e6:.2f} MB (seed {seed})")
    return True


def write_gguf(name, out_file, quantized_experts=False):
    """The fixture `name` as a deepseek2 GGUF (see the docstring)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    def add_experts(g, key, stacked):
        if not quantized_experts:
            g.add_tensor(key, stacked)
        elif stacked.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(stacked, gguf.GGMLQuantizationType.Q8_0)
            g.add_tensor(key, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            g.add_tensor(key, stacked.astype(np.float16))

    src = os.path.join(ROOT, name)
    cfg = CONFIGS[name]
    w = load_file(os.path.join(src, "model.safetensors"))
    H, R = cfg.num_attention_heads, cfg.kv_lora_rank
    Dn, Dr, Dv, E = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.n_routed_experts
    a = "deepseek2"
    g = gguf.GGUFWriter(out_file, a)
    for key, value in [("block_count", cfg.num_hidden_layers),
                       ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size),
                       ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", H), ("attention.head_count_kv", 1),
                       ("attention.kv_lora_rank", R), ("attention.key_length", R + Dr),
                       ("attention.value_length", R), ("attention.key_length_mla", Dn + Dr),
                       ("attention.value_length_mla", Dv), ("rope.dimension_count", Dr),
                       ("leading_dense_block_count", cfg.first_k_dense_replace),
                       ("expert_feed_forward_length", cfg.moe_intermediate_size),
                       ("expert_count", E), ("expert_used_count", cfg.num_experts_per_tok),
                       ("expert_shared_count", cfg.n_shared_experts), ("expert_gating_func", 1),
                       ("expert_group_count", cfg.n_group), ("expert_group_used_count", cfg.topk_group),
                       ("vocab_size", cfg.vocab_size)]:
        g.add_uint32(f"{a}.{key}", value)
    g.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    g.add_float32(f"{a}.rope.freq_base", cfg.rope_parameters["rope_theta"])
    g.add_float32(f"{a}.expert_weights_scale", cfg.routed_scaling_factor)
    g.add_uint32("tokenizer.ggml.bos_token_id", cfg.bos_token_id)
    g.add_uint32("tokenizer.ggml.eos_token_id", cfg.eos_token_id)
    g.add_tensor("token_embd.weight", w["model.embed_tokens.weight"])
    g.add_tensor("output_norm.weight", w["model.norm.weight"])
    g.add_tensor("output.weight", w["lm_head.weight"])
    for l in range(cfg.num_hidden_layers):
        hf, b = f"model.layers.{l}.", f"blk.{l}."
        g.add_tensor(b + "attn_norm.weight", w[hf + "input_layernorm.weight"])
        g.add_tensor(b + "ffn_norm.weight", w[hf + "post_attention_layernorm.weight"])
        g.add_tensor(b + "attn_q.weight", w[hf + "self_attn.q_proj.weight"])
        g.add_tensor(b + "attn_kv_a_mqa.weight", w[hf + "self_attn.kv_a_proj_with_mqa.weight"])
        g.add_tensor(b + "attn_kv_a_norm.weight", w[hf + "self_attn.kv_a_layernorm.weight"])
        kv_b = w[hf + "self_attn.kv_b_proj.weight"].reshape(H, Dn + Dv, R)
        g.add_tensor(b + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :Dn].transpose(0, 2, 1)))
        g.add_tensor(b + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, Dn:]))
        g.add_tensor(b + "attn_output.weight", w[hf + "self_attn.o_proj.weight"])
        if l < cfg.first_k_dense_replace:
            for p, q in [("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")]:
                g.add_tensor(b + f"ffn_{p}.weight", w[hf + f"mlp.{q}.weight"])
            continue
        g.add_tensor(b + "ffn_gate_inp.weight", w[hf + "mlp.gate.weight"])
        for p, q in [("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")]:
            add_experts(g, b + f"ffn_{p}_exps.weight",
                        np.stack([w[hf + f"mlp.experts.{e}.{q}.weight"] for e in range(E)]))
            g.add_tensor(b + f"ffn_{p}_shexp.weight", w[hf + f"mlp.shared_experts.{q}.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print(f"{out_file}: {os.path.getsize(out_file) / 1e6:.2f} MB")


def main():
    args = sys.argv[1:]
    only = args[args.index("--only") + 1] if "--only" in args else None
    if "--gguf-only" not in args:
        for i, (name, cfg) in enumerate(CONFIGS.items()):
            if only and name != only:
                continue
            if not any(make(name, cfg, seed=30 + i + 100 * attempt) for attempt in range(10)):
                raise SystemExit(f"{name}: no seed without a near-tie")
    if only:
        return
    write_gguf("deepseek_v2_tiny", os.path.join(ROOT, "gguf", "deepseek_v2_tiny.gguf"))
    write_gguf("deepseek_v2_tiny", os.path.join(ROOT, "gguf", "deepseek_v2_tiny_q8.gguf"), True)


if __name__ == "__main__":
    main()
