// Model files: round trip, and refusal of files that are not what they claim.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "ddiloco/error.hpp"
#include "ddiloco/model_io.hpp"
#include "ddiloco/sampler.hpp"
#include "io/h5.hpp"
#include "temp_dir.hpp"

namespace ddiloco {
namespace {

TEST(ModelIo, RoundTripKeepsShapeParamsAndMetadata) {
  test::TempDir dir;
  const GptConfig c{256, 16, 2, 2, 16};
  Gpt<float> model(c);
  model.init_weights(9);
  save_model(dir / "m.h5", c, model.parameters(), {{"step", 12}, {"val_loss", 1.5}});
  EXPECT_FALSE(std::filesystem::exists(dir / "m.h5.tmp"));
  const LoadedModel back = load_model(dir / "m.h5");
  EXPECT_EQ(back.config, c);
  ASSERT_EQ(back.params.size(), model.parameters().size());
  EXPECT_TRUE(std::equal(back.params.begin(), back.params.end(), model.parameters().begin()));
  EXPECT_EQ(back.metadata["step"], 12);
}

TEST(ModelIo, RefusesNonHdf5WrongFormatAndWrongShapes) {
  test::TempDir dir;
  test::write_bytes(dir / "junk.h5", "definitely not hdf5");
  EXPECT_THROW(load_model(dir / "junk.h5"), Error);
  EXPECT_THROW(load_model(dir / "missing.h5"), Error);

  // A file whose /model says one shape while a tensor has another.
  const GptConfig c{256, 16, 1, 2, 16};
  Gpt<float> model(c);
  {
    h5::Handle f = h5::create_file(dir / "bad.h5");
    h5::write_attr(f, "format", std::string("ddiloco-model"));
    h5::write_attr(f, "format_version", kModelFormatVersion);
    h5::write_attr(f, "metadata", std::string("{}"));
    h5::Handle m = h5::create_group(f, "model", "bad");
    for (auto [k, v] : {std::pair{"vocab_size", 256}, {"seq_len", 16}, {"n_layer", 1},
                        {"n_head", 2}, {"n_embd", 16}})
      h5::write_attr(m, k, int64_t{v});
    h5::Handle p = h5::create_group(f, "params", "bad");
    for (const auto& t : model.layout().tensors()) {
      std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
      if (t.name == "wpe") dims = {8, 16};  // wrong
      std::vector<float> zeros(t.numel);
      h5::write_dataset(p, t.name, zeros.data(), dims);
    }
  }
  try {
    load_model(dir / "bad.h5");
    ADD_FAILURE() << "accepted a wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'wpe' has shape (8, 16), expected (16, 16)"),
              std::string::npos)
        << e.what();
  }
}

