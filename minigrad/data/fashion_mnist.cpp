#include <minigrad/data/fashion_mnist.h>

#include <filesystem>
#include <system_error>

#include <minigrad/core/error.h>
#include <minigrad/data/idx.h>

namespace mg::data {

const std::array<const char*, 10> FashionMNIST::kClassNames = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

std::array<std::string, 2> fashion_mnist_file_names(Split split) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  return {prefix + "-images-idx3-ubyte", prefix + "-labels-idx1-ubyte"};
}

std::string find_dataset_file(const std::string& root, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path raw = fs::path(root) / name;
  const fs::path gz = fs::path(root) / (name + ".gz");
  std::error_code ec;
  // Whatever is there is returned, and the reader refuses what is not a regular file
  // (a FIFO, a directory) by name, rather than this saying it found nothing.
  if (fs::exists(raw, ec)) return raw.string();
  if (fs::exists(gz, ec)) return gz.string();
  const bool root_exists = fs::is_directory(root, ec);
  MG_FAIL("FashionMNIST: cannot find {} (tried {} and {}){}; pass the directory that holds the "
          "Fashion-MNIST IDX files (on Debian: apt-get install dataset-fashion-mnist, which "
          "installs them in {})",
          name, raw.string(), gz.string(),
          root_exists ? std::string() : fmt::format(": the directory {} does not exist", root),
          FashionMNIST::kDefaultRoot);
}

struct FashionMNIST::Loaded {
  Tensor images, labels;
  std::string images_path, labels_path;
};

FashionMNIST::FashionMNIST(const std::string& root, Split split, FashionMNISTOptions options)
    : FashionMNIST(load(root, split, options)) {}

FashionMNIST::FashionMNIST(Loaded loaded)
    : TensorDataset(loaded.images, loaded.labels),
      images_path_(std::move(loaded.images_path)),
      labels_path_(std::move(loaded.labels_path)) {}

FashionMNIST::Loaded FashionMNIST::load(const std::string& root, Split split, FashionMNISTOptions options) {
  const auto names = fashion_mnist_file_names(split);
  Loaded out;
  out.images_path = find_dataset_file(root, names[0]);
  out.labels_path = find_dataset_file(root, names[1]);

  const IdxArray images = read_idx_ubyte(out.images_path, 3);
  constexpr int64_t side = FashionMNIST::kImageSize;
  MG_CHECK(images.dims[1] == side && images.dims[2] == side,
           "{}: bad dimensions: expected {}x{} images, got {}x{}", out.images_path, side, side,
           images.dims[1], images.dims[2]);
  const IdxArray labels = read_idx_ubyte(out.labels_path, 1);
  MG_CHECK(images.dims[0] == labels.dims[0],
           "FashionMNIST: label/image count mismatch: {} holds {} images but {} holds {} labels",
           out.images_path, images.dims[0], out.labels_path, labels.dims[0]);
  const int64_t n = images.dims[0];
  MG_CHECK(n > 0, "FashionMNIST: {} holds no images", out.images_path);

  out.images = empty(Shape{n, side * side}, DType::Float32, Device::cpu());
  float* pixels = out.images.data<float>();
  // One affine map per pixel: x / 255, then optionally (x - mean) / std.
  const float scale = options.normalize ? 1.0f / (255.0f * FashionMNIST::kStd) : 1.0f / 255.0f;
  const float shift = options.normalize ? -FashionMNIST::kMean / FashionMNIST::kStd : 0.0f;
  const std::size_t count = images.values.size();
  for (std::size_t i = 0; i < count; ++i)
    pixels[i] = static_cast<float>(images.values[i]) * scale + shift;

  out.labels = empty(Shape{n}, DType::Int64, Device::cpu());
  int64_t* classes = out.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t label = labels.values[static_cast<std::size_t>(i)];
    MG_CHECK(label < FashionMNIST::kNumClasses,
             "{}: label {} of example {} is out of range: Fashion-MNIST has classes 0 to 9",
             out.labels_path, label, i);
    classes[i] = label;
  }
  return out;
}

}  // namespace mg::data
