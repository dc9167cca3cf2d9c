#include "loom/data/sft_dataset.h"

#include <unistd.h>

#include <cstring>
#include <fstream>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/tensor/rng.h"
#include "loom/util/error.h"
#include "loom/util/progress.h"

namespace loom::data {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'S', 'F', 'T', '1'};

// One conversation as model input: ids[n-1] and aligned targets (-100 = no loss).
struct Tokenized {
  std::vector<int32_t> ids, targets;
};

Tokenized tokenize(const Conversation& c, const EncodeFn& encode, const SftOptions& o,
                   bool* truncated) {
  std::vector<int32_t> toks;
  std::vector<uint8_t> train;
  for (const Segment& s : render_chat(o.chat_template, c, o.template_options)) {
    std::vector<int32_t> t = encode(s.text);
    toks.insert(toks.end(), t.begin(), t.end());
    train.insert(train.end(), t.size(), s.train ? 1 : 0);
  }
  *truncated = static_cast<int64_t>(toks.size()) > o.seq_len + 1;
  if (*truncated) {
    toks.resize(o.seq_len + 1);
    train.resize(o.seq_len + 1);
  }
  Tokenized r;
  if (toks.size() < 2) return r;
  for (size_t t = 0; t + 1 < toks.size(); ++t) {
    r.ids.push_back(toks[t]);
    r.targets.push_back(train[t + 1] ? toks[t + 1] : kernels::kIgnoreIndex);
  }
  return r;
}

template <typename T>
void put(std::ofstream& f, const T& v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

uint64_t file_hash(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  LOOM_CHECK(in.good(), p.string() + ": cannot open");
  uint64_t h = 0xcbf29ce484222325ull;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i)
      h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ull;
  }
  return h;
}

void split_validation(std::vector<Conversation>& train, std::vector<Conversation>& valid,
                      double fraction, uint64_t seed) {
  if (fraction <= 0.0) return;
  LOOM_CHECK(fraction < 1.0, "data.valid_fraction must be in [0, 1)");
  std::vector<Conversation> keep;
  for (size_t i = 0; i < train.size(); ++i) {
    const bool to_valid = rng_uniform(seed, stream_id("valid_split"), i) < fraction;
    (to_valid ? valid : keep).push_back(std::move(train[i]));
  }
  train = std::move(keep);
  LOOM_CHECK(!train.empty() && !valid.empty(),
             "data.valid_fraction leaves an empty training or validation set");
}

std::unique_ptr<SftDataset> SftDataset::build(const std::vector<Conversation>& convs,
                                              const EncodeFn& encode, const SftOptions& o,
                                              const fs::path& cache_file,
                                              const std::string& cache_key, SftStats* stats) {
  LOOM_CHECK(o.seq_len > 0, "data.seq_len must be positive");
  std::unique_ptr<SftDataset> ds(new SftDataset());
  ds->T_ = o.seq_len;
  ds->packed_ = o.pack;
  SftStats local;
  SftStats& st = stats ? *stats : local;
  st = SftStats{};
  const uint64_t key = stream_id(cache_key);
  if (!cache_file.empty() && fs::exists(cache_file) && ds->load_cache(cache_file, key, &st))
    return ds;

  const int64_t T = o.seq_len;
  std::vector<int32_t> row_ids, row_tg, row_pos;
  auto flush = [&] {
    if (row_ids.empty()) return;
    const size_t n = row_ids.size();
    row_ids.resize(T, o.pad_id);
    row_tg.resize(T, kernels::kIgnoreIndex);
    for (size_t t = n; t < static_cast<size_t>(T); ++t) row_pos.push_back(static_cast<int32_t>(t));
    ds->ids_.insert(ds->ids_.end(), row_ids.begin(), row_ids.end());
    ds->targets_.insert(ds->targets_.end(), row_tg.begin(), row_tg.end());
    ds->pos_.insert(ds->pos_.end(), row_pos.begin(), row_pos.end());
    row_ids.clear();
    row_tg.clear();
    row_pos.clear();
    ++ds->rows_;
  };
  Progress progress(o.progress_label, static_cast<int64_t>(convs.size()));
  for (const Conversation& c : convs) {
    progress.update(st.conversations);
    ++st.conversations;
    bool truncated = false;
    Tokenized tk = tokenize(c, encode, o, &truncated);
    st.truncated += truncated;
    const int64_t n_targets = kernels::count_targets(tk.targets.data(), tk.targets.size());
    if (n_targets == 0) {
      ++st.dropped;
      continue;
    }
    st.tokens += tk.ids.size();
    st.target_tokens += n_targets;
    if (!o.pack || static_cast<int64_t>(row_ids.size() + tk.ids.size()) > T) flush();
    for (size_t t = 0; t < tk.ids.size(); ++t) row_pos.push_back(static_cast<int32_t>(t));
    row_ids.insert(row_ids.end(), tk.ids.begin(), tk.ids.end());
    row_tg.insert(row_tg.end(), tk.targets.begin(), tk.targets.end());
  }
  flush();
  st.rows = ds->rows_;
  LOOM_CHECK(ds->rows_ > 0, "no conversation has a trainable token within data.seq_len " +
                                std::to_string(T) + " (" + std::to_string(st.dropped) +
                                " dropped)");
  if (!cache_file.empty()) ds->save_cache(cache_file, key, st);
  return ds;
}

