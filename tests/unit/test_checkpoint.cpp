// Checkpoint files and directories: round trips, and every way a checkpoint can be incomplete,
// corrupt or of another job, each refused with its message while an older complete one is
// still found.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <ostream>
#include <tuple>
#include <utility>

#include "ddiloco/checkpoint.hpp"
#include "ddiloco/fragments.hpp"
#include "ddiloco/error.hpp"
#include "ddiloco/rng.hpp"
#include "ddiloco/run_dir.hpp"
#include "io/h5.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

namespace fs = std::filesystem;
using checkpoint::SyncerState;
using checkpoint::UnitState;

Config job() {
  Config c;
  c.mode = Mode::decoupled;
  c.model = GptConfig{256, 16, 1, 2, 16};
  c.units.count = 2;
  c.outer.fragments = 2;
  return c;
}

std::vector<float> values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

SyncerState syncer_state(const Config& c, int64_t id) {
  const size_t n = ParameterLayout::gpt2(c.model).size();
  SyncerState s;
  s.id = id;
  s.mode = "decoupled";
  s.config_yaml = to_yaml(c);
  s.model = c.model;
  s.units = 2;
  s.fragments = 2;
  s.h = 50;
  s.theta = values(n, 1 + id);
  s.momentum = values(n, 100 + id);
  s.versions = {3, 4};
  s.merges = 7;
  s.merged_seq = {1, 2, 3, 4};
  s.grace = {0.1, 0.09, 0.02, 0.01, 1, 1, 0};
  s.tokens = 12345;
  s.next_eval = 10;
  s.elapsed_s = 12.5;
  s.run_seed = 1337;
  s.chaos_seed = 1;
  return s;
}

// Unit `unit`'s state with every field set (but `lost`: a lost unit has no parameters, its
// round trip is LostUnitHasNoParameters), the wire-format references and residuals included.
UnitState unit_state(const Config& c, int unit, int64_t id) {
  const size_t n = ParameterLayout::gpt2(c.model).size();
  UnitState s;
  s.id = id;
  s.unit = unit;
  s.model = c.model;
  s.step = 40 + unit;
  s.tokens = 5000;
  s.schedule_step = 39;
  s.rejoins = 2;
  s.run_seed = 1337;
  s.params = values(n, 7 + unit);
  s.adam_m = values(n, 8 + unit);
  s.adam_v = values(n, 9 + unit);
  for (auto& x : s.adam_v) x = x * x;
  s.adam_step = 40;
  s.c_steps = {3, 5};
  s.c_tok = {96, 160};
  s.sent_step = {-1, 38};
  s.last_seq = {4, 6};
  s.sent_c_steps = {0, 3};
  s.sent_c_tok = {0, 96};
  // Per-fragment vectors are as long as their fragment (the reader checks it).
  const ParameterLayout layout = ParameterLayout::gpt2(c.model);
  const protocol::FragmentPlan plan(layout, 2, 1);
  const size_t n0 = plan.fragments()[0].numel, n1 = plan.fragments()[1].numel;
  s.sent_theta = {values(n0, 1), values(n1, 2)};
  s.wire_ref_version = {3, 4};
  s.wire_ref = {values(n0, 3), values(n1, 4)};
  s.wire_residual = {values(n0, 5), {}};  // fragment 1 has no residual
  s.cursors = {{0, 40}, {1, 2}};
  Rng sampler(1337 + static_cast<uint64_t>(unit));
  sampler.next_u64();
  s.sample_rng = sampler.state();  // mode single's (the outer modes leave these empty)
  s.log_loss_sum = 12.5;
  s.log_steps = 7;
  return s;
}

// A state's fields in declaration order, by structured binding. The binding must name every
// field: one added to checkpoint.hpp breaks the build here until it is named, and
// expect_every_field_set then covers it.
auto fields(const SyncerState& s) {
  const auto& [id, mode, config_yaml, model, units, fragments, h, theta, momentum, versions,
               merged_seq, grace, merges, tokens, next_eval, run_seed, chaos_seed, elapsed_s] = s;
  return std::tie(id, mode, config_yaml, model, units, fragments, h, theta, momentum, versions,
                  merged_seq, grace, merges, tokens, next_eval, run_seed, chaos_seed, elapsed_s);
}
auto fields(const UnitState& s) {
  const auto& [id, unit, model, lost, step, tokens, schedule_step, rejoins, run_seed, params,
               adam_m, adam_v, adam_step, c_steps, c_tok, sent_step, last_seq, sent_c_steps,
               sent_c_tok, sent_theta, wire_ref_version, wire_ref, wire_residual, cursors,
               sample_rng, log_loss_sum, log_steps] = s;
  return std::tie(id, unit, model, lost, step, tokens, schedule_step, rejoins, run_seed, params,
                  adam_m, adam_v, adam_step, c_steps, c_tok, sent_step, last_seq, sent_c_steps,
                  sent_c_tok, sent_theta, wire_ref_version, wire_ref, wire_residual, cursors,
                  sample_rng, log_loss_sum, log_steps);
}

