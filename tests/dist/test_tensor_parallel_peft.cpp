// PEFT under tensor parallelism against one process, on real ranks (ctest label `dist`,
// mpirun -np 2 and 4). As in test_tensor_parallel.cpp, the world is split into tp groups
// and every rank also builds the whole model alone; both attach the same PEFT modules and
// get the same full-tensor weights (LoRA's B and the adapters' up included, so no branch
// starts at zero), then one forward and backward in training mode, with LoRA dropout under
// one fixed DropoutContext, must give
//   - the same init: every PEFT parameter's shard, initialised from the seed, equals that
//     slice of the one-process parameter (full shapes, PEFT's names);
//   - the logits: this rank's vocabulary columns equal the whole model's (1e-5 relative);
//   - the loss sum (1e-5 relative);
//   - every trainable gradient: this rank's shard equals that slice of the whole model's
//     (1e-5), and the gradient of every replicated parameter (LoRA's A on column-parallel
//     layers, B on row-parallel ones, adapters, the prefix encoder's E, W1) is the same on
//     every rank of the group (it is applied to replicated values there).
// Models: GPT-2 (tied head, fused c_attn split in q, k, v blocks) and Llama with GQA (2 KV
// heads: split at tp2, replicated at tp4; packed rows). Methods: LoRA on every projection
// (with trainable biases), bottleneck adapters, prefix tuning with and without the
// projection, and LoRA + adapters + prefix together; LoRA and all three again with sequence
// parallel (_sp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/dist_main.h"
#include "common/test_util.h"
#include "common/tp_models.h"
#include "loom/dist/communicator.h"
#include "loom/dist/mesh.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/gpt2.h"
#include "loom/models/llama.h"

namespace loom {
namespace {

dist::Communicator* g_world = nullptr;

struct Methods {
  bool lora = false, adapter = false, prefix = false, projection = false;
};

struct Case {
  std::string name;
  nlohmann::json config;  // HF config.json
  int tp;
  bool packed;
  Methods peft;
  bool sp = false;  // sequence parallel
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// What models::declare_peft does for one method, for several at once: the base frozen
// (biases trainable with LoRA, PEFT's bias "all"), the methods' parameters declared and
// marked adapter, the store laid out by unit and the new parameters initialised.
void add_peft(models::CausalLM& m, const Methods& w, uint64_t seed) {
  nn::ParamStore& ps = m.params();
  const size_t n_base = ps.all().size();
  for (auto& p : ps.all()) p->trainable = w.lora && p->name.ends_with(".bias");
  if (w.lora)
    for (nn::Linear* l : m.linears())
      l->attach_lora(ps, {/*r=*/4, /*alpha=*/8.0f, /*rslora=*/false, /*dropout=*/0.25f},
                     &m.dropout());
  if (w.adapter) m.add_bottleneck_adapters({/*bottleneck=*/8, "gelu", 0.02f});
  if (w.prefix) m.add_kv_prefix({/*num_virtual_tokens=*/3, w.projection, /*hidden=*/12});
  for (size_t i = n_base; i < ps.all().size(); ++i) ps.all()[i]->adapter = true;
  ps.materialize([&](const nn::Parameter& p) { return m.unit_of(p.name); });
  ps.init_new(seed);
}

// p's slice of the one-process tensor `full` [p.full_shape].
std::vector<float> slice_of(const nn::Parameter& p, const float* full) {
  std::vector<float> s(shape_numel(p.shape));
  if (p.shard.sharded())
    nn::shard_from_full(p, full, s.data());
  else
    std::copy_n(full, s.size(), s.data());
  return s;
}

nlohmann::json gpt2() {
  return {{"model_type", "gpt2"}, {"vocab_size", 256}, {"n_positions", 32},
          {"n_embd", 32},         {"n_layer", 2},      {"n_head", 4}};
}

nlohmann::json llama() {
  return {{"model_type", "llama"},       {"vocab_size", 256},
          {"hidden_size", 32},           {"intermediate_size", 48},
          {"num_hidden_layers", 2},      {"num_attention_heads", 4},
          {"num_key_value_heads", 2},    {"max_position_embeddings", 32},
          {"tie_word_embeddings", true}, {"attention_bias", true}};
}

class TensorParallelPeft : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelPeft, LogitsLossAndGradientsEqualOneProcess) {
  const Case& c = GetParam();
  if (g_world->size() % c.tp != 0) GTEST_SKIP() << "world " << g_world->size();
  dist::ProcessMesh mesh(*g_world, c.tp, 1);
  const nn::TensorParallel tp{&mesh.tp(), c.sp};
  auto one = test::build(c.config, {});
  auto split = test::build(c.config, tp);
  add_peft(*one, c.peft, 17);
  add_peft(*split, c.peft, 17);

