// Placements (minigrad/parallel/placement.h): the arithmetic of Replicate, Shard and the
// strided Shard against parts written out by hand; flat ranges; local_part and place_into
// as inverses over every rank of a split; what record_placement keeps, replaces and names;
// and the messages of what does not fit.
#include <set>

#include "catch_compat.h"

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>
#include <minigrad/parallel/placement.h>

using namespace mg;
using namespace mg::parallel;

namespace {

// [rows, cols] holding 0, 1, 2, ... (int64: exact, and place_into copies bytes).
Tensor numbers(int64_t rows, int64_t cols) { return arange(static_cast<double>(rows * cols)).reshape(Shape{rows, cols}); }

DimPlacement on(const std::string& dim, Placement p, int rank, int size) { return {dim, nullptr, rank, size, p, false}; }

std::vector<int64_t> values(const Tensor& t) { return t.contiguous().to_vector<int64_t>(); }

}  // namespace

TEST_CASE("placement: Shard(0) takes rank r's rows, the strided Shard rank r's rows of every block") {
  const Tensor full = numbers(12, 2);
  // Shard(0) over 2: rows 0-5 and 6-11.
  CHECK(values(shard_tensor(full, Placement::shard(0), 1, 2)) ==
        values(numbers(12, 2).narrow(0, 6, 6)));
  // Shard(0, stride 3) over 2 (q, k, v of 4 rows each, 2 heads' rows per rank): rank 1
  // holds rows 2-3 of q, of k and of v, that is rows 2, 3, 6, 7, 10, 11.
  const Tensor strided = shard_tensor(full, Placement::shard(0, 3), 1, 2);
  CHECK(strided.shape() == Shape{6, 2});
  CHECK(values(strided) == std::vector<int64_t>{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23});
  // Shard(1) over 2: columns.
  CHECK(values(shard_tensor(full, Placement::shard(1), 0, 2)) == values(full.narrow(1, 0, 1)));
  CHECK(shard_tensor(full, Placement::replicate(), 1, 2).is_same(full));
  CHECK(sharded_shape(Shape{12, 2}, Placement::shard(0, 3), 2) == Shape{6, 2});
  CHECK(Placement::shard(0, 3).str() == "Shard(0, stride 3)");
  CHECK(Placement::shard(1) == Placement::shard(1));
  CHECK_FALSE(Placement::shard(0, 3) == Placement::shard(0));
  CHECK(Placement::replicate() == Placement{});
  CHECK(on("tp", Placement::shard(0), 1, 2).str() == "tp: Shard(0) (rank 1 of 2)");
}

TEST_CASE("placement: a placement that does not divide, or names no dimension, is an error naming it") {
  REQUIRE_THROWS_WITH(sharded_shape(Shape{8, 6}, Placement::shard(0), 3, "0.weight"),
                      MG_CONTAINS("placement of '0.weight': Shard(0) over 3 ranks does not divide dimension 0 of "
                                  "shape [8, 6] (8 is not a multiple of 3)"));
  // A strided shard must divide every block: 12 rows in 3 blocks over 8 ranks do not.
  REQUIRE_THROWS_WITH(sharded_shape(Shape{12}, Placement::shard(0, 3), 8),
                      MG_CONTAINS("(12 is not a multiple of 24)"));
  REQUIRE_THROWS_WITH(sharded_shape(Shape{4}, Placement::shard(1), 2, "b"),
                      MG_CONTAINS("Shard(1) of a tensor of shape [4] (no dimension 1)"));
}

