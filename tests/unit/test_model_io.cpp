// Model files: round trip, and refusal of files that are not what they claim.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
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
