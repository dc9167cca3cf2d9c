// Data parallel training and ZeRO stages 1-3 (Rajbhandari et al. 2020, DeepSpeed's
// zero_optimization.stage) over the data-parallel group:
//   stage 0  every rank holds everything; after the step's last backward the gradients are
//            summed by bucketed all-reduce, each bucket started as soon as its units'
//            gradients are complete (overlapping the rest of the backward)
//   stage 1  AdamW moments sharded: gradients reduce-scattered (each rank receives the sum
//            of its shard), the shard updated, the updated parameters all-gathered
//   stage 2  gradients sharded too: each unit's gradient lives only while its backward runs
//            and is reduce-scattered into the shard right after, every micro-batch
//   stage 3  parameters sharded too: a unit's parameters are all-gathered just before it
//            runs (the next unit prefetched) and released after, in forward and backward
// Partition: the model's units (models/causal_lm.h) each own one contiguous range of the
// flat trainable vector (ParamStore's layout); a unit of L elements is padded to N * c with
// c = ceil(L / N), and rank r owns elements [r c, (r + 1) c) of every unit. The rank's
// shard is those pieces back to back (length S = sum of c). Frozen (PEFT base) parameters
// are neither sharded nor communicated.
// Expert parallelism: a unit's routed-expert parameters (nn::Parameter::expert, laid out
// after every dense one) are a unit of their own, held only by the dp ranks with the same
// expert slice; they are reduced, sharded and gathered over that expert-data-parallel
// group (`edp`, dist::ProcessMesh::edp) instead of dp. Without expert parallelism edp is
// dp and the expert units behave as the others.
// Gradients arrive already scaled by 1 / (target tokens of the global batch), so summing
// over ranks gives the global batch's gradient exactly as one process computes it.
// Stages 2-3 add the micro-batches' reduced pieces as a pairwise tree over the micro-batch
// index (MicroBatchSum below), not a running sum. Rank r's k-th micro-batch is the global
// batch's micro-batch k dp + r (data/sampler.h), and a 2-rank reduce-scatter adds the
// pair (2k, 2k + 1) in one fp32 addition: the job's sums are then the upper levels of one
// process's tree over the same micro-batches, bit for bit (with a power-of-two dp when the
// reduction itself adds in a tree). That is what lets a 16-bit run on 2 ranks stay equal to
// one process step after step (a 1e-7 difference in an fp32 master flips the rounding of
// some 16-bit operands, and such flips compound). Pairwise sums also drift less over long
// accumulations (error growing with log2 of the micro-batch count, not with the count).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/dist/communicator.h"
#include "loom/kernels/cpu/bf16.h"
#include "loom/models/causal_lm.h"
#include "loom/optim/adamw.h"

namespace loom::parallel {

struct ZeroConfig {
  int stage = 0;
  int64_t reduce_bucket_size = 500'000'000;  // elements per stage-0 all-reduce (DeepSpeed's)
  // Mixed precision: the model's matrices are used in 16 bits by their products
  // (nn/weight_ops.h); the fp32 values are the master AdamW updates (StateBytes::loom_mixed
  // says where each stage keeps what).
  std::optional<kernels::Half> half;
  // DeepSpeed's communication_data_type bf16/fp16: gradients are rounded to 16 bits for
  // their all-reduce / reduce-scatter (half the bytes; each pairwise sum rounded) and
  // widened back into the fp32 accumulators. Unset: fp32, the accumulation dtype.
  std::optional<kernels::Half> comm;
  // Micro-batches per step on a rank (gradient accumulation): sizes the pairwise sums'
  // buffers at stages 2-3 (ZeroPartition::memory).
  int64_t micro_batches = 1;
  // DeepSpeed's data_types.grad_accum_dtype bf16/fp16 (stages 2-3): the shard's summed
  // gradients held in 16 bits, each micro-batch's reduced fp32 piece added with one rounding
  // (half the gradient bytes; the sum then depends on the order, so layouts are no longer
  // bitwise one process). Unset: fp32.
  std::optional<kernels::Half> accum;
};

// The pairwise sum of A micro-batches' gradient pieces, as a binary counter: the k-th piece
// joins level 0, and two partial sums of the same level (2^j consecutive micro-batches each)
// add into one of level j + 1 as soon as both exist; what is left at the end (one partial
// per set bit of A) is added from the lowest level up. The earliest partial, always the
// highest level, lives in the caller's accumulator; the others are the pieces themselves,
// kept until they are added (at most sum_buffers(A) at a time).
class MicroBatchSum {
 public:
  // acc: the accumulator (n elements of f32, or of bf16/fp16 under grad_accum_dtype), zero
  // at the step's start; it ends holding the sum. piece: n or more f32 elements.
  void add(const Tensor& acc, Tensor piece, int64_t n);
  void finish(const Tensor& acc, int64_t n);  // after the step's last piece; ready for the next
  // Pieces held at most beside the accumulator over A micro-batches: the largest popcount
  // of 1..A, less one (0 for A = 1 or 2, 1 for 3-6, 2 for 7-14).
  static int64_t sum_buffers(int64_t micro_batches);