// Every field differs from its default in at least one of `states`: a round trip of these
// states through a writer or reader that skipped a field would not come back equal.
template <typename State>
void expect_every_field_set(const std::vector<State>& states) {
  const State none{};
  const auto defaults = fields(none);
  constexpr size_t n = std::tuple_size_v<decltype(defaults)>;
  const auto set = [&]<size_t... I>(std::index_sequence<I...>) {
    return std::array<bool, n>{std::any_of(states.begin(), states.end(), [&](const State& s) {
      return std::get<I>(fields(s)) != std::get<I>(defaults);
    })...};
  }(std::make_index_sequence<n>{});
  for (size_t i = 0; i < n; ++i)
    EXPECT_TRUE(set[i]) << "field " << i << " (in declaration order) is left at its default in every test state";
}

}  // namespace

// What GoogleTest prints of a state that differs: every field, in declaration order.
namespace checkpoint {
template <typename State>
void print_fields(const State& s, std::ostream* os) {
  std::apply([&](const auto&... f) { ((*os << ::testing::PrintToString(f) << "; "), ...); }, fields(s));
}
void PrintTo(const SyncerState& s, std::ostream* os) { print_fields(s, os); }
void PrintTo(const UnitState& s, std::ostream* os) { print_fields(s, os); }
}  // namespace checkpoint

