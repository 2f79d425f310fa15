// The IDX reader and FashionMNIST: good files (raw and gzipped), and every fault a
// file can have, each with the message that names the file and the fault.
#include "catch_compat.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <minigrad/data/dataloader.h>
#include <minigrad/data/fashion_mnist.h>
#include <minigrad/data/idx.h>

#include "data/synthetic_fashion_mnist.h"
#include "temp_dir.h"

using namespace mg;
using mg::testing::TempDir;

namespace {

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A valid labels file with `n` labels 0..9 (raw bytes).
std::vector<uint8_t> labels_file(uint32_t n) {
  std::vector<uint8_t> b{0, 0, 8, 1, uint8_t(n >> 24), uint8_t(n >> 16), uint8_t(n >> 8), uint8_t(n)};
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

}  // namespace

TEST_CASE("IDX: a raw and a gzipped file read back the same array") {
  TempDir dir;
  const std::vector<uint8_t> values{1, 2, 3, 4, 5, 6, 250, 0, 9, 10, 11, 12};
  for (bool gzip : {false, true}) {
    const std::string path = dir / (gzip ? "a.idx.gz" : "a.idx");
    data::write_idx_ubyte(path, {2, 3, 2}, values, gzip);
    const data::IdxArray a = data::read_idx_ubyte(path, 3);
    REQUIRE(a.dims == std::vector<int64_t>{2, 3, 2});
    REQUIRE(a.values == values);
  }
  // The gzipped file really is gzip (magic 1f 8b), and the raw one is IDX.
  REQUIRE(read_bytes(dir / "a.idx.gz")[0] == 0x1f);
  REQUIRE(read_bytes(dir / "a.idx")[2] == 0x08);
}

TEST_CASE("IDX: a bad magic number names the file, expected and got in hex") {
  TempDir dir;
  const std::string path = dir / "labels";
  write_bytes(path, labels_file(3));
  // A labels file (1 dimension) where images (3 dimensions) are expected.
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 3),
                      MG_CONTAINS(path + ": bad magic number 0x00000801, expected 0x00000803") &&
                          MG_CONTAINS("this file has 1 dimension"));
  std::vector<uint8_t> garbage = labels_file(3);
  garbage[0] = 0xDE;
  garbage[1] = 0xAD;
  write_bytes(path, garbage);
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 1),
                      MG_CONTAINS(path + ": bad magic number 0xDEAD0801, expected 0x00000801"));
}

TEST_CASE("IDX: truncated files say how many bytes were expected and found") {
  TempDir dir;
  const std::string path = dir / "labels";
  std::vector<uint8_t> bytes = labels_file(10);
  bytes.resize(bytes.size() - 3);  // 7 of 10 labels
  write_bytes(path, bytes);
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 1),
                      MG_CONTAINS(path + ": truncated: the header describes 10 values (18 bytes "
                                         "with the 8-byte header), but the file has 15 bytes"));
  write_bytes(path, {0, 0, 8});
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 1),
                      MG_CONTAINS("starts with a 4-byte magic number, but the file has 3 bytes"));
  write_bytes(path, {0, 0, 8, 3, 0, 0, 0, 1});
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 3),
                      MG_CONTAINS(path + ": truncated: the header of a 3-dimensional IDX file has "
                                         "16 bytes, but the file has 8"));
  // Sizes whose product overflows 64 bits are "truncated", not a crash.
  write_bytes(path, {0, 0, 8, 3, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 1});
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 3),
                      MG_CONTAINS("more than 2^64 bytes") && MG_CONTAINS("the file has 17 bytes"));
  // Trailing bytes are a fault too: the header and the file disagree.
  bytes = labels_file(2);
  bytes.push_back(7);
  write_bytes(path, bytes);
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(path, 1),
                      MG_CONTAINS(path + ": 1 bytes of trailing data"));
}

TEST_CASE("IDX: a truncated or corrupt gzip stream is an error naming the file") {
  TempDir dir;
  const std::string good = dir / "x.gz";
  data::write_idx_ubyte(good, {4000}, std::vector<uint8_t>(4000, 7), true);
  std::vector<uint8_t> gz = read_bytes(good);
  const std::string cut = dir / "cut.gz";
  write_bytes(cut, std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)));
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(cut, 1),
                      MG_CONTAINS(cut + ": corrupt or truncated gzip data"));
  const std::string bad = dir / "bad.gz";
  for (size_t i = 12; i < gz.size() - 8; ++i) gz[i] ^= 0x5A;
  write_bytes(bad, gz);
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(bad, 1),
                      MG_CONTAINS(bad + ": corrupt or truncated gzip data"));
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(dir / "absent", 1),
                      MG_CONTAINS("read_idx_ubyte: cannot open '" + dir / "absent" +
                                  "': No such file or directory"));
}