 private:
  struct Partial {
    Tensor sum;
    int level;
  };
  std::vector<Partial> stack_;  // levels strictly decreasing from bottom to top
  int acc_level_ = -1;          // the accumulator's level; -1: nothing added yet
};

// Bytes one rank holds for the model state under a stage, and the engine's buffers: what
// `loom plan` prints and the engine logs, from the same arithmetic.
struct ZeroMemory {
  int64_t params = 0, grads = 0, optimizer = 0, buffers = 0;
  int64_t model_state() const { return params + grads + optimizer; }
};

// Bytes per trainable element of each kind of model state (the ZeRO paper's 2 + 2 + K):
// fp32 training holds fp32 weights, gradients and AdamW's two moments (4 + 4 + 8).
// paper_mixed: the paper's mixed precision (DeepSpeed's layout) holds 16-bit weights for
// forward/backward, gradients in the accumulation dtype (fp32 by default, 2 bytes with
// data_types.grad_accum_dtype bf16/fp16) and the fp32 master copy with the moments (K = 12,
// sharded from stage 1), and communicates 16-bit gradients.
// loom_mixed: what this engine holds under bf16/fp16. Stage 0: the f32 weights are
// the master, each trained matrix has a 16-bit copy beside them (`half`) - the paper's 14
// bytes split 4 + 2 + 8. Stages 1-2: the paper's layout (16-bit working weights whole, the
// fp32 master sharded with the moments; norms and biases, a few thousandths of the
// elements, stay f32 and are counted as 16-bit). Stage 3: the f32 master shard and the
// moments (12 per shard element; each gathered unit is rounded to 16 bits while it is
// held). Gradients accumulate and travel in fp32 unless grad_accum_dtype (stages 2-3: grad
// 2) or communication_data_type (comm 2) say 16 bits.
struct StateBytes {
  int64_t param = 4, grad = 4, optimizer = 8, comm = 4, half = 0;
  static StateBytes paper_mixed(int64_t grad_accum_bytes) {
    return {2, grad_accum_bytes, 12, 2, 0};
  }
  static StateBytes loom_mixed() { return {4, 4, 8, 4, 2}; }  // ZeroPartition::memory splits it
};

// The partition of a model's trainable vector, from unit sizes alone (no model needed).
// Each unit is split over its group: the dp ranks (N = world), or for an expert unit the
// expert-data-parallel ranks (N = expert_world).
struct ZeroPartition {
  std::vector<int64_t> unit_start, unit_len;  // flat range of each unit
  std::vector<int64_t> piece, shard_offset;   // per unit: c = ceil(L / N), its place in the shard
  std::vector<bool> expert;                   // per unit: split over the expert group
  int64_t shard_len = 0;                      // S
  int world = 1, rank = 0;
  int expert_world = 1, expert_rank = 0;

