// The schedule trace on one process: the recorder (util/trace.h), the Communicator's spans,
// the Chrome file (dist/job_trace.h) and what Trainer::run writes with a trace path. The
// pipeline's order across ranks is checked under mpirun (tests/dist/test_pipeline_trace.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "loom/data/dataset.h"
#include "loom/dist/communicator.h"
#include "loom/dist/job_trace.h"
#include "loom/dist/mesh.h"
#include "loom/train/trainer.h"
#include "loom/util/trace.h"

namespace loom {
namespace {

using nlohmann::json;

// Records while alive, and leaves the recorder off and empty.
struct Recording {
  Recording() {
    trace::take();
    trace::enable(true);
  }
  ~Recording() {
    trace::enable(false);
    trace::take();
  }
};

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// The complete events of a trace file, in file order.
std::vector<json> spans(const json& file) {
  std::vector<json> out;
  for (const json& e : file["traceEvents"])
    if (e["ph"] == "X") out.push_back(e);
  return out;
}

TEST(Trace, DisabledRecordsNothing) {
  trace::take();
  ASSERT_FALSE(trace::enabled());
  { trace::Span s(trace::Kind::Forward, 0); }
  dist::LocalComm comm;
  double x = 1.0;
  comm.all_reduce_sum(&x, 1);
  EXPECT_TRUE(trace::take().empty());
}

TEST(Trace, SpansNestAndTakeTheMicroBatchOfTheirScope) {
  Recording rec;
  {
    trace::Span step(trace::Kind::Step, -1, 7);
    trace::MicroScope ms(3);
    { trace::Span f(trace::Kind::Forward, 3); }
    trace::Span wait(trace::Kind::Wait, "irecv", 64, 1);
  }
  const std::vector<trace::Event> ev = trace::take();
  ASSERT_EQ(ev.size(), 3u);  // in the order they ended: F3, the wait, the step
  EXPECT_EQ(ev[0].kind, trace::Kind::Forward);
  EXPECT_EQ(ev[0].micro, 3);
  EXPECT_EQ(ev[1].kind, trace::Kind::Wait);
  EXPECT_EQ(ev[1].micro, 3);  // from the scope
  EXPECT_EQ(ev[1].bytes, 64);
  EXPECT_EQ(ev[1].peer, 1);
  EXPECT_EQ(ev[2].kind, trace::Kind::Step);
  EXPECT_EQ(ev[2].step, 7);
  EXPECT_EQ(ev[2].micro, -1);  // begun outside the scope
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(ev[2].start_ns, ev[i].start_ns);
    EXPECT_LE(ev[i].start_ns, ev[i].end_ns);
    EXPECT_LE(ev[i].end_ns, ev[2].end_ns);
  }
}

TEST(Trace, EveryCommunicatorCallIsASpanWithItsPayload) {
  Recording rec;
  dist::LocalComm comm;
  std::vector<float> buf(10, 1.0f);
  double d[3] = {1, 2, 3};
  comm.all_reduce_sum(buf.data(), 10);
  comm.all_reduce_sum(d, 3);
  comm.all_gather(buf.data(), buf.data(), 10);
  comm.broadcast(d, sizeof d, 0);
  comm.barrier();
  const std::vector<trace::Event> ev = trace::take();
  ASSERT_EQ(ev.size(), 5u);
  const std::vector<std::pair<std::string, int64_t>> want = {{"all_reduce_sum", 40},
                                                             {"all_reduce_sum", 24},
                                                             {"all_gather", 40},
                                                             {"broadcast", 24},
                                                             {"barrier", 0}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ev[i].kind, trace::Kind::Comm);
    EXPECT_EQ(std::string(ev[i].op), want[i].first);
    EXPECT_EQ(ev[i].bytes, want[i].second) << want[i].first;
  }
}

