// ProcessGroupGloo::new_group on 4 forked ranks: a 2 x 2 mesh's row and column groups
// with collectives and messages on both at once, groups of sub-groups, a group of one;
// the checks of the ranks, and ranks that were given different lists.
#ifdef MINIGRAD_WITH_GLOO

#include "catch_compat.h"
#include "multiprocess.h"

#include <minigrad/parallel/c10d/gloo/process_group_gloo.h>

using namespace mg;
using namespace mg::parallel;
using namespace mg::test;
using namespace std::chrono_literals;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

float first(const Tensor& t) { return t.contiguous().to_vector<float>()[0]; }

}  // namespace

TEST_CASE("ProcessGroupGloo: a 2 x 2 mesh of sub-groups, collectives on rows and columns at once") {
  auto results = run_ranks(4, [](RankContext& ctx) {
    auto world = ctx.gloo();
    const int me = ctx.rank;  // me = 2 * row + column
    // Every rank makes every group, in the same order; each keeps the two it is in.
    std::shared_ptr<ProcessGroup> row, column;
    for (int r = 0; r < 2; ++r)
      if (auto g = world->new_group({2 * r, 2 * r + 1})) row = g;
    for (int c = 0; c < 2; ++c)
      if (auto g = world->new_group({c, c + 2})) column = g;
    MG_CHECK(row && column, "rank {} is in no row or column group", me);
    ctx.report("row", std::vector<float>{static_cast<float>(row->rank()),
                                         static_cast<float>(row->size())});
    ctx.report("column", std::vector<float>{static_cast<float>(column->rank()),
                                            static_cast<float>(column->size())});

    // All in flight before any wait, on three groups: row and column allreduces of the
    // same sizes interleaved (the same collective numbers on both: their tags would mix
    // if the groups shared connections), a world allreduce between them.
    std::vector<Tensor> on_row, on_column;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 3; ++k) {
      on_row.push_back(full(Shape{1000}, (me + 1) * (k + 1)));
      works.push_back(row->allreduce(on_row.back()));
      on_column.push_back(full(Shape{1000}, 10 * (me + 1) * (k + 1)));
      works.push_back(column->allreduce(on_column.back()));
    }
    Tensor everyone = full(Shape{1000}, 100 * (me + 1));
    works.push_back(world->allreduce(everyone));
    // A reduce_scatter on the row, an all_gather on the column.
    Tensor scattered = empty(Shape{3});
    works.push_back(row->reduce_scatter(scattered, full(Shape{6}, me + 1)));
    Tensor gathered = empty(Shape{2});
    works.push_back(column->all_gather(gathered, full(Shape{1}, me)));
    // Messages of tag 0 on both: rank 0 to 1 (row) and to 2 (column), rank 3 takes one
    // from 2 (row) and one from 1 (column). Peers are ranks of the sub-group.
    Tensor from_row = empty(Shape{2}), from_column = empty(Shape{2});
    works.push_back(row->send(full(Shape{2}, 1000 + me), 1 - row->rank()));
    works.push_back(row->recv(from_row, 1 - row->rank()));
    works.push_back(column->send(full(Shape{2}, 2000 + me), 1 - column->rank()));
    works.push_back(column->recv(from_column, 1 - column->rank()));
    for (auto& w : works) w->wait();
    std::vector<float> values;
    for (const Tensor& t : on_row) values.push_back(first(t));
    for (const Tensor& t : on_column) values.push_back(first(t));
    values.push_back(first(everyone));
    values.push_back(first(scattered));
    for (float v : gathered.to_vector<float>()) values.push_back(v);
    values.push_back(first(from_row));
    values.push_back(first(from_column));
    ctx.report("values", values);

    // Groups of sub-groups: g = {1, 2, 3}; in it, h = g's {0, 2} (world ranks 1 and 3)
    // and one = g's {1} (world rank 2), a group of one.
    auto g = world->new_group({1, 2, 3});
    ctx.report("in g", std::vector<float>{g ? 1.0f : 0.0f});
    if (g) {
      auto h = g->new_group({0, 2});
      auto one = g->new_group({1});
      std::vector<float> nested{static_cast<float>(g->rank()),
                                h ? static_cast<float>(h->rank()) : -1.0f,
                                one ? static_cast<float>(one->size()) : -1.0f};
      if (h) {
        Tensor t = full(Shape{3}, me + 1);
        h->allreduce(t)->wait();
        nested.push_back(first(t));
        // A sub-group of a sub-group of a sub-group.
        auto hh = h->new_group({0, 1});
        Tensor u = full(Shape{1}, me);
        hh->allreduce(u)->wait();
        nested.push_back(first(u));
      }
      if (one) {
        Tensor t = full(Shape{3}, 7);
        one->allreduce(t)->wait();
        nested.push_back(first(t));
      }
      ctx.report("nested", nested);
    }
    world->barrier()->wait();  // nobody leaves while another still talks to it
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    const int me = r.rank, row = me / 2, column = me % 2;
    CHECK(r.floats("row") == std::vector<float>{static_cast<float>(column), 2.0f});
    CHECK(r.floats("column") == std::vector<float>{static_cast<float>(row), 2.0f});
    // Row sums of (rank + 1): 1 + 2 = 3 and 3 + 4 = 7; columns: 1 + 3 = 4, 2 + 4 = 6.
    const float row_sum = row == 0 ? 3.0f : 7.0f;
    const float column_sum = column == 0 ? 4.0f : 6.0f;
    const int partner_in_row = me ^ 1, partner_in_column = me ^ 2;
    std::vector<float> expected;
    for (int k = 0; k < 3; ++k) expected.push_back(row_sum * (k + 1));
    for (int k = 0; k < 3; ++k) expected.push_back(10 * column_sum * (k + 1));
    expected.push_back(1000.0f);
    expected.push_back(row_sum);                         // reduce_scatter
    expected.push_back(static_cast<float>(column));      // all_gather: column rank 0
    expected.push_back(static_cast<float>(column + 2));  // and 1
    expected.push_back(1000.0f + static_cast<float>(partner_in_row));
    expected.push_back(2000.0f + static_cast<float>(partner_in_column));
    CHECK(r.floats("values") == expected);
    CHECK(r.floats("in g") == std::vector<float>{me == 0 ? 0.0f : 1.0f});
  }
  // g's ranks: world 1, 2, 3 are 0, 1, 2; h = world {1, 3}, one = world {2}.
  CHECK(results[1].floats("nested") == std::vector<float>{0, 0, -1, 6, 4});
  CHECK(results[2].floats("nested") == std::vector<float>{1, -1, 1, 7});
  CHECK(results[3].floats("nested") == std::vector<float>{2, 1, -1, 6, 4});
}

