# Loom's entry points. `make demo` and `make test` each work on a fresh machine on their
# own: they install missing Debian packages, configure, build and run.
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= 2
REF_VENV ?= $(HOME)/.cache/loom/ref-venv
export OMP_WAIT_POLICY ?= PASSIVE

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 600
# Seconds of fuzzing per target in `make fuzz-smoke` (part of `make test`), after its corpus.
FUZZ_SMOKE_SECONDS ?= 5
# Seconds one input may run before libFuzzer reports it as a timeout (its default is 1200).
FUZZ_TIMEOUT ?= 30
# Which targets to run (fuzz/fuzz_NAME.cpp), e.g. `make fuzz FUZZ_TARGETS=gguf`.
FUZZ_TARGETS ?= $(patsubst fuzz/fuzz_%.cpp,%,$(wildcard fuzz/fuzz_*.cpp))

.PHONY: all deps build build-loom build-asan demo demo-gpt2 test test-asan bench bench-tp bench-moe bench-pp bench-plan bench-gemm bench-ckpt \
  fixtures check-demo-checkpoint fuzz fuzz-smoke format clean

all: build

deps:
	@bash scripts/install_deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release > /dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Only the `loom` program (what the demos run): a fresh machine's first `make demo` does not
# wait for the test and benchmark binaries.
build-loom: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release > /dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target loom

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=ON > /dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target loom loom_unit_tests test_collectives \
	  test_zero_equivalence test_tensor_parallel test_pipeline_parallel test_mixed_precision \
	  test_expert_parallel

# The worked example: LoRA fine-tuning of SmolLM2-135M-Instruct (GGUF Q4_1 base kept
# quantized) on ../shared/data/zh_dialogue.json, then Chinese prompts answered by the base
# model and by the tuned one (scripts/demo.sh).
demo: build-loom
	OMP_NUM_THREADS=2 bash scripts/demo.sh $(BUILD)

# The earlier demo: a small GPT-2 trained from scratch on the wiki text, then sampled.
demo-gpt2: build-loom
	OMP_NUM_THREADS=2 $(BUILD)/loom train configs/demo-gpt2-wiki.json
	OMP_NUM_THREADS=2 $(BUILD)/loom generate --model out/demo-gpt2-wiki/checkpoint-final \
	  --prompt "The history of " --max-tokens 300 --temperature 0.8 --top-k 40

# Every test (labels unit, golden and dist), then the parser and memory tests and the 2-rank
# collectives again under AddressSanitizer + UBSan, then the fuzz targets built with clang
# and run briefly (fuzz-smoke), so a change that breaks them fails here and in CI.
test: build build-asan
	@bash scripts/install_deps.sh --test
	@bash scripts/fetch_default_model.sh > /dev/null
	cd $(BUILD) && OMP_NUM_THREADS=2 ctest --output-on-failure --timeout 600
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory fuzz-smoke

# The collectives, the ZeRO engine, TP, PP, mixed precision and expert parallelism (2 ranks) run without leak checking: OpenMPI keeps ~120 KB of its own allocations (its
# plugins') at exit.
test-asan:
	ASAN_OPTIONS=detect_leaks=1 OMP_NUM_THREADS=1 $(ASAN_BUILD)/loom_unit_tests \
	  --gtest_filter='Safetensors*:TbEvents*:Monitor*:Report*:DiskFault*:Config*:Bf16*:LossScaler*:Trace*:Schedule*:CliErrors*:Checkpoint*:KernelGrad*:ModuleGrad*:LlamaGrad*:Conversation*:ChatTemplates*:Generate*:Packing*:Gguf*:SftDataset*:Tokenizer*:Peft*:QMatmul*:TrainPeft*:Dist*:ZeroPlan*:Plan*:Pipeline*:ActivationCheckpointing*:MixedPrecision.Fp16*:MixedPrecision.Products*:MixedPrecision.Loads*:MixedPrecision.SixteenBit*:Deepseek*:ExpertBalance*'
	ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root \
	  --bind-to none -np 2 $(ASAN_BUILD)/test_collectives
	ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root \
	  --bind-to none -np 2 $(ASAN_BUILD)/test_zero_equivalence
	ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root \
	  --bind-to none -np 2 $(ASAN_BUILD)/test_tensor_parallel
	ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root \
	  --bind-to none -np 2 $(ASAN_BUILD)/test_pipeline_parallel
	ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root \
	  --bind-to none -np 2 $(ASAN_BUILD)/test_mixed_precision
	ASAN_OPTIONS=detect_leaks=0 OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root \
	  --bind-to none -np 2 $(ASAN_BUILD)/test_expert_parallel

# Benchmark: the GPT-2 124M training step (fp32, bf16) and SmolLM2 fine-tuning steps (LoRA
# on the quantized and the fp32 base, full), ours vs PyTorch's (+ PEFT), same machine and
# threads (bench/run.sh; CASES=gpt2 or CASES=ft for one part).
bench: build
	bash bench/run.sh $(BUILD) $(REF_VENV)

# Tensor parallelism: the step at tp1 vs tp2 (same cores), and the tp bytes per layer
# against Megatron's formula at tp2 and tp4 (bench/tp.sh; mpirun, not in `make test`).
bench-tp: build
	bash bench/tp.sh $(BUILD)

