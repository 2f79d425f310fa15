// nn::save / nn::load and save_tensors / load_tensors: the safetensors layout byte for
// byte, round trips, every-mismatch-at-once errors, corrupt and truncated files (which
// must leave the module unchanged), and atomic writes.
#include "catch_compat.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>
#include <minigrad/nn/serialize.h>

namespace fs = std::filesystem;
namespace nn = mg::nn;
using mg::Shape;
using mg::Tensor;

namespace {

// A fresh directory for the test's files, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("minigrad-serialize-test-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::permissions(path, fs::perms::owner_all, ignored);
    fs::remove_all(path, ignored);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Names in the directory, to catch temporary files left behind.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// A safetensors file from a header text and data bytes, laid out by hand.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::shared_ptr<nn::Sequential> mlp(int64_t in, int64_t hidden, int64_t out) {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(in, hidden), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(hidden, out)});
}

// Every parameter's values, to show a failed load changed nothing.
std::vector<std::vector<float>> values_of(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

// A module with an int64 buffer next to its parameters.
class Counter : public nn::Cloneable<Counter> {
 public:
  Counter() : nn::Cloneable<Counter>("Counter") {
    register_parameter("w", mg::full(Shape{2, 2}, 0.5));
    register_buffer("count", mg::from_vector(std::vector<int64_t>{0, -7}, Shape{2}));
  }
  Tensor forward(const Tensor& x) override { return x; }
};

}  // namespace

TEST_CASE("save: writes the safetensors layout (header length, sorted JSON, raw data)") {
  TempDir dir;
  const std::string path = dir.file("counter.safetensors");
  Counter m;
  nn::save(m, path, {{"epoch", "3"}});
  const std::string bytes = read_bytes(path);

  const uint64_t n = header_length(bytes);
  REQUIRE(n % 8 == 0);  // data starts 8-byte aligned
  REQUIRE(bytes.size() == 8 + n + 16 + 16);
  std::string header = bytes.substr(8, n);
  while (!header.empty() && header.back() == ' ') header.pop_back();  // the padding
  CHECK(header ==
        R"({"__metadata__":{"epoch":"3","format":"pt"},)"
        R"("count":{"data_offsets":[0,16],"dtype":"I64","shape":[2]},)"
        R"("w":{"data_offsets":[16,32],"dtype":"F32","shape":[2,2]}})");

  // The data: little-endian int64 {0, -7}, then four float 0.5.
  int64_t count[2];
  std::memcpy(count, bytes.data() + 8 + n, 16);
  CHECK(count[0] == 0);
  CHECK(count[1] == -7);
  float w[4];
  std::memcpy(w, bytes.data() + 8 + n + 16, 16);
  CHECK(std::vector<float>(w, w + 4) == std::vector<float>(4, 0.5f));
  CHECK(dir.listing() == std::vector<std::string>{"counter.safetensors"});
}

TEST_CASE("save/load: a round trip restores every parameter in place") {
  TempDir dir;
  const std::string path = dir.file("mlp.safetensors");
  mg::manual_seed(21);
  auto saved = mlp(5, 7, 3);
  nn::save(*saved, path);

  mg::manual_seed(22);  // different initial values
  auto restored = mlp(5, 7, 3);
  REQUIRE(values_of(*restored) != values_of(*saved));
  const auto handles = restored->parameters();
  nn::load(*restored, path);
  CHECK(values_of(*restored) == values_of(*saved));
  // Same tensors as before (an optimizer holding them sees the loaded values), still
  // leaves that require grad.
  const auto after = restored->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].is_same(handles[i]));
    CHECK(after[i].requires_grad());
    CHECK(after[i].is_leaf());
  }

  // Buffers, int64 included.
  Counter c;
  nn::save(c, path);
  Counter d;
  {
    mg::NoGradGuard no_grad;
    d.buffer("count").fill_(99);
    d.parameter("w").fill_(-1);
  }
  nn::load(d, path);
  CHECK(d.buffer("count").to_vector<int64_t>() == std::vector<int64_t>{0, -7});
  CHECK(d.parameter("w").to_vector<float>() == std::vector<float>(4, 0.5f));
}

