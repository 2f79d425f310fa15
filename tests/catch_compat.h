// One include for Catch2 2.x (Debian 12) and 3.x (Ubuntu 24.04, the GPU machine).
#pragma once

#if MINIGRAD_CATCH_V3
#include <catch2/catch_all.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif

// REQUIRE_THROWS_WITH(expr, Contains("...")) reads the same under both versions.
#if MINIGRAD_CATCH_V3
using Catch::Matchers::ContainsSubstring;
#define MG_CONTAINS(s) Catch::Matchers::ContainsSubstring(s)
#else
#define MG_CONTAINS(s) Catch::Matchers::Contains(s)
#endif
