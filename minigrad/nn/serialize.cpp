#include <minigrad/nn/serialize.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/files.h>
#include <minigrad/core/ops.h>

// Tensors are written as they sit in memory; the format says little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "nn/serialize.cpp writes host bytes as safetensors' little-endian data");

namespace mg::nn {
namespace {

using json = nlohmann::json;

// The reference implementation refuses larger headers too; it bounds what a corrupt
// length field can make us parse.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

// safetensors' dtype strings (and torch's: torch.bfloat16 is "BF16", torch.float16 "F16",
// as the safetensors package writes them; the bytes are the IEEE / bfloat16 bit patterns,
// little-endian, as torch holds them in memory).
const char* dtype_code(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
    case DType::Int64: return "I64";
    case DType::BFloat16: return "BF16";
    case DType::Float16: return "F16";
  }
  MG_FAIL("save: unknown dtype");
}

// The number of elements of t (a float tensor) that are NaN or infinite, and the first.
template <typename T>
int64_t count_non_finite(const Tensor& t, int64_t& first) {
  const T* v = t.data<T>();
  int64_t count = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(static_cast<double>(v[i])) && count++ == 0) first = i;
  return count;
}

// count_non_finite for a float tensor of any dtype, with its first bad value as stored.
int64_t count_non_finite(const Tensor& t, int64_t& first, std::string& first_value) {
  int64_t count = 0;
  switch (t.dtype()) {
    case DType::Float64: count = count_non_finite<double>(t, first); break;
    case DType::BFloat16: count = count_non_finite<bfloat16>(t, first); break;
    case DType::Float16: count = count_non_finite<float16>(t, first); break;
    default: count = count_non_finite<float>(t, first); break;
  }
  if (count == 0) return 0;
  switch (t.dtype()) {
    case DType::Float64: first_value = fmt::format("{}", t.data<double>()[first]); break;
    case DType::BFloat16: first_value = fmt::format("{}", t.data<bfloat16>()[first]); break;
    case DType::Float16: first_value = fmt::format("{}", t.data<float16>()[first]); break;
    default: first_value = fmt::format("{}", t.data<float>()[first]); break;
  }
  return count;
}

// ---------------------------------------------------------------- encoding

std::string encode(const char* op, const std::string& path, const TensorDict& tensors,
                   const Metadata& metadata) {
  json header = json::object();
  std::vector<Tensor> host_tensors;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    MG_CHECK(!name.empty() && name != kMetadataKey,
             "{}: cannot write '{}': invalid tensor name '{}'", op, path, name);
    MG_CHECK(tensor.defined(), "{}: cannot write '{}': tensor '{}' is undefined", op, path, name);
    const Tensor host =
        ops::contiguous(tensor.device().is_cpu() ? tensor : ops::copy_to(tensor, Device::cpu()));
    const uint64_t size = host.nbytes();
    header[name] = {{"dtype", dtype_code(host.dtype())},
                    {"shape", host.shape().sizes()},
                    {"data_offsets", {offset, offset + size}}};
    offset += size;
    host_tensors.push_back(host);
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // names that are not valid UTF-8
    MG_FAIL("{}: cannot write '{}': the header cannot be written as JSON: {}", op, path, e.what());
  }
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t header_size = text.size();
  out.append(reinterpret_cast<const char*>(&header_size), 8);
  out += text;
  for (const Tensor& t : host_tensors)
    out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  return out;
}

// ---------------------------------------------------------------- decoding

[[noreturn]] void corrupt(const char* op, const std::string& path, const std::string& fault) {
  MG_FAIL("{}: '{}' is not a valid safetensors file: {}", op, path, fault);
}

// A JSON array of non-negative integers, or a fault naming `what`.
std::vector<uint64_t> unsigned_list(const char* op, const std::string& path, const json& value,
                                    const std::string& what) {
  bool ok = value.is_array();
  if (ok)
    for (const json& v : value) ok = ok && v.is_number_unsigned();
  if (!ok) corrupt(op, path, fmt::format("{} is {}, not a list of non-negative integers", what,
                                         value.dump()));
  std::vector<uint64_t> out;
  for (const json& v : value) out.push_back(v.get<uint64_t>());
  return out;
}

