// Communication accounting of tensor parallelism (not a test; bench/tp.sh runs it): the
// bytes one GPT-2-shaped model's tp communicator sends per transformer layer for one
// forward + backward of one micro-batch [b, s], measured, against Megatron's volume.
//   mpirun -np W tp_comm [--tp N] [--batch b] [--seq s]      (N defaults to W)
//
// What is measured. Models with L = 1, 2 and 3 layers (GPT-2 124M widths: h = 768, 12
// heads, vocabulary 50304) each run one forward and one backward of the same batch on this
// rank's tp group, and CommStats (dist/communicator.h) says what the group sent in between.
// Everything outside the blocks (the vocab-parallel embedding and head) is the same for
// every L, so bytes(L+1) - bytes(L) is exactly one block's traffic; the program checks that
// the difference is the same from 1 to 2 and from 2 to 3 layers, and that every rank of
// the job measured the same.
//
// The convention is the communicator's: an all-reduce of n fp32 values counts
// floor(2(t-1)/t * 4n) bytes sent per rank (ring), an all-gather or reduce-scatter with n/t
// values per rank (t-1) * 4n/t. Megatron's layer without sequence parallel: two all-reduces
// of b*s*h in forward (after attention's and the MLP's row-parallel projection, g) and two
// in backward (the gradient at the attention and MLP input, f), so per layer
//   4 calls, 4 * floor(2(t-1) * 4bsh / t) bytes.
// With sequence parallel each of them becomes an all-gather plus a reduce-scatter of
// b*s*h/t per rank (forward: all-gather before attention and MLP, reduce-scatter after;
// backward the conjugates; no re-gather of saved inputs), so per layer
//   8 calls, 8 * (t-1) * 4bsh/t bytes: the same bytes as 4 ring all-reduces,
// plus one all-reduce of the layer's LayerNorm gradients (4h fp32: their rows are split,
// so each rank's gradient is partial and summed per backward): 9 calls.
// The rest of the model (also checked, from the L = 1 model): the embedding's forward
// all-reduce of b*s*h fp32, the head's backward all-reduce of dh (b*s*h fp32), and the
// vocab-parallel cross-entropy's all-reduces of b*s row maxima and 2*b*s sums in fp64;
// with sequence parallel the two b*s*h all-reduces become two reduce-scatters and two
// all-gathers, plus the sums of the position rows' (s*h) and ln_f's (2h) partial gradients.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/dist/mesh.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/models/registry.h"
#include "loom/util/error.h"

namespace {

using loom::dist::Communicator;

struct Traffic {
  int64_t bytes = 0, calls = 0;
};

// One forward + backward of a [b, s] batch through GPT-2 with `layers` blocks split over
// the tp group; the tp communicator's traffic in between.
Traffic measure(Communicator& tp_comm, bool sp, int64_t layers, int64_t b, int64_t s) {
  const nlohmann::json hf = {{"model_type", "gpt2"}, {"vocab_size", 50304}, {"n_positions", 1024},
                             {"n_embd", 768},        {"n_layer", layers},   {"n_head", 12}};
  auto model = loom::models::make_model(hf, "tp_comm", loom::nn::TensorParallel{&tp_comm, sp});
  model->params().init(1);
  loom::Tensor ids = loom::Tensor::zeros({b, s}, loom::DType::I32);
  loom::Tensor tg = loom::Tensor::zeros({b, s}, loom::DType::I32);
  for (int64_t i = 0; i < b * s; ++i) {
    ids.i32()[i] = static_cast<int32_t>((i * 7919 + 13) % 50304);
    tg.i32()[i] = static_cast<int32_t>((i * 104729 + 7) % 50304);
  }
  model->params().zero_grads();
  tp_comm.reset_stats();
  model->forward(ids);
  model->backward(tg, 1.0f / static_cast<float>(b * s));
  const loom::dist::CommStats st = tp_comm.stats();
  return {st.bytes_sent, st.collectives};
}

// The communicator's counting (dist/communicator.cpp), restated here on purpose: the
// formulas below must use the same convention to be compared exactly.
int64_t all_reduce_bytes(int t, int64_t payload) { return 2 * (t - 1) * payload / t; }
int64_t ring_bytes(int t, int64_t n_per_rank) { return (t - 1) * n_per_rank * 4; }

// Every rank's value of x equal (the model and the batch are the same on every rank).
bool same_on_all_ranks(Communicator& world, int64_t x) {
  double hi = static_cast<double>(x), neg_lo = -static_cast<double>(x);
  world.all_reduce_max(&hi);
  world.all_reduce_max(&neg_lo);
  return hi == -neg_lo;
}

}  // namespace

