#include "loom/train/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "loom/io/hf_checkpoint.h"
#include "loom/io/safetensors.h"
#include "loom/nn/full_tensors.h"
#include "loom/util/error.h"

namespace loom::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path shard_file(const fs::path& dir, int rank) {
  return dir / "optimizer" / ("rank" + std::to_string(rank) + ".safetensors");
}

// "12:345" -> {12, 345}; errors name the file and tensor.
std::pair<int64_t, int64_t> parse_range(const std::string& s, const std::string& where) {
  const size_t colon = s.find(':');
  try {
    LOOM_CHECK(colon != std::string::npos, "");
    size_t a = 0, b = 0;
    const int64_t begin = std::stoll(s.substr(0, colon), &a);
    const int64_t end = std::stoll(s.substr(colon + 1), &b);
    LOOM_CHECK(a == colon && b == s.size() - colon - 1 && 0 <= begin && begin <= end, "");
    return {begin, end};
  } catch (...) {
    throw Error(where + ": slice metadata '" + s + "' is not begin:end");
  }
}

void write_checkpoint_parts(const fs::path& tmp, const TrainerState& st,
                            parallel::ZeroEngine& engine, dist::ProcessMesh& mesh,
                            const nn::TensorParallel& tp,
                            const std::function<void(const fs::path&)>& write_stage,
                            const std::function<void(const fs::path&)>& finish_model) {
  dist::Communicator& world = mesh.world();
  // Collective at stage 3: the stage's full model on dp rank 0 only (each expert slice on
  // the first dp rank holding it: dp ranks [0, ep)).
  engine.gather_all(0);
  if (mesh.dp_rank() < mesh.ep_size()) {
    nn::FullTensors full(engine.model().params(), tp);  // ... and its shards on tp rank 0
    if (mesh.tp_rank() == 0) {
      try {
        write_stage(tmp);
      } catch (...) {
        engine.release_all();
        throw;
      }
    }
  }
  engine.release_all();
  // Each element once: replicated moments (stage 0) from the first rank of the group that
  // reduces them, ZeRO pieces from their owners; of a slice held by several tp ranks, the
  // primary copy's.
  const optim::AdamW& opt = engine.optimizer();
  std::vector<io::StWriteTensor> tensors;
  std::map<std::string, std::string> meta;
  {
    for (const auto& r : engine.owned_runs()) {
      if (!engine.writes(r) || !nn::primary_copy(*r.param, mesh.tp_rank()) || r.param->stage_copy)
        continue;
      nn::for_full_runs(*r.param, r.begin, r.end, [&](int64_t local, int64_t full, int64_t n) {
        const std::string range = std::to_string(full) + ":" + std::to_string(full + n);
        const int64_t at = r.state_offset + (local - r.begin);
        for (const auto& [kind, buf] :
             {std::pair{"exp_avg/", &opt.exp_avg()}, std::pair{"exp_avg_sq/", &opt.exp_avg_sq()}}) {
          const std::string name = kind + r.param->name + "@" + range;
          tensors.push_back({name,
                             io::StDType::F32,
                             {n},
                             buf->f32() + at,
                             static_cast<size_t>(n) * sizeof(float)});
          meta[name] = range;
        }
      });
    }
  }
  meta["adamw_step"] = std::to_string(opt.steps_taken());
  io::write_safetensors(shard_file(tmp, world.rank()), tensors, meta);
  world.barrier();
  if (world.rank() == 0) {
    finish_model(tmp);
    json state{{"step", st.step},
               {"train_batch_size", st.train_batch},
               {"world_size", st.world_size},
               {"zero_stage", st.zero_stage},
               {"tensor_parallel_size", st.tensor_parallel},
               {"pipeline_parallel_size", st.pipeline_parallel},
               {"skipped_steps", st.skipped_steps}};
    if (st.loss_scaler)
      state["loss_scaler"] = {{"scale", st.loss_scaler->scale},
                              {"iter", st.loss_scaler->iter},
                              {"last_overflow_iter", st.loss_scaler->last_overflow_iter},
                              {"hysteresis_left", st.loss_scaler->hysteresis_left}};
    io::write_json_file(tmp / "trainer_state.json", state);
  }
}

}  // namespace

void save_train_checkpoint(const fs::path& dir, const TrainerState& st,
                           parallel::ZeroEngine& engine, dist::ProcessMesh& mesh,
                           const nn::TensorParallel& tp,
                           const std::function<void(const fs::path&)>& write_stage,
                           const std::function<void(const fs::path&)>& finish_model) {
  dist::Communicator& world = mesh.world();
  const fs::path tmp = dir.string() + ".tmp";
  if (world.rank() == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp / "optimizer");
  }
  world.barrier();
  try {
    write_checkpoint_parts(tmp, st, engine, mesh, tp, write_stage, finish_model);
  } catch (...) {
    // A failed write (disk full, file-size limit) leaves no half-written folder; the
    // previous checkpoint was never touched.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  if (world.rank() == 0) {
    if (fs::exists(dir)) fs::remove_all(dir);
    fs::rename(tmp, dir);
  }
  world.barrier();
}

