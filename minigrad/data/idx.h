// The IDX file format of (Fashion-)MNIST, unsigned-byte variant:
//
//   magic   4 bytes  0x00 0x00 0x08 <number of dimensions>   (0x08 = unsigned byte)
//   sizes   4 bytes per dimension, big-endian
//   values  product(sizes) bytes, row-major
//
// Files may be gzipped (the distribution's *.gz) or raw. Every fault is an mg::Error
// that names the file and says what is wrong; parsing never reads out of bounds, so a
// corrupt file cannot crash the process (the fuzz harness calls parse_idx_ubyte).
//
// The file readers refuse anything but a regular file without blocking on it (a FIFO;
// minigrad/core/files.h), read the header first, and then no more than the values it
// declares (the product of the sizes, overflow-checked): a small .gz that inflates to
// gigabytes is stopped at the declared size and costs no more memory than an honest file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mg::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // product(dims) bytes, row-major
};

// The magic number of an unsigned-byte IDX array with `ndims` dimensions
// (0x00000801 for labels, 0x00000803 for images).
constexpr uint32_t idx_ubyte_magic(int ndims) { return 0x0800u | static_cast<uint32_t>(ndims); }

// Parses an in-memory unsigned-byte IDX array that must have `ndims` dimensions.
// `name` (usually the file's path) begins every error message.
IdxArray parse_idx_ubyte(const uint8_t* bytes, std::size_t size, int ndims,
                         const std::string& name);

// The bytes of a file, gunzipped when it is gzip-compressed (zlib reads a raw file as
// it is), at most `limit` of them: longer data is an mg::Error, and nothing past the limit
// is inflated. Errors name the path: not a regular file, cannot open, read error, corrupt
// or truncated gzip data, over the limit.
std::vector<uint8_t> read_maybe_gzipped(const std::string& path, std::size_t limit);

// Reads and parses an IDX file, gunzipping it when it is gzip-compressed: the header,
// then exactly the values it declares (one byte more is an error: trailing data, or a
// gzip stream that inflates past the declared size, where inflating stops).
IdxArray read_idx_ubyte(const std::string& path, int ndims);

// Writes an unsigned-byte IDX file, gzipped when `gzip` (tests, seed corpora, and
// converting data for minigrad), with files::write_atomically.
void write_idx_ubyte(const std::string& path, const std::vector<int64_t>& dims,
                     const std::vector<uint8_t>& values, bool gzip);

}  // namespace mg::data