namespace {

// A complete checkpoint `id` of job() under root.
fs::path write_checkpoint(const fs::path& root, int64_t id) {
  const Config c = job();
  const fs::path dir = checkpoint::directory(root, id);
  fs::create_directories(dir);
  for (int u = 0; u < 2; ++u) checkpoint::write_unit(dir, unit_state(c, u, id));
  checkpoint::write_syncer(dir, syncer_state(c, id));
  checkpoint::write_manifest(dir, id, c, {{"merges", 7}, {"tokens", 12345}});
  return dir;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, FilesRoundTripEveryField) {
  test::TempDir tmp;
  const fs::path dir = write_checkpoint(tmp.path(), 3);
  EXPECT_EQ(dir.filename(), "ckpt_00000003");
  EXPECT_FALSE(fs::exists(dir / "syncer.h5.tmp"));
  const Config c = job();
  const SyncerState want = syncer_state(c, 3);
  expect_every_field_set<SyncerState>({want});
  EXPECT_EQ(checkpoint::read_syncer(checkpoint::syncer_file(dir)), want);
  for (int u = 0; u < 2; ++u)
    EXPECT_EQ(checkpoint::read_unit(checkpoint::unit_file(dir, u), 2), unit_state(c, u, 3)) << "unit " << u;
  EXPECT_NO_THROW(checkpoint::verify(dir));
  EXPECT_NE(checkpoint::describe(dir).find("unit 1, checkpoint 3, 2 ranks, step 41"), std::string::npos);
}

TEST(Checkpoint, AFragmentWithoutAWireReferenceComesBackWithoutOne) {
  // Version −1: no reference of fragment 1 (and so no residual); fragment 0 keeps both.
  test::TempDir tmp;
  UnitState want = unit_state(job(), 0, 1);
  want.wire_ref_version[1] = -1;
  want.wire_ref[1].clear();
  checkpoint::write_unit(tmp.path(), want);
  const UnitState back = checkpoint::read_unit(checkpoint::unit_file(tmp.path(), 0), 2);
  EXPECT_EQ(back, want);
  EXPECT_TRUE(checkpoint::has_reference(back, 0, 3));
  EXPECT_FALSE(checkpoint::has_reference(back, 0, 4));
  EXPECT_FALSE(checkpoint::has_reference(back, 1, -1));
}

// Rewrites group `group` of an HDF5 file in place, as a damaged or hostile file would have it.
template <typename Edit>
void edit_group(const std::filesystem::path& file, const char* group, Edit edit) {
  h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  ASSERT_GE(f.get(), 0);
  h5::Handle g = h5::open_group(f, group, "test");
  edit(g.get());
}

// Issue 34: a sent_theta_<p> shorter than its fragment was read as it was, and the resume then
// mixed past its end. Every per-fragment vector must be exactly its fragment long.
TEST(Checkpoint, PerFragmentVectorOfTheWrongLengthIsRefusedNamingIt) {
  for (const char* stem : {"sent_theta", "wire_ref", "wire_residual"}) {
    test::TempDir tmp;
    checkpoint::write_unit(tmp.path(), unit_state(job(), 0, 1));
    const auto file = checkpoint::unit_file(tmp.path(), 0);
    edit_group(file, "outer", [&](hid_t outer) {
      const std::string name = fmt::format("{}_0", stem);
      ASSERT_GE(H5Ldelete(outer, name.c_str(), H5P_DEFAULT), 0);
      const std::vector<float> shorter(3, 1.0f);
      h5::write_dataset(outer, name, shorter.data(), {3});
    });
    const ParameterLayout layout = ParameterLayout::gpt2(job().model);
    try {
      checkpoint::read_unit(file, 2, protocol::FragmentPlan(layout, 2, 1).numels());
      ADD_FAILURE() << stem << "_0 of 3 values was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("{}_0 has shape (3), expected (", stem)), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
    }
  }
}

// Found by fuzz/h5_readers.cpp (the model-file twin of this): a unit file whose /model
// describes a model far larger than the file made read_unit allocate three copies of it.
TEST(Checkpoint, ShapeLargerThanTheFileIsRefusedBeforeAllocating) {
  test::TempDir tmp;
  checkpoint::write_unit(tmp.path(), unit_state(job(), 0, 1));
  const auto file = checkpoint::unit_file(tmp.path(), 0);
  edit_group(file, "model", [](hid_t m) {
    h5::write_attr(m, "n_embd", int64_t{1} << 17);
    h5::write_attr(m, "n_layer", int64_t{64});
    h5::write_attr(m, "n_head", int64_t{1});
  });
  const std::string e = error_of([&] { checkpoint::read_unit(file, 2); });
  EXPECT_NE(e.find("more than the whole file"), std::string::npos) << e;
  EXPECT_NE(e.find(file.string()), std::string::npos) << e;
}

// `ddiloco inspect` of a unit file took the fragment count as c_steps' first dimension
// without checking there is one: a scalar c_steps read past an empty vector.
TEST(Checkpoint, InspectRefusesAUnitFileWhoseCStepsIsNoList) {
  test::TempDir tmp;
  checkpoint::write_unit(tmp.path(), unit_state(job(), 0, 1));
  const auto file = checkpoint::unit_file(tmp.path(), 0);
  edit_group(file, "outer", [](hid_t outer) {
    ASSERT_GE(H5Ldelete(outer, "c_steps", H5P_DEFAULT), 0);
    const int64_t one = 1;
    h5::write_dataset(outer, "c_steps", &one, {});
  });
  const std::string e = error_of([&] { checkpoint::describe(file); });
  EXPECT_NE(e.find("dataset 'c_steps' has shape (), expected (P,)"), std::string::npos) << e;
}

// Checkpoints of earlier ddiloco versions hold variable-length string attributes, which
// libhdf5 1.10 cannot read safely (docs/fuzzing.md): resume, and inspect, refuse them naming
// the file and the attribute, before reading the string.
TEST(Checkpoint, VariableLengthStringOfAnEarlierVersionIsRefusedNamingFileAndAttribute) {
  test::TempDir tmp;
  checkpoint::write_syncer(tmp.path(), syncer_state(job(), 1));
  const auto file = checkpoint::syncer_file(tmp.path());
  {
    h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(H5Adelete(f, "config"), 0);
    h5::Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type, H5T_VARIABLE);
    h5::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    h5::Handle attr(H5Acreate2(f, "config", type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    const char* yaml = "mode: diloco\n";
    ASSERT_GE(H5Awrite(attr, type, &yaml), 0);
  }
  for (const std::string& e : {error_of([&] { checkpoint::read_syncer(file); }),
                               error_of([&] { checkpoint::describe(file); })}) {
    EXPECT_NE(e.find(file.string() + ": attribute 'config' is a variable-length string"),
              std::string::npos) << e;
    EXPECT_NE(e.find("written by a ddiloco before fixed-length string attributes"),
              std::string::npos) << e;
  }
}

TEST(Checkpoint, LostUnitHasNoParameters) {
  test::TempDir tmp;
  UnitState s = unit_state(job(), 1, 1);
  s.lost = true;
  expect_every_field_set<UnitState>({unit_state(job(), 1, 1), s});
  checkpoint::write_unit(tmp.path(), s);
  const UnitState back = checkpoint::read_unit(checkpoint::unit_file(tmp.path(), 1), 2);
  // Neither θ nor AdamW's state is written; everything else comes back.
  UnitState want = s;
  want.params.clear();
  want.adam_m.clear();
  want.adam_v.clear();
  want.adam_step = 0;
  EXPECT_EQ(back, want);
  EXPECT_FALSE(checkpoint::has_reference(back, 0, 3));  // a lost unit's references are void
}

TEST(Checkpoint, IncompleteOrCorruptOnesAreRefusedAndTheNewestCompleteIsFound) {
  test::TempDir tmp;
  const fs::path root = tmp.path();
  write_checkpoint(root, 1);
  const fs::path truncated = write_checkpoint(root, 2);
  const fs::path unlisted = write_checkpoint(root, 3);
  const fs::path no_manifest = write_checkpoint(root, 4);
  // 2: a unit file cut short.
  fs::resize_file(checkpoint::unit_file(truncated, 1), fs::file_size(checkpoint::unit_file(truncated, 1)) / 2);
  EXPECT_NE(error_of([&] { checkpoint::verify(truncated); }).find("unit_1.h5: "), std::string::npos);
  EXPECT_NE(error_of([&] { checkpoint::verify(truncated); }).find("truncated"), std::string::npos);
  // 3: a file missing.
  fs::remove(checkpoint::syncer_file(unlisted));
  EXPECT_NE(error_of([&] { checkpoint::verify(unlisted); }).find("syncer.h5: missing"), std::string::npos);
  // 4: stopped before its manifest.
  fs::remove(no_manifest / "manifest.json");
  EXPECT_NE(error_of([&] { checkpoint::verify(no_manifest); }).find("no manifest.json"), std::string::npos);
  // A partial directory of a later checkpoint.
  fs::create_directories(checkpoint::directory(root, 5));
  std::vector<std::string> warnings;
  const auto found = checkpoint::find_latest(root, warnings);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->dir, checkpoint::directory(root, 1));
  EXPECT_EQ(found->manifest["id"], 1);
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_NE(warnings[0].find("ckpt_00000005"), std::string::npos);
  EXPECT_NE(warnings[3].find("ckpt_00000002"), std::string::npos);
  EXPECT_EQ(checkpoint::highest_id(root), 5);
  EXPECT_NE(checkpoint::describe(root).find("ckpt_00000002  INCOMPLETE OR CORRUPT"), std::string::npos);
  // A flipped byte keeps the size: the checksum catches it.
  const fs::path one = checkpoint::unit_file(checkpoint::directory(root, 1), 0);
  {
    std::fstream f(one, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(one) / 2));
    f.put('\x5a');
  }
  EXPECT_NE(error_of([&] { checkpoint::verify(checkpoint::directory(root, 1)); }).find("checksum"),
            std::string::npos);
  warnings.clear();
  EXPECT_FALSE(checkpoint::find_latest(root, warnings).has_value());
}

TEST(Checkpoint, AnotherJobsCheckpointIsRefusedNamingTheField) {
  test::TempDir tmp;
  const fs::path dir = write_checkpoint(tmp.path(), 1);
  const nlohmann::json m = checkpoint::verify(dir);
  EXPECT_NO_THROW(checkpoint::check_compatible(m, job(), dir));
  Config c = job();
  c.model.n_embd = 32;
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(m, c, dir); }).find("model.n_embd is 16 there, 32 in this configuration"),
            std::string::npos);
  c = job();
  c.units.count = 3;
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(m, c, dir); }).find("units.count is 2 there, 3"),
            std::string::npos);
  c = job();
  c.units.ranks = {1, 2};
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(m, c, dir); }).find("the ranks of unit 1 is 1 there, 2"),
            std::string::npos);
  c = job();
  c.run.seed = 2;
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(m, c, dir); }).find("run.seed is 1337 there, 2"),
            std::string::npos);
  c = job();
  c.mode = Mode::diloco;
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(m, c, dir); }).find("mode is decoupled there, diloco"),
            std::string::npos);
  // diloco counts its rounds in steps: its warm-up cannot change on resume. A manifest from
  // before the key had none.
  nlohmann::json dm = m;
  dm["mode"] = "diloco";
  dm["fragments"] = 1;
  dm.erase("warmup_steps");
  EXPECT_NO_THROW(checkpoint::check_compatible(dm, c, dir));
  dm["warmup_steps"] = 300;
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(dm, c, dir); })
                .find("outer.warmup_steps (diloco counts its rounds in steps) is 300 there, 0"),
            std::string::npos);
  c.outer.warmup_steps = 300;
  EXPECT_NO_THROW(checkpoint::check_compatible(dm, c, dir));
  EXPECT_EQ(m.at("warmup_steps"), 0);  // written with every checkpoint
  // A file whose tensor has another shape than its /model says, and one with fewer fragments.
  const fs::path file = checkpoint::unit_file(dir, 0);
  {
    h5::Handle f(H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    ASSERT_GE(f.get(), 0);
    h5::Handle params = h5::open_group(f, "params", "test");
    ASSERT_GE(H5Ldelete(params, "wpe", H5P_DEFAULT), 0);
    const std::vector<float> wpe(8 * 16, 0.0f);
    h5::write_dataset(params, "wpe", wpe.data(), {8, 16});
  }
  std::string e = error_of([&] { checkpoint::read_unit(file, 2); });
  EXPECT_NE(e.find("unit_0.h5:/params: dataset 'wpe'"), std::string::npos) << e;
  EXPECT_NE(e.find("(16, 16)"), std::string::npos) << e;
  e = error_of([&] { checkpoint::read_unit(checkpoint::unit_file(dir, 1), 3); });
  EXPECT_NE(e.find("c_steps"), std::string::npos) << e;
}