  static ZeroPartition make(const std::vector<int64_t>& unit_lens, int world, int rank,
                            const std::vector<bool>& expert = {}, int expert_world = 0,
                            int expert_rank = 0);
  int world_of(size_t u) const { return expert[u] ? expert_world : world; }
  int rank_of(size_t u) const { return expert[u] ? expert_rank : rank; }
  int64_t piece_begin(size_t u) const { return rank_of(u) * piece[u]; }  // in unit coordinates
  int64_t piece_end(size_t u) const;                                     // clipped to the unit
  // Model-state bytes per rank for `stage` with AdamW, `b` bytes per element of each kind:
  // frozen_bytes are the weights that are not trained (held whole on every rank; under
  // mixed precision a frozen matrix is held in its 16 bits alone); micro_batches per step
  // size the pairwise sums' pieces at stages 2-3 (MicroBatchSum).
  ZeroMemory memory(int stage, int64_t frozen_bytes, const StateBytes& b = {},
                    int64_t micro_batches = 1) const;
};

class ZeroEngine : public models::UnitHooks {
 public:
  // tp: the model's tensor-parallel group (its ranks hold different shards; the gradient
  // norm sums over it, counting each replicated parameter once). edp: the expert-data-
  // parallel group inside dp (null: dp itself, no expert parallelism).
  ZeroEngine(models::CausalLM& model, dist::Communicator& dp, const ZeroConfig& cfg,
             const optim::AdamWConfig& adamw, const nn::TensorParallel& tp = {},
             dist::Communicator* edp = nullptr);
  ~ZeroEngine() override;
  // A pipeline stage's further activation context (parallel/pipeline_stage.h): a copy of the
  // model's modules over its parameters. It shares the views the engine sets (the stage's
  // layout, gathered values at stage 3, unit gradients at stages 2 and 3) and reports to
  // the engine as the model does.
  void add_context(models::CausalLM& ctx);

  // The step path, in order (Trainer::step):
  void zero_grads();
  void begin_micro_batch(bool last);  // `last`: the step's gradients are reduced after it
  void begin_backward();
  void end_backward();  // after the last micro-batch: every reduction finished
  // After a pipeline stage's schedule (every micro-batch marked not last): at stages 0 and 1
  // reduces every unit's accumulated gradients now, as the hooks would have during the last
  // backward; at stages 2 and 3 the reductions ran during each backward. Waits for them.
  void reduce_grads();
  // After the reduction: p's summed gradient as a whole tensor (p's local shape) on every
  // dp rank (stage 0: p's own; stages 1-3: the pieces all-gathered, a collective over dp),
  // and `extra` (p's shape) added to p's summed gradient where this rank holds it.
  Tensor reduced_grad(const nn::Parameter& p);
  void add_to_reduced_grad(const nn::Parameter& p, const Tensor& extra);
  // Of the step's summed gradients, over all ranks (dp and tp; a pipeline stage's own
  // parameters, its copy of a tied embedding not counted: the caller sums over stages).
  double grad_sq_norm();
  void optimizer_step(float lr, float clip_coef);  // the rank's shard, then parameter sync

  // Full parameter values on `root` for the caller's scope (saving a checkpoint); the other
  // ranks take part in each unit's all-gather and keep at most the next prefetched unit, so
  // only the writing rank ever holds the whole model. A no-op below stage 3. Expert units
  // are gathered on their own group's `root` (each expert slice on one rank).
  void gather_all(int root);
  void release_all();

  // For checkpoints: the elements this rank updates, as (parameter, first, last) runs in
  // the parameter's flattened coordinates, and where they sit in the moment buffers.
  struct OwnedRun {
    nn::Parameter* param;
    int64_t begin, end;  // flattened element range of the parameter
    int64_t state_offset;
  };
  const std::vector<OwnedRun>& owned_runs() const { return owned_; }
  // After the reduction: the first element of this rank's owned runs (in their order) whose summed
  // gradient is not finite, as (run, element of the parameter's flattened local tensor), or none.
  // For the fp32 stop on a non-finite gradient.
  struct NonFinite {
    const OwnedRun* run;
    int64_t element;
    float value;
  };
  std::optional<NonFinite> first_non_finite() const;
  optim::AdamW& optimizer() { return *opt_; }
  // Whether this rank writes r's optimizer state to a checkpoint: every owner of a ZeRO
  // piece; at stage 0 the first rank of the group that reduces r's parameter.
  bool writes(const OwnedRun& r) const;
  // Values of the owned elements (the master shard at stage 3 and under mixed precision at
  // stages 1-2, the store's elsewhere).
  float* owned_value(const OwnedRun& r);

