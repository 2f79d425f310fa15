#include <minigrad/data/idx.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/error.h>
#include <minigrad/core/files.h>

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

// What the first 4 + 4 * ndims bytes of an IDX file say: the magic number (checked), the
// dimensions, and the number of values after the header (overflow-checked: a corrupt
// header may claim 2^96 values; `overflow` then says so and `count` means nothing).
struct IdxHeader {
  std::size_t header_bytes = 0;
  std::vector<int64_t> dims;
  std::size_t count = 1;
  bool overflow = false;
};

// `available` bytes are at `bytes`; `file_size` is what the messages call the file's size
// (a gzip stream's size is only known once it is inflated).
IdxHeader parse_idx_header(const uint8_t* bytes, std::size_t available, int ndims,
                           const std::string& name, const std::string& file_size) {
  MG_CHECK(ndims >= 1 && ndims <= 255, "parse_idx_ubyte: ndims must be in [1, 255], got {}",
           ndims);
  MG_CHECK(available >= 4, "{}: truncated: an IDX file starts with a 4-byte magic number, but "
                           "the file has {} bytes",
           name, file_size);
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
  IdxHeader h;
  h.header_bytes = 4 + 4 * static_cast<std::size_t>(ndims);
  MG_CHECK(available >= h.header_bytes,
           "{}: truncated: the header of a {}-dimensional IDX file has {} bytes, but the file "
           "has {}",
           name, ndims, h.header_bytes, file_size);
  for (int d = 0; d < ndims; ++d) {
    const uint32_t dim = read_be32(bytes + 4 + 4 * d);
    h.dims.push_back(static_cast<int64_t>(dim));
    h.overflow = h.overflow || __builtin_mul_overflow(h.count, std::size_t{dim}, &h.count);
  }
  // The whole file's size must fit too.
  std::size_t total = 0;
  h.overflow = h.overflow || __builtin_add_overflow(h.count, h.header_bytes, &total);
  return h;
}

// "20 x 28 x 28 values (15696 bytes with the 16-byte header)"
std::string declared_str(const IdxHeader& h) {
  return fmt::format("{} values ({} bytes with the {}-byte header)", dims_str(h.dims),
                     h.overflow ? std::string("more than 2^64")
                                : std::to_string(h.count + h.header_bytes),
                     h.header_bytes);
}

}  // namespace

IdxArray parse_idx_ubyte(const uint8_t* bytes, std::size_t size, int ndims,
                         const std::string& name) {
  const IdxHeader h = parse_idx_header(bytes, size, ndims, name, std::to_string(size));
  const std::size_t payload = size - h.header_bytes;
  MG_CHECK(!h.overflow && h.count <= payload,
           "{}: truncated: the header describes {}, but the file has {} bytes", name,
           declared_str(h), size);
  MG_CHECK(h.count == payload,
           "{}: {} bytes of trailing data: the header describes {}, but the file has {} bytes",
           name, payload - h.count, declared_str(h), size);
  IdxArray out;
  out.dims = h.dims;
  out.values.assign(bytes + h.header_bytes, bytes + size);
  return out;
}

namespace {

// A file read through zlib, which gunzips a gzip stream and passes any other file through
// as it is.
class GzipReader {
 public:
  GzipReader(const char* op, const std::string& path) : path_(path) {
    files::OpenedFile file = files::open_for_reading(op, path);
    file_size_ = file.size;
    errno = 0;
    file_ = gzdopen(file.fd.get(), "rb");  // on success, gzclose closes the descriptor
    MG_CHECK(file_ != nullptr, "{}: cannot open: {}", path,
             errno != 0 ? std::strerror(errno) : "out of memory");
    file.fd.release();
    gzbuffer(file_, 1 << 18);
  }
  ~GzipReader() { gzclose(file_); }
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Appends up to `n` more bytes to `out` (fewer only at the end of the data); mg::Error
  // on corrupt or truncated gzip data. The buffer grows as the data comes, never to `n`
  // at once: a header may declare far more than the file holds.
  void read(std::vector<uint8_t>& out, std::size_t n) {
    std::size_t used = out.size();
    const std::size_t want = used + n;
    while (used < want) {
      if (out.size() == used)
        out.resize(std::min(want, std::max<std::size_t>(2 * used, used + (1u << 20))));
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(out.size() - used, 1u << 30));
      const int got = gzread(file_, out.data() + used, chunk);
      if (got <= 0) {
        check_stream(used);
        break;
      }
      used += static_cast<std::size_t>(got);
    }
    out.resize(used);
  }

  bool compressed() const { return gzdirect(file_) == 0; }
  uint64_t file_size() const { return file_size_; }

 private:
  void check_stream(std::size_t decompressed) {
    int code = Z_OK;
    const std::string message = gzerror(file_, &code);
    MG_CHECK(code == Z_OK || code == Z_STREAM_END,
             "{}: corrupt or truncated gzip data ({}) after {} decompressed bytes", path_,
             code == Z_ERRNO ? std::strerror(errno) : message.c_str(), decompressed);
  }

  std::string path_;
  gzFile file_ = nullptr;
  uint64_t file_size_ = 0;
};

}  // namespace