TEST_CASE("save_tensors/load_tensors: any tensors and metadata, through a Checkpoint") {
  TempDir dir;
  const std::string path = dir.file("ck.safetensors");
  mg::manual_seed(23);
  const Tensor matrix = mg::randn(Shape{3, 4});
  nn::Checkpoint ck;
  ck.put("model.", {{"w", matrix}, {"wt", matrix.t()}});  // .t(): a non-contiguous view
  ck.put("optim.", {{"momentum_buffer.0", mg::ones(Shape{2})}});
  ck.put("", {{"rng", mg::from_vector(std::vector<int64_t>{42, int64_t(1) << 40}, Shape{2})},
              {"scalar", mg::scalar_tensor(2.5)},
              {"double", mg::from_vector(std::vector<double>{0.1, -1e300, 3.0}, Shape{3})},
              {"empty", mg::zeros(Shape{0, 3})}});
  ck.metadata = {{"epoch", "4"}, {"step", "1200"}};
  REQUIRE_THROWS_WITH(ck.put("model.", {{"w", matrix}}),
                      MG_CONTAINS("already has a tensor named 'model.w'"));
  nn::save_tensors(ck, path);

  const nn::Checkpoint back = nn::load_tensors(path);
  CHECK(back.metadata == ck.metadata);
  REQUIRE(back.tensors.size() == ck.tensors.size());
  for (const auto& [name, t] : ck.tensors) {
    INFO(name);
    const Tensor& u = back.tensors.at(name);
    CHECK(u.shape() == t.shape());
    CHECK(u.dtype() == t.dtype());
    CHECK(u.device() == mg::Device::cpu());
    CHECK_FALSE(u.requires_grad());
    if (t.dtype() == mg::DType::Float32) {
      CHECK(u.to_vector<float>() == t.to_vector<float>());
    } else if (t.dtype() == mg::DType::Float64) {  // F64, bit for bit
      CHECK(u.to_vector<double>() == t.to_vector<double>());
    } else {
      CHECK(u.to_vector<int64_t>() == t.to_vector<int64_t>());
    }
  }
  const nn::TensorDict model = back.get("model.");
  CHECK(model.size() == 2);
  CHECK(model.count("w") == 1);
  CHECK(model.count("wt") == 1);
  CHECK(back.get("optim.").count("momentum_buffer.0") == 1);
  CHECK(back.get("nothing.").empty());

  REQUIRE_THROWS_WITH(nn::save_tensors({{"__metadata__", matrix}}, path),
                      MG_CONTAINS("invalid tensor name '__metadata__'"));
  REQUIRE_THROWS_WITH(nn::save_tensors({{"x", Tensor()}}, path),
                      MG_CONTAINS("tensor 'x' is undefined"));
  CHECK(nn::load_tensors(path).tensors.size() == ck.tensors.size());  // still the good file
}

TEST_CASE("load: shape mismatches, missing and unexpected keys are all in one message") {
  TempDir dir;
  const std::string path = dir.file("mlp.safetensors");
  nn::save(*mlp(3, 4, 2), path);

  // Wider hidden layer, no bias on the last Linear, one more Linear at the end.
  auto other = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(5, 2, false), std::make_shared<nn::Linear>(2, 2)});
  const auto before = values_of(*other);
  try {
    nn::load(*other, path);
    FAIL("load accepted a checkpoint of another architecture");
  } catch (const mg::Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, MG_CONTAINS("nn::load: " + path + " does not match Sequential (6 problems; "
                                "nothing was loaded)"));
    CHECK_THAT(msg, MG_CONTAINS("missing key '3.weight' (shape [2, 2], float32)"));
    CHECK_THAT(msg, MG_CONTAINS("missing key '3.bias' (shape [2], float32)"));
    CHECK_THAT(msg, MG_CONTAINS("unexpected key '2.bias' (shape [2], float32)"));
    CHECK_THAT(msg, MG_CONTAINS("size mismatch for '0.weight': shape [4, 3] (float32) in " +
                                path + ", shape [5, 3] (float32) in the module"));
    CHECK_THAT(msg, MG_CONTAINS("size mismatch for '0.bias': shape [4] (float32)"));
    CHECK_THAT(msg, MG_CONTAINS("size mismatch for '2.weight': shape [2, 4] (float32)"));
  }
  CHECK(values_of(*other) == before);

  // A dtype mismatch is reported the same way.
  Counter c;
  nn::save_tensors({{"w", mg::ones(Shape{2, 2})}, {"count", mg::ones(Shape{2})}}, path);
  REQUIRE_THROWS_WITH(nn::load(c, path),
                      MG_CONTAINS("dtype mismatch for 'count': shape [2] (float32) in " + path +
                                  ", shape [2] (int64) in the module"));
  CHECK(c.buffer("count").to_vector<int64_t>() == std::vector<int64_t>{0, -7});
  CHECK(c.parameter("w").to_vector<float>() == std::vector<float>(4, 0.5f));

  // load_state_dict checks the same way, naming its source.
  REQUIRE_THROWS_WITH(nn::load_state_dict(c, {{"w", mg::ones(Shape{2, 2})}}, "my dict"),
                      MG_CONTAINS("nn::load_state_dict: my dict does not match Counter (1 problem"));
  REQUIRE_NOTHROW(nn::check_state_dict(c, nn::state_dict(c)));
}

