// DeviceMesh with named dimensions (dp, pp, cp, tp) on Gloo ranks: each rank's
// coordinates follow Megatron's numbering (tp fastest), and the group of each dimension
// holds exactly the ranks that differ from it only along that dimension (checked by an
// all-reduce of the world ranks over it). Plus the errors for impossible meshes.
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

using namespace mg;
using namespace mg::test;

TEST_CASE("DeviceMesh dp x cp x tp: coordinates and the group along each named dimension",
          "[device_mesh]") {
  // 8 ranks as dp=2, pp=1, cp=2, tp=2: rank = (dp * 2 + cp) * 2 + tp.
  auto results = run_ranks(8, [](RankContext& ctx) {
    auto world = ctx.gloo();
    parallel::DeviceMesh mesh(world, {{"dp", 2}, {"pp", 1}, {"cp", 2}, {"tp", 2}});
    ctx.report("mesh", mesh.str());
    std::vector<float> coords, sizes, sums;
    for (const char* dim : {"dp", "pp", "cp", "tp"}) {
      coords.push_back(static_cast<float>(mesh.rank(dim)));
      sizes.push_back(static_cast<float>(mesh.group(dim)->size()));
      // The sum of the world ranks in this rank's group along `dim`.
      Tensor r = full({1}, static_cast<double>(world->rank()));
      mesh.group(dim)->allreduce(r)->wait();
      sums.push_back(r.item<float>());
      // The group's own rank is the coordinate along its dimension.
      coords.push_back(static_cast<float>(mesh.group(dim)->rank()));
    }
    ctx.report("coords", coords);
    ctx.report("sizes", sizes);
    ctx.report("sums", sums);
    ctx.report("2d names", std::vector<float>{static_cast<float>(mesh.dp_rank()),
                                              static_cast<float>(mesh.tp_rank()),
                                              static_cast<float>(mesh.size("dp"))});
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    const int dp = r.rank / 4, cp = (r.rank / 2) % 2, tp = r.rank % 2;
    REQUIRE(r.text("mesh") ==
            fmt::format("DeviceMesh(dp=2, pp=1, cp=2, tp=2), rank {} = (dp {}, pp 0, cp {}, tp {})",
                        r.rank, dp, cp, tp));
    const auto fdp = static_cast<float>(dp), fcp = static_cast<float>(cp),
               ftp = static_cast<float>(tp);
    REQUIRE(r.floats("coords") == std::vector<float>{fdp, fdp, 0, 0, fcp, fcp, ftp, ftp});
    REQUIRE(r.floats("sizes") == std::vector<float>{2, 1, 2, 2});
    // dp: r and r +- 4; pp: r alone; cp: r and r +- 2; tp: r and r +- 1.
    const auto me = static_cast<float>(r.rank);
    REQUIRE(r.floats("sums") == std::vector<float>{2 * me + (dp == 0 ? 4.f : -4.f), me,
                                                   2 * me + (cp == 0 ? 2.f : -2.f),
                                                   2 * me + (tp == 0 ? 1.f : -1.f)});
    REQUIRE(r.floats("2d names") == std::vector<float>{fdp, ftp, 2});
  }
}

TEST_CASE("DeviceMesh refuses impossible meshes and unknown names", "[device_mesh]") {
  parallel::TCPStoreOptions options;
  options.is_server = true;
  auto store = std::make_shared<parallel::TCPStore>("127.0.0.1", 0, options);
  auto world = std::make_shared<parallel::ProcessGroupGloo>(store, 0, 1);
  using parallel::DeviceMesh;
  REQUIRE_THROWS_WITH(DeviceMesh(world, {{"dp", 2}, {"cp", 1}, {"tp", 3}}),
                      MG_CONTAINS("DeviceMesh: dp=2 x cp=1 x tp=3 = 6 ranks, but the job has 1; "
                                  "the product of the mesh's sizes must be the world size"));
  REQUIRE_THROWS_WITH(DeviceMesh(world, {{"dp", 1}, {"ep", 1}}),
                      MG_CONTAINS("DeviceMesh(dp=1, ep=1): unknown dimension 'ep'; the names "
                                  "are dp, pp, cp, tp"));
  REQUIRE_THROWS_WITH(DeviceMesh(world, {{"tp", 1}, {"dp", 1}}),
                      MG_CONTAINS("dimension 'dp' is repeated or out of order; the dimensions "
                                  "go dp, pp, cp, tp"));
  REQUIRE_THROWS_WITH(DeviceMesh(world, {{"dp", 0}}),
                      MG_CONTAINS("dimension 'dp' must have size at least 1, got 0"));
  // A one-rank mesh: known names that are absent have size 1; unknown names are errors.
  const DeviceMesh mesh(world, {{"dp", 1}, {"tp", 1}});
  REQUIRE(mesh.size("pp") == 1);
  REQUIRE(mesh.rank("cp") == 0);
  REQUIRE(mesh.group("tp")->size() == 1);
  REQUIRE_THROWS_WITH(mesh.size("mp"),
                      MG_CONTAINS("DeviceMesh::size('mp'): unknown dimension; this mesh has "
                                  "dp=1, tp=1 (names: dp, pp, cp, tp)"));
  REQUIRE_THROWS_WITH(mesh.group("cp"),
                      MG_CONTAINS("DeviceMesh::group('cp'): this mesh (dp=1, tp=1) has no 'cp' "
                                  "dimension; add it with size 1"));
}

#endif  // MINIGRAD_WITH_GLOO