void SftDataset::get(int64_t index, int32_t* ids, int32_t* targets) const {
  LOOM_CHECK(index >= 0 && index < rows_, "sample index out of range");
  std::memcpy(ids, ids_.data() + index * T_, T_ * sizeof(int32_t));
  std::memcpy(targets, targets_.data() + index * T_, T_ * sizeof(int32_t));
}

void SftDataset::get_positions(int64_t index, int32_t* pos) const {
  LOOM_CHECK(index >= 0 && index < rows_, "sample index out of range");
  std::memcpy(pos, pos_.data() + index * T_, T_ * sizeof(int32_t));
}

void SftDataset::save_cache(const fs::path& f, uint64_t key, const SftStats& st) const {
  fs::create_directories(f.parent_path());
  const fs::path tmp = f.string() + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(kMagic, 8);
    put(out, key);
    put(out, T_);
    put(out, rows_);
    put(out, static_cast<int64_t>(packed_));
    for (int64_t v : {st.conversations, st.truncated, st.dropped, st.tokens, st.target_tokens})
      put(out, v);
    for (const auto* a : {&ids_, &targets_, &pos_})
      out.write(reinterpret_cast<const char*>(a->data()), a->size() * sizeof(int32_t));
    if (!out.good()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;  // a cache that cannot be written only costs the next run its tokenization
    }
  }
  fs::rename(tmp, f);
}

bool SftDataset::load_cache(const fs::path& f, uint64_t key, SftStats* st) {
  std::ifstream in(f, std::ios::binary);
  char magic[8];
  uint64_t k = 0;
  int64_t T = 0, rows = 0, packed = 0, v[5];
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&k), 8);
  in.read(reinterpret_cast<char*>(&T), 8);
  in.read(reinterpret_cast<char*>(&rows), 8);
  in.read(reinterpret_cast<char*>(&packed), 8);
  in.read(reinterpret_cast<char*>(v), sizeof v);
  // Every count is checked against the file size before anything is allocated.
  const uint64_t header = 8 + 8 * 9;
  if (!in.good() || std::memcmp(magic, kMagic, 8) != 0 || k != key || T != T_ ||
      packed != static_cast<int64_t>(packed_) || rows <= 0 ||
      rows > static_cast<int64_t>(fs::file_size(f) / (3 * 4 * std::max<int64_t>(T, 1))) ||
      fs::file_size(f) != header + 3ull * rows * T * sizeof(int32_t))
    return false;
  for (auto* a : {&ids_, &targets_, &pos_}) {
    a->resize(rows * T);
    in.read(reinterpret_cast<char*>(a->data()), a->size() * sizeof(int32_t));
  }
  if (!in.good()) return false;
  rows_ = rows;
  *st = SftStats{v[0], rows, v[1], v[2], v[3], v[4], true};
  return true;
}

}  // namespace loom::data
