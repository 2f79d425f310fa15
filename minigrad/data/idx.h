// The IDX file format of (Fashion-)MNIST, unsigned-byte variant:
//
//   magic   4 bytes  0x00 0x00 0x08 <number of dimensions>   (0x08 = unsigned byte)
//   sizes   4 bytes per dimension, big-endian
//   values  product(sizes) bytes, row-major
//
// Files may be gzipped (the distribution's *.gz) or raw. Every fault is an mg::Error
// that names the file and says what is wrong; parsing never reads out of bounds, so a
// corrupt file cannot crash the process (the fuzz harness calls parse_idx_ubyte).
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
// it is). Errors name the path: cannot open, read error, corrupt or truncated gzip data.
std::vector<uint8_t> read_maybe_gzipped(const std::string& path);

// read_maybe_gzipped + parse_idx_ubyte.
IdxArray read_idx_ubyte(const std::string& path, int ndims);

// Writes an unsigned-byte IDX file, gzipped when `gzip` (tests, seed corpora, and
// converting data for minigrad). Written to a temporary name and renamed into place.
void write_idx_ubyte(const std::string& path, const std::vector<int64_t>& dims,
                     const std::vector<uint8_t>& values, bool gzip);

}  // namespace mg::data