std::vector<uint8_t> read_maybe_gzipped(const std::string& path, std::size_t limit) {
  GzipReader reader("read_maybe_gzipped", path);
  std::vector<uint8_t> bytes;
  reader.read(bytes, limit == SIZE_MAX ? limit : limit + 1);
  MG_CHECK(bytes.size() <= limit,
           "{}: the data is longer than the limit of {} bytes{}; stopped reading there", path,
           limit, reader.compressed() ? " (decompressed)" : "");
  return bytes;
}

// The header first, then exactly the values it declares and one byte more, to tell a
// file that is too long: a gzip stream is never inflated past what the header declares,
// so a small file that inflates to gigabytes costs no more memory than an honest one.
IdxArray read_idx_ubyte(const std::string& path, int ndims) {
  MG_CHECK(ndims >= 1 && ndims <= 255, "read_idx_ubyte: ndims must be in [1, 255], got {}",
           ndims);
  GzipReader reader("read_idx_ubyte", path);
  std::vector<uint8_t> bytes;
  reader.read(bytes, 4 + 4 * static_cast<std::size_t>(ndims));
  const bool gz = reader.compressed();
  // What messages call the file's size: the bytes seen so far of a gzip stream, and the
  // real size of a raw file (which the header check below may not have read to the end).
  const auto size_str = [&](std::size_t seen) {
    return gz ? fmt::format("{} (decompressed)", seen) : std::to_string(reader.file_size());
  };
  const IdxHeader h =
      parse_idx_header(bytes.data(), bytes.size(), ndims, path, size_str(bytes.size()));
  MG_CHECK(!h.overflow, "{}: the header describes {}, more than any file holds; {}", path,
           declared_str(h),
           gz ? std::string("the gzip data was not inflated further")
              : fmt::format("the file has {} bytes", reader.file_size()));
  reader.read(bytes, h.count + 1);
  const std::size_t declared = h.header_bytes + h.count;
  if (bytes.size() > declared) {
    MG_CHECK(!gz,
             "{}: the gzip data inflates past the {} bytes that its header declares ({} values "
             "and the {}-byte header); stopped inflating there",
             path, declared, dims_str(h.dims), h.header_bytes);
    MG_FAIL("{}: {} bytes of trailing data: the header describes {}, but the file has {} bytes",
            path, reader.file_size() - declared, declared_str(h), reader.file_size());
  }
  return parse_idx_ubyte(bytes.data(), bytes.size(), ndims, path);
}

namespace {

// `bytes` as one gzip member (what gzip(1) and Python's gzip module write).
std::string gzip_compress(const std::string& path, const std::vector<uint8_t>& bytes) {
  z_stream z{};
  // 15 + 16: a 32 KiB window with a gzip header and trailer instead of zlib's.
  MG_CHECK(deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                        Z_DEFAULT_STRATEGY) == Z_OK,
           "write_idx_ubyte: {}: zlib's deflateInit2 failed (out of memory?)", path);
  std::string out(deflateBound(&z, static_cast<uLong>(bytes.size())), '\0');
  z.next_in = const_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  MG_CHECK(rc == Z_STREAM_END, "write_idx_ubyte: {}: zlib's deflate failed ({})", path, rc);
  return out;
}

}  // namespace

void write_idx_ubyte(const std::string& path, const std::vector<int64_t>& dims,
                     const std::vector<uint8_t>& values, bool gzip) {
  MG_CHECK(!dims.empty() && dims.size() <= 255,
           "write_idx_ubyte: {}: an IDX array has 1 to 255 dimensions, got {}", path, dims.size());
  std::size_t count = 1;
  bool overflow = false;
  for (int64_t d : dims) {
    MG_CHECK(d >= 0 && d <= std::numeric_limits<uint32_t>::max(),
             "write_idx_ubyte: {}: dimension {} does not fit the format's 32 bits", path, d);
    overflow = overflow || __builtin_mul_overflow(count, static_cast<std::size_t>(d), &count);
  }
  MG_CHECK(!overflow && count == values.size(),
           "write_idx_ubyte: {}: dimensions {} need {} values, got {}", path, dims_str(dims),
           overflow ? std::string("more than 2^64") : std::to_string(count), values.size());
  // deflateBound and z_stream count in uLong/uInt; the IDX files minigrad writes are far
  // smaller than 4 GiB.
  MG_CHECK(!gzip || values.size() < (std::size_t{1} << 31),
           "write_idx_ubyte: {}: {} values are too many to gzip in one piece", path,
           values.size());
  std::vector<uint8_t> bytes(4 + 4 * dims.size());
  write_be32(bytes.data(), idx_ubyte_magic(static_cast<int>(dims.size())));
  for (std::size_t d = 0; d < dims.size(); ++d)
    write_be32(bytes.data() + 4 + 4 * d, static_cast<uint32_t>(dims[d]));
  bytes.insert(bytes.end(), values.begin(), values.end());

  if (gzip) {
    files::write_atomically("write_idx_ubyte", path, gzip_compress(path, bytes));
  } else {
    files::write_atomically(
        "write_idx_ubyte", path,
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
}

}  // namespace mg::data
