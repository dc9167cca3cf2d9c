// What a run does when something goes wrong in it or around it: a non-finite gradient in
// fp32 training stops the run at that step, naming the step and the first parameter (and
// element) whose gradient is not finite, before the optimizer changes any parameter or
// moment; a SIGTERM stops a multi-rank job after the step in progress with a resumable
// checkpoint (util/stop_signals.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "common/ref_python.h"
#include "common/test_util.h"
#include "loom/data/dataset.h"
#include "loom/io/hf_checkpoint.h"
#include "loom/io/safetensors.h"
#include "loom/train/trainer.h"
#include "loom/util/stop_signals.h"

namespace loom {
namespace {

train::TrainConfig tiny_gpt2() {
  train::TrainConfig c;
  c.model = {{"arch", "gpt2"}, {"n_layer", 2},     {"n_embd", 32},
             {"n_head", 4},    {"vocab_size", 64}, {"n_positions", 16}};
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.train_batch = 4;
  c.train_steps = 10;
  c.seed = 3;
  c.adamw.lr = 1e-3f;
  return c;
}

std::unique_ptr<data::Dataset> rows(int64_t n, int64_t T, int V) {
  return std::make_unique<data::RandomTokenDataset>(V, T, n, 7);
}

std::vector<float> values(train::Trainer& t) {
  const Tensor v = t.model().params().flat_values();
  return std::vector<float>(v.f32(), v.f32() + v.numel());
}

TEST(NonFiniteGradient, StopsNamingTheStepAndTheParameterBeforeTheUpdate) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    train::Trainer t(tiny_gpt2(), rows(32, 16, 64));
    const std::string name = "transformer.h.1.mlp.c_fc.weight";
    nn::Parameter* p = t.model().params().find(name);
    ASSERT_NE(p, nullptr);
    t.set_grad_hook([&] {
      if (t.steps_done() == 2) p->grad.f32()[37] = bad;  // the third step
    });
    t.step();
    t.step();
    const std::vector<float> before = values(t);
    const std::vector<float> moments(
        t.engine().optimizer().exp_avg().f32(),
        t.engine().optimizer().exp_avg().f32() + t.engine().optimizer().exp_avg().numel());
    const std::string err = test::error_of([&] { t.step(); });
    EXPECT_NE(err.find("step 3: the gradient is not finite"), std::string::npos) << err;
    // GPT-2's c_fc is stored transposed from HF's Conv1D; the element is in Loom's layout.
    EXPECT_NE(err.find("the first is " + name + "[37] = " + std::to_string(bad)), std::string::npos)
        << err;
    EXPECT_EQ(values(t), before) << "the parameters moved";
    EXPECT_EQ(0, std::memcmp(moments.data(), t.engine().optimizer().exp_avg().f32(),
                             moments.size() * sizeof(float)))
        << "the moments moved";
  }
}

// The first non-finite gradient in parameter order is the one named, whichever was
// planted first.
TEST(NonFiniteGradient, NamesTheFirstInParameterOrder) {
  train::Trainer t(tiny_gpt2(), rows(32, 16, 64));
  t.set_grad_hook([&] {
    t.model().params().find("transformer.h.1.attn.c_proj.weight")->grad.f32()[0] = NAN;
    t.model().params().find("transformer.h.0.ln_2.weight")->grad.f32()[5] = NAN;
  });
  const std::string err = test::error_of([&] { t.step(); });
  EXPECT_NE(err.find("the first is transformer.h.0.ln_2.weight[5]"), std::string::npos) << err;
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

namespace fs = std::filesystem;

// `cmd` in the background through /bin/sh, its output in `log`.
pid_t spawn(const std::string& cmd, const fs::path& log) {
  const std::string line = "exec " + cmd + " > " + log.string() + " 2>&1";
  pid_t pid = 0;
  const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
  EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  return pid;
}

// `loom launch -n 2 -- train CFG` in the background.
pid_t spawn_launch(const fs::path& cfg, const fs::path& log) {
  return spawn(test::loom_binary() + " launch -n 2 -- train " + cfg.string(), log);
}

// metrics.jsonl's step losses (by step) and its "stopped" step, if any.
std::map<int64_t, double> losses_by_step(const fs::path& metrics, int64_t* stopped = nullptr) {
  std::map<int64_t, double> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // a line being written
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    if (stopped && j.contains("stopped")) *stopped = j["stopped"]["step"].get<int64_t>();
  }
  return out;
}