// Mode single: unit_0.h5 and the manifest, no syncer.h5, on any number of ranks.
TEST(Checkpoint, ModeSingleNeedsNoSyncerFileAndIsChosenByAuto) {
  test::TempDir tmp;
  Config c = job();
  c.mode = Mode::single;
  c.units.count = 1;
  c.units.ranks = {};
  c.run.dir = tmp.path().string();
  const fs::path root = c.checkpoint.directory(c.run.dir);
  const fs::path dir = checkpoint::directory(root, 3);
  fs::create_directories(dir);
  checkpoint::UnitState st = unit_state(c, 0, 3);
  checkpoint::write_unit(dir, st);
  checkpoint::write_manifest(dir, 3, c, {{"step", st.step}, {"unit_ranks", std::vector<int>{2}}});
  const nlohmann::json m = checkpoint::verify(dir);
  EXPECT_EQ(m.at("mode"), "single");
  EXPECT_NO_THROW(checkpoint::check_compatible(m, c, dir));
  EXPECT_EQ(checkpoint::choose(c, "auto"), dir.string());
  EXPECT_EQ(checkpoint::choose(c, dir.string()), dir.string());
  EXPECT_EQ(checkpoint::read_unit(checkpoint::unit_file(dir, 0), 2), st);
  Config other = job();  // decoupled, 2 units
  EXPECT_NE(error_of([&] { checkpoint::check_compatible(m, other, dir); }).find("mode is single there, decoupled"),
            std::string::npos);
  // The same files under another mode's manifest lack the syncer's.
  nlohmann::json dm = m;
  dm["mode"] = "decoupled";
  write_text_atomically(dir / "manifest.json", dm.dump());
  EXPECT_NE(error_of([&] { checkpoint::verify(dir); }).find("does not list syncer.h5"), std::string::npos);
}

TEST(Checkpoint, PruneKeepsTheNewestCompleteOnesAndDropsAbandonedPartialOnes) {
  test::TempDir tmp;
  const fs::path root = tmp.path();
  for (int id = 1; id <= 4; ++id) write_checkpoint(root, id);
  fs::create_directories(checkpoint::directory(root, 2) / "x");
  fs::remove(checkpoint::directory(root, 3) / "manifest.json");  // abandoned
  fs::create_directories(checkpoint::directory(root, 5));          // being written
  checkpoint::prune(root, 2);
  EXPECT_FALSE(fs::exists(checkpoint::directory(root, 1)));
  EXPECT_TRUE(fs::exists(checkpoint::directory(root, 2)));
  EXPECT_FALSE(fs::exists(checkpoint::directory(root, 3)));
  EXPECT_TRUE(fs::exists(checkpoint::directory(root, 4)));
  EXPECT_TRUE(fs::exists(checkpoint::directory(root, 5)));
}

}  // namespace
}  // namespace ddiloco
