// The process mesh: world = dp x pp x tp, tp fastest (Megatron's order), so the ranks of a
// tensor-parallel group are neighbours (same node, fastest links):
//   rank = (dp_rank * pp + pp_rank) * tp + tp_rank
// Contract: every sub-communicator the engine uses comes from here (never from rank
// arithmetic elsewhere); within each group, the group rank equals the coordinate along it
// (the dp communicator's rank() is dp_rank, and so on). The coordinate functions are pure,
// for any sizes, so plans and tests can use them without a communicator.
#pragma once

#include <memory>
#include <vector>

#include "loom/dist/communicator.h"

namespace loom::dist {

struct MeshShape {
  int dp = 1, pp = 1, tp = 1;
  int world() const { return dp * pp * tp; }
};

struct MeshCoord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const MeshCoord&) const = default;
};

enum class MeshAxis { dp, pp, tp };

// dp = world / (tp * pp); throws loom::Error naming the sizes unless tp, pp >= 1 and
// tp * pp divides world.
MeshShape mesh_shape(int world, int tp, int pp);

int mesh_rank(MeshCoord coord, MeshShape shape);  // throws if coord is outside shape
MeshCoord mesh_coord(int rank, MeshShape shape);  // throws if rank is outside shape

// The world ranks of `rank`'s group along `axis` (the ranks that share its other two
// coordinates), in order of the coordinate along the axis: element i has coordinate i.
std::vector<int> mesh_group(MeshAxis axis, int rank, MeshShape shape);

class ProcessMesh {
 public:
  // Collective over `world`: splits it into this rank's dp, pp and tp groups.
  ProcessMesh(Communicator& world, int tp, int pp);

  Communicator& world() const { return world_; }  // every rank of the job
  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int dp_rank() const { return coord_.dp; }
  int pp_rank() const { return coord_.pp; }
  int tp_rank() const { return coord_.tp; }

  // Ranks with the same (pp, tp): gradients are reduced and ZeRO shards split over these.
  Communicator& dp() { return *dp_; }
  // Ranks with the same (dp, tp): the stages of one pipeline, in stage order.
  Communicator& pp() { return *pp_; }
  // Ranks with the same (dp, pp): one tensor-parallel layer's shards.
  Communicator& tp() { return *tp_; }
  // Expert parallelism (nn/moe.h), inside the data-parallel group: its ranks in runs of
  // `size` consecutive dp ranks (dp ranks d with the same d / size), group rank d % size.
  // Collective over dp on the first call (made once, then the same group); size must
  // divide the dp size (an error naming expert_parallel.size).
  Communicator& ep(int size);
  // The dp ranks holding the same experts as this one (the same d % size), rank d / size:
  // expert gradients are reduced and their ZeRO shards split over these (Megatron's
  // expert-data-parallel group). Size 1: dp itself.
  Communicator& edp(int size);
  int ep_size() const { return ep_ ? ep_->size() : 1; }  // 1 until ep() made the group

 private:
  Communicator& world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::unique_ptr<Communicator> dp_, pp_, tp_, ep_, edp_;
};

}  // namespace loom::dist