TEST_CASE("load: a truncated file is an error naming the file, and changes nothing") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  const std::string cut = dir.file("cut.safetensors");
  mg::manual_seed(24);
  nn::save(*mlp(3, 4, 2), good);
  const std::string bytes = read_bytes(good);
  const uint64_t n = header_length(bytes);

  auto model = mlp(3, 4, 2);
  const auto before = values_of(*model);
  const struct {
    size_t keep;
    const char* fault;
  } cases[] = {
      {0, "the file has 0 bytes, fewer than the 8 of the header length"},
      {5, "the file has 5 bytes, fewer than the 8 of the header length"},
      {8 + n / 2, "is larger than the"},
      {8 + n + 10, "beyond the 10 bytes of data (truncated?)"},
      {bytes.size() - 1, "(truncated?)"},
  };
  for (const auto& c : cases) {
    INFO("keeping " << c.keep << " of " << bytes.size() << " bytes");
    write_bytes(cut, bytes.substr(0, c.keep));
    REQUIRE_THROWS_WITH(nn::load(*model, cut),
                        MG_CONTAINS("nn::load: '" + cut + "' is not a valid safetensors file: ") &&
                            MG_CONTAINS(c.fault));
    CHECK(values_of(*model) == before);
  }
  REQUIRE_THROWS_WITH(nn::load(*model, dir.file("missing.safetensors")),
                      MG_CONTAINS("nn::load: cannot open '" + dir.file("missing.safetensors") +
                                  "': No such file or directory"));
  REQUIRE_THROWS_WITH(nn::load(*model, dir.path.string()),
                      MG_CONTAINS("'" + dir.path.string() + "' is not a regular file"));
  CHECK(values_of(*model) == before);
}

TEST_CASE("load: a corrupt header or bad header length is an error, and changes nothing") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  const std::string bad = dir.file("bad.safetensors");
  mg::manual_seed(25);
  nn::save(*mlp(3, 4, 2), good);
  const std::string bytes = read_bytes(good);
  auto model = mlp(3, 4, 2);
  const auto before = values_of(*model);
  auto check_rejected = [&](const std::string& contents, const std::string& fault) {
    INFO("expecting: " << fault);
    write_bytes(bad, contents);
    REQUIRE_THROWS_WITH(nn::load(*model, bad),
                        MG_CONTAINS("'" + bad + "' is not a valid safetensors file") &&
                            MG_CONTAINS(fault));
    CHECK(values_of(*model) == before);
  };

  std::string not_json = bytes;
  not_json[8] = 'x';  // the opening brace
  check_rejected(not_json, "its JSON header does not parse");

  std::string huge_length = bytes;
  const uint64_t huge = uint64_t(1) << 40;
  std::memcpy(huge_length.data(), &huge, 8);
  check_rejected(huge_length, "the header length 1099511627776 is larger than the");

  std::string zero_length = bytes;
  std::memset(zero_length.data(), 0, 8);
  check_rejected(zero_length, "its JSON header does not parse");

  std::string i32 = bytes;
  i32.replace(i32.find("F32"), 3, "I32");
  check_rejected(i32, "has dtype \"I32\"; minigrad reads F32, F64, BF16, F16 and I64");
  // F16 is read, but a float32 tensor's bytes are twice what its shape needs in float16.
  std::string f16 = bytes;
  f16.replace(f16.find("F32"), 3, "F16");
  check_rejected(f16, "and dtype F16 needs");

  // Hand-made headers for the checks a flipped byte is unlikely to reach.
  const std::string data(16, '\0');
  check_rejected(make_file("[1, 2]", data), "its JSON header is a JSON array, not an object");
  check_rejected(make_file(R"({"a": 3})", data), "the entry of tensor 'a' is 3");
  check_rejected(make_file(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
                           data),
                 "the shape of tensor 'a' is [-2], not a list of non-negative integers");
  check_rejected(make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}})",
                           data),
                 "tensor 'a' of shape [2] and dtype F32 needs 8 bytes, but its data_offsets "
                 "[0, 12] span 12");
  check_rejected(make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})",
                           data),
                 "tensor 'a' has data_offsets [8,0], not [begin, end] with begin <= end");
  check_rejected(make_file(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                           data),
                 "tensor 'a' has data_offsets [8, 24] beyond the 16 bytes of data");
  check_rejected(make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                           R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                           data),
                 "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
  check_rejected(make_file(R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4],)"
                           R"( "data_offsets": [0, 16]}})",
                           data),
                 "tensor 'a' has an impossibly large shape");
  check_rejected(make_file(R"({"__metadata__": {"epoch": 3}})", ""),
                 "__metadata__ entry 'epoch' is 3, not a string");

  // A well-formed file with the wrong tensors is a mismatch, not corruption.
  write_bytes(bad, make_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                             data));
  REQUIRE_THROWS_WITH(nn::load(*model, bad), MG_CONTAINS("unexpected key 'a' (shape [2], float32)"));
  CHECK(values_of(*model) == before);
}

