// Writing and reading training checkpoints: the live objects' states flattened into one
// safetensors file with checksums (save_checkpoint, read_checkpoint). Restoring into live
// objects is in checkpoint_load.cpp.
//
// Note [Checkpoint layout]
// Tensors:  "model.<state_dict key>", "optim.<key>", "sched.<key>", "scaler.<key>".
// Metadata (all strings):
//   "format"               "strata.checkpoint/1"
//   "step"                 decimal int64
//   "config.<k>"           the model configuration
//   "loader.<k>"           decimal int64: the data loader's position
//   "user.<k>"             free-form metadata
//   "<part>.type"          for part in optim, sched, scaler: the StateDict type; its presence
//                          marks the part as saved
//   "<part>.scalar.<k>"    StateDict scalars, "{:.17g}" (round-trips every double exactly)
//   "rng.<name>"           "<seed>,<offset>" in decimal; "rng.default" is default_generator()
//   "checksum.<tensor>"    xxHash64 of the tensor's bytes (C order, little-endian), 16 hex digits
//   "checksum.metadata"    xxHash64 over every other metadata entry ("key\0value\0" in key order)
#include <strata/io/checkpoint.hpp>

#include <cstdio>

#include <fmt/format.h>

#include <strata/core/error.hpp>
#include <strata/io/atomic_file.hpp>
#include <strata/io/safetensors.hpp>

#include "io/checkpoint_format.h"
#include "io/checksum.h"

namespace strata::io {
namespace {

void put_state(TensorMap& tensors, Metadata& meta, const std::string& part, const optim::StateDict& d) {
  meta[part + ".type"] = d.type;
  for (const auto& [k, v] : d.scalars) meta[part + ".scalar." + k] = detail::format_double(v);
  for (const auto& [k, t] : d.tensors) tensors[part + "." + k] = t;
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainingState& s, const Checkpoint& progress) {
  TensorMap tensors;
  Metadata meta;
  meta["format"] = detail::kCheckpointFormat;
  meta["step"] = std::to_string(progress.step);
  for (const auto& [k, v] : s.config) meta["config." + k] = v;
  for (const auto& [k, v] : progress.loader) meta["loader." + k] = std::to_string(v);
  for (const auto& [k, v] : progress.metadata) meta["user." + k] = v;
  if (s.model)
    for (const auto& [k, t] : s.model->state_dict()) tensors["model." + k] = t;
  if (s.optimizer) put_state(tensors, meta, "optim", s.optimizer->state_dict());
  if (s.scheduler) put_state(tensors, meta, "sched", s.scheduler.save());
  if (s.scaler) put_state(tensors, meta, "scaler", s.scaler.save());

  const RandomDraw dg = default_generator().state();  // seed and offset read together
  meta["rng.default"] = detail::format_rng(dg.seed, dg.offset);
  for (const auto& [name, g] : s.generators) {
    STRATA_CHECK(name != "default", "[checkpoint] the generator name 'default' is reserved for default_generator()");
    STRATA_CHECK(g != nullptr, "[checkpoint] generator '{}' is null", name);
    const RandomDraw st = g->state();
    meta["rng." + name] = detail::format_rng(st.seed, st.offset);
  }

  for (auto& [name, t] : tensors) {
    STRATA_CHECK(t.defined(), "[checkpoint] cannot save {}: tensor '{}' is undefined", path, name);
    t = t.cpu().contiguous();  // the bytes the file will hold, hashed once here
    meta["checksum." + name] = detail::to_hex64(detail::xxhash64(t.nbytes() ? t.data() : "", t.nbytes()));
  }
  meta["checksum.metadata"] = detail::to_hex64(detail::metadata_hash(meta));

  save_safetensors(path, tensors, meta);  // its atomic write removes temporaries of runs killed mid-save
}

CheckpointFile read_checkpoint(const std::string& path) {
  SafetensorsFile f;
  try {
    f = load_safetensors(path);
  } catch (const Error& e) {
    throw Error(fmt::format("[checkpoint] {} is not a readable checkpoint: {}", path, e.what()));
  }
  Metadata& meta = f.metadata;
  auto format = meta.find("format");
  STRATA_CHECK(format != meta.end() && format->second == detail::kCheckpointFormat,
               "[checkpoint] {} is a safetensors file but not a strata checkpoint (format '{}', expected '{}')", path,
               format == meta.end() ? "" : format->second, detail::kCheckpointFormat);
  auto mh = meta.find("checksum.metadata");
  STRATA_CHECK(mh != meta.end(), "[checkpoint] {} has no metadata checksum", path);
  STRATA_CHECK(detail::parse_hex64(mh->second) == detail::metadata_hash(meta),
               "[checkpoint] {} is corrupted: the metadata does not match its checksum", path);

  // every tensor must carry a matching checksum, and every checksum name a tensor
  for (const auto& [name, t] : f.tensors) {
    auto it = meta.find("checksum." + name);
    STRATA_CHECK(it != meta.end(), "[checkpoint] {}: tensor '{}' has no checksum", path, name);
    Tensor c = t.contiguous();
    uint64_t got = detail::xxhash64(c.nbytes() ? c.data() : "", c.nbytes());
    auto want = detail::parse_hex64(it->second);
    STRATA_CHECK(want && *want == got,
                 "[checkpoint] {} is corrupted: tensor '{}' does not match its checksum (stored {}, computed {})", path,
                 name, it->second, detail::to_hex64(got));
  }
  // a tensor dropped from the file with its checksum left behind (a re-save of a subset) would
  // otherwise resume with that state re-created as zeros
  constexpr std::string_view kChecksum = "checksum.";
  for (const auto& [key, value] : meta) {
    if (key.rfind(kChecksum, 0) != 0 || key == "checksum.metadata") continue;
    const std::string name = key.substr(kChecksum.size());
    STRATA_CHECK(f.tensors.count(name), "[checkpoint] {}: a checksum names tensor '{}', which the file lacks", path,
                 name);
  }
  CheckpointFile out;
  detail::parse_layout(path, f, out);
  return out;
}

}  // namespace strata::io
