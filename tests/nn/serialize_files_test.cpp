// nn::save / nn::load against hostile paths and files: targets that are not regular files
// (never replaced), symbolic links (written through), FIFOs (refused without blocking),
// files far larger than their header declares (only the declared bytes are read), and
// checkpoints of a run that diverged (non-finite values, refused unless asked).
#include "catch_compat.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <minigrad/minigrad.h>
#include <minigrad/nn/serialize.h>

#include "special_files.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
namespace nn = mg::nn;
using mg::Tensor;
using mg::testing::TempDir;

namespace {

// The names in `dir`, sorted: to catch temporary files left behind.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<float> weights_of(nn::Linear& m) { return m.weight().to_vector<float>(); }

bool is_symlink_to(const std::string& link, const std::string& target) {
  std::error_code ec;
  return fs::is_symlink(fs::symlink_status(link, ec)) && fs::read_symlink(link, ec) == target;
}

}  // namespace

TEST_CASE("save: a path that is not a regular file is refused, and left as it was") {
  TempDir dir;
  nn::Linear model(3, 2);
  const auto refused = [&](const std::string& path, const std::string& fault) {
    INFO(path);
    REQUIRE_THROWS_WITH(nn::save(model, path),
                        MG_CONTAINS("nn::save: cannot write '" + path + "': " + fault) &&
                            MG_CONTAINS("only regular files are replaced (nothing was written)"));
    REQUIRE_THROWS_WITH(nn::save_tensors(nn::state_dict(model), path),
                        MG_CONTAINS("save_tensors: cannot write '" + path + "': " + fault));
  };

  const std::string fifo = dir / "fifo";
  mg::testing::make_fifo(fifo);
  refused(fifo, "it is a named pipe (FIFO), not a regular file");
  CHECK(mg::testing::is_fifo(fifo));

  // An empty directory, which rename() would happily replace with a file.
  const std::string empty_dir = dir / "empty";
  fs::create_directory(empty_dir);
  refused(empty_dir, "it is a directory, not a regular file");
  CHECK(fs::is_directory(empty_dir));

  // A link to a device: the link is followed, and the device is not a regular file. (The
  // link, not /dev/null itself, so that a broken build replaces only the link.)
  const std::string to_null = dir / "to-null";
  fs::create_symlink("/dev/null", to_null);
  refused(to_null,
          "it is a symbolic link to '/dev/null', which is a character device, not a "
          "regular file");
  CHECK(is_symlink_to(to_null, "/dev/null"));

  // A device node of its own (the null device's numbers), where the test may make one.
  const std::string device = dir / "null-device";
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    refused(device, "it is a character device, not a regular file");
    struct stat st {};
    CHECK((::lstat(device.c_str(), &st) == 0 && S_ISCHR(st.st_mode)));
  } else {
    WARN("mknod is not permitted here: the character-device case ran through the link only");
  }
  // Nothing else appeared: no temporary file was left anywhere.
  std::vector<std::string> expected{"empty", "fifo", "to-null"};
  if (fs::exists(fs::symlink_status(device))) expected.push_back("null-device");
  std::sort(expected.begin(), expected.end());
  CHECK(listing(dir.path()) == expected);
}

TEST_CASE("save: a symbolic link is written through: its target is replaced, the link stays") {
  TempDir dir;
  fs::create_directories(dir / "runs/a");
  fs::create_directories(dir / "links");
  const std::string real = dir / "runs/a/ck.safetensors";
  const std::string link = dir / "links/ck.safetensors";
  const std::string link_to_link = dir / "links/latest.safetensors";
  fs::create_symlink("../runs/a/ck.safetensors", link);  // relative: from the link's directory
  fs::create_symlink("ck.safetensors", link_to_link);

  mg::manual_seed(31);
  nn::Linear first(3, 2), second(3, 2), loaded(3, 2);
  // A dangling link: the file it names is created.
  nn::save(first, link);
  REQUIRE(fs::is_regular_file(fs::symlink_status(real)));
  nn::load(loaded, real);
  CHECK(weights_of(loaded) == weights_of(first));
  // A chain of two links: the file at its end is replaced.
  nn::save(second, link_to_link);
  nn::load(loaded, real);
  CHECK(weights_of(loaded) == weights_of(second));
  CHECK(is_symlink_to(link, "../runs/a/ck.safetensors"));
  CHECK(is_symlink_to(link_to_link, "ck.safetensors"));
  CHECK(listing(dir / "runs/a") == std::vector<std::string>{"ck.safetensors"});
  CHECK(listing(dir / "links") == std::vector<std::string>{"ck.safetensors", "latest.safetensors"});

  // Links in a loop are an error, not a hang.
  fs::create_symlink("loop-b", dir / "loop-a");
  fs::create_symlink("loop-a", dir / "loop-b");
  REQUIRE_THROWS_WITH(nn::save(first, dir / "loop-a"),
                      MG_CONTAINS("nn::save: cannot write '" + (dir / "loop-a") +
                                  "': more than 40 symbolic links (a loop?)"));
}

TEST_CASE("save: the replaced file keeps its permission bits") {
  TempDir dir;
  const std::string path = dir / "private.safetensors";
  nn::Linear model(3, 2);
  nn::save(model, path);
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  nn::save(model, path);
  CHECK(fs::status(path).permissions() == (fs::perms::owner_read | fs::perms::owner_write));
}

