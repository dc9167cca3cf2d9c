#include "loom/dist/mesh.h"

#include <string>

#include "loom/util/error.h"

namespace loom::dist {

namespace {

std::string shape_name(MeshShape s) {
  return "dp=" + std::to_string(s.dp) + " pp=" + std::to_string(s.pp) +
         " tp=" + std::to_string(s.tp);
}

int& at(MeshCoord& c, MeshAxis axis) {
  switch (axis) {
    case MeshAxis::dp:
      return c.dp;
    case MeshAxis::pp:
      return c.pp;
    case MeshAxis::tp:
      return c.tp;
  }
  throw Error("mesh: invalid MeshAxis");
}

int along(MeshCoord c, MeshAxis axis) { return at(c, axis); }

int extent(MeshShape s, MeshAxis axis) { return along(MeshCoord{s.dp, s.pp, s.tp}, axis); }

}  // namespace

MeshShape mesh_shape(int world, int tp, int pp) {
  LOOM_CHECK(tp >= 1 && pp >= 1, "mesh: tp and pp must be >= 1, got tp=" + std::to_string(tp) +
                                     " pp=" + std::to_string(pp));
  LOOM_CHECK(world >= 1 && world % (tp * pp) == 0,
             "mesh: world size " + std::to_string(world) +
                 " is not divisible by tp=" + std::to_string(tp) + " x pp=" + std::to_string(pp));
  return MeshShape{world / (tp * pp), pp, tp};
}

int mesh_rank(MeshCoord c, MeshShape s) {
  LOOM_CHECK(c.dp >= 0 && c.dp < s.dp && c.pp >= 0 && c.pp < s.pp && c.tp >= 0 && c.tp < s.tp,
             "mesh: coordinate (dp=" + std::to_string(c.dp) + ", pp=" + std::to_string(c.pp) +
                 ", tp=" + std::to_string(c.tp) + ") is outside " + shape_name(s));
  return (c.dp * s.pp + c.pp) * s.tp + c.tp;
}

MeshCoord mesh_coord(int rank, MeshShape s) {
  LOOM_CHECK(rank >= 0 && rank < s.world(),
             "mesh: rank " + std::to_string(rank) + " is outside " + shape_name(s));
  return MeshCoord{rank / (s.tp * s.pp), rank / s.tp % s.pp, rank % s.tp};
}

std::vector<int> mesh_group(MeshAxis axis, int rank, MeshShape s) {
  MeshCoord c = mesh_coord(rank, s);
  std::vector<int> group;
  for (int i = 0; i < extent(s, axis); ++i) {
    MeshCoord member = c;
    at(member, axis) = i;
    group.push_back(mesh_rank(member, s));
  }
  return group;
}

ProcessMesh::ProcessMesh(Communicator& world, int tp, int pp)
    : world_(world),
      shape_(mesh_shape(world.size(), tp, pp)),
      coord_(mesh_coord(world.rank(), shape_)) {
  // Color: the group's first world rank (one per group); key: the coordinate along the axis,
  // so the group rank is that coordinate.
  auto make = [&](MeshAxis axis) {
    auto comm = world.split(mesh_group(axis, world.rank(), shape_).front(), along(coord_, axis));
    LOOM_CHECK(comm->size() == extent(shape_, axis) && comm->rank() == along(coord_, axis),
               "mesh: split gave rank " + std::to_string(comm->rank()) + " of " +
                   std::to_string(comm->size()) + " for " + shape_name(shape_));
    return comm;
  };
  dp_ = make(MeshAxis::dp);
  pp_ = make(MeshAxis::pp);
  tp_ = make(MeshAxis::tp);
}

Communicator& ProcessMesh::ep(int size) {
  LOOM_CHECK(size >= 1 && shape_.dp % size == 0, "expert_parallel.size " + std::to_string(size) +
                                                     " does not divide the data-parallel size " +
                                                     std::to_string(shape_.dp) + " (" +
                                                     shape_name(shape_) + ")");
  if (ep_) {
    LOOM_CHECK(ep_->size() == size, "mesh: expert-parallel group made with size " +
                                        std::to_string(ep_->size()) + ", asked for " +
                                        std::to_string(size));
    return *ep_;
  }
  ep_ = dp_->split(coord_.dp / size, coord_.dp % size);
  LOOM_CHECK(ep_->size() == size && ep_->rank() == coord_.dp % size,
             "mesh: expert-parallel split gave rank " + std::to_string(ep_->rank()) + " of " +
                 std::to_string(ep_->size()));
  edp_ = dp_->split(coord_.dp % size, coord_.dp / size);
  LOOM_CHECK(edp_->size() == shape_.dp / size && edp_->rank() == coord_.dp / size,
             "mesh: expert-data-parallel split gave rank " + std::to_string(edp_->rank()) + " of " +
                 std::to_string(edp_->size()));
  return *ep_;
}

Communicator& ProcessMesh::edp(int size) {
  if (size == 1) return *dp_;
  ep(size);
  return *edp_;
}

}  // namespace loom::dist