// A NaN or an infinity in a checkpoint is nearly always the state of a run that
// diverged; loading it silently moves the failure away from its cause (a run resumed from
// it stops at its first step, or trains on with dead units). Every float tensor is
// checked, and the message lists each bad one.
void check_finite(const char* op, const std::string& path, const TensorDict& tensors) {
  std::string list;
  size_t bad_tensors = 0;
  for (const auto& [name, t] : tensors) {
    if (!is_floating_point(t.dtype())) continue;
    int64_t first = -1;
    // The first bad value as it is stored (a float prints as float, a double as double).
    std::string value;
    const int64_t count = count_non_finite(t, first, value);
    if (count == 0) continue;
    ++bad_tensors;
    list += fmt::format("\n  '{}' (shape {}): {} of {} values, the first {} at index {}", name,
                        t.shape(), count, t.numel(), value, first);
  }
  if (bad_tensors > 0)
    MG_FAIL("{}: '{}' holds non-finite values (NaN or infinity) in {} tensor{} (a checkpoint of "
            "a run that diverged?); nothing was loaded (nn::LoadOptions::allow_non_finite "
            "loads it anyway):{}",
            op, path, bad_tensors, bad_tensors == 1 ? "" : "s", list);
}

// A name from a file, as a message shows it: at most 64 characters (a header of a hundred
// megabytes may hold one key of that size).
std::string short_name(const std::string& name) {
  constexpr std::size_t kMax = 64;
  if (name.size() <= kMax) return name;
  return fmt::format("{}... ({} bytes)", name.substr(0, kMax), name.size());
}