TrainerState read_trainer_state(const fs::path& dir) {
  const fs::path f = dir / "trainer_state.json";
  LOOM_CHECK(fs::exists(f), dir.string() + ": not a training checkpoint (no trainer_state.json)");
  const json j = io::read_json_file(f);
  TrainerState st;
  auto get = [&](const char* k) {
    LOOM_CHECK(j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 0,
               f.string() + ": key '" + k + "' must be a non-negative integer");
    return j[k].get<int64_t>();
  };
  st.step = get("step");
  st.train_batch = get("train_batch_size");
  st.world_size = static_cast<int>(get("world_size"));
  st.zero_stage = static_cast<int>(get("zero_stage"));
  if (j.contains("tensor_parallel_size"))
    st.tensor_parallel = static_cast<int>(get("tensor_parallel_size"));
  if (j.contains("pipeline_parallel_size"))
    st.pipeline_parallel = static_cast<int>(get("pipeline_parallel_size"));
  if (j.contains("skipped_steps")) st.skipped_steps = get("skipped_steps");
  LOOM_CHECK(st.skipped_steps <= st.step,
             f.string() + ": 'skipped_steps' exceeds 'step' (" + std::to_string(st.step) + ")");
  if (j.contains("loss_scaler")) {
    const json& ls = j["loss_scaler"];
    auto num = [&](const char* k) {
      LOOM_CHECK(ls.is_object() && ls.contains(k) && ls[k].is_number(),
                 f.string() + ": key 'loss_scaler." + k + "' must be a number");
      return ls[k].get<double>();
    };
    optim::LossScaler::State s;
    s.scale = num("scale");
    s.iter = static_cast<int64_t>(num("iter"));
    s.last_overflow_iter = static_cast<int64_t>(num("last_overflow_iter"));
    s.hysteresis_left = static_cast<int>(num("hysteresis_left"));
    LOOM_CHECK(std::isfinite(s.scale) && s.scale > 0 && s.iter >= 0 && s.hysteresis_left >= 0,
               f.string() + ": 'loss_scaler' holds an impossible state (scale " +
                   std::to_string(s.scale) + ")");
    st.loss_scaler = s;
  }
  return st;
}

void load_optimizer_state(const fs::path& dir, const TrainerState& st,
                          parallel::ZeroEngine& engine) {
  // Every shard file of the saving run, and where each parameter's slices are.
  struct Slice {
    const io::SafetensorsFile* file;
    std::string tensor;
    int64_t begin, end;
  };
  // Every rank writes a file (checkpoints from before tensor parallelism: at stage 0 only
  // rank 0 did).
  std::vector<io::SafetensorsFile> files;
  for (int r = 0; r < st.world_size; ++r)
    if (r == 0 || fs::exists(shard_file(dir, r)))
      files.push_back(io::SafetensorsFile::open(shard_file(dir, r)));
  std::map<std::string, std::vector<Slice>> slices;  // "exp_avg/<param>" -> slices
  int64_t adamw_step = -1;
  for (const auto& f : files) {
    const std::string where = f.path().string();
    auto it = f.metadata().find("adamw_step");
    LOOM_CHECK(it != f.metadata().end(), where + ": no adamw_step in the metadata");
    adamw_step = std::stoll(it->second);
    for (const auto& t : f.tensors()) {
      auto m = f.metadata().find(t.name);
      LOOM_CHECK(m != f.metadata().end(),
                 where + ": tensor '" + t.name + "' has no slice metadata");
      auto [b, e] = parse_range(m->second, where + ": tensor '" + t.name + "'");
      LOOM_CHECK(t.dtype == io::StDType::F32 && t.numel() == e - b,
                 where + ": tensor '" + t.name + "' does not hold " + std::to_string(e - b) +
                     " f32 values");
      slices[t.name.substr(0, t.name.rfind('@'))].push_back({&f, t.name, b, e});
    }
  }
  optim::AdamW& opt = engine.optimizer();
  for (const auto& r : engine.owned_runs()) {
    for (const auto& moment :
         {std::pair{"exp_avg/", &opt.exp_avg()}, std::pair{"exp_avg_sq/", &opt.exp_avg_sq()}}) {
      const std::string key = moment.first + r.param->name;
      const Tensor* buf = moment.second;  // (a lambda below may not capture a binding: clang 14)
      int64_t covered = 0;
      nn::for_full_runs(*r.param, r.begin, r.end, [&](int64_t local, int64_t full, int64_t n) {
        float* dst = buf->f32() + r.state_offset + (local - r.begin);
        for (const Slice& s : slices[key]) {
          const int64_t a = std::max(full, s.begin), b = std::min(full + n, s.end);
          if (a >= b) continue;
          const float* src = reinterpret_cast<const float*>(s.file->find(s.tensor)->data.data());
          std::copy(src + (a - s.begin), src + (b - s.begin), dst + (a - full));
          covered += b - a;
        }
      });
      LOOM_CHECK(covered == r.end - r.begin,
                 dir.string() + ": optimizer state '" + key + "' elements [" +
                     std::to_string(r.begin) + ", " + std::to_string(r.end) +
                     ") are not in the checkpoint (or are there twice)");
    }
  }
  opt.set_steps_taken(adamw_step);
}

}  // namespace loom::train
