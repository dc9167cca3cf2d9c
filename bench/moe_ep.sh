#!/usr/bin/env bash
# Expert parallelism and DeepSeek-V3's auxiliary-loss-free balancing, measured on the tiny
# DeepSeek-V3 of the tests (tests/fixtures/deepseek_v3_tiny: 2 MoE layers, 8 routed experts,
# top-2 of 4 groups, hidden 32) fine-tuned on ../shared/data/zh_dialogue.json with the bytes
# tokenizer, at ep2 (2 ranks under mpirun), for STEPS steps (default 100), once per
# moe.bias_update_rate in RATES (default "0 0.001 0.01"; 0 leaves the bias as loaded).
# Prints per MoE layer:
#   - the forward token exchange's bytes per micro-batch (rank 0's, from metrics.jsonl)
#     against tokens x top-k x hidden x 4 bytes x (ep-1)/ep, what a uniform routing sends;
#   - the load balance (most loaded expert's tokens / the mean) at step 1 and averaged over
#     the last 10 steps, for each rate;
# then what expert parallelism saves at scale, from `loom plan` (no weights: a config.json of
# DeepSeek-V2-Lite's published shape, 15.7B parameters, 64 routed experts of which each
# token takes 6): model-state MiB per rank on 8 ranks, bf16, ZeRO 0-3, at ep 1, 2 and 8.
# Not part of `make test` (a minute of training).
#   bash bench/moe_ep.sh [BUILD_DIR]          (make bench-moe)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${STEPS:-100}
rates=${RATES:-0 0.001 0.01}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores" >&2
for rate in $rates; do
  cat > "$tmp/cfg-$rate.json" <<JSON
{
  "model": "tests/fixtures/deepseek_v3_tiny",
  "data": {"path": "../shared/data/zh_dialogue.json", "format": "prompt_response",
           "tokenizer": "bytes", "template": "plain", "seq_len": 64,
           "cache_dir": "$tmp/cache"},
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "train_steps": $steps,
  "seed": 1,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
  "gradient_clipping": 1.0,
  "expert_parallel": {"size": 2},
  "moe": {"bias_update_rate": $rate},
  "steps_per_print": $steps,
  "output_dir": "$tmp/out-$rate"
}
JSON
  mpirun --oversubscribe --bind-to none -np 2 "$build/loom" train "$tmp/cfg-$rate.json" >&2
done
python3 - "$tmp" $rates <<'PY'
import json, sys
tmp, rates = sys.argv[1], sys.argv[2:]
def rows(rate):
    return [json.loads(l) for l in open(f"{tmp}/out-{rate}/metrics.jsonl") if '"moe"' in l]
runs = {r: rows(r) for r in rates}
first = runs[rates[0]]
B, T, K, C, P = 8, 64, 2, 32, 2
expect = B * T * K * C * 4 * (P - 1) / P
def balance(r, i):
    return r["moe"]["tokens_max"][i] / r["moe"]["tokens_mean"][i]
print(f"tiny DeepSeek-V3, ep2, micro-batch {B} x {T} tokens, top-{K}, hidden {C}, {len(first)} steps")
head = f"{'layer':>5} {'exchange B/micro-batch':>23} {'uniform routing':>16} {'max/mean step 1':>16}"
for r in rates:
    head += f" {'last 10, rate ' + r:>20}"
print(head)
for i, layer in enumerate(first[0]["moe"]["layer"]):
    sent = sum(r["moe"]["dispatch_bytes"][i] for r in first) / len(first)
    line = f"{layer:>5} {sent:23.0f} {expect:16.0f} {balance(first[0], i):16.2f}"
    for r in rates:
        line += f" {sum(balance(x, i) for x in runs[r][-10:]) / 10:20.2f}"
    print(line)
for r in rates:
    last = runs[r][-1]["moe"]
    print(f"rate {r}: bias range after {len(runs[r])} steps: " + ", ".join(
        f"layer {l}: [{a:+.3f}, {b:+.3f}]" for l, a, b in
        zip(last["layer"], last["bias_min"], last["bias_max"])))
PY
mkdir -p "$tmp/v2lite"
cat > "$tmp/v2lite/config.json" <<'JSON'
{"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
 "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
 "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
 "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6,
 "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": null,
 "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1,
 "topk_group": 1, "topk_method": "greedy", "routed_scaling_factor": 1.0,
 "norm_topk_prob": false, "scoring_func": "softmax", "aux_loss_alpha": 0.001, "seq_aux": true,
 "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
 "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
 "tie_word_embeddings": false, "attention_bias": false, "hidden_act": "silu",
 "bos_token_id": 100000, "eos_token_id": 100001, "initializer_range": 0.02}
JSON
cat > "$tmp/v2lite.json" <<JSON
{"model": "$tmp/v2lite", "data": {"path": "../shared/data/zh_dialogue.json", "seq_len": 2048,
 "tokenizer": "bytes"}, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
 "bf16": {"enabled": true}, "activation_checkpointing": {"granularity": "full"}}
JSON
echo
echo "DeepSeek-V2-Lite shape, 8 ranks, bf16: model state MiB per rank (loom plan)"
printf "%-6s %12s %12s %12s %12s\n" "" "ZeRO-0" "ZeRO-1" "ZeRO-2" "ZeRO-3"
for ep in 1 2 8; do
  "$build/loom" plan "$tmp/v2lite.json" --world 8 --set expert_parallel.size=$ep |
    python3 -c '
import re, sys
cols = [re.split(r"\s+", l.replace("(cfg)", "").strip()) for l in sys.stdin if l.startswith("stage ")]
print(f"ep {sys.argv[1]:<3} " + " ".join(f"{float(c[5]):12.0f}" for c in cols))' $ep
done