TEST_CASE("placement: local_part and place_into are inverses over every rank, strided shards and flat ranges too") {
  // tp Shard over 2 ranks, then dp flat ranges over 3 ranks (FSDP x TP), on [12, 4].
  struct Case {
    const char* what;
    Placement tp;
  };
  for (const Case& c : {Case{"Shard(0)", Placement::shard(0)}, Case{"Shard(1)", Placement::shard(1)},
                        Case{"Shard(0, stride 3)", Placement::shard(0, 3)}, Case{"Replicate", Placement::replicate()}}) {
    INFO(c.what);
    const Tensor full = numbers(12, 4);
    // Without a flat range: each tp rank's part, put back, rebuilds the whole.
    Tensor rebuilt = zeros(Shape{12, 4}, DType::Int64);
    for (int r = 0; r < 2; ++r) {
      const ParameterPiece piece{"w", Shape{12, 4}, {on("tp", c.tp, r, 2)}, std::nullopt};
      const Tensor part = local_part(piece, full);
      CHECK(part.shape() == piece.placed_shape());
      CHECK(values(part) == values(shard_tensor(full, c.tp, r, 2)));
      place_into(rebuilt, piece, part);
    }
    CHECK(values(rebuilt) == values(full));
    // With flat ranges of the tp part over 3 ranks, uneven (7 + 7 + the rest), and the
    // pieces at an offset of a flat tensor (local_offset) holding other pieces too.
    rebuilt = zeros(Shape{12, 4}, DType::Int64);
    std::set<int64_t> seen;
    for (int r = 0; r < 2; ++r) {
      const int64_t placed = c.tp.is_replicate() ? 48 : 24;
      for (int64_t begin = 0; begin < placed; begin += 7) {
        const int64_t n = std::min<int64_t>(7, placed - begin);
        ParameterPiece piece{"w", Shape{12, 4}, {on("tp", c.tp, r, 2)}, FlatRange{"dp", nullptr, 0, 1, begin, n, 3}};
        const Tensor part = local_part(piece, full);
        REQUIRE(part.shape() == Shape{n});
        const std::vector<int64_t> got = values(part);
        const std::vector<int64_t> whole_part = values(shard_tensor(full, c.tp, r, 2));
        CHECK(got == std::vector<int64_t>(whole_part.begin() + begin, whole_part.begin() + begin + n));
        // The piece's values inside a flat tensor that holds more: at local_offset 3.
        Tensor flat = zeros(Shape{n + 5}, DType::Int64);
        ops::copy_(piece_values(piece, flat), part);
        CHECK(values(flat.narrow(0, 3, n)) == got);
        place_into(rebuilt, piece, part);
        if (!c.tp.is_replicate() || r == 0) seen.insert(got.begin(), got.end());
      }
    }
    CHECK(values(rebuilt) == values(full));
    CHECK(seen.size() == 48u);  // every element in some piece once (rank 0's, for Replicate)
  }
}

TEST_CASE("placement: local_part and place_into refuse what does not fit, naming the piece") {
  const ParameterPiece piece{"0.weight", Shape{8, 6}, {on("tp", Placement::shard(0), 1, 3)}, std::nullopt};
  REQUIRE_THROWS_WITH(local_part(piece, numbers(8, 6)),
                      MG_CONTAINS("placement of '0.weight': Shard(0) over 3 ranks does not divide dimension 0"));
  const ParameterPiece fits{"0.weight", Shape{8, 6}, {on("tp", Placement::shard(0), 1, 2)}, std::nullopt};
  REQUIRE_THROWS_WITH(local_part(fits, numbers(6, 8)),
                      MG_CONTAINS("local_part: 0.weight [8, 6], tp: Shard(0) (rank 1 of 2) is [8, 6] on one device, "
                                  "got a tensor of [6, 8]"));
  Tensor full = numbers(8, 6);
  REQUIRE_THROWS_WITH(place_into(full, fits, numbers(3, 6)), MG_CONTAINS("this rank's part has 24 elements"));
  const ParameterPiece bad_rank{"b", Shape{4}, {on("tp", Placement::shard(0), 2, 2)}, std::nullopt};
  REQUIRE_THROWS_WITH(local_part(bad_rank, numbers(1, 4).reshape(Shape{4})),
                      MG_CONTAINS("placement of 'b' on tp: rank 2 of 2"));
  const ParameterPiece outside{"b", Shape{4}, {}, FlatRange{"dp", nullptr, 0, 2, 2, 3, 0}};
  REQUIRE_THROWS_WITH(local_part(outside, numbers(1, 4).reshape(Shape{4})),
                      MG_CONTAINS("a flat range [2, 5) of 4 elements"));
  REQUIRE_THROWS_WITH(piece_values(outside, zeros(Shape{2})),
                      MG_CONTAINS("sits at [0, 3) of this rank's flat tensor, which has 2 elements"));
}