TEST_CASE("ProcessGroupGloo: new_group checks its ranks, and that every member got the same") {
  auto results = run_ranks(2, [](RankContext& ctx) {
    auto pg = ctx.gloo(5s);
    ctx.report("empty", error_of([&] { pg->new_group({}); }));
    ctx.report("unsorted", error_of([&] { pg->new_group({1, 0}); }));
    ctx.report("repeated", error_of([&] { pg->new_group({0, 0}); }));
    ctx.report("outside", error_of([&] { pg->new_group({0, 2}); }));
    // The checks came first: no sub-group was numbered, so these still agree.
    auto both = pg->new_group({0, 1});
    both->barrier()->wait();
    // Rank 0 is given {0, 1}, rank 1 only {1}: rank 0 finds out from what rank 1 wrote.
    if (ctx.rank == 0) {
      ctx.report("disagree", error_of([&] { pg->new_group({0, 1}); }));
      ctx.store->set("rank 0 checked", "1");
    } else {
      auto alone = pg->new_group({1});
      ctx.report("alone", std::vector<float>{static_cast<float>(alone ? alone->size() : 0)});
      ctx.store->wait({"rank 0 checked"}, 60s);
    }
  });
  INFO(describe(results));
  for (const RankResult& r : results) {
    REQUIRE(r.ok());
    CHECK_THAT(r.text("empty"), MG_CONTAINS("new_group (gloo): the list of ranks is empty"));
    CHECK_THAT(r.text("unsorted"),
               MG_CONTAINS("new_group (gloo): the ranks [1, 0] must be sorted and distinct"));
    CHECK_THAT(r.text("repeated"), MG_CONTAINS("the ranks [0, 0] must be sorted and distinct"));
    CHECK_THAT(r.text("outside"),
               MG_CONTAINS("new_group (gloo): rank 2 of [0, 2] is outside this group's [0, 2)"));
  }
  CHECK_THAT(results[0].text("disagree"),
             MG_CONTAINS("new_group (gloo): rank 0 was given the ranks [0, 1], but rank 1 was "
                         "given [1]: every rank must call new_group in the same order, with the "
                         "same ranks"));
  CHECK(results[1].floats("alone") == std::vector<float>{1.0f});
}

#endif  // MINIGRAD_WITH_GLOO
