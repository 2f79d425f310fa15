#include <minigrad/data/idx.h>

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>

namespace mg::data {

namespace {

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void write_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

std::string dims_str(const std::vector<int64_t>& dims) { return fmt::format("{}", fmt::join(dims, " x ")); }

}  // namespace

IdxArray parse_idx_ubyte(const uint8_t* bytes, std::size_t size, int ndims,
                         const std::string& name) {
  MG_CHECK(ndims >= 1 && ndims <= 255, "parse_idx_ubyte: ndims must be in [1, 255], got {}",
           ndims);
  MG_CHECK(size >= 4, "{}: truncated: an IDX file starts with a 4-byte magic number, but the "
                      "file has {} bytes",
           name, size);
  const uint32_t expected_magic = idx_ubyte_magic(ndims);
  const uint32_t magic = read_be32(bytes);
  MG_CHECK(magic == expected_magic,
           "{}: bad magic number 0x{:08X}, expected 0x{:08X} (an unsigned-byte IDX file with {} "
           "dimension{}){}",
           name, magic, expected_magic, ndims, ndims == 1 ? "" : "s",
           (magic & 0xFFFFFF00u) == 0x0800u
               ? fmt::format("; this file has {} dimension{}", magic & 0xFFu,
                             (magic & 0xFFu) == 1 ? "" : "s")
               : std::string());
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndims);
  MG_CHECK(size >= header,
           "{}: truncated: the header of a {}-dimensional IDX file has {} bytes, but the file "
           "has {}",
           name, ndims, header, size);

  IdxArray out;
  // Multiply with an overflow check: a corrupt header may claim 2^96 values.
  std::size_t count = 1;
  bool overflow = false;
  for (int d = 0; d < ndims; ++d) {
    const uint32_t dim = read_be32(bytes + 4 + 4 * d);
    out.dims.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && count > std::numeric_limits<std::size_t>::max() / dim) overflow = true;
    count *= dim;
  }
  const std::size_t payload = size - header;
  MG_CHECK(!overflow && count <= payload,
           "{}: truncated: the header describes {} values ({} bytes with the {}-byte header), "
           "but the file has {} bytes",
           name, dims_str(out.dims),
           overflow ? std::string("more than 2^64") : std::to_string(count + header), header,
           size);
  MG_CHECK(count == payload,
           "{}: {} bytes of trailing data: the header describes {} values ({} bytes with the "
           "{}-byte header), but the file has {} bytes",
           name, payload - count, dims_str(out.dims), count + header, header, size);
  out.values.assign(bytes + header, bytes + size);
  return out;
}

std::vector<uint8_t> read_maybe_gzipped(const std::string& path) {
  errno = 0;
  gzFile file = gzopen(path.c_str(), "rb");
  MG_CHECK(file != nullptr, "{}: cannot open: {}", path,
           errno != 0 ? std::strerror(errno) : "out of memory");
  gzbuffer(file, 1 << 18);
  std::vector<uint8_t> bytes;
  std::size_t used = 0;
  while (true) {
    if (bytes.size() - used < (1u << 20)) bytes.resize(std::max<std::size_t>(bytes.size() * 2, 1u << 20));
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(bytes.size() - used, 1u << 30));
    const int got = gzread(file, bytes.data() + used, chunk);
    if (got <= 0) break;
    used += static_cast<std::size_t>(got);
  }
  int code = Z_OK;
  const std::string message = gzerror(file, &code);
  gzclose(file);
  MG_CHECK(code == Z_OK || code == Z_STREAM_END,
           "{}: corrupt or truncated gzip data ({}) after {} decompressed bytes", path,
           code == Z_ERRNO ? std::strerror(errno) : message.c_str(), used);
  bytes.resize(used);
  return bytes;
}

IdxArray read_idx_ubyte(const std::string& path, int ndims) {
  const std::vector<uint8_t> bytes = read_maybe_gzipped(path);
  return parse_idx_ubyte(bytes.data(), bytes.size(), ndims, path);
}

void write_idx_ubyte(const std::string& path, const std::vector<int64_t>& dims,
                     const std::vector<uint8_t>& values, bool gzip) {
  MG_CHECK(!dims.empty() && dims.size() <= 255,
           "write_idx_ubyte: {}: an IDX array has 1 to 255 dimensions, got {}", path, dims.size());
  std::size_t count = 1;
  for (int64_t d : dims) {
    MG_CHECK(d >= 0 && d <= std::numeric_limits<uint32_t>::max(),
             "write_idx_ubyte: {}: dimension {} does not fit the format's 32 bits", path, d);
    count *= static_cast<std::size_t>(d);
  }
  MG_CHECK(count == values.size(),
           "write_idx_ubyte: {}: dimensions {} need {} values, got {}", path, dims_str(dims), count,
           values.size());
  std::vector<uint8_t> bytes(4 + 4 * dims.size());
  write_be32(bytes.data(), idx_ubyte_magic(static_cast<int>(dims.size())));
  for (std::size_t d = 0; d < dims.size(); ++d)
    write_be32(bytes.data() + 4 + 4 * d, static_cast<uint32_t>(dims[d]));
  bytes.insert(bytes.end(), values.begin(), values.end());

  const std::string temp = path + ".tmp";
  bool ok = false;
  if (gzip) {
    errno = 0;
    gzFile file = gzopen(temp.c_str(), "wb");
    MG_CHECK(file != nullptr, "write_idx_ubyte: cannot create {}: {}", temp, std::strerror(errno));
    ok = gzfwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
    ok = gzclose(file) == Z_OK && ok;
  } else {
    std::FILE* file = std::fopen(temp.c_str(), "wb");
    MG_CHECK(file != nullptr, "write_idx_ubyte: cannot create {}: {}", temp, std::strerror(errno));
    ok = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
    ok = std::fclose(file) == 0 && ok;
  }
  if (!ok) std::remove(temp.c_str());
  MG_CHECK(ok, "write_idx_ubyte: writing {} failed (disk full?)", temp);
  MG_CHECK(std::rename(temp.c_str(), path.c_str()) == 0, "write_idx_ubyte: cannot rename {} to {}: {}",
           temp, path, std::strerror(errno));
}

}  // namespace mg::data