TEST_CASE("placement: record_placement appends, keeps a dimension recorded again alike, keeps and fills names, "
          "and replace_placement changes one") {
  const Tensor shard = zeros(Shape{4, 6});
  record_placement(shard, "", Shape{8, 6}, on("tp", Placement::shard(0), 1, 2));
  REQUIRE(spec_of(shard) != nullptr);
  CHECK(spec_of(shard)->pieces[0].name.empty());  // the layer does not know it
  const Tensor handle = shard;                     // a copy of the handle sees every change
  record_placement(shard, "0.weight", Shape{4, 6}, on("dp", Placement::replicate(), 1, 3));
  ParameterPiece piece = spec_of(handle)->pieces[0];
  CHECK(piece.name == "0.weight");  // filled
  CHECK(piece.shape == Shape{8, 6});  // kept: the single-device shape
  CHECK(piece.str() == "0.weight [8, 6], tp: Shard(0) (rank 1 of 2), dp: Replicate() (rank 1 of 3)");
  CHECK_FALSE(piece.counted_here());  // dp rank 1 holds a replica
  // The layer and the style that made it both record tp: alike, one placement; no renaming.
  record_placement(shard, "module.0.weight", Shape{8, 6}, on("tp", Placement::shard(0), 1, 2));
  piece = spec_of(shard)->pieces[0];
  CHECK(piece.name == "0.weight");
  CHECK(piece.placements.size() == 2u);
  REQUIRE_THROWS_WITH(record_placement(shard, "", Shape{8, 6}, on("tp", Placement::shard(0), 0, 2)),
                      MG_CONTAINS("record_placement of '0.weight': placed on tp already as tp: Shard(0) (rank 1 of "
                                  "2); now asked tp: Shard(0) (rank 0 of 2)"));
  // Sequence parallelism switched on: the same dimension, now with a Partial gradient, in
  // its place in the order.
  DimPlacement partial = on("tp", Placement::shard(0), 1, 2);
  partial.partial_gradient = true;
  replace_placement(shard, partial);
  CHECK(spec_of(shard)->pieces[0].placements[0].str() == "tp: Shard(0), gradient Partial (rank 1 of 2)");
  CHECK(spec_of(shard)->pieces[0].placements.size() == 2u);
  REQUIRE_THROWS_WITH(replace_placement(shard, on("tp", Placement::shard(1), 1, 2)),
                      MG_CONTAINS("replace_placement of '0.weight': [8, 6] placed as tp: Shard(1) (rank 1 of 2) "
                                  "would be [8, 3] on this rank, but the tensor is [4, 6]"));

  REQUIRE_THROWS_WITH(record_placement(zeros(Shape{4, 6}), "w", Shape{8, 6}, on("tp", Placement::shard(1), 0, 2)),
                      MG_CONTAINS("record_placement of 'w': [8, 6] placed as tp: Shard(1) (rank 0 of 2) would be [8, 3] on this rank, "
                                  "but the tensor is [4, 6]"));
  REQUIRE_THROWS_WITH(record_placement(zeros(Shape{8, 6}), "w", Shape{8, 6}, on("tp", Placement::shard(0), 0, 3)),
                      MG_CONTAINS("Shard(0) over 3 ranks does not divide dimension 0 of shape [8, 6]"));
  const Tensor flat = zeros(Shape{5});
  set_spec(flat, {ParameterPiece{"b", Shape{5}, {}, FlatRange{"dp", nullptr, 0, 1, 0, 5, 0}}});
  REQUIRE_THROWS_WITH(record_placement(flat, "b", Shape{5}, on("tp", Placement::replicate(), 0, 2)),
                      MG_CONTAINS("is a flat shard"));
}

