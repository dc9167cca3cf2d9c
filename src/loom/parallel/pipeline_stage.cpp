#include "loom/parallel/pipeline_stage.h"

#include <algorithm>

#include "loom/nn/buffers.h"
#include "loom/util/error.h"
#include "loom/util/profile.h"
#include "loom/util/trace.h"

namespace loom::parallel {

namespace {
int act_tag(int chunk, int micro, int m) { return 2 * (chunk * m + micro); }
int grad_tag(int chunk, int micro, int m) { return 2 * (chunk * m + micro) + 1; }
constexpr int kTiedTag = 32767;  // MPI's smallest allowed tag bound

// Waits for a non-blocking call; the trace's wait span names micro-batch `micro` (-1: none).
void wait(dist::Request& req, int micro = -1) {
  prof::ScopedPhase ph(prof::Phase::Comm);
  trace::MicroScope ms(micro);
  req.wait();
}
}  // namespace

PipelineStage::PipelineStage(std::vector<models::CausalLM*> contexts, dist::Communicator& pp,
                             std::string schedule, int chunks)
    : contexts_(std::move(contexts)), pp_(pp), schedule_(std::move(schedule)), chunks_(chunks) {
  LOOM_CHECK(!contexts_.empty(), "internal: a pipeline stage needs a model");
}

double PipelineStage::train(const std::vector<MicroBatchTensors>& micro, float grad_scale,
                            const PassHooks& hooks) {
  const int p = pp_.size(), r = pp_.rank(), m = static_cast<int>(micro.size()), v = chunks_;
  const int K = contexts();
  passes_ = stage_schedule(schedule_, p, r, m, v);
  LOOM_CHECK(max_in_flight(passes_) <= K,
             "internal: the " + schedule_ + " schedule holds " +
                 std::to_string(max_in_flight(passes_)) + " micro-batches on stage " +
                 std::to_string(r) + ", which has " + std::to_string(K) + " activation contexts");
  const models::CausalLM& model = *contexts_[0];
  // The receiver's chunk of what chunk c sends on (its output) and back (its input gradient).
  auto next_chunk = [&](int c) { return r < p - 1 ? c : c + 1; };
  auto prev_chunk = [&](int c) { return r > 0 ? c : c - 1; };

  // Every receive of the step, posted up front.
  act_in_.resize(static_cast<size_t>(v) * m);
  grad_in_.resize(static_cast<size_t>(v) * m);
  std::vector<dist::Request> act_recv(v * m), grad_recv(v * m);
  for (int c = 0; c < v; ++c) {
    for (int i = 0; i < m; ++i) {
      const Shape io = model.stage_io_shape(micro[i].ids.dim(0), micro[i].ids.dim(1));
      const int k = c * m + i;
      if (!model_first(c)) {
        nn::ensure(act_in_[k], io);
        act_recv[k] =
            pp_.irecv(act_in_[k].f32(), act_in_[k].numel(), prev_rank(), act_tag(c, i, m));
      }
      if (!model_last(c)) {
        nn::ensure(grad_in_[k], io);
        grad_recv[k] =
            pp_.irecv(grad_in_[k].f32(), grad_in_[k].numel(), next_rank(), grad_tag(c, i, m));
      }
    }
  }
  // A context's chunk output and input gradient live in it until that chunk's next pass
  // there: a send from them is waited for before it. The trace names each wait's
  // micro-batch (the sends': the one sent last from the slot).
  std::vector<dist::Request> act_sent(K * v), grad_sent(K * v);
  std::vector<int> act_sent_micro(K * v, -1), grad_sent_micro(K * v, -1);
  std::vector<int> context_of(m, -1), passes_left(m, 2 * v), free_contexts(K);
  for (int k = 0; k < K; ++k) free_contexts[k] = K - 1 - k;  // context 0 first
  double loss_sum = 0.0;
  for (const Pass& pass : passes_) {
    const int i = pass.micro, c = pass.chunk, k = c * m + i;
    if (context_of[i] < 0) {
      context_of[i] = free_contexts.back();
      free_contexts.pop_back();
    }
    const int slot = context_of[i] * v + c;
    models::CausalLM& ctx = *contexts_[context_of[i]];
    const MicroBatchTensors& mb = micro[i];
    if (pass.kind == Pass::Forward) {
      wait(act_sent[slot], act_sent_micro[slot]);
      if (!model_first(c)) wait(act_recv[k], i);
      hooks.before_forward(ctx, i);
      trace::MicroScope ms(i);
      const Tensor* out;
      {
        trace::Span span(trace::Kind::Forward, i, -1, c);
        out = &ctx.forward_stage(mb.ids, mb.pos, model_first(c) ? Tensor() : act_in_[k], c);
      }
      if (!model_last(c)) {
        act_sent[slot] =
            pp_.isend(out->f32(), out->numel(), next_rank(), act_tag(next_chunk(c), i, m));
        act_sent_micro[slot] = i;
      }
    } else {
      wait(grad_sent[slot], grad_sent_micro[slot]);
      if (!model_last(c)) wait(grad_recv[k], i);
      trace::MicroScope ms(i);
      hooks.before_backward();
      {
        trace::Span span(trace::Kind::Backward, i, -1, c);
        loss_sum +=
            ctx.backward_stage(mb.targets, grad_scale, model_last(c) ? Tensor() : grad_in_[k], c);
      }
      hooks.after_backward();
      if (!model_first(c)) {
        const Tensor& g = ctx.input_grad(c);
        grad_sent[slot] =
            pp_.isend(g.f32(), g.numel(), prev_rank(), grad_tag(prev_chunk(c), i, m));
        grad_sent_micro[slot] = i;
      }
    }
    if (--passes_left[i] == 0) free_contexts.push_back(context_of[i]);
  }
  for (int s = 0; s < K * v; ++s) {
    wait(act_sent[s], act_sent_micro[s]);
    wait(grad_sent[s], grad_sent_micro[s]);
  }
  return loss_sum;
}

models::CausalLM* PipelineStage::forward(const Tensor& ids, const Tensor& pos) {
  const int r = pp_.rank();
  models::CausalLM& model = *contexts_[0];
  for (int c = 0; c < chunks_; ++c) {
    Tensor in;
    if (!model_first(c)) {
      in = Tensor::zeros(model.stage_io_shape(ids.dim(0), ids.dim(1)));
      dist::Request req = pp_.irecv(in.f32(), in.numel(), prev_rank(), act_tag(c, 0, 1));
      wait(req);
    }
    const Tensor& out = model.forward_stage(ids, pos, in, c);
    if (model_last(c)) return &model;
    const int to = r < pp_.size() - 1 ? c : c + 1;
    dist::Request req = pp_.isend(out.f32(), out.numel(), next_rank(), act_tag(to, 0, 1));
    wait(req);
  }
  return nullptr;
}

void PipelineStage::sum_tied_grads(ZeroEngine& engine) {
  const int p = pp_.size(), r = pp_.rank();
  if (p == 1 || (r != 0 && r != p - 1)) return;
  nn::Parameter* w = contexts_[0]->tied_embedding();
  if (!w || !w->trainable) return;  // untied, or a frozen base (PEFT)
  const int peer = r == 0 ? p - 1 : 0;
  const Tensor mine = engine.reduced_grad(*w);  // collective over the stage's dp group
  Tensor theirs = Tensor::zeros(mine.shape());
  {
    prof::ScopedPhase ph(prof::Phase::Comm);
    dist::Request in = pp_.irecv(theirs.f32(), theirs.numel(), peer, kTiedTag);
    dist::Request out = pp_.isend(mine.f32(), mine.numel(), peer, kTiedTag);
    in.wait();
    out.wait();
  }
  engine.add_to_reduced_grad(*w, theirs);
}

}  // namespace loom::parallel