std::map<std::string, std::vector<char>> tensors_of(const fs::path& file) {
  std::map<std::string, std::vector<char>> out;
  const io::SafetensorsFile f = io::SafetensorsFile::open(file);
  for (const auto& t : f.tensors())
    out[t.name].assign(reinterpret_cast<const char*>(t.data.data()),
                       reinterpret_cast<const char*>(t.data.data()) + t.data.size());
  return out;
}

// The pids of this test's ranks (processes running `train CFG`) with OMPI_COMM_WORLD_RANK.
std::map<int, pid_t> rank_pids(const fs::path& cfg) {
  std::map<int, pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmd)), {});
    if (args.find("train") == std::string::npos || args.find(cfg.string()) == std::string::npos ||
        args.find("launch") != std::string::npos)
      continue;
    std::ifstream env(e.path() / "environ");
    for (std::string var; std::getline(env, var, '\0');)
      if (var.starts_with("OMPI_COMM_WORLD_RANK="))
        out[std::stoi(var.substr(21))] = static_cast<pid_t>(std::stol(pid));
  }
  return out;
}

// Waits for `pid` at most `seconds`; its exit status, or -1 on timeout (then it is killed).
int wait_for(pid_t pid, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// The tiny GPT-2 job both tests run (2 ranks, ZeRO-2, bytes of a text file).
nlohmann::json tiny_job(const fs::path& dir, int64_t steps) {
  {
    std::ofstream text(dir / "data.txt");
    for (int i = 0; i < 400; ++i) text << "rank " << i % 13 << " saves; the run resumes. ";
  }
  return {{"model", test::tiny_gpt2_json()},
          {"data",
           {{"path", (dir / "data.txt").string()},
            {"format", "text"},
            {"tokenizer", "bytes"},
            {"seq_len", 32}}},
          {"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 2},
          {"train_steps", steps},
          {"zero_optimization", {{"stage", 2}}},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}},
          {"steps_per_print", 100}};
}

fs::path write_job(const fs::path& dir, const std::string& name, nlohmann::json j) {
  j["output_dir"] = (dir / name).string();
  io::write_json_file(dir / (name + ".json"), j);
  return dir / (name + ".json");
}

// Waits until the run's metrics.jsonl has `steps` steps (at most a minute).
bool wait_for_steps(const fs::path& metrics, size_t steps) {
  const auto t0 = std::chrono::steady_clock::now();
  while (losses_by_step(metrics).size() < steps) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The watchdog: rank 1 of a 2-rank job stopped (SIGSTOP) mid-run; rank 0 waits in a
// collective past comm_timeout_s 3 and ends the job within the timeout + 10 s, naming the
// call and rank 1.
TEST(CommWatchdog, AStoppedRankEndsTheJobNamingIt) {
  test::TempDir tmp;
  nlohmann::json c = tiny_job(tmp.path, 100000);
  c["comm_timeout_s"] = 3;
  const fs::path cfg = write_job(tmp.path, "hung", c);
  const pid_t pid = spawn_launch(cfg, tmp.path / "hung.log");
  ASSERT_TRUE(wait_for_steps(tmp.path / "hung" / "metrics.jsonl", 3));
  const std::map<int, pid_t> ranks = rank_pids(cfg);
  ASSERT_EQ(ranks.size(), 2u);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(ranks.at(1), SIGSTOP), 0);
  const int rc = wait_for(pid, 3 + 10 + 5);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::kill(ranks.at(1), SIGKILL);  // if mpirun left it stopped
  std::ifstream log_file(tmp.path / "hung.log");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  EXPECT_NE(rc, -1) << "the job did not end; " << log;
  EXPECT_NE(rc, 0) << log;
  EXPECT_LT(seconds, 3 + 10.0) << log;
  EXPECT_NE(log.find("comm watchdog: rank 1 did not arrive in "), std::string::npos) << log;
  EXPECT_NE(log.find("over a group of 2 ranks (world ranks 0, 1)"), std::string::npos) << log;
}