TEST_CASE("placement: name_placements names what has no name and never renames, and pieces_of reads any tensor") {
  const Tensor unnamed = zeros(Shape{2, 3});
  record_placement(unnamed, "", Shape{2, 6}, on("tp", Placement::shard(1), 0, 2));
  const Tensor named = zeros(Shape{3});
  record_placement(named, "kept", Shape{3}, on("tp", Placement::replicate(), 0, 2));
  const Tensor plain = zeros(Shape{4});
  name_placements({{"a.weight", unnamed}, {"a.bias", named}, {"b", plain}});
  CHECK(spec_of(unnamed)->pieces[0].name == "a.weight");
  CHECK(spec_of(named)->pieces[0].name == "kept");
  REQUIRE(spec_of(plain) != nullptr);  // a whole tensor, now named
  CHECK(spec_of(plain)->pieces[0].str() == "b [4]");
  CHECK(spec_of(plain)->pieces[0].counted_here());

  const std::vector<ParameterPiece> whole = pieces_of(zeros(Shape{2}), "given");
  REQUIRE(whole.size() == 1u);
  CHECK(whole[0].str() == "given [2]");
  const Tensor anonymous = zeros(Shape{2});
  record_placement(anonymous, "", Shape{4}, on("tp", Placement::shard(0), 1, 2));
  CHECK(pieces_of(anonymous, "from the caller")[0].name == "from the caller");
  CHECK(pieces_of(named, "from the caller")[0].name == "kept");
}

TEST_CASE("placement: the tensor-parallel layers record their placements, parallelize_mlp names them") {
  manual_seed(3);
  auto plain = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(6, 4),
      std::make_shared<nn::Linear>(4, 2)});
  auto group = std::make_shared<InProcessGroup>(std::vector<Device>(2, Device::cpu()));
  auto shard = parallelize_mlp(*plain, group->rank(1));
  std::vector<std::string> seen;
  for (const auto& [name, p] : shard->named_parameters()) seen.push_back(spec_of(p)->pieces[0].str());
  CHECK(seen == std::vector<std::string>{
                    "0.weight [6, 4], tp: Shard(0) (rank 1 of 2)", "0.bias [6], tp: Shard(0) (rank 1 of 2)",
                    "2.weight [4, 6], tp: Shard(1) (rank 1 of 2)", "2.bias [4], tp: Replicate() (rank 1 of 2)",
                    "3.weight [2, 4], tp: Replicate() (rank 1 of 2)", "3.bias [2], tp: Replicate() (rank 1 of 2)"});
  CHECK(spec_of(shard->parameters()[0])->pieces[0].placements[0].group == nullptr);  // threads of one process
  // Sequence parallelism: the row layer's bias gets a Partial gradient.
  auto row = std::static_pointer_cast<nn::RowParallelLinear>((*shard)[2]);
  row->set_sequence_parallel(true);
  CHECK(spec_of(row->bias())->pieces[0].str() == "2.bias [4], tp: Replicate(), gradient Partial (rank 1 of 2)");
  row->set_sequence_parallel(false);
  CHECK_FALSE(spec_of(row->bias())->pieces[0].placements[0].partial_gradient);
  // The vocabulary-parallel embedding: rows.
  nn::Embedding table(8, 3);
  nn::VocabParallelEmbedding vocab(table, group->rank(0));
  CHECK(spec_of(vocab.weight())->pieces[0].str() == "(unnamed) [8, 3], tp: Shard(0) (rank 0 of 2)");
}