TEST_CASE("save: the write is atomic, and a failed write leaves the old file and no temp file") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  mg::manual_seed(26);
  nn::save(*mlp(3, 4, 2), path);
  const std::string old_bytes = read_bytes(path);
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});

  // Overwriting goes through a rename: still one file, now the new contents.
  auto bigger = mlp(30, 40, 20);
  nn::save(*bigger, path);
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});
  CHECK(read_bytes(path).size() > old_bytes.size());
  write_bytes(path, old_bytes);

  // The disk "fills up" half way through (a file size limit, which holds for root too):
  // the old file must survive whole and the temporary file must be gone.
  {
    struct rlimit saved {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    struct rlimit small = saved;
    small.rlim_cur = 1024;
    auto* previous = ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string message;
    try {
      nn::save(*bigger, path);
    } catch (const mg::Error& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::signal(SIGXFSZ, previous);
    CHECK_THAT(message, MG_CONTAINS("nn::save: cannot write '" + path + "': writing the "
                                    "temporary file '" + path + ".tmp.") &&
                            MG_CONTAINS("File too large ('" + path + "' was not changed)"));
  }
  CHECK(read_bytes(path) == old_bytes);
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors"});

  // A directory that does not exist.
  const std::string nowhere = dir.file("no/such/dir/model.safetensors");
  REQUIRE_THROWS_WITH(nn::save(*bigger, nowhere),
                      MG_CONTAINS("nn::save: cannot write '" + nowhere + "': creating the "
                                  "temporary file") &&
                          MG_CONTAINS("No such file or directory"));

  // The target is a directory: refused before anything is written (serialize_files_test
  // has every kind of file that is not a regular one).
  fs::create_directory(dir.path / "taken");
  fs::create_directory(dir.path / "taken" / "inside");  // a non-empty directory
  REQUIRE_THROWS_WITH(nn::save(*bigger, dir.file("taken")),
                      MG_CONTAINS("nn::save: cannot write '" + dir.file("taken") +
                                  "': it is a directory, not a regular file"));
  CHECK(dir.listing() == std::vector<std::string>{"model.safetensors", "taken"});
  CHECK(read_bytes(path) == old_bytes);
}

TEST_CASE("load_tensors: a key given twice is refused with a short message, however long") {
  const std::string path =
      (fs::temp_directory_path() / ("minigrad-duplicate-" + std::to_string(::getpid()))).string();
  const std::string name(100000, 'k');
  const std::string entry = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  std::string header = "{\"" + name + "\":" + entry + ",\"" + name + "\":" + entry + "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t length = header.size();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header;
    const float value = 1.0f;
    out.write(reinterpret_cast<const char*>(&value), 4);
  }
  try {
    (void)nn::load_tensors(path);
    FAIL("a duplicate key was accepted");
  } catch (const mg::Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, MG_CONTAINS("its header names 'kkkk") &&
                            MG_CONTAINS("... (100000 bytes)' twice"));
    CHECK(message.size() < 600);
  }
  fs::remove(path);
}