  models::CausalLM& model() { return model_; }
  const ZeroMemory& memory() const { return mem_; }
  int stage() const { return cfg_.stage; }
  const ZeroPartition& partition() const { return part_; }

  // models::UnitHooks
  void acquire(int unit) override;
  void release(int unit) override;
  void grads_ready(int unit) override;

 private:
  // The hooks' work on one engine unit (a model unit's dense part, or its expert part).
  void acquire_one(int unit);
  void release_one(int unit);
  void grads_ready_one(int unit);
  dist::Communicator& comm(size_t unit) const;  // the unit's group: dp or edp
  struct Unit;
  struct Pending;
  // Points the unit's parameters' value or grad views into buf (its unit layout), or
  // leaves them undefined (buf undefined).
  void point(Unit& u, Tensor nn::Parameter::*field, const Tensor& buf);
  void launch_reduce(int unit);
  void finish(Pending& p);
  void finish_sums();  // stages 2-3: each unit's pairwise sum settled into shard_grads_
  // Unit u's piece of shard_grads_ (its owned elements), in the accumulation dtype.
  Tensor shard_piece(size_t u) const;
  void progress();  // drives MPI and retires finished reductions
  void wait_all();
  // Stage 3: starts gathering a unit. Under mixed precision its matrices travel as the 16-bit
  // image and the rest packed in f32 (Unit::half / Unit::small, as stages 1-2 hold them);
  // fp32 (checkpoints, verify) gathers the fp32 master into Unit::value instead.
  void start_gather(int unit, bool fp32 = false);
  bool gathered(const Unit& u) const;  // stage 3: held, or its gather in flight
  void drop_prefetches();              // gathered units nobody holds
  void sync_params();                  // stage 1/2: all-gather the updated pieces
  // Stages 1-2 under mixed precision: the units' working weights from the master shards
  // (16-bit all-gather of the matrices, f32 of the rest), and the views onto them.
  // rounded: the optimizer step already wrote the updated matrices' 16-bit values into the
  // image (only the small parameters' slots there, never read, are left as they were).
  void sync_working(bool rounded = false);
  // One unit's part of it (stage 3: each gather): this rank's piece rounded into the
  // allocated Unit::half (unless `rounded`) and its small values packed, both all-gathers
  // started; finish waits and unpacks the small values into Unit::small.
  void start_working_gather(size_t unit, bool rounded = false);
  void finish_working_gather(size_t unit);
  void point_working(Unit& u);
  void mark_updated();  // the trainable values changed: their 16-bit copies are stale

  // The unit holding trainable p, and p's first element in it.
  std::pair<int, int64_t> unit_of(const nn::Parameter& p) const;

  models::CausalLM& model_;
  std::vector<models::CausalLM*> contexts_;  // add_context()
  dist::Communicator& comm_;
  dist::Communicator* edp_;  // expert units' group (comm_ when null)
  ZeroConfig cfg_;
  nn::TensorParallel tp_;
  ZeroPartition part_;
  // The model's units (their dense parts) first, in the model's numbering, then the expert
  // parts of those that have them (Unit::expert_part).
  std::vector<Unit> units_;
  std::vector<std::vector<int>> buckets_;  // stage 0: units per all-reduce, in ready order
  std::vector<std::unique_ptr<Pending>> pending_;
  std::unique_ptr<optim::AdamW> opt_;
  std::vector<optim::AdamW::Segment> segments_;
  std::vector<OwnedRun> owned_;
  Tensor shard_values_;              // master_sharded_
  Tensor shard_grads_;               // stage >= 1: f32, or cfg_.accum's 16 bits
  std::vector<MicroBatchSum> sums_;  // stage >= 2: per unit, into its part of shard_grads_
  bool master_sharded_ = false;      // stage 3, or stages 1-2 with cfg_.half
  bool working_ = false;             // stages 1-2 with cfg_.half: Unit::half / Unit::small
  bool gather16_ = false;            // stage 3 with cfg_.half: gathered as half / small
  bool last_micro_ = true, in_backward_ = false;
  // Stage 0: the last optimizer step left every gradient zero (AdamW's clear_grads), so the
  // next zero_grads has nothing to do. A skipped fp16 step leaves them as they are.
  bool grads_cleared_ = false;
  ZeroMemory mem_;
};

}  // namespace loom::parallel
