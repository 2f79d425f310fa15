// Device parsing and printing, dtypes, shapes, and what a build without a usable CUDA
// device says when one is asked for.
#include "catch_compat.h"

#include <fmt/format.h>

#include <minigrad/core/backend.h>
#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/shape.h>
#include <minigrad/core/tensor.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/cuda/graph.h>

using namespace mg;

TEST_CASE("Device parses and prints cpu, cuda and cuda:N") {
  CHECK(Device("cpu") == Device::cpu());
  CHECK(Device("cpu").is_cpu());
  CHECK(Device("cuda") == Device::cuda(0));
  CHECK(Device("cuda:0") == Device::cuda(0));
  CHECK(Device("cuda:1") == Device::cuda(1));
  CHECK(Device("cuda:12").index() == 12);
  CHECK(Device("cuda:3").is_cuda());
  CHECK(Device::cpu().str() == "cpu");
  CHECK(Device::cuda(2).str() == "cuda:2");
  CHECK(Device("cuda").str() == "cuda:0");
  CHECK(fmt::format("{}", Device::cuda(1)) == "cuda:1");
  CHECK(fmt::format("on {}", Device::cpu()) == "on cpu");
  CHECK(Device::cuda(0) != Device::cuda(1));
  CHECK(Device::cpu() < Device::cuda(0));
  CHECK(Device::cuda(0) < Device::cuda(1));
}

TEST_CASE("Device rejects what it cannot parse, naming the input") {
  for (const char* bad : {"gpu:1", "gpu", "", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:1x",
                          "cuda1", "cudax:1", " cpu", "cpu:1", "cuda:1:2"}) {
    INFO("spec: '" << bad << "'");
    REQUIRE_THROWS_AS(Device(bad), Error);
    REQUIRE_THROWS_WITH(Device(bad), MG_CONTAINS(fmt::format("'{}'", bad)) &&
                                         MG_CONTAINS("expected 'cpu', 'cuda' or 'cuda:N'"));
  }
  REQUIRE_THROWS_WITH(Device(DeviceType::CUDA, -1), MG_CONTAINS("index") && MG_CONTAINS("-1"));
  REQUIRE_THROWS_WITH(Device(DeviceType::CPU, 1), MG_CONTAINS("cpu:1"));
}

TEST_CASE("DType names and sizes") {
  CHECK(element_size(DType::Float32) == 4);
  CHECK(element_size(DType::Int64) == 8);
  CHECK(fmt::format("{}", DType::Float32) == "float32");
  CHECK(fmt::format("{}", DType::Int64) == "int64");
  CHECK(dtype_of<float>() == DType::Float32);
  CHECK(dtype_of<int64_t>() == DType::Int64);
}

TEST_CASE("Shape: numel, printing, broadcasting, dimension wrapping") {
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{2, 3, 4}.numel() == 24);
  CHECK(Shape{2, 0, 4}.numel() == 0);
  CHECK(fmt::format("{}", Shape{2, 3}) == "[2, 3]");
  CHECK(fmt::format("{}", Shape{}) == "[]");
  CHECK(contiguous_strides(Shape{2, 3, 4}) == std::vector<int64_t>{12, 4, 1});
  CHECK(broadcast_shapes({3, 1}, {1, 4}, "t") == Shape{3, 4});
  CHECK(broadcast_shapes({5}, {2, 5}, "t") == Shape{2, 5});
  CHECK(broadcast_shapes({}, {2, 5}, "t") == Shape{2, 5});
  CHECK(broadcast_shapes({2, 1, 3}, {4, 1}, "t") == Shape{2, 4, 3});
  CHECK(broadcast_shapes({0, 1}, {1, 3}, "t") == Shape{0, 3});
  REQUIRE_THROWS_WITH(broadcast_shapes({2, 3}, {4, 3}, "myop"),
                      MG_CONTAINS("myop") && MG_CONTAINS("[2, 3]") && MG_CONTAINS("[4, 3]") &&
                          MG_CONTAINS("do not broadcast"));
  CHECK(wrap_dim(-1, 3, "t") == 2);
  CHECK(wrap_dim(0, 0, "t") == 0);
  CHECK(wrap_dim(-1, 0, "t") == 0);
  REQUIRE_THROWS_WITH(wrap_dim(3, 3, "sum"),
                      MG_CONTAINS("sum") && MG_CONTAINS("dimension 3") && MG_CONTAINS("[-3, 2]"));
  REQUIRE_THROWS_WITH(wrap_dim(-4, 3, "sum"), MG_CONTAINS("dimension -4"));
}

TEST_CASE("asking for a CUDA tensor without a usable CUDA device is a clear error") {
  Backend& cuda = backend(DeviceType::CUDA);
  CHECK(cuda.type() == DeviceType::CUDA);
  if (cuda.device_count() > 0) {
    // A device index past the last one must not crash either.
    const int missing = cuda.device_count() + 7;
    REQUIRE_THROWS_AS(zeros({2, 3}, DType::Float32, Device::cuda(missing)), Error);
    SUCCEED("CUDA devices present: the no-device error is exercised on machines without one");
    return;
  }
  REQUIRE_THROWS_AS(zeros({2, 3}, DType::Float32, Device::cuda(0)), Error);
  REQUIRE_THROWS_WITH(zeros({2, 3}, DType::Float32, Device::cuda(0)), MG_CONTAINS("CUDA"));
  REQUIRE_THROWS_WITH(ones({4}, DType::Float32, Device("cuda:1")), MG_CONTAINS("CUDA"));
  const Tensor host = ones({2});
  REQUIRE_THROWS_WITH(host.to(Device::cuda(0)), MG_CONTAINS("CUDA"));
  REQUIRE_THROWS_WITH(from_vector(std::vector<float>{1, 2}, {2}, Device::cuda(0)),
                      MG_CONTAINS("CUDA"));
}

TEST_CASE("CUDAGraph without a usable CUDA device is a clear error") {
  if (cuda::device_count() > 0) {
    SUCCEED("CUDA devices present: tests/cuda/graph_test.cpp captures and replays");
    return;
  }
  cuda::CUDAGraph graph;
  // Without a GPU: "cuda:0 is not a visible device"; without CUDA: "built without CUDA".
  REQUIRE_THROWS_WITH(graph.capture_begin(), MG_CONTAINS("CUDAGraph::capture_begin"));
  CHECK_FALSE(graph.is_capturing());
  REQUIRE_THROWS_WITH(graph.replay(), MG_CONTAINS("CUDAGraph::replay"));
  REQUIRE_THROWS_WITH(graph.capture_end(), MG_CONTAINS("CUDAGraph::capture_end"));
}

TEST_CASE("cuda::is_built tells a build without CUDA from a machine without a GPU") {
#ifdef MINIGRAD_WITH_CUDA
  CHECK(cuda::is_built());
#else
  CHECK_FALSE(cuda::is_built());
  CHECK(cuda::device_count() == 0);
#endif
  if (cuda::device_count() > 0) return;
  std::string message;
  try {
    zeros({1}, DType::Float32, Device::cuda(0));
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(!message.empty());
  CHECK((message.find("minigrad was built without CUDA") != std::string::npos) == !cuda::is_built());
}

TEST_CASE("memory_info: the host reports its free and total memory") {
  const mg::MemoryInfo info = mg::backend(mg::Device::cpu()).memory_info(0);
  REQUIRE(info.known);  // Linux: /proc/meminfo
  REQUIRE(info.total_bytes > 0);
  REQUIRE(info.free_bytes <= info.total_bytes);
}