// Reads and checks a safetensors file: the 8-byte header length first, checked against the
// file's size and kMaxHeaderBytes before anything is allocated; then the header, checked
// whole; then each tensor's own bytes straight into the tensor. Nothing is read that the
// header does not declare, so memory is bounded by the tensors, not by the file.
Checkpoint decode(const char* op, const std::string& path, const LoadOptions& options) {
  const files::OpenedFile file = files::open_for_reading(op, path);
  if (file.size < 8)
    corrupt(op, path, fmt::format("the file has {} bytes, fewer than the 8 of the header length "
                                  "(truncated?)",
                                  file.size));
  uint64_t header_size = 0;
  files::read_exactly(op, path, file.fd.get(), 0, &header_size, 8);
  const uint64_t rest = file.size - 8;
  if (header_size > rest)
    corrupt(op, path, fmt::format("the header length {} is larger than the {} bytes that follow "
                                  "it (truncated, or not a safetensors file)",
                                  header_size, rest));
  if (header_size > kMaxHeaderBytes)
    corrupt(op, path, fmt::format("the header length {} exceeds the limit of {} bytes",
                                  header_size, kMaxHeaderBytes));
  std::string header_text(static_cast<size_t>(header_size), '\0');
  files::read_exactly(op, path, file.fd.get(), 8, header_text.data(), header_text.size());

  const char* header_begin = header_text.data();
  // A safetensors header nests three levels ({name: {"shape": [...]}}). Deeper JSON is
  // refused while parsing: the messages below dump() values, which recurses once per
  // level, and 100000 nested brackets would overflow the stack.
  constexpr int kMaxJsonDepth = 16;
  // A key given twice in one object (two tensors of one name, an "epoch" twice in
  // __metadata__, two "shape"s) is refused: nlohmann's parser would keep the last one
  // silently, and another reader might keep the first. Each open object's keys so far.
  struct OpenObject {
    std::string name;  // the key it is the value of ("" for the header itself)
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<OpenObject> open_objects;
  const auto check_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      corrupt(op, path, fmt::format("its JSON header nests deeper than {} levels", kMaxJsonDepth));
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.push_back(
            {open_objects.empty() ? std::string() : open_objects.back().last_key, {}, {}});
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open_objects.empty()) break;
        OpenObject& object = open_objects.back();
        std::string key = parsed.get<std::string>();
        if (!object.keys.insert(key).second) {
          const std::string shown = short_name(key);
          if (open_objects.size() == 1)
            corrupt(op, path, fmt::format("its header names '{}' twice; which one is meant is "
                                          "not knowable (a reader would silently keep one)",
                                          shown));
          corrupt(op, path, fmt::format("the entry '{}' of its header has the key '{}' twice; "
                                        "which one is meant is not knowable (a reader would "
                                        "silently keep one)",
                                        short_name(object.name), shown));
        }
        object.last_key = std::move(key);
        break;
      }
      default:
        break;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_size, check_event);
  } catch (const json::exception& e) {
    corrupt(op, path, fmt::format("its JSON header does not parse: {}", e.what()));
  }
  if (!header.is_object())
    corrupt(op, path, fmt::format("its JSON header is a JSON {}, not an object", header.type_name()));

  const uint64_t data_begin = 8 + header_size;
  const uint64_t data_size = rest - header_size;

  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  Checkpoint checkpoint;
  for (const auto& [name, info] : header.items()) {
    if (name == kMetadataKey) {
      if (!info.is_object())
        corrupt(op, path, fmt::format("__metadata__ is a JSON {}, not an object", info.type_name()));
      for (const auto& [key, value] : info.items()) {
        if (!value.is_string())
          corrupt(op, path, fmt::format("__metadata__ entry '{}' is {}, not a string", key,
                                        value.dump()));
        checkpoint.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets"))
      corrupt(op, path, fmt::format("the entry of tensor '{}' is {}, not an object with dtype, "
                                    "shape and data_offsets",
                                    name, info.dump()));

    const json& code = info["dtype"];
    DType dtype = DType::Float32;
    if (code == "F32") {
      dtype = DType::Float32;
    } else if (code == "F64") {
      dtype = DType::Float64;
    } else if (code == "I64") {
      dtype = DType::Int64;
    } else if (code == "BF16") {
      dtype = DType::BFloat16;
    } else if (code == "F16") {
      dtype = DType::Float16;
    } else {
      corrupt(op, path, fmt::format("tensor '{}' has dtype {}; minigrad reads F32, F64, BF16, "
                                    "F16 and I64",
                                    name, code.dump()));
    }

    const auto dims = unsigned_list(op, path, info["shape"], "the shape of tensor '" + name + "'");
    // numel * element size, refusing shapes that overflow int64 (a corrupt shape). The
    // bound is on the product of the dims with zeros counted as ones, which the strides
    // of the tensor reach even when it is empty: [0, 2^62, 2^62] holds nothing, but its
    // first stride would be 2^124.
    constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
    uint64_t size = element_size(dtype), span = element_size(dtype);
    bool overflow = false;
    std::vector<int64_t> sizes;
    for (uint64_t d : dims) {
      const uint64_t extent = std::max<uint64_t>(d, 1);
      overflow = overflow || d > kMax || span > kMax / extent;
      if (!overflow) {
        size *= d;
        span *= extent;
      }
      sizes.push_back(static_cast<int64_t>(d));
    }
    if (overflow)
      corrupt(op, path, fmt::format("tensor '{}' has an impossibly large shape {}", name,
                                    info["shape"].dump()));

    const auto offsets =
        unsigned_list(op, path, info["data_offsets"], "data_offsets of tensor '" + name + "'");
    if (offsets.size() != 2 || offsets[0] > offsets[1])
      corrupt(op, path, fmt::format("tensor '{}' has data_offsets {}, not [begin, end] with begin "
                                    "<= end",
                                    name, info["data_offsets"].dump()));
    if (offsets[1] > data_size)
      corrupt(op, path, fmt::format("tensor '{}' has data_offsets [{}, {}] beyond the {} bytes of "
                                    "data (truncated?)",
                                    name, offsets[0], offsets[1], data_size));
    if (offsets[1] - offsets[0] != size)
      corrupt(op, path, fmt::format("tensor '{}' of shape {} and dtype {} needs {} bytes, but its "
                                    "data_offsets [{}, {}] span {}",
                                    name, info["shape"].dump(), code.get<std::string>(), size,
                                    offsets[0], offsets[1], offsets[1] - offsets[0]));
    entries.push_back({name, dtype, Shape(std::move(sizes)), offsets[0], offsets[1]});
  }

  // Two tensors sharing bytes is corruption (or an attack); empty tensors own no bytes.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& a = *by_offset[i - 1];
    const Entry& b = *by_offset[i];
    if (b.begin < a.end)
      corrupt(op, path, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", a.name,
                                    a.begin, a.end, b.name, b.begin, b.end));
  }

  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    if (e.end > e.begin)
      files::read_exactly(op, path, file.fd.get(), data_begin + e.begin, t.data_ptr(),
                          e.end - e.begin);
    checkpoint.tensors.emplace(e.name, t);
  }
  if (!options.allow_non_finite) check_finite(op, path, checkpoint.tensors);
  return checkpoint;
}

// ---------------------------------------------------------------- module state

void check_module_state(const char* op, const Module& module, const TensorDict& tensors,
                        const std::string& source) {
  std::map<std::string, TensorSpec> expected;
  for (const auto& [name, t] : state_dict(module)) expected.emplace(name, TensorSpec{t.shape(), t.dtype()});
  check_state_dict(expected, tensors, op, module.type_name(), source);
}

