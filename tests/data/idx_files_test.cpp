// The IDX reader and writer against hostile files: a small gzip file that inflates far
// past what its header declares (stopped there), FIFOs (refused without blocking), and
// targets of write_idx_ubyte that are not regular files (never replaced).
#include "catch_compat.h"

#include <zlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include <minigrad/data/fashion_mnist.h>
#include <minigrad/data/idx.h>

#include "data/synthetic_fashion_mnist.h"
#include "special_files.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mg;
using mg::testing::TempDir;

namespace {

// A gzip file of `header` followed by `zeros` zero bytes, written in pieces so the test
// never holds the inflated size: a few KiB on disk for each MiB it inflates to.
void write_gzip_bomb(const std::string& path, const std::vector<uint8_t>& header,
                     std::size_t zeros) {
  gzFile f = gzopen(path.c_str(), "wb9");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, header.data(), static_cast<unsigned>(header.size())) ==
          static_cast<int>(header.size()));
  const std::vector<uint8_t> chunk(1 << 20, 0);
  for (std::size_t done = 0; done < zeros; done += chunk.size()) {
    const auto n = static_cast<unsigned>(std::min(chunk.size(), zeros - done));
    REQUIRE(gzwrite(f, chunk.data(), n) == static_cast<int>(n));
  }
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace

TEST_CASE("IDX: a gzip file that inflates past its header's size is stopped there") {
  TempDir dir;
  // The header of 2 images of 28 x 28 (1568 values), then 64 MiB: a 64 KiB file.
  const std::string bomb = dir / "train-images-idx3-ubyte.gz";
  write_gzip_bomb(bomb, {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28}, std::size_t{64} << 20);
  REQUIRE(fs::file_size(bomb) < (std::size_t{1} << 20));
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(bomb, 3),
                      MG_CONTAINS(bomb + ": the gzip data inflates past the 1584 bytes that its "
                                         "header declares (2 x 28 x 28 values and the 16-byte "
                                         "header); stopped inflating there"));

  // The same for a labels file; and a raw file with trailing data says how much.
  const std::string labels = dir / "labels.gz";
  write_gzip_bomb(labels, {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3}, std::size_t{8} << 20);
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(labels, 1),
                      MG_CONTAINS(labels + ": the gzip data inflates past the 11 bytes that its "
                                           "header declares (3 values and the 8-byte header)"));

  // An honest gzip file of the declared size still reads, as does one declaring far more
  // than it holds (truncated, and no buffer of the declared size is ever made).
  const std::string honest = dir / "honest.gz";
  write_gzip_bomb(honest, {0, 0, 8, 1, 0, 0, 0, 5}, 5);
  CHECK(data::read_idx_ubyte(honest, 1).values == std::vector<uint8_t>(5, 0));
  const std::string liar = dir / "liar.gz";
  write_gzip_bomb(liar, {0, 0, 8, 3, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF},
                  100);
  REQUIRE_THROWS_WITH(data::read_idx_ubyte(liar, 3),
                      MG_CONTAINS(liar + ": truncated: the header describes 4294967295 x 65535 x "
                                         "65535 values") &&
                          MG_CONTAINS("but the file has 116 bytes"));
}

TEST_CASE("IDX: a FIFO is refused at once, by the reader and by FashionMNIST") {
  TempDir dir;
  testing::write_synthetic_fashion_mnist(dir.path(), 20, 10, false);
  const std::string images = dir / "train-images-idx3-ubyte";
  fs::remove(images);
  testing::make_fifo(images);
  const testing::FifoWatchdog watchdog(images, 3.0);  // a reader that blocks fails, not hangs
  const std::string fault = "'" + images + "' is not a regular file but a named pipe (FIFO)";
  const double read_seconds = testing::seconds_taken([&] {
    REQUIRE_THROWS_WITH(data::read_idx_ubyte(images, 3), MG_CONTAINS("read_idx_ubyte: " + fault));
  });
  // Found by name, then refused by the reader: not "cannot find".
  const double dataset_seconds = testing::seconds_taken([&] {
    REQUIRE_THROWS_WITH(data::FashionMNIST(dir.path(), data::Split::Train),
                        MG_CONTAINS("read_idx_ubyte: " + fault));
  });
  CHECK(read_seconds < 2.0);
  CHECK(dataset_seconds < 2.0);
}

TEST_CASE("write_idx_ubyte: a target that is not a regular file is refused, a link is followed") {
  TempDir dir;
  const std::string fifo = dir / "fifo";
  testing::make_fifo(fifo);
  for (bool gzip : {false, true}) {
    REQUIRE_THROWS_WITH(data::write_idx_ubyte(fifo, {2}, {7, 8}, gzip),
                        MG_CONTAINS("write_idx_ubyte: cannot write '" + fifo +
                                    "': it is a named pipe (FIFO), not a regular file"));
    CHECK(testing::is_fifo(fifo));
  }
  fs::create_directory(dir / "data");
  fs::create_symlink("data/labels", dir / "labels");
  data::write_idx_ubyte(dir / "labels", {2}, {7, 8}, true);
  CHECK(fs::is_symlink(fs::symlink_status(dir / "labels")));
  CHECK(data::read_idx_ubyte(dir / "data/labels", 1).values == std::vector<uint8_t>{7, 8});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"data", "fifo", "labels"});
  CHECK(std::distance(fs::directory_iterator(dir / "data"), fs::directory_iterator()) == 1);
}