TEST_CASE("load: a FIFO is refused at once, without waiting for a writer") {
  TempDir dir;
  const std::string fifo = dir / "ck.safetensors";
  mg::testing::make_fifo(fifo);
  const mg::testing::FifoWatchdog watchdog(fifo, 3.0);  // a reader that blocks fails, not hangs
  nn::Linear model(3, 2);
  const std::string fault = "'" + fifo + "' is not a regular file but a named pipe (FIFO)";
  const double load_seconds = mg::testing::seconds_taken(
      [&] { REQUIRE_THROWS_WITH(nn::load(model, fifo), MG_CONTAINS("nn::load: " + fault)); });
  const double load_tensors_seconds = mg::testing::seconds_taken(
      [&] { REQUIRE_THROWS_WITH(nn::load_tensors(fifo), MG_CONTAINS("load_tensors: " + fault)); });
  CHECK(load_seconds < 2.0);
  CHECK(load_tensors_seconds < 2.0);
  // Other special files, which the old check after open() caught too: the messages name them.
  REQUIRE_THROWS_WITH(nn::load(model, "/dev/null"),
                      MG_CONTAINS("'/dev/null' is not a regular file but a character device"));
  REQUIRE_THROWS_WITH(nn::load(model, dir.path()),
                      MG_CONTAINS("'" + dir.path() + "' is not a regular file but a directory"));
}

TEST_CASE("load: a file much larger than its header declares: only the declared bytes are read") {
  TempDir dir;
  const std::string path = dir / "sparse.safetensors";
  mg::manual_seed(32);
  nn::Linear model(2, 3), loaded(2, 3);
  nn::save(model, path);
  // 256 GiB of holes after the tensors: more memory than a test machine has, so a reader
  // that takes in the whole file fails (std::bad_alloc), and one that reads what the
  // header declares does not notice.
  const uint64_t huge = uint64_t{256} << 30;
  fs::resize_file(path, huge);
  nn::load(loaded, path);
  CHECK(weights_of(loaded) == weights_of(model));
  CHECK(nn::load_tensors(path).tensors.size() == 2);

  // A header length over the limit is refused before the header is read, too.
  std::string length(8, '\0');
  const uint64_t over_limit = 200'000'000;
  std::memcpy(length.data(), &over_limit, 8);
  {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(length.data(), 1, 8, f) == 8);
    REQUIRE(std::fclose(f) == 0);
  }
  REQUIRE_THROWS_WITH(nn::load(loaded, path),
                      MG_CONTAINS("the header length 200000000 exceeds the limit of 100000000 "
                                  "bytes"));
}

TEST_CASE("load: non-finite values are refused, naming each tensor and the file") {
  TempDir dir;
  const std::string path = dir / "diverged.safetensors";
  mg::manual_seed(33);
  nn::Linear diverged(2, 3);
  {
    mg::NoGradGuard no_grad;
    diverged.weight().data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    diverged.weight().data<float>()[4] = std::numeric_limits<float>::quiet_NaN();
    diverged.bias().data<float>()[2] = -std::numeric_limits<float>::infinity();
  }
  nn::save(diverged, path);

  nn::Linear model(2, 3);
  const std::vector<float> before = weights_of(model);
  // The message of what `load` throws (empty if it throws nothing).
  const auto message_of = [](const std::function<void()>& load) {
    try {
      load();
    } catch (const mg::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const std::string op : {"nn::load", "load_tensors"}) {
    const std::string message = message_of([&] {
      if (op == "nn::load") {
        nn::load(model, path);
      } else {
        nn::load_tensors(path);
      }
    });
    INFO(op);
    CHECK_THAT(message,
               MG_CONTAINS(op + ": '" + path +
                           "' holds non-finite values (NaN or infinity) in 2 "
                           "tensors") &&
                   MG_CONTAINS("nothing was loaded") &&
                   MG_CONTAINS("'bias' (shape [3]): 1 of 3 values, the first -inf at index 2") &&
                   MG_CONTAINS("'weight' (shape [3, 2]): 2 of 6 values, the first nan at index 1"));
  }
  CHECK(weights_of(model) == before);

  // Int64 tensors cannot hold a NaN; a finite checkpoint loads as ever.
  nn::save_tensors({{"ids", mg::from_vector(std::vector<int64_t>{1, -2}, mg::Shape{2})}},
                   dir / "ids.safetensors");
  CHECK(nn::load_tensors(dir / "ids.safetensors").tensors.at("ids").to_vector<int64_t>() ==
        std::vector<int64_t>{1, -2});
}

TEST_CASE("load: LoadOptions::allow_non_finite loads a checkpoint with NaN as it is") {
  TempDir dir;
  const std::string path = dir / "diverged.safetensors";
  nn::Linear diverged(2, 3);
  {
    mg::NoGradGuard no_grad;
    diverged.weight().data<float>()[0] = std::numeric_limits<float>::infinity();
    diverged.bias().data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  }
  nn::save(diverged, path);
  nn::LoadOptions options;
  options.allow_non_finite = true;
  nn::Linear model(2, 3);
  nn::load(model, path, options);
  CHECK(std::isinf(model.weight().to_vector<float>()[0]));
  CHECK(std::isnan(model.bias().to_vector<float>()[1]));
  CHECK(std::isnan(nn::load_tensors(path, options).tensors.at("bias").to_vector<float>()[1]));
}
