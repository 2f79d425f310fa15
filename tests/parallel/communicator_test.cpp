// Coalescing, the host communicator, broadcast_coalesced and reduce_add: sums, not
// averages.
#include "catch_compat.h"

#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>
#include <minigrad/parallel/coalesce.h>
#include <minigrad/parallel/devices/host_communicator.h>

using mg::Device;
using mg::Shape;
using mg::Tensor;
namespace comm = mg::parallel::comm;

using mg::testing::cpus;

TEST_CASE("flatten and unflatten round-trip as views of one buffer") {
  const Tensor a = mg::randn({2, 3});
  const Tensor b = mg::randn({4});
  const Tensor c = mg::randn({3, 2}).t();  // not contiguous
  const Tensor flat = mg::parallel::flatten_dense_tensors({a, b, c});
  REQUIRE(flat.shape() == Shape{16});
  const auto views = mg::parallel::unflatten_dense_tensors(flat, {a, b, c});
  REQUIRE(views.size() == 3);
  mg::testing::require_close(views[0], a, "a", 0, 0);
  mg::testing::require_close(views[1], b, "b", 0, 0);
  mg::testing::require_close(views[2], c, "c", 0, 0);
  for (const Tensor& v : views) REQUIRE(v.storage().is_alias_of(flat.storage()));
  REQUIRE_THROWS_WITH(mg::parallel::flatten_dense_tensors({a, mg::zeros({2}, mg::DType::Int64)}),
                      MG_CONTAINS("flatten_dense_tensors: tensor 1 is int64 on cpu, but tensor 0 is "
                                  "float32 on cpu"));
  REQUIRE_THROWS_WITH(mg::parallel::unflatten_dense_tensors(flat, {a, b}),
                      MG_CONTAINS("unflatten_dense_tensors: the flat buffer has 16 elements but the "
                                  "tensors hold 10"));
  const auto groups = mg::parallel::group_by_dtype({a, mg::zeros({1}, mg::DType::Int64), b});
  REQUIRE(groups == std::vector<std::vector<size_t>>{{0, 2}, {1}});
}

