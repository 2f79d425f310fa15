// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017): 28x28 grey images of clothing in 10
// classes, 60000 for training and 10000 for testing, in IDX files (idx.h).
//
// FashionMNIST(root, split) reads <root>/<split>-images-idx3-ubyte and
// <root>/<split>-labels-idx1-ubyte, each raw or with a .gz suffix, into a
// TensorDataset: images float32 [N, 784] scaled to [0, 1] (optionally normalised with
// the training set's mean and standard deviation), labels int64 [N] in [0, 10).
// Debian's dataset-fashion-mnist package installs the gzipped files in
// kDefaultRoot.
#pragma once

#include <array>
#include <string>

#include <minigrad/data/dataset.h>

namespace mg::data {

enum class Split { Train, Test };

struct FashionMNISTOptions {
  // (x - kMean) / kStd after scaling to [0, 1], as transforms.Normalize((0.2860,), (0.3530,)).
  bool normalize = false;
};

class FashionMNIST : public TensorDataset {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";
  static constexpr float kMean = 0.2860f;
  static constexpr float kStd = 0.3530f;
  static constexpr int64_t kImageSize = 28;
  static constexpr int64_t kNumClasses = 10;
  static const std::array<const char*, 10> kClassNames;  // "T-shirt/top", "Trouser", ...

  explicit FashionMNIST(const std::string& root = kDefaultRoot, Split split = Split::Train,
                        FashionMNISTOptions options = {});

  const Tensor& images() const { return data(); }    // float32 [N, 784]
  const Tensor& labels() const { return targets(); }  // int64 [N]
  // The files that were read.
  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }

 private:
  struct Loaded;  // the tensors and paths read by the constructor (fashion_mnist.cpp)
  static Loaded load(const std::string& root, Split split, FashionMNISTOptions options);
  explicit FashionMNIST(Loaded loaded);
  std::string images_path_, labels_path_;
};

// <root>/<name> if it exists, else <root>/<name>.gz, else an mg::Error that lists both
// paths tried (and says so when `root` itself does not exist).
std::string find_dataset_file(const std::string& root, const std::string& name);

// The file names of a split, without .gz: {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}.
std::array<std::string, 2> fashion_mnist_file_names(Split split);

}  // namespace mg::data
