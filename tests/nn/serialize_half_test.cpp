// safetensors checkpoints of bfloat16 and float16 tensors (nn/serialize.h): the dtype strings
// "BF16" and "F16", the bytes torch writes (tests/nn/reference/half_tensors.safetensors,
// made by tests/nn/reference/make_half_safetensors.py from torch tensors) read as torch
// meant them and written back byte for byte, a round trip of a bfloat16 model, and the
// non-finite check for 16-bit tensors.
#include "catch_compat.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <minigrad/core/ops.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/serialize.h>

#include "temp_dir.h"

using namespace mg;

namespace {

const std::string kReference = std::string(MINIGRAD_SOURCE_DIR) + "/tests/nn/reference/half_tensors.safetensors";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The header and the bytes of each tensor of a safetensors file.
struct Parsed {
  nlohmann::json header;
  std::string data;
  std::string bytes_of(const std::string& name) const {
    const auto& offsets = header.at(name).at("data_offsets");
    const auto begin = offsets[0].get<size_t>(), end = offsets[1].get<size_t>();
    return data.substr(begin, end - begin);
  }
};
Parsed parse(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return {nlohmann::json::parse(file.substr(8, n)), file.substr(8 + n)};
}

}  // namespace

TEST_CASE("safetensors: torch's BF16 and F16 tensors read as torch meant them", "[serialize][reduced_float]") {
  // The reference holds inf and -inf: allowed explicitly (and refused otherwise, below).
  nn::LoadOptions options;
  options.allow_non_finite = true;
  const nn::Checkpoint ck = nn::load_tensors(kReference, options);
  const Tensor bf16 = ck.tensors.at("bf16"), f16 = ck.tensors.at("f16");
  CHECK(bf16.dtype() == DType::BFloat16);
  CHECK(f16.dtype() == DType::Float16);
  CHECK(ck.tensors.at("bf16_matrix").shape() == Shape{3, 4});
  // torch's values, widened, are the file's "_as_f32" tensors.
  CHECK(ops::to_dtype(bf16, DType::Float32).to_vector<float>() == ck.tensors.at("bf16_as_f32").to_vector<float>());
  CHECK(ops::to_dtype(f16, DType::Float32).to_vector<float>() == ck.tensors.at("f16_as_f32").to_vector<float>());
  // And torch's rounding of the float32 source is ours, value for value.
  const Tensor source = ck.tensors.at("source");
  const auto bits = [](const Tensor& t) {
    const Tensor c = ops::contiguous(t);
    std::vector<uint16_t> v(static_cast<size_t>(c.numel()));
    std::memcpy(v.data(), c.data_ptr(), v.size() * 2);
    return v;
  };
  CHECK(bits(ops::to_dtype(source, DType::BFloat16)) == bits(bf16));
  CHECK(bits(ops::to_dtype(source, DType::Float16)) == bits(f16));
  CHECK_THROWS_WITH(nn::load_tensors(kReference), MG_CONTAINS("'bf16' (shape [13]): 2 of 13 values, the first inf at index 9"));
}

TEST_CASE("safetensors: BF16 and F16 are written as torch writes them, byte for byte", "[serialize][reduced_float]") {
  nn::LoadOptions options;
  options.allow_non_finite = true;
  const nn::Checkpoint reference = nn::load_tensors(kReference, options);
  mg::testing::TempDir dir;
  const std::string path = dir / "half.safetensors";
  // Our own 16-bit tensors of the same values, written by nn::save_tensors.
  const Tensor source = reference.tensors.at("source");
  nn::save_tensors(nn::TensorDict{{"bf16", ops::to_dtype(source, DType::BFloat16)},
                                  {"f16", ops::to_dtype(source, DType::Float16)},
                                  {"bf16_matrix", reference.tensors.at("bf16_matrix").t()}},  // a strided view
                   path);
  const Parsed ours = parse(read_file(path)), torchs = parse(read_file(kReference));
  CHECK(ours.header.at("bf16").at("dtype") == "BF16");
  CHECK(ours.header.at("f16").at("dtype") == "F16");
  CHECK(ours.header.at("bf16").at("shape") == torchs.header.at("bf16").at("shape"));
  CHECK(ours.bytes_of("bf16") == torchs.bytes_of("bf16"));
  CHECK(ours.bytes_of("f16") == torchs.bytes_of("f16"));
  CHECK(ours.header.at("bf16_matrix").at("shape") == nlohmann::json::array({4, 3}));
  // Read back: the same bits.
  const nn::Checkpoint back = nn::load_tensors(path, options);
  CHECK(ops::to_dtype(back.tensors.at("bf16"), DType::Float32).to_vector<float>() ==
        reference.tensors.at("bf16_as_f32").to_vector<float>());
}

TEST_CASE("safetensors: a bfloat16 model round-trips, 16-bit NaN and infinities are refused unless allowed",
          "[serialize][reduced_float]") {
  mg::testing::TempDir dir;
  nn::Linear model(5, 3);
  model.to(DType::BFloat16);
  const std::string path = dir / "model.safetensors";
  nn::save(model, path);
  nn::Linear other(5, 3);
  other.to(DType::BFloat16);
  nn::load(other, path);
  for (size_t i = 0; i < model.parameters().size(); ++i)
    CHECK(ops::to_dtype(other.parameters()[i], DType::Float32).to_vector<float>() ==
          ops::to_dtype(model.parameters()[i], DType::Float32).to_vector<float>());
  // A float32 model is not loaded from a bfloat16 file: the dtype must match (convert the
  // model with Module::to first).
  nn::Linear wide(5, 3);
  CHECK_THROWS_WITH(nn::load(wide, path), MG_CONTAINS("dtype"));

  const std::string bad = dir / "nan.safetensors";
  const Tensor h = ops::to_dtype(from_vector(std::vector<float>{1.0f, NAN, 2.0f}, {3}), DType::Float16);
  nn::save_tensors(nn::TensorDict{{"h", h}}, bad);
  CHECK_THROWS_WITH(nn::load_tensors(bad), MG_CONTAINS("'h' (shape [3]): 1 of 3 values, the first nan at index 1"));
  nn::LoadOptions options;
  options.allow_non_finite = true;
  CHECK(std::isnan(static_cast<float>(nn::load_tensors(bad, options).tensors.at("h").to_vector<float16>()[1])));
}