// SIGTERM to `loom launch` of a 2-rank ZeRO-2 job mid-run (a scheduler's preemption): the
// ranks finish the step, save checkpoint-<step> and the job exits with kExitInterrupted
// within seconds; resuming from it gives the uninterrupted run's losses and final
// parameters bit for bit.
TEST(StopSignal, SigtermSavesAResumableCheckpointOnEveryRank) {
  test::TempDir tmp;
  const nlohmann::json c = tiny_job(tmp.path, 120);
  // Stopped once step 5 is in the metrics.
  const pid_t pid = spawn_launch(write_job(tmp.path, "stopped", c), tmp.path / "stopped.log");
  const fs::path metrics = tmp.path / "stopped" / "metrics.jsonl";
  ASSERT_TRUE(wait_for_steps(metrics, 5)) << "the job did not get going";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int rc = wait_for(pid, 60);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream log_file(tmp.path / "stopped.log");
  const std::string log((std::istreambuf_iterator<char>(log_file)), {});
  EXPECT_EQ(rc, kExitInterrupted) << log;
  EXPECT_LT(seconds, 30.0) << log;
  int64_t stopped = -1;
  losses_by_step(metrics, &stopped);
  ASSERT_GE(stopped, 5) << log;
  ASSERT_LT(stopped, 120) << log;
  const fs::path ck = tmp.path / "stopped" / ("checkpoint-" + std::to_string(stopped));
  ASSERT_TRUE(fs::exists(ck / "trainer_state.json")) << log;

  nlohmann::json resumed = c;
  resumed["resume_from"] = ck.string();
  for (const auto& [name, j] : {std::pair{"resumed", resumed}, std::pair{"whole", c}}) {
    auto [code, out] = test::run_command(test::loom_binary() + " launch -n 2 -- train " +
                                         write_job(tmp.path, name, j).string());
    ASSERT_EQ(code, 0) << out;
  }
  const auto whole = losses_by_step(tmp.path / "whole" / "metrics.jsonl");
  const auto after = losses_by_step(tmp.path / "resumed" / "metrics.jsonl");
  ASSERT_EQ(after.size(), static_cast<size_t>(120 - stopped));
  for (const auto& [step, loss] : after) EXPECT_EQ(loss, whole.at(step)) << "step " << step;
  EXPECT_EQ(tensors_of(tmp.path / "resumed" / "checkpoint-final" / "model.safetensors"),
            tensors_of(tmp.path / "whole" / "checkpoint-final" / "model.safetensors"));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// kill -9 at random moments of a run that saves a checkpoint after every step (so most of
// its time goes into writing them), 20 times, on one process and on two ranks alternately:
// every checkpoint-<n> folder left behind loads, and the latest resumes exactly (its next
// two steps' losses equal those of an uninterrupted run of the same layout). Checkpoints
// are written into checkpoint-<n>.tmp and renamed when complete, so a kill leaves either
// the whole folder or only the .tmp one.
TEST(CrashSafety, KillDuringCheckpointWritesLeavesOnlyCheckpointsThatResume) {
  test::TempDir tmp;
  nlohmann::json c = tiny_job(tmp.path, 60);
  c["zero_optimization"] = {{"stage", 1}};
  auto command = [&](int ranks, const fs::path& cfg) {
    return test::loom_binary() + (ranks == 1 ? " train " : " launch -n 2 -- train ") + cfg.string();
  };
  std::map<int, std::map<int64_t, double>> reference;  // by rank count
  std::map<int, int64_t> run_ms;  // how long an uninterrupted run takes here, by rank count
  for (int ranks : {1, 2}) {
    const std::string name = "reference" + std::to_string(ranks);
    const auto t0 = std::chrono::steady_clock::now();
    auto [code, out] = test::run_command(command(ranks, write_job(tmp.path, name, c)));
    run_ms[ranks] =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    ASSERT_EQ(code, 0) << out;
    reference[ranks] = losses_by_step(tmp.path / name / "metrics.jsonl");
  }
  c["checkpoint_interval"] = 1;
  std::mt19937 rng(17);
  int resumed = 0, mid_write = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int ranks = 1 + trial % 2;
    const std::string name = "trial" + std::to_string(trial);
    const fs::path cfg = write_job(tmp.path, name, c);
    const pid_t pid = spawn(command(ranks, cfg), tmp.path / (name + ".log"));
    ASSERT_TRUE(wait_for_steps(tmp.path / name / "metrics.jsonl", 1));
    // A moment within the run (writing a checkpoint a step makes it longer than the
    // reference's): a fixed range ended most runs first on a fast machine.
    std::this_thread::sleep_for(std::chrono::milliseconds(
        rng() % static_cast<uint64_t>(std::max<int64_t>(100, run_ms[ranks] * 3 / 4))));
    if (ranks == 1) {
      ::kill(pid, SIGKILL);
    } else {
      const std::map<int, pid_t> pids = rank_pids(cfg);
      if (!pids.empty()) ::kill(pids.at(static_cast<int>(rng() % pids.size())), SIGKILL);
    }
    wait_for(pid, 30);
    // mpirun is gone; so must its ranks be before the folder is read (one may still be
    // dying in the middle of a rename).
    for (int i = 0; i < 200 && !rank_pids(cfg).empty(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(rank_pids(cfg).empty()) << name << ": a rank outlived mpirun";
    int64_t latest = -1;
    for (const auto& e : fs::directory_iterator(tmp.path / name)) {
      const std::string dir = e.path().filename().string();
      if (dir.starts_with("checkpoint-") && dir.ends_with(".tmp")) ++mid_write;
      if (!dir.starts_with("checkpoint-") || dir.ends_with(".tmp")) continue;
      const std::string num = dir.substr(11);  // checkpoint-final: the run ended first
      const int64_t n =
          num.find_first_not_of("0123456789") == std::string::npos ? std::stoll(num) : 60;
      latest = std::max(latest, n);
      // Loads: weights, optimizer state and trainer state, on one process (the same global
      // batch: accumulation times the ranks).
      nlohmann::json r = c;
      r["resume_from"] = e.path().string();
      r["gradient_accumulation_steps"] = 2 * ranks;
      EXPECT_NO_THROW(train::Trainer(train::parse_config(r, "test", 1))) << e.path();
    }
    if (latest < 1 || latest + 2 > 60) continue;  // killed before the first save, or done
    nlohmann::json r = c;
    r.erase("checkpoint_interval");
    r["resume_from"] = (tmp.path / name / ("checkpoint-" + std::to_string(latest))).string();
    r["train_steps"] = latest + 2;
    const std::string again = name + "-resumed";
    auto [code, out] = test::run_command(command(ranks, write_job(tmp.path, again, r)));
    ASSERT_EQ(code, 0) << out;
    const auto after = losses_by_step(tmp.path / again / "metrics.jsonl");
    ASSERT_EQ(after.size(), 2u) << name;
    for (const auto& [step, loss] : after)
      EXPECT_EQ(loss, reference[ranks].at(step)) << name << ", step " << step;
    ++resumed;
  }
  EXPECT_GE(resumed, 10) << "too few trials left a checkpoint to resume";
  std::printf(
      "[ crash  ] 20 kills: %d inside a checkpoint write (a .tmp folder left), %d "
      "latest checkpoints resumed exactly\n",
      mid_write, resumed);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The files of a checkpoint folder and their bytes.
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    out[fs::relative(e.path(), dir).string()] =
        std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  return out;
}

// A checkpoint write that fails on a file-size limit (a quota, `ulimit -f`): the run ends
// with exit 1 naming the file and the reason, no checkpoint-4 nor its .tmp folder is left,
// the step-2 checkpoint is untouched and resumes to the uninterrupted run's losses.
TEST(DiskFault, AFileSizeLimitNamesTheFileAndKeepsThePreviousCheckpoint) {
  test::TempDir tmp;
  nlohmann::json c = tiny_job(tmp.path, 4);
  c["checkpoint_interval"] = 2;
  auto [code, out] =
      test::run_command(test::loom_binary() + " train " + write_job(tmp.path, "run", c).string());
  ASSERT_EQ(code, 0) << out;
  const auto reference = losses_by_step(tmp.path / "run" / "metrics.jsonl");
  const fs::path ck2 = tmp.path / "run" / "checkpoint-2";
  const auto before = folder_bytes(ck2);
  c["resume_from"] = ck2.string();
  c["train_steps"] = 6;
  // 64 KiB: the logs fit, the 136 KiB of weights do not.
  auto [code2, out2] = test::run_command("prlimit --fsize=65536 " + test::loom_binary() +
                                         " train " + write_job(tmp.path, "run", c).string());
  EXPECT_EQ(code2, 1) << out2;
  EXPECT_NE(out2.find((tmp.path / "run" / "checkpoint-4.tmp").string() + "/"), std::string::npos)
      << out2;
  EXPECT_NE(out2.find("write failed: File too large"), std::string::npos) << out2;
  EXPECT_FALSE(fs::exists(tmp.path / "run" / "checkpoint-4"));
  EXPECT_FALSE(fs::exists(tmp.path / "run" / "checkpoint-4.tmp")) << "a half-written folder";
  EXPECT_EQ(folder_bytes(ck2), before);
  c["train_steps"] = 4;
  auto [code3, out3] =
      test::run_command(test::loom_binary() + " train " + write_job(tmp.path, "again", c).string());
  ASSERT_EQ(code3, 0) << out3;
  const auto after = losses_by_step(tmp.path / "again" / "metrics.jsonl");
  ASSERT_EQ(after.size(), 2u);
  for (const auto& [step, loss] : after) EXPECT_EQ(loss, reference.at(step)) << "step " << step;
}

// The same with a full disk (a 600 KiB tmpfs holds one checkpoint, not two): the error
// names the file and ENOSPC. Needs root's mount; skipped with the reason elsewhere.
TEST(DiskFault, AFullDiskNamesTheFileAndKeepsThePreviousCheckpoint) {
  test::TempDir tmp;
  const fs::path disk = tmp.path / "disk";
  fs::create_directories(disk);
  if (test::run_command("mount -t tmpfs -o size=600k tmpfs " + disk.string()).first != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  struct Unmount {
    fs::path dir;
    ~Unmount() { (void)test::run_command("umount -l " + dir.string()); }
  } unmount{disk};
  nlohmann::json c = tiny_job(tmp.path, 6);
  c["checkpoint_interval"] = 2;
  c["output_dir"] = (disk / "run").string();
  io::write_json_file(tmp.path / "full.json", c);
  auto [code, out] =
      test::run_command(test::loom_binary() + " train " + (tmp.path / "full.json").string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find((disk / "run" / "checkpoint-4.tmp").string() + "/"), std::string::npos) << out;
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(disk / "run" / "checkpoint-4.tmp")) << "a half-written folder";
  const auto failed = losses_by_step(disk / "run" / "metrics.jsonl");
  ASSERT_TRUE(failed.count(4)) << "steps 3 and 4 ran before the failed save";
  c["resume_from"] = (disk / "run" / "checkpoint-2").string();
  c["train_steps"] = 4;
  auto [code2, out2] =
      test::run_command(test::loom_binary() + " train " + write_job(tmp.path, "again", c).string());
  ASSERT_EQ(code2, 0) << out2;
  const auto after = losses_by_step(tmp.path / "again" / "metrics.jsonl");
  ASSERT_EQ(after.size(), 2u);
  for (const auto& [step, loss] : after) EXPECT_EQ(loss, failed.at(step)) << "step " << step;
}

}  // namespace
}  // namespace loom