  // The same init in every layout: PEFT's names, full shapes, init keyed by full index.
  for (auto& q : split->params().all()) {
    if (!q->adapter) continue;
    const nn::Parameter* r = one->params().find(q->name);
    ASSERT_NE(r, nullptr) << q->name;
    EXPECT_EQ(q->full_shape, r->shape) << q->name;
    const std::vector<float> want = slice_of(*q, r->value.f32());
    EXPECT_EQ(0, std::memcmp(q->value.raw(), want.data(), q->value.nbytes())) << q->name;
  }

  test::set_weights(*one);
  test::set_weights(*split);
  // Training mode: LoRA dropout on, the same mask keys for both (rows from 5 on, step 3).
  for (models::CausalLM* m : {one.get(), split.get()}) m->dropout() = {true, 11, 3, 5};

  const int64_t B = 2, T = 12, V = one->vocab_size();
  const test::TpBatch batch = test::tp_batch(B, T, V);
  const Tensor &ids = batch.ids, &tg = batch.targets;
  const Tensor p = c.packed ? batch.pos : Tensor();
  const Tensor& ref = one->forward(ids, p);
  const Tensor& got = split->forward(ids, p);
  const int64_t Vl = got.dim(2);
  const std::vector<float> want = test::logit_columns(ref, *split, Vl);
  EXPECT_LT(test::rel_err(got.f32(), want.data(), B * T * Vl), 1e-5) << "logits";

  const float scale = 1.0f / static_cast<float>(kernels::count_targets(tg.i32(), B * T));
  one->params().zero_grads();
  split->params().zero_grads();
  const double l1 = one->backward(tg, scale), l2 = split->backward(tg, scale);
  EXPECT_LT(std::fabs(l1 - l2) / l1, 1e-5) << l1 << " vs " << l2;

  int checked = 0;
  for (auto& q : split->params().all()) {
    if (!q->trainable) continue;
    const nn::Parameter* r = one->params().find(q->name);
    ASSERT_NE(r, nullptr) << q->name;
    ASSERT_TRUE(r->trainable) << q->name;
    const std::vector<float> slice = slice_of(*q, r->grad.f32());
    const double err = test::rel_err(q->grad.f32(), slice.data(), q->grad.numel());
    // GPT-2's key bias gradient is exactly zero on both sides without a prefix.
    EXPECT_LT(err, 1e-5) << q->name << " (rank " << g_world->rank() << ")";
    ++checked;
    if (q->shard.sharded()) continue;
    // A replicated parameter must get the same gradient on every rank of the group, or
    // its copies would drift apart step by step.
    std::vector<float> first(q->grad.f32(), q->grad.f32() + q->grad.numel());
    mesh.tp().broadcast(first.data(), static_cast<int64_t>(first.size() * sizeof(float)), 0);
    EXPECT_LT(test::rel_err(q->grad.f32(), first.data(), q->grad.numel()), 1e-6)
        << q->name << ": rank " << mesh.tp_rank() << " differs from tp rank 0";
  }
  EXPECT_GT(checked, 0);
  // Every method's parameters were checked (not silently frozen).
  int peft = 0;
  for (auto& q : split->params().all()) peft += q->adapter && q->trainable;
  EXPECT_GT(peft, 0);
}

Case make(const std::string& model, int tp, const std::string& method, bool sp = false) {
  Methods m;
  m.lora = method == "lora" || method == "all";
  m.adapter = method == "adapter" || method == "all";
  m.prefix = method == "prefix" || method == "prefix_projection" || method == "all";
  m.projection = method == "prefix_projection";
  const bool is_gpt2 = model == "gpt2";
  return Case{model + "_tp" + std::to_string(tp) + "_" + method + (sp ? "_sp" : ""),
              is_gpt2 ? gpt2() : llama(),
              tp,
              /*packed=*/!is_gpt2,
              m,
              sp};
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* model : {"gpt2", "llama_gqa"})
    for (int tp : {2, 4})
      for (const char* method : {"lora", "adapter", "prefix", "prefix_projection", "all"}) {
        out.push_back(make(model, tp, method));
        // Sequence parallel: a row-parallel layer's branch goes to this rank's token rows.
        if (std::string(method) == "lora" || std::string(method) == "all")
          out.push_back(make(model, tp, method, /*sp=*/true));
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelPeft, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  std::unique_ptr<loom::dist::Communicator> world = loom::dist::make_world_communicator();
  loom::g_world = world.get();
  return loom::test::run_tests_on_every_rank(argc, argv, *world);
}