# Expert parallelism: the token exchange's bytes per MoE layer per micro-batch against
# uniform routing's, and the load balance with and without DeepSeek-V3's bias update
# (bench/moe_ep.sh; mpirun, a minute, not in `make test`).
bench-moe: build
	bash bench/moe_ep.sh $(BUILD)

# Pipeline parallelism: each stage's idle time from the schedule trace, GPipe and 1F1B at
# m = 2, 4, 8 on pp2, against the bubble (p - 1) / (m + p - 1) (bench/pp_bubble.sh; mpirun).
bench-pp: build
	bash bench/pp_bubble.sh $(BUILD)

# bf16 GEMM (oneDNN on native bf16, and the widening fallback) against OpenBLAS sgemm on
# GPT-2 124M's layer products, 1024 tokens, 2 threads then 1 (bench/gemm_bf16.cpp).
bench-gemm: build
	OMP_NUM_THREADS=2 $(BUILD)/gemm_bf16 --tokens 1024
	OMP_NUM_THREADS=1 $(BUILD)/gemm_bf16 --tokens 1024 --reps 3

# loom plan's estimates against real runs: GPT-2 124M and the default model at 2, 4 and 8
# ranks, each in the fastest layout `loom plan --memory-per-rank` finds (bench/plan_check.sh;
# 7-15 minutes here, not in `make test`). `bash bench/plan_calibrate.sh` re-measures the
# cost model's constants (src/loom/train/cost_model.cpp).
bench-plan: build
	bash bench/plan_check.sh $(BUILD)

# Memory by precision and activation checkpointing: GPT-2 124M at T = 512 (fp32 with none,
# selective and full; bf16; bf16 + full) and the SmolLM2 LoRA demo config (fp32, bf16), peak
# RSS against loom plan (bench/ckpt_memory.sh; about 15 minutes, not in
# `make test`).
bench-ckpt: build
	bash bench/ckpt_memory.sh $(BUILD)

# Regenerates tests/fixtures (needs torch + transformers; see scripts/make_fixtures.py).
fixtures:
	bash scripts/ref_venv.sh $(REF_VENV)
	$(REF_VENV)/bin/python scripts/make_fixtures.py

# Checks the demo's output against the references: the LoRA adapter folder loads with
# peft.PeftModel.from_pretrained on transformers' GGUF-loaded base with Loom's logits, and
# the merged export (loom export --merge) loads in transformers with Loom's logits.
DEMO_OUT ?= out/sft-smollm2-zh-lora/checkpoint-final
check-demo-checkpoint: build
	bash scripts/ref_venv.sh $(REF_VENV)
	$(REF_VENV)/bin/python scripts/check_peft_adapter.py $(DEMO_OUT) \
	  $$(bash scripts/fetch_default_model.sh) --loom $(BUILD)/loom
	$(BUILD)/loom export --model $(DEMO_OUT) --merge --out $(DEMO_OUT)-merged
	$(REF_VENV)/bin/python scripts/check_hf_checkpoint.py $(DEMO_OUT)-merged --loom $(BUILD)/loom --tol 1e-3
	$(REF_VENV)/bin/python scripts/check_hf_tokenizer.py $(DEMO_OUT)-merged --gguf $$(bash scripts/fetch_default_model.sh)

# libFuzzer + ASan/UBSan on every parser in fuzz/ (clang), FUZZ_SECONDS each (default 600),
# seeded from tiny valid files (fuzz/make_seeds.py). Each target first runs every input of
# its corpus ($(FUZZ_BUILD)/corpus/NAME: the seeds plus what earlier runs kept), then fuzzes.
# Findings land in $(FUZZ_BUILD)/findings and fail the target (the fuzzer's exit status, any
# artifact there, or a UBSan report in the log); logs in $(FUZZ_BUILD)/logs.
fuzz: deps
	@bash scripts/install_deps.sh --fuzz
	@CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF > /dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@python3 fuzz/make_seeds.py $(FUZZ_BUILD)/seeds
	@mkdir -p $(FUZZ_BUILD)/findings $(FUZZ_BUILD)/logs
	@for t in $(FUZZ_TARGETS); do f=$(FUZZ_BUILD)/fuzz_$$t; \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; cp -n $(FUZZ_BUILD)/seeds/$$t/* $(FUZZ_BUILD)/corpus/$$t/ 2>/dev/null; \
	  echo "== fuzz $$t for $(FUZZ_SECONDS)s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -rss_limit_mb=4096 \
	    -artifact_prefix=$(FUZZ_BUILD)/findings/$$t- $(FUZZ_BUILD)/corpus/$$t \
	    > $(FUZZ_BUILD)/logs/$$t.log 2>&1; rc=$$?; grep -E '^#[0-9]+' $(FUZZ_BUILD)/logs/$$t.log | tail -1; \
	  if [ $$rc -ne 0 ] || ls $(FUZZ_BUILD)/findings/$$t-* > /dev/null 2>&1 || \
	     grep -q 'runtime error:' $(FUZZ_BUILD)/logs/$$t.log; then \
	    tail -40 $(FUZZ_BUILD)/logs/$$t.log; \
	    echo "fuzz $$t: finding (exit $$rc), see $(FUZZ_BUILD)/findings and $(FUZZ_BUILD)/logs/$$t.log"; exit 1; fi; done

# The same recipe for a few seconds per target: a target that no longer compiles under clang,
# or that crashes on its corpus or soon after, fails `make test`.
fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