TEST(Trace, ChromeFileHasOneNamedTrackAndNestedSpans) {
  test::TempDir dir;
  dist::LocalComm world;
  dist::ProcessMesh mesh(world, 1, 1);
  {
    Recording rec;
    {
      trace::Span step(trace::Kind::Step, -1, 0);
      { trace::Span f(trace::Kind::Forward, 2); }
      { trace::Span b(trace::Kind::Backward, 2); }
      { trace::Span o(trace::Kind::Optimizer); }
    }
    dist::write_job_trace(mesh, dir.path / "sub" / "trace.json");
    EXPECT_TRUE(trace::enabled()) << "recording continues as it was";
    EXPECT_TRUE(trace::take().empty()) << "the gather itself is not recorded";
  }
  const json file = read_json(dir.path / "sub" / "trace.json");
  bool named = false;
  for (const json& e : file["traceEvents"])
    named |= e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 0 &&
             e["args"]["name"] == "rank 0 (dp 0, pp 0, tp 0)";
  EXPECT_TRUE(named);
  const std::vector<json> s = spans(file);
  ASSERT_EQ(s.size(), 4u);
  // Outer first; times in microseconds from the first span.
  EXPECT_EQ(s[0]["name"], "step 0");
  EXPECT_EQ(s[0]["ts"], 0.0);
  EXPECT_EQ(s[1]["name"], "F2");
  EXPECT_EQ(s[1]["cat"], "forward");
  EXPECT_EQ(s[1]["args"]["micro"], 2);
  EXPECT_EQ(s[2]["name"], "B2");
  EXPECT_EQ(s[3]["name"], "optimizer");
  for (const json& e : s) {
    EXPECT_EQ(e["pid"], 1);
    EXPECT_EQ(e["tid"], 0);
    EXPECT_GE(e["ts"].get<double>(), s[0]["ts"].get<double>());
    EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(),
              s[0]["ts"].get<double>() + s[0]["dur"].get<double>());
  }
  for (const auto& f : std::filesystem::directory_iterator(dir.path / "sub"))
    EXPECT_EQ(f.path().filename(), "trace.json") << "a temporary file was left";
}

// Trainer::run with a trace path: each step holds F0 B0 F1 B1 (accumulation 2), then the
// optimizer, and the collectives of the step (the token count, the loss) are in it too.
TEST(Trace, TrainerRunWritesEveryStepsPasses) {
  test::TempDir dir;
  train::TrainConfig cfg;
  cfg.model = {{"arch", "gpt2"}, {"n_layer", 2},     {"n_embd", 16},
               {"n_head", 2},    {"vocab_size", 64}, {"n_positions", 16}};
  cfg.micro_batch = 1;
  cfg.grad_accum = 2;
  cfg.train_batch = 2;
  cfg.train_steps = 3;
  cfg.output_dir = (dir.path / "out").string();
  cfg.trace_path = (dir.path / "trace.json").string();
  {
    train::Trainer t(cfg, std::make_unique<data::RandomTokenDataset>(64, 8, 16, 1));
    t.run();
  }
  EXPECT_FALSE(trace::enabled());
  const std::vector<json> s = spans(read_json(dir.path / "trace.json"));
  std::vector<std::string> order;
  int comm_in_steps = 0;
  double step_end = -1;
  for (const json& e : s) {
    const std::string cat = e["cat"];
    const double ts = e["ts"];
    if (cat == "step") {
      order.push_back(e["name"]);
      step_end = ts + e["dur"].get<double>();
    } else if (cat == "forward" || cat == "backward" || cat == "optimizer") {
      EXPECT_LE(ts, step_end) << e["name"] << " outside a step";
      order.push_back(e["name"]);
    } else if (cat == "comm" && ts <= step_end) {
      ++comm_in_steps;
    }
  }
  const std::vector<std::string> one = {"F0", "B0", "F1", "B1", "optimizer"};
  std::vector<std::string> want;
  for (int st = 0; st < 3; ++st) {
    want.push_back("step " + std::to_string(st));
    want.insert(want.end(), one.begin(), one.end());
  }
  EXPECT_EQ(order, want);
  EXPECT_GE(comm_in_steps, 3 * 3);  // tokens, loss and the gradient norm's, at least
}

TEST(Trace, ConfigKeyWritesIntoTheOutputFolder) {
  json j = {{"model", {{"arch", "gpt2"}}},
            {"data", {{"path", "x.txt"}}},
            {"output_dir", "runs/a"},
            {"trace", true}};
  EXPECT_EQ(train::parse_config(j, "cfg.json", 1).trace_path, "runs/a/trace.json");
  j["trace"] = false;
  EXPECT_EQ(train::parse_config(j, "cfg.json", 1).trace_path, "");
  j["trace"] = "runs/a/t.json";
  try {
    train::parse_config(j, "cfg.json", 1);
    ADD_FAILURE() << "a string for 'trace' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'trace'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