int main(int argc, char** argv) {
  auto world = loom::dist::make_world_communicator();
  int64_t tp = world->size(), b = 4, s = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--tp")
      tp = v;
    else if (k == "--batch")
      b = v;
    else if (k == "--seq")
      s = v;
    else {
      if (world->rank() == 0) std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (tp < 2 || world->size() % tp != 0 || (b * s) % tp != 0) {
    if (world->rank() == 0)
      std::fprintf(stderr,
                   "tp_comm: needs mpirun -np W with --tp N >= 2 dividing W (and b*s), got "
                   "W=%d N=%lld\n",
                   world->size(), static_cast<long long>(tp));
    return 2;
  }
  loom::dist::ProcessMesh mesh(*world, static_cast<int>(tp), 1);
  const int t = static_cast<int>(tp);
  const int64_t h = 768, n = b * s * h, N = b * s;
  const bool root = world->rank() == 0;
  bool ok = true;
  nlohmann::json rows = nlohmann::json::array();
  if (root)
    std::printf("%-3s %-3s %-22s %-22s %-7s %-18s %s\n", "tp", "sp", "measured B/layer/mb",
                "formula B/layer/mb", "equal?", "calls/layer (f.)", "rest of model (f.)");
  for (bool sp : {false, true}) {
    Traffic m[3];
    for (int64_t L = 1; L <= 3; ++L) m[L - 1] = measure(mesh.tp(), sp, L, b, s);
    const int64_t per_layer = m[1].bytes - m[0].bytes, calls = m[1].calls - m[0].calls;
    const bool linear = m[2].bytes - m[1].bytes == per_layer && m[2].calls - m[1].calls == calls;
    bool agree = true;
    for (const Traffic& x : m)
      agree = same_on_all_ranks(*world, x.bytes) && same_on_all_ranks(*world, x.calls) && agree;
    const int64_t rest = m[0].bytes - per_layer;
    // Outside the layers: the cross-entropy's row maxima and sums (fp64), and the token
    // embedding's forward reduce plus the head's backward reduce of dh. With sequence
    // parallel those two become a reduce-scatter and an all-gather each (the embedding to
    // rows and back, the final norm's rows gathered for the head and back), and the partial
    // gradients of the position rows used (s x h) and of ln_f (2h) are summed.
    const int64_t ce = all_reduce_bytes(t, 8 * N) + all_reduce_bytes(t, 16 * N);
    const int64_t rest_formula = !sp ? 2 * all_reduce_bytes(t, 4 * n) + ce
                                     : 4 * ring_bytes(t, n / t) + all_reduce_bytes(t, 4 * s * h) +
                                           all_reduce_bytes(t, 4 * 2 * h) + ce;
    int64_t formula, formula_calls;
    if (!sp) {
      formula = 4 * all_reduce_bytes(t, 4 * n);
      formula_calls = 4;
    } else {
      formula = 8 * ring_bytes(t, n / t) + all_reduce_bytes(t, 4 * 4 * h);
      formula_calls = 9;
    }
    const bool equal = per_layer == formula && calls == formula_calls;
    std::string verdict = equal ? "yes" : "NO";
    if (!linear || !agree) verdict = "NO";
    const bool rest_ok = rest == rest_formula;
    ok = ok && verdict == "yes" && rest_ok;
    if (root) {
      char c[32], r[48];
      std::snprintf(c, sizeof c, "%lld (%lld)", static_cast<long long>(calls),
                    static_cast<long long>(formula_calls));
      std::snprintf(r, sizeof r, "%lld (%lld)%s", static_cast<long long>(rest),
                    static_cast<long long>(rest_formula), rest_ok ? "" : " NO");
      std::printf("%-3d %-3d %-22lld %-22lld %-7s %-18s %s\n", t, sp ? 1 : 0,
                  static_cast<long long>(per_layer), static_cast<long long>(formula),
                  verdict.c_str(), c, r);
    }
    rows.push_back({{"tp", t},
                    {"sp", sp},
                    {"b", b},
                    {"s", s},
                    {"h", h},
                    {"bytes_per_layer", per_layer},
                    {"formula_bytes_per_layer", formula},
                    {"calls_per_layer", calls},
                    {"formula_calls_per_layer", formula_calls},
                    {"rest_bytes", rest},
                    {"formula_rest_bytes", rest_formula},
                    {"same_every_layer", linear},
                    {"same_every_rank", agree},
                    {"equal", verdict == "yes"}});
  }
  if (root) std::printf("%s\n", rows.dump().c_str());
  return ok ? 0 : 1;
}
