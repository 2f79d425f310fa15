#include <minigrad/parallel/piece_exchange.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {

namespace {

// ---- the bytes of a rank's pieces ----

class Writer {
 public:
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void shape(const Shape& s) {
    i64(s.dim());
    for (int64_t d : s.sizes()) i64(d);
  }
  void bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  const std::string& out() const { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const char* p, size_t n, int rank) : p_(p), end_(p + n), rank_(rank) {}
  bool done() const { return p_ == end_; }
  int64_t i64() {
    int64_t v = 0;
    bytes(&v, sizeof v);
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    need(n);
    std::string s(p_, static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  Shape shape() {
    const int64_t dims = i64();
    need(dims * 8);
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < dims; ++d) sizes.push_back(i64());
    return Shape(sizes);
  }
  void bytes(void* dst, size_t n) {
    need(static_cast<int64_t>(n));
    std::memcpy(dst, p_, n);
    p_ += n;
  }

 private:
  void need(int64_t n) {
    MG_CHECK(n >= 0 && n <= end_ - p_, "all_gather_pieces: rank {}'s message ends early (a rank built by another "
             "version of minigrad?)", rank_);
  }
  const char* p_;
  const char* end_;
  int rank_;
};

void write(Writer& w, const PieceValues& v) {
  const ParameterPiece& p = v.piece;
  w.str(p.name);
  w.str(v.state);
  w.i64(v.whole ? 1 : 0);
  w.shape(p.shape);
  w.i64(static_cast<int64_t>(p.placements.size()));
  for (const DimPlacement& d : p.placements) {
    w.str(d.dim);
    w.i64(d.placement.is_shard() ? 1 : 0);
    w.i64(d.placement.dim);
    w.i64(d.placement.stride);
    w.i64(d.rank);
    w.i64(d.size);
    w.i64(d.partial_gradient ? 1 : 0);
  }
  w.i64(p.flat ? 1 : 0);
  if (p.flat) {
    w.str(p.flat->dim);
    w.i64(p.flat->rank);
    w.i64(p.flat->size);
    w.i64(p.flat->offset);
    w.i64(p.flat->numel);
  }
  const Tensor values = ops::contiguous(ops::copy_to(v.values, Device::cpu()));
  w.i64(static_cast<int64_t>(values.dtype()));
  w.shape(values.shape());
  w.bytes(values.data_ptr(), values.nbytes());
}

PieceValues read(Reader& r, int rank) {
  PieceValues v;
  v.rank = rank;
  ParameterPiece& p = v.piece;
  p.name = r.str();
  v.state = r.str();
  v.whole = r.i64() != 0;
  p.shape = r.shape();
  const int64_t placements = r.i64();
  for (int64_t i = 0; i < placements; ++i) {
    DimPlacement d;
    d.dim = r.str();
    const bool shard = r.i64() != 0;
    const int64_t dim = r.i64(), stride = r.i64();
    d.placement = shard ? Placement::shard(dim, stride) : Placement::replicate();
    d.rank = static_cast<int>(r.i64());
    d.size = static_cast<int>(r.i64());
    d.partial_gradient = r.i64() != 0;
    p.placements.push_back(std::move(d));
  }
  if (r.i64() != 0) {
    FlatRange f;
    f.dim = r.str();
    f.rank = static_cast<int>(r.i64());
    f.size = static_cast<int>(r.i64());
    f.offset = r.i64();
    f.numel = r.i64();
    p.flat = f;
  }
  const auto dtype = static_cast<DType>(r.i64());
  const Shape shape = r.shape();
  v.values = empty(shape, dtype, Device::cpu());
  r.bytes(v.values.data_ptr(), v.values.nbytes());
  return v;
}

// Where a piece sits, as a string: two pieces of one tensor at the same place came twice.
std::string place_of(const ParameterPiece& p) {
  std::string key;
  for (const DimPlacement& d : p.placements) key += d.str() + ";";
  if (p.flat) key += fmt::format("flat [{}, +{})", p.flat->offset, p.flat->numel);
  return key;
}

std::string label(const std::pair<std::string, std::string>& key) {
  return key.second.empty() ? fmt::format("'{}'", key.first) : fmt::format("'{}' of '{}'", key.second, key.first);
}

}  // namespace

std::vector<PieceValues> all_gather_pieces(const std::vector<PieceValues>& mine,
                                           const std::shared_ptr<ProcessGroup>& world) {
  NoGradGuard no_grad;
  if (!world) return mine;
  Writer w;
  for (const PieceValues& v : mine) write(w, v);
  // Every rank's length in bytes, then every rank's bytes as int64 words, padded to the longest.
  const Device device = world->device();
  const auto nbytes = static_cast<int64_t>(w.out().size());
  const Tensor length = ops::copy_to(from_vector(std::vector<int64_t>{nbytes}, Shape{1}), device);
  Tensor lengths = empty(Shape{world->size()}, DType::Int64, device);
  world->all_gather(lengths, length)->wait();
  const std::vector<int64_t> all_bytes = ops::copy_to(lengths, Device::cpu()).to_vector<int64_t>();
  const int64_t longest = std::max<int64_t>(1, (*std::max_element(all_bytes.begin(), all_bytes.end()) + 7) / 8);
  std::vector<int64_t> padded(static_cast<size_t>(longest), 0);
  std::memcpy(padded.data(), w.out().data(), w.out().size());
  const Tensor message = ops::copy_to(from_vector(padded, Shape{longest}), device);
  Tensor messages = empty(Shape{world->size() * longest}, DType::Int64, device);
  world->all_gather(messages, message)->wait();
  const Tensor host = ops::contiguous(ops::copy_to(messages, Device::cpu()));
  const auto* base = static_cast<const char*>(host.data_ptr());
  std::vector<PieceValues> out;
  for (int r = 0; r < world->size(); ++r) {
    Reader reader(base + static_cast<size_t>(r * longest) * 8, static_cast<size_t>(all_bytes[r]), r);
    while (!reader.done()) out.push_back(read(reader, r));
  }
  return out;
}

std::map<std::pair<std::string, std::string>, Tensor> assemble_pieces(const std::vector<PieceValues>& pieces,
                                                                      const char* op) {
  NoGradGuard no_grad;
  struct Whole {
    Tensor tensor;
    int64_t elements = 0;                    // placed so far
    std::map<std::string, int> places;       // where each piece sat -> the rank that sent it
    std::vector<std::string> sent;           // "rank 1: tp: Shard(0) (rank 1 of 2)", for messages
    int first_rank = 0;
  };
  std::map<std::pair<std::string, std::string>, Whole> wholes;
  for (const PieceValues& v : pieces) {
    const std::pair<std::string, std::string> key{v.piece.name, v.state};
    MG_CHECK(!v.piece.name.empty(), "{}: rank {} sent a piece with no name ({}); name the parameters "
             "(name_placements)", op, v.rank, v.piece.str());
    auto [it, fresh] = wholes.try_emplace(key);
    Whole& w = it->second;
    if (v.whole) {
      if (fresh) {
        w.tensor = ops::clone(v.values);
        w.first_rank = v.rank;
        continue;
      }
      const bool same = w.tensor.shape() == v.values.shape() && w.tensor.dtype() == v.values.dtype() &&
                        std::memcmp(w.tensor.data_ptr(), v.values.data_ptr(), v.values.nbytes()) == 0;
      MG_CHECK(same, "{}: {} is one value for the whole tensor, but ranks {} and {} hold different ones ({} {} "
               "and {} {})", op, label(key), w.first_rank, v.rank, w.tensor.shape(), w.tensor.dtype(),
               v.values.shape(), v.values.dtype());
      continue;
    }
    if (fresh) {
      w.tensor = zeros(v.piece.shape, v.values.dtype(), Device::cpu());
      w.first_rank = v.rank;
    }
    MG_CHECK(w.tensor.shape() == v.piece.shape && w.tensor.dtype() == v.values.dtype(),
             "{}: {} is {} ({}) on rank {}, but {} ({}) on rank {}", op, label(key), w.tensor.shape(),
             w.tensor.dtype(), w.first_rank, v.piece.shape, v.values.dtype(), v.rank);
    const std::string place = place_of(v.piece);
    const auto [seen, first_time] = w.places.emplace(place, v.rank);
    MG_CHECK(first_time,
             "{}: {} came twice, from ranks {} and {} alike ({}): a replica whose placement says nothing "
             "(record Replicate on it: placement.h)", op, label(key), seen->second, v.rank, v.piece.str());
    place_into(w.tensor, v.piece, v.values);
    w.elements += v.values.numel();
    w.sent.push_back(fmt::format("rank {}: {}", v.rank, v.piece.str()));
  }
  std::map<std::pair<std::string, std::string>, Tensor> out;
  for (auto& [key, w] : wholes) {
    if (w.sent.empty()) {  // a whole value
      out.emplace(key, w.tensor);
      continue;
    }
    std::string list;
    for (const std::string& s : w.sent) list += "\n  " + s;
    MG_CHECK(w.elements == w.tensor.numel(),
             "{}: the ranks sent {} of the {} elements of {} {}: {}; is a shard recorded as Replicate, or a "
             "replica recorded as a shard? The pieces:{}", op, w.elements, w.tensor.numel(), label(key),
             w.tensor.shape(), w.elements < w.tensor.numel() ? "some are missing" : "some came twice", list);
    out.emplace(key, w.tensor);
  }
  return out;
}

}  // namespace mg::parallel