// Issue 34: a model.h5 whose format_version is an array of 64 int64 overflowed the one value
// read_attr_int reads into; every scalar attribute is now checked to hold one element.
TEST(ModelIo, AttributeThatIsAnArrayIsRefusedNotReadIntoAScalar) {
  test::TempDir dir;
  {
    h5::Handle f = h5::create_file(dir / "array.h5");
    h5::write_attr(f, "format", std::string("ddiloco-model"));
    const hsize_t n = 64;
    h5::Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    h5::Handle attr(H5Acreate2(f, "format_version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    std::vector<int64_t> values(n, 0x4141414141414141);
    ASSERT_GE(H5Awrite(attr, H5T_NATIVE_INT64, values.data()), 0);
    h5::Handle d(H5Acreate2(f, "ratio", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    std::vector<double> doubles(n, 1.0);
    ASSERT_GE(H5Awrite(d, H5T_NATIVE_DOUBLE, doubles.data()), 0);
  }
  h5::Handle f = h5::open_file(dir / "array.h5");
  for (const char* name : {"format_version", "ratio"}) {
    try {
      if (std::string(name) == "ratio") h5::read_attr_double(f, name, "array.h5");
      else h5::read_attr_int(f, name, "array.h5");
      ADD_FAILURE() << name << ": an array was read as a scalar";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("attribute '{}' has 64 elements, expected a scalar", name)),
                std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(load_model(dir / "array.h5"), Error);
}

TEST(ModelIo, DetectsCorruptionNonFiniteValuesAndExtraTensors) {
  test::TempDir dir;
  const GptConfig c{256, 16, 1, 2, 16};
  Gpt<float> model(c);
  model.init_weights(1);
  const auto& wpe = model.layout().at("wpe");
  std::fill_n(model.parameters().begin() + wpe.offset, wpe.numel, 0.123456f);
  save_model(dir / "m.h5", c, model.parameters(), {});
  // Flip one byte inside wpe's data on disk: the Fletcher-32 checksum must catch it.
  std::string bytes;
  {
    std::ifstream in(dir / "m.h5", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  float marker = 0.123456f;
  const std::string pattern(reinterpret_cast<const char*>(&marker), 4);
  const size_t at = bytes.find(pattern + pattern);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] ^= 0x40;
  test::write_bytes(dir / "flipped.h5", bytes);
  try {
    load_model(dir / "flipped.h5");
    ADD_FAILURE() << "a flipped byte went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'wpe'"), std::string::npos) << e.what();
  }

  model.parameters()[wpe.offset] = NAN;
  save_model(dir / "nan.h5", c, model.parameters(), {});
  EXPECT_THROW(load_model(dir / "nan.h5"), Error);

  // A file with two layers whose /model claims one.
  const GptConfig two{256, 16, 2, 2, 16};
  Gpt<float> bigger(two);
  save_model(dir / "two.h5", two, bigger.parameters(), {});
  {
    h5::Handle f(H5Fopen((dir / "two.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    h5::Handle m(H5Gopen2(f, "model", H5P_DEFAULT), H5Gclose);
    h5::write_attr(m, "n_layer", int64_t{1});
  }
  try {
    load_model(dir / "two.h5");
    ADD_FAILURE() << "extra tensors went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/params holds 28 tensors"), std::string::npos) << e.what();
  }
}

// Found by fuzz/h5_readers.cpp: /model attributes that pass GptConfig::validate but describe
// a model far larger than the file made load_model allocate it first (48 TB here: bad_alloc,
// or gigabytes actually allocated for a smaller lie) before reading a tensor.
TEST(ModelIo, ShapeLargerThanTheFileIsRefusedBeforeAllocating) {
  test::TempDir dir;
  const GptConfig c{256, 8, 1, 2, 8};
  Gpt<float> model(c);
  save_model(dir / "m.h5", c, model.parameters(), {});
  {
    h5::Handle f(H5Fopen((dir / "m.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    h5::Handle m(H5Gopen2(f, "model", H5P_DEFAULT), H5Gclose);
    h5::write_attr(m, "n_embd", int64_t{131072});
    h5::write_attr(m, "n_layer", int64_t{64});
  }
  try {
    load_model(dir / "m.h5");
    ADD_FAILURE() << "a 48 TB shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the whole file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n_embd 131072"), std::string::npos) << e.what();
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A scalar string attribute of `type` holding `bytes` (as many as the type's size), written
// with HDF5's API as another writer (an earlier ddiloco, h5py) would have it.
void write_string_attr(hid_t obj, const char* name, hid_t type, const void* bytes) {
  if (H5Aexists(obj, name) > 0) {
    ASSERT_GE(H5Adelete(obj, name), 0);
  }
  h5::Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  h5::Handle attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  ASSERT_GE(attr.get(), 0);
  ASSERT_GE(H5Awrite(attr, type, bytes), 0);
}

h5::Handle string_type(size_t size, H5T_str_t pad, H5T_cset_t cset) {
  h5::Handle t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, size);
  H5Tset_strpad(t, pad);
  H5Tset_cset(t, cset);
  return t;
}

// Strings are written fixed-length (no global heap, whose libhdf5 1.10 reader a corrupt file
// makes hang, overflow or allocate gigabytes: docs/fuzzing.md), exactly as long as the text.
TEST(H5Strings, ModelFileStringAttributesAreFixedLengthOfTheirText) {
  test::TempDir dir;
  const GptConfig c{256, 8, 1, 2, 8};
  Gpt<float> model(c);
  save_model(dir / "m.h5", c, model.parameters(), {{"step", 3}});
  h5::Handle f = h5::open_file(dir / "m.h5");
  for (auto [name, size] : {std::pair{"format", size_t{13}}, {"metadata", size_t{10}}}) {
    h5::Handle attr(H5Aopen(f, name, H5P_DEFAULT), H5Aclose);
    h5::Handle type(H5Aget_type(attr), H5Tclose);
    EXPECT_EQ(H5Tget_class(type), H5T_STRING) << name;
    EXPECT_EQ(H5Tis_variable_str(type), 0) << name;
    EXPECT_EQ(H5Tget_size(type), size) << name;
  }
  EXPECT_EQ(load_model(dir / "m.h5").metadata["step"], 3);
}

TEST(H5Strings, FixedLengthStringsRoundTripAndOtherWritersPaddingIsRead) {
  test::TempDir dir;
  h5::Handle f = h5::create_file(dir / "s.h5");
  const std::string utf8 = "d\xc3\xa9j\xc3\xa0 vu";
  const std::string large(60000, 'y');
  for (const auto& [name, value] :
       {std::pair{"empty", std::string()}, {"one", std::string("x")}, {"utf8", utf8}, {"large", large}}) {
    h5::write_attr(f, name, value);
    EXPECT_EQ(h5::read_attr_string(f, name, "s.h5"), value) << name;
  }
  // h5py's np.bytes_ (ASCII, null-padded), a C writer's null-terminated one, Fortran's
  // space-padded one: each up to its text.
  write_string_attr(f, "ascii", string_type(5, H5T_STR_NULLPAD, H5T_CSET_ASCII), "abc\0\0");
  EXPECT_EQ(h5::read_attr_string(f, "ascii", "s.h5"), "abc");
  write_string_attr(f, "nullterm", string_type(4, H5T_STR_NULLTERM, H5T_CSET_UTF8), "abc");
  EXPECT_EQ(h5::read_attr_string(f, "nullterm", "s.h5"), "abc");
  write_string_attr(f, "spaces", string_type(5, H5T_STR_SPACEPAD, H5T_CSET_ASCII), "ab   ");
  EXPECT_EQ(h5::read_attr_string(f, "spaces", "s.h5"), "ab");
  // HDF5 holds an attribute of at most 64 KiB in the format ddiloco writes: named, not lost.
  const std::string e = error_of([&] { h5::write_attr(f, "huge", std::string(70000, 'z')); });
  EXPECT_NE(e.find("cannot write attribute 'huge' (70000 bytes"), std::string::npos) << e;
}

// Files of earlier ddiloco versions hold variable-length strings, which libhdf5 1.10 reads
// from the global heap without bounds (a hang, a heap overflow, 4 GiB allocations on corrupt
// input): refused before H5Aread, naming the file, the attribute and the way to convert.
TEST(H5Strings, VariableLengthStringOfAnEarlierVersionIsRefusedNamingTheConversion) {
  test::TempDir dir;
  const GptConfig c{256, 8, 1, 2, 8};
  Gpt<float> model(c);
  save_model(dir / "old.h5", c, model.parameters(), {});
  {
    h5::Handle f(H5Fopen((dir / "old.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    h5::Handle vlen = string_type(H5T_VARIABLE, H5T_STR_NULLTERM, H5T_CSET_UTF8);
    const char* text = "ddiloco-model";
    write_string_attr(f, "format", vlen, &text);
  }
  const std::string e = error_of([&] { load_model(dir / "old.h5"); });
  EXPECT_NE(e.find((dir / "old.h5").string() + ": attribute 'format' is a variable-length string"),
            std::string::npos) << e;
  EXPECT_NE(e.find("written by a ddiloco before fixed-length string attributes"), std::string::npos) << e;
  EXPECT_NE(e.find("scripts/h5_fixed_strings.py " + (dir / "old.h5").string()), std::string::npos) << e;
}

// A string attribute's declared size is bounded before the reader allocates it: one of 2 MiB
// (possible in HDF5's newer format, dense attribute storage) is refused, unread.
TEST(H5Strings, StringAttributeDeclaringMoreThanTheBoundIsRefusedBeforeAllocating) {
  test::TempDir dir;
  const std::string big(h5::kMaxStringAttrBytes + 1, 'b');
  {
    h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    ASSERT_GE(H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), 0);
    h5::Handle f(H5Fcreate((dir / "big.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    write_string_attr(f, "metadata", string_type(big.size(), H5T_STR_NULLPAD, H5T_CSET_UTF8),
                      big.data());
  }
  h5::Handle f = h5::open_file(dir / "big.h5");
  const std::string e = error_of([&] { h5::read_attr_string(f, "metadata", "big.h5"); });
  EXPECT_NE(e.find(fmt::format("big.h5: attribute 'metadata' declares a string of {} bytes, over the {}",
                               big.size(), h5::kMaxStringAttrBytes)),
            std::string::npos) << e;
}

// Found by fuzz/h5_readers.cpp: a model file whose one byte made a chunk of
// h.0.mlp.c_proj.weight (8, 32) declare (8, 2424864), and one whose float32 type declared
// elements of megabytes, made libhdf5 1.10.8's H5Dread read out of bounds (a SEGV, a
// heap-buffer-overflow) past the chunk's 1 KiB: the library copies a chunk's declared size
// out of what its filters returned without comparing the two. ddiloco writes contiguous
// storage or chunks of its own shape with Fletcher-32, each holding its bytes; anything else
// (here: a larger chunk, another filter, a chunk of 100 bytes planted without its checksum,
// compact and external storage) is refused before H5Dread, naming the file and the dataset.
TEST(ModelIo, DatasetStorageDdilocoNeverWritesIsRefusedBeforeReading) {
  const GptConfig c{256, 8, 1, 2, 8};
  Gpt<float> model(c);
  const auto& t = model.layout().at("h.0.mlp.c_proj.weight");  // (8, 32)
  const std::vector<float> values(t.numel, 0.5f);
  // Replaces the tensor's dataset by one made with `dcpl` (and `maxdims`); with `planted`,
  // its one chunk is written as those bytes, the checksum filter marked skipped.
  auto with_storage = [&](const std::filesystem::path& path, hid_t dcpl, const hsize_t* maxdims,
                          const std::vector<char>& planted = {}) {
    save_model(path, c, model.parameters(), {});
    h5::Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    h5::Handle p(H5Gopen2(f, "params", H5P_DEFAULT), H5Gclose);
    ASSERT_GE(H5Ldelete(p, t.name.c_str(), H5P_DEFAULT), 0);
    const hsize_t dims[2] = {8, 32}, origin[2] = {0, 0};
    h5::Handle space(H5Screate_simple(2, dims, maxdims), H5Sclose);
    h5::Handle set(H5Dcreate2(p, t.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    ASSERT_GE(set.get(), 0);
    if (planted.empty()) {
      ASSERT_GE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    } else {
      ASSERT_GE(H5Dwrite_chunk(set, H5P_DEFAULT, 1u, origin, planted.size(), planted.data()), 0);
    }
  };
  auto chunked = [](hsize_t columns, bool deflate) {
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    const hsize_t chunk[2] = {8, columns};
    H5Pset_chunk(dcpl, 2, chunk);
    if (deflate) H5Pset_deflate(dcpl, 1);
    else H5Pset_fletcher32(dcpl);
    return dcpl;
  };
  test::TempDir dir;
  const hsize_t unlimited[2] = {8, H5S_UNLIMITED};
  with_storage(dir / "chunk.h5", chunked(64, false), unlimited);
  with_storage(dir / "deflate.h5", chunked(32, true), nullptr);
  with_storage(dir / "planted.h5", chunked(32, false), nullptr, std::vector<char>(100, 'x'));
  {
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(dcpl, H5D_COMPACT);
    with_storage(dir / "compact.h5", dcpl, nullptr);
  }
  {
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_external(dcpl, (dir / "outside.bin").c_str(), 0, 8 * 32 * 4);
    with_storage(dir / "external.h5", dcpl, nullptr);
  }
  const std::string set = "dataset 'h.0.mlp.c_proj.weight' ";
  for (const auto& [file, expected] :
       {std::pair{"chunk.h5", set + "has chunks of shape (8, 64), expected (8, 32) for shape (8, 32)"},
        {"deflate.h5", set + "has filter 1, expected only Fletcher-32"},
        {"planted.h5", set + "has a chunk at row 0 of 100 bytes, expected 1024"},
        {"compact.h5", set + "has storage layout 0, expected chunked or contiguous"},
        {"external.h5", set + "is stored in external files"}}) {
    const std::string e = error_of([&] { load_model(dir / file); });
    EXPECT_NE(e.find((dir / file).string()), std::string::npos) << e;
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  }
  // What ddiloco writes, and contiguous storage (h5repack -l CONTI), are read.
  save_model(dir / "plain.h5", c, model.parameters(), {});
  EXPECT_NO_THROW(load_model(dir / "plain.h5"));
  with_storage(dir / "contiguous.h5", H5P_DEFAULT, nullptr);
  EXPECT_NO_THROW(load_model(dir / "contiguous.h5"));
}

TEST(Sampler, GreedyIsDeterministicAndRespectsTheWindow) {
  Gpt<float> model(GptConfig{256, 8, 1, 2, 16});
  model.init_weights(3);
  Rng a(1), b(2);
  const auto prompt = encode_prompt("And", 256);
  EXPECT_EQ(prompt, (std::vector<int32_t>{0, 'A', 'n', 'd'}));
  // Greedy decoding ignores the generator; 20 tokens exceed seq_len = 8 (sliding window).
  EXPECT_EQ(generate(model, prompt, 20, 0.0, a), generate(model, prompt, 20, 0.0, b));
  Rng c(5), d(5);
  EXPECT_EQ(generate(model, prompt, 20, 1.0, c), generate(model, prompt, 20, 1.0, d));
  EXPECT_THROW(encode_prompt("bad \xFF", 256), Error);
  EXPECT_EQ(encode_prompt("ignored", 50257), (std::vector<int32_t>{50256}));
}

TEST(Sampler, TinyTemperatureApproachesGreedyInsteadOfUnderflowing) {
  Gpt<float> model(GptConfig{256, 8, 1, 2, 16});
  model.init_weights(4);
  const auto prompt = encode_prompt("And", 256);
  Rng a(1), b(1);
  // p^(1/τ) underflows for every token at τ = 0.001; the log-space weights pick the argmax.
  EXPECT_EQ(generate(model, prompt, 12, 0.001, a), generate(model, prompt, 12, 0.0, b));
}

}  // namespace
}  // namespace ddiloco