TEST_CASE("FashionMNIST: reads raw and gzipped files into [N, 784] floats and int64 labels") {
  for (bool gzip : {false, true}) {
    TempDir dir;
    testing::write_synthetic_fashion_mnist(dir.path(), 30, 20, gzip);
    const data::FashionMNIST train(dir.path(), data::Split::Train);
    const data::FashionMNIST test(dir.path(), data::Split::Test);
    REQUIRE(train.size() == 30);
    REQUIRE(test.size() == 20);
    REQUIRE(train.images().shape() == Shape{30, 784});
    REQUIRE(train.images().dtype() == DType::Float32);
    REQUIRE(train.labels().shape() == Shape{30});
    REQUIRE(train.labels().dtype() == DType::Int64);
    REQUIRE(train.images_path() == dir / (std::string("train-images-idx3-ubyte") + (gzip ? ".gz" : "")));
    REQUIRE(test.labels_path() == dir / (std::string("t10k-labels-idx1-ubyte") + (gzip ? ".gz" : "")));

    const auto expected = testing::synthetic_images(30, 1);
    const auto pixels = train.images().to_vector<float>();
    for (size_t i = 0; i < pixels.size(); i += 97)
      REQUIRE(pixels[i] == Approx(expected.pixels[i] / 255.0f));
    const auto labels = train.labels().to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i) REQUIRE(labels[i] == expected.labels[i]);

    data::FashionMNISTOptions normalize;
    normalize.normalize = true;
    const data::FashionMNIST normed(dir.path(), data::Split::Train, normalize);
    const auto n = normed.images().to_vector<float>();
    for (size_t i = 0; i < n.size(); i += 97)
      REQUIRE(n[i] == Approx((expected.pixels[i] / 255.0f - 0.2860f) / 0.3530f).margin(1e-5));
  }
}

TEST_CASE("FashionMNIST: a missing file lists the paths tried") {
  TempDir dir;
  const std::string images = dir / "train-images-idx3-ubyte";
  REQUIRE_THROWS_WITH(data::FashionMNIST(dir.path(), data::Split::Train),
                      MG_CONTAINS("FashionMNIST: cannot find train-images-idx3-ubyte (tried " +
                                  images + " and " + images + ".gz)") &&
                          MG_CONTAINS("dataset-fashion-mnist"));
  const std::string nowhere = dir / "nowhere";
  REQUIRE_THROWS_WITH(data::FashionMNIST(nowhere, data::Split::Test),
                      MG_CONTAINS("cannot find t10k-images-idx3-ubyte") &&
                          MG_CONTAINS("the directory " + nowhere + " does not exist"));
}

TEST_CASE("FashionMNIST: label/image count mismatch names both files") {
  TempDir dir;
  testing::write_synthetic_fashion_mnist(dir.path(), 30, 20, false);
  const std::string labels = dir / "train-labels-idx1-ubyte";
  write_bytes(labels, labels_file(29));
  REQUIRE_THROWS_WITH(data::FashionMNIST(dir.path(), data::Split::Train),
                      MG_CONTAINS("label/image count mismatch: " + (dir / "train-images-idx3-ubyte") +
                                  " holds 30 images but " + labels + " holds 29 labels"));
}

TEST_CASE("FashionMNIST: bad image dimensions and out-of-range labels") {
  TempDir dir;
  testing::write_synthetic_fashion_mnist(dir.path(), 10, 10, true);
  const std::string images = dir / "t10k-images-idx3-ubyte.gz";
  data::write_idx_ubyte(images, {10, 32, 28}, std::vector<uint8_t>(10 * 32 * 28), true);
  REQUIRE_THROWS_WITH(data::FashionMNIST(dir.path(), data::Split::Test),
                      MG_CONTAINS(images + ": bad dimensions: expected 28x28 images, got 32x28"));

  std::vector<uint8_t> labels = labels_file(10);
  labels.back() = 12;
  const std::string labels_path = dir / "train-labels-idx1-ubyte";  // raw wins over .gz
  write_bytes(labels_path, labels);
  REQUIRE_THROWS_WITH(data::FashionMNIST(dir.path(), data::Split::Train),
                      MG_CONTAINS(labels_path + ": label 12 of example 9 is out of range"));
}

TEST_CASE("FashionMNIST: the installed dataset, when present, has 60000 + 10000 examples") {
  const std::string root = data::FashionMNIST::kDefaultRoot;
  if (!std::filesystem::exists(root + "/t10k-images-idx3-ubyte.gz") &&
      !std::filesystem::exists(root + "/t10k-images-idx3-ubyte")) {
    WARN("Fashion-MNIST is not installed in " << root << " (apt-get install dataset-fashion-mnist); "
         "this test checks nothing here");
    return;
  }
  // The test split only: reading the training split takes a second, and is the same code.
  const data::FashionMNIST test(root, data::Split::Test);
  REQUIRE(test.size() == 10000);
  const auto labels = test.labels().to_vector<int64_t>();
  std::vector<int64_t> per_class(10, 0);
  for (int64_t l : labels) ++per_class[static_cast<size_t>(l)];
  REQUIRE(per_class == std::vector<int64_t>(10, 1000));
  const Tensor mean = test.images().mean();
  REQUIRE(mean.item<float>() == Approx(0.2868).margin(0.002));  // the test split's mean

  data::DataLoaderOptions options;
  options.batch_size = 256;
  data::DataLoader loader(std::make_shared<data::FashionMNIST>(test), options);
  REQUIRE(loader.size() == 40);
  REQUIRE(loader.begin()->data.shape() == Shape{256, 784});
}
