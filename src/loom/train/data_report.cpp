#include "loom/train/data_report.h"

#include <cstdio>
#include <sstream>

#include "loom/kernels/cpu/cross_entropy.h"

namespace loom::train {

std::string render_row(const data::Dataset& ds, int64_t index, const TextCodec& codec) {
  const int64_t T = ds.seq_len();
  std::vector<int32_t> ids(T), targets(T);
  ds.get(index, ids.data(), targets.data());
  // Token j >= 1 of the row is trained when position j - 1 predicts it: it is then
  // targets[j - 1] (the last one exists only as a target), else ids[j].
  std::vector<int32_t> tokens{ids[0]};
  std::vector<bool> trained{false};
  for (int64_t j = 1; j <= T; ++j) {
    const bool t = targets[j - 1] != kernels::kIgnoreIndex;
    if (!t && j == T) break;
    tokens.push_back(t ? targets[j - 1] : ids[j]);
    trained.push_back(t);
  }
  size_t end = tokens.size();
  while (end > 1 && !trained[end - 1] && tokens[end - 1] == codec.pad_id) --end;
  // Runs of trained / untrained tokens as text. A token boundary may fall inside a UTF-8
  // character (bytes, byte-level BPE): such continuation bytes move to the run before, so
  // the marks never split a character.
  std::vector<std::pair<std::string, bool>> runs;
  for (size_t j = 0; j < end;) {
    size_t k = j;
    while (k < end && trained[k] == trained[j]) ++k;
    std::string text = codec.decode(std::vector<int32_t>(tokens.begin() + j, tokens.begin() + k));
    size_t cont = 0;
    while (!runs.empty() && cont < text.size() &&
           (static_cast<unsigned char>(text[cont]) & 0xC0) == 0x80)
      ++cont;
    if (cont > 0) runs.back().first += text.substr(0, cont);
    runs.emplace_back(text.substr(cont), trained[j]);
    j = k;
  }
  std::string out;
  for (const auto& [text, t] : runs) out += t ? kTrainOpen + text + kTrainClose : text;
  if (end < tokens.size()) out += " (+" + std::to_string(tokens.size() - end) + " padding)";
  return out;
}

std::string describe_data(const TrainConfig& cfg, const TextCodec& codec, int samples) {
  const TrainData d = build_train_data(cfg.data, codec, cfg.seed);
  const auto parts = d.train->parts();
  std::ostringstream o;
  char buf[64];
  o << "data: " << d.sources.size() << (d.sources.size() == 1 ? " file" : " files") << ", seq_len "
    << cfg.data.seq_len << (cfg.data.pack ? ", packed" : "") << ", tokenizer " << codec.id << "\n";
  for (size_t i = 0; i < d.sources.size(); ++i) {
    const SourceStats& s = d.sources[i];
    const data::Dataset& ds = *parts.at(i).dataset;
    // Positions that carry loss, counted on the rows themselves.
    int64_t loss_positions = 0;
    std::vector<int32_t> ids(ds.seq_len()), tg(ds.seq_len());
    for (int64_t r = 0; r < ds.size(); ++r) {
      ds.get(r, ids.data(), tg.data());
      loss_positions += kernels::count_targets(tg.data(), tg.size());
    }
    const int64_t positions = ds.size() * ds.seq_len();
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * s.share);
    o << "\n[" << i << "] " << s.path << ": " << s.format << ", " << buf << " of the samples\n";
    o << "  records " << s.records << " (" << s.skipped << " malformed, skipped)";
    if (s.format == "text")
      o << ", documents " << s.documents << " (+" << s.valid_documents << " held out)";
    o << "; truncated " << s.truncated << ", dropped " << s.dropped << "\n";
    o << "  tokens " << s.tokens << "; training rows " << s.rows << ", validation rows "
      << s.valid_rows << "\n";
    std::snprintf(buf, sizeof buf, "%.1f%%", positions ? 100.0 * loss_positions / positions : 0.0);
    o << "  loss on " << loss_positions << " of " << positions << " row positions (" << buf
      << ")\n";
    for (int64_t r = 0; r < std::min<int64_t>(samples, ds.size()); ++r)
      o << "  --- row " << r << " (loss on " << kTrainOpen << "..." << kTrainClose << "):\n"
        << render_row(ds, r, codec) << "\n";
  }
  return o.str();
}

}  // namespace loom::train