void load_module_state(const char* op, Module& module, const TensorDict& tensors,
                       const std::string& source) {
  check_module_state(op, module, tensors, source);
  NoGradGuard no_grad;
  // Move everything onto the destination devices first, so a failing transfer leaves
  // the module as it was; the copies in place then cannot fail on shape or dtype.
  std::vector<std::pair<Tensor, Tensor>> copies;
  for (const auto& [name, dst] : state_dict(module)) {
    const Tensor& src = tensors.at(name);
    copies.emplace_back(dst, src.device() == dst.device() ? src : ops::copy_to(src, dst.device()));
  }
  for (auto& [dst, src] : copies) dst.copy_(src);
}

}  // namespace

// ---------------------------------------------------------------- public API

void Checkpoint::put(const std::string& prefix, const TensorDict& entries) {
  for (const auto& [name, tensor] : entries) {
    const bool inserted = tensors.emplace(prefix + name, tensor).second;
    MG_CHECK(inserted, "Checkpoint::put: the checkpoint already has a tensor named '{}'",
             prefix + name);
  }
}

TensorDict Checkpoint::get(const std::string& prefix) const {
  TensorDict out;
  for (auto it = tensors.lower_bound(prefix);
       it != tensors.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.emplace(it->first.substr(prefix.size()), it->second);
  return out;
}

void save_tensors(const TensorDict& tensors, const std::string& path, const Metadata& metadata) {
  files::write_atomically("save_tensors", path, encode("save_tensors", path, tensors, metadata));
}

void save_tensors(const Checkpoint& checkpoint, const std::string& path) {
  save_tensors(checkpoint.tensors, path, checkpoint.metadata);
}

Checkpoint load_tensors(const std::string& path, const LoadOptions& options) {
  return decode("load_tensors", path, options);
}

TensorDict state_dict(const Module& module) {
  TensorDict out;
  for (auto& [name, t] : module.named_parameters()) out.emplace(name, t);
  for (auto& [name, t] : module.named_buffers()) out.emplace(name, t);
  return out;
}

void check_state_dict(const std::map<std::string, TensorSpec>& expected, const TensorDict& tensors,
                      const std::string& op, const std::string& holder, const std::string& source) {
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [name, want] : expected) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      missing.push_back(fmt::format("missing key '{}' (shape {}, {})", name, want.shape,
                                    want.dtype));
      continue;
    }
    const Tensor& got = it->second;
    if (!got.defined()) {
      mismatched.push_back(fmt::format("'{}' is an undefined tensor", name));
    } else if (got.shape() != want.shape || got.dtype() != want.dtype) {
      mismatched.push_back(fmt::format("{} mismatch for '{}': shape {} ({}) in {}, shape {} ({}) "
                                       "in the module",
                                       got.shape() != want.shape ? "size" : "dtype", name,
                                       got.shape(), got.dtype(), source, want.shape,
                                       want.dtype));
    }
  }
  for (const auto& [name, got] : tensors)
    if (expected.count(name) == 0)
      unexpected.push_back(got.defined() ? fmt::format("unexpected key '{}' (shape {}, {})", name,
                                                       got.shape(), got.dtype())
                                         : fmt::format("unexpected key '{}'", name));

  const size_t count = missing.size() + unexpected.size() + mismatched.size();
  if (count == 0) return;
  std::string list;
  for (const auto* group : {&missing, &unexpected, &mismatched})
    for (const auto& line : *group) list += "\n  " + line;
  MG_FAIL("{}: {} does not match {} ({} problem{}; nothing was loaded):{}", op, source,
          holder, count, count == 1 ? "" : "s", list);
}

void check_state_dict(const Module& module, const TensorDict& tensors, const std::string& source) {
  check_module_state("nn::check_state_dict", module, tensors, source);
}

void load_state_dict(Module& module, const TensorDict& tensors, const std::string& source) {
  load_module_state("nn::load_state_dict", module, tensors, source);
}

void save(const Module& module, const std::string& path, const Metadata& metadata) {
  Metadata meta = metadata;
  meta.emplace("format", "pt");  // what safetensors.torch.save_file writes
  files::write_atomically("nn::save", path, encode("nn::save", path, state_dict(module), meta));
}

void load(Module& module, const std::string& path, const LoadOptions& options) {
  const Checkpoint checkpoint = decode("nn::load", path, options);
  load_module_state("nn::load", module, checkpoint.tensors, path);
}

}  // namespace mg::nn