TEST_CASE("reduce_add sums the replicas' tensors and does not average them") {
  const std::vector<Tensor> grads{mg::full({2, 2}, 1.0), mg::full({2, 2}, 2.0), mg::full({2, 2}, 3.0)};
  const Tensor sum = comm::reduce_add(grads, cpus(3));
  REQUIRE(sum.to_vector<float>() == std::vector<float>{6, 6, 6, 6});
  // The inputs are left as they were.
  REQUIRE(grads[0].to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  // Any root; the order of the sum is rank order either way.
  REQUIRE(comm::reduce_add(grads, cpus(3), 2).to_vector<float>() == std::vector<float>{6, 6, 6, 6});
}

TEST_CASE("reduce_add_coalesced sums every tensor of every replica with dtypes kept apart") {
  std::vector<std::vector<Tensor>> per_device;
  for (int r = 0; r < 4; ++r) {
    per_device.push_back({mg::full({2, 3}, r + 1.0), mg::full({1}, 10.0 * (r + 1), mg::DType::Int64),
                          mg::full({4}, -1.0)});
  }
  const auto sums = comm::reduce_add_coalesced(per_device, cpus(4));
  REQUIRE(sums.size() == 3);
  REQUIRE(sums[0].to_vector<float>() == std::vector<float>(6, 10.f));
  REQUIRE(sums[1].dtype() == mg::DType::Int64);
  REQUIRE(sums[1].to_vector<int64_t>() == std::vector<int64_t>{100});
  REQUIRE(sums[2].to_vector<float>() == std::vector<float>(4, -4.f));
  // One flat buffer per dtype: the float results are views of one storage.
  REQUIRE(sums[0].storage().is_alias_of(sums[2].storage()));

  per_device[2][0] = mg::zeros({3, 2});
  REQUIRE_THROWS_WITH(comm::reduce_add_coalesced(per_device, cpus(4)),
                      MG_CONTAINS("reduce_add: tensor 0 of device 2 is float32 [3, 2] on cpu, but "
                                  "device 0 has float32 [2, 3]"));
  REQUIRE_THROWS_WITH(comm::reduce_add_coalesced(per_device, cpus(3)),
                      MG_CONTAINS("reduce_add: got tensors from 4 devices for a device list of 3"));
}

TEST_CASE("broadcast_coalesced gives every device its own copy") {
  const Tensor w = mg::randn({3, 2});
  const Tensor b = mg::randn({2});
  const auto copies = comm::broadcast_coalesced({w, b}, cpus(3));
  REQUIRE(copies.size() == 3);
  REQUIRE(copies[0][0].is_same(w));  // the source device keeps the originals
  for (size_t i = 1; i < 3; ++i) {
    mg::testing::require_close(copies[i][0], w, "w", 0, 0);
    mg::testing::require_close(copies[i][1], b, "b", 0, 0);
    REQUIRE_FALSE(copies[i][0].storage().is_alias_of(w.storage()));
    REQUIRE_FALSE(copies[i][0].requires_grad());
  }
  REQUIRE_FALSE(copies[1][0].storage().is_alias_of(copies[2][0].storage()));
}

TEST_CASE("communicator_for picks the host communicator for CPU and repeated devices") {
  REQUIRE(mg::parallel::communicator_for(cpus(2))->name() == "host");
  REQUIRE(mg::parallel::communicator_for({Device::cuda(0), Device::cuda(0)})->name() == "host");
  REQUIRE_FALSE(mg::parallel::nccl_available_for(cpus(2)));
  REQUIRE_FALSE(mg::parallel::nccl_available_for({Device::cuda(0), Device::cuda(0)}));
  REQUIRE_FALSE(mg::parallel::nccl_available_for({Device::cuda(0)}));
#ifdef MINIGRAD_WITH_NCCL
  REQUIRE(mg::parallel::nccl_available_for({Device::cuda(0), Device::cuda(1)}));
#else
  REQUIRE_FALSE(mg::parallel::nccl_available_for({Device::cuda(0), Device::cuda(1)}));
#endif
}

TEST_CASE("host communicator checks its arguments") {
  mg::parallel::HostCommunicator host(cpus(2));
  REQUIRE_THROWS_WITH(host.broadcast({mg::zeros({1})}, 2),
                      MG_CONTAINS("host broadcast: root 2 is not a rank of [cpu, cpu]"));
  REQUIRE_THROWS_WITH(host.reduce_add({{mg::zeros({1})}}, 0),
                      MG_CONTAINS("host reduce_add: got tensors for 1 ranks, but the communicator "
                                  "has 2 ([cpu, cpu])"));
  REQUIRE_THROWS_WITH(host.reduce_add({{mg::zeros({1})}, {mg::zeros({2})}}, 0),
                      MG_CONTAINS("host reduce_add: tensor 0 of rank 1 is float32 [2], but on rank 0 "
                                  "it is float32 [1]"));
}

TEST_CASE("device lists parse as the command line writes them") {
  using mg::parallel::parse_device_list;
  REQUIRE(parse_device_list("0,1") == std::vector<Device>{Device::cuda(0), Device::cuda(1)});
  REQUIRE(parse_device_list("cpu, cpu") == cpus(2));
  REQUIRE(parse_device_list("cuda:1,0,0") ==
          std::vector<Device>{Device::cuda(1), Device::cuda(0), Device::cuda(0)});
  REQUIRE_THROWS_WITH(parse_device_list("0,,1"), MG_CONTAINS("device list '0,,1': empty entry"));
  REQUIRE_THROWS_WITH(parse_device_list("gpu0"),
                      MG_CONTAINS("device list 'gpu0': Device: cannot parse 'gpu0'"));
  REQUIRE_THROWS_WITH(parse_device_list(""), MG_CONTAINS("device list '': empty entry"));
}

TEST_CASE("HostCommunicator all_reduce and all_gather: one tensor per rank, every rank's result") {
  mg::parallel::HostCommunicator host(cpus(3));
  const std::vector<Tensor> inputs{mg::full({2}, 1.0), mg::full({2}, 2.0), mg::full({2}, 4.0)};
  const auto sums = host.all_reduce(inputs);
  REQUIRE(sums.size() == 3);
  for (size_t r = 0; r < 3; ++r) {
    REQUIRE(sums[r].to_vector<float>() == std::vector<float>{7, 7});
    for (const Tensor& in : inputs) REQUIRE_FALSE(sums[r].storage().is_alias_of(in.storage()));
  }
  REQUIRE_FALSE(sums[0].storage().is_alias_of(sums[1].storage()));  // each rank owns its copy
  REQUIRE(inputs[0].to_vector<float>() == std::vector<float>{1, 1});

  const auto stacked = host.all_gather({mg::full({1, 2}, 1.0), mg::full({1, 2}, 2.0), mg::full({1, 2}, 3.0)});
  REQUIRE(stacked.size() == 3);
  for (const Tensor& t : stacked) {
    REQUIRE(t.shape() == Shape{3, 1, 2});
    REQUIRE(t.to_vector<float>() == std::vector<float>{1, 1, 2, 2, 3, 3});
  }
  // A group of one returns a copy, not the input.
  mg::parallel::HostCommunicator one(cpus(1));
  REQUIRE_FALSE(one.all_reduce({inputs[0]})[0].storage().is_alias_of(inputs[0].storage()));

  REQUIRE_THROWS_WITH(host.all_reduce({inputs[0], inputs[1]}),
                      MG_CONTAINS("host all_reduce: got tensors for 2 ranks, but the communicator "
                                  "has 3 ([cpu, cpu, cpu])"));
  REQUIRE_THROWS_WITH(host.all_gather({inputs[0], mg::zeros({3}), inputs[2]}),
                      MG_CONTAINS("host all_gather: rank 1 has a float32 tensor of shape [3], but "
                                  "rank 0 has float32 [2]"));
}
