// The support library of the sample programs: --devices parsing, the metrics CSV, the
// SVG plot.
#include "catch_compat.h"

#include <minigrad/core/error.h>
#include "../../samples/support/devices.h"
#include "../../samples/support/metrics.h"
#include "../../samples/support/svg_plot.h"

using namespace mg;
using samples::parse_devices;

TEST_CASE("parse_devices: cpu, all, GPU ids, repeats") {
  REQUIRE(parse_devices("cpu", 0) == std::vector<Device>{Device::cpu()});
  REQUIRE(parse_devices("all", 0) == std::vector<Device>{Device::cpu()});
  REQUIRE(parse_devices("all", 2) == std::vector<Device>{Device::cuda(0), Device::cuda(1)});
  REQUIRE(parse_devices("0,1", 2) == std::vector<Device>{Device::cuda(0), Device::cuda(1)});
  REQUIRE(parse_devices(" 1 ", 2) == std::vector<Device>{Device::cuda(1)});
  REQUIRE(parse_devices("cuda:1,0", 2) == std::vector<Device>{Device::cuda(1), Device::cuda(0)});
  REQUIRE(parse_devices("0,0", 1) == std::vector<Device>{Device::cuda(0), Device::cuda(0)});
  REQUIRE(parse_devices("cpu,cpu", 0) == std::vector<Device>{Device::cpu(), Device::cpu()});
  REQUIRE(samples::devices_str({Device::cuda(0), Device::cuda(1)}) == "cuda:0, cuda:1");
}

TEST_CASE("parse_devices: errors say which devices exist") {
  REQUIRE_THROWS_WITH(parse_devices("3", 0),
                      "--devices 3: no CUDA device 3; this machine has 0 CUDA devices "
                      "(available: cpu)");
  REQUIRE_THROWS_WITH(parse_devices("0,2", 2),
                      "--devices 0,2: no CUDA device 2; this machine has 2 CUDA devices "
                      "(available: cpu, 0, 1, all)");
  REQUIRE_THROWS_WITH(parse_devices("cuda:1", 1),
                      MG_CONTAINS("no CUDA device 1; this machine has 1 CUDA device (available"));
  REQUIRE_THROWS_WITH(parse_devices("gpu", 1),
                      MG_CONTAINS("--devices gpu: 'gpu' is not a device; expected cpu, all, or "
                                  "GPU ids such as 0,1 (available: cpu, 0, all)"));
  REQUIRE_THROWS_WITH(parse_devices("0,", 1), MG_CONTAINS("--devices 0,: empty entry"));
  // A build without CUDA has no GPU to offer, whatever the machine holds.
  REQUIRE_THROWS_WITH(parse_devices("0", 0, /*cuda_built=*/false),
                      "--devices 0: no CUDA device 0; minigrad was built without CUDA "
                      "(available: cpu); rebuild it with the CUDA toolkit installed to train "
                      "on GPUs");
  REQUIRE_THROWS_WITH(parse_devices("cuda:1", 4, /*cuda_built=*/false),
                      MG_CONTAINS("minigrad was built without CUDA (available: cpu)"));
  REQUIRE(parse_devices("all", 4, /*cuda_built=*/false) == std::vector<Device>{Device::cpu()});
  REQUIRE_THROWS_WITH(parse_devices("cpu,0", 1),
                      MG_CONTAINS("--devices cpu,0: mixes the CPU and GPUs"));
}

TEST_CASE("metrics CSV: header, rows, and back") {
  const std::vector<samples::EpochMetrics> history{{1, 0.5, 0.45, 0.8312, 6.25},
                                                   {2, 0.375, 0.4, 0.85, 5.5}};
  const std::string csv = samples::metrics_csv(history);
  REQUIRE(csv ==
          "epoch,train_loss,test_loss,test_accuracy,seconds\n"
          "1,0.500000,0.450000,0.8312,6.25\n"
          "2,0.375000,0.400000,0.8500,5.50\n");
  const auto back = samples::parse_metrics_csv(csv, "x.csv");
  REQUIRE(back.size() == 2);
  REQUIRE(back[1].epoch == 2);
  REQUIRE(back[1].test_accuracy == Approx(0.85));
  REQUIRE(samples::parse_metrics_csv(std::string(samples::kMetricsHeader) + "\n", "x").empty());
  REQUIRE_THROWS_WITH(samples::parse_metrics_csv("epoch,loss\n", "x.csv"),
                      MG_CONTAINS("x.csv: line 1 is 'epoch,loss', expected the header"));
  REQUIRE_THROWS_WITH(
      samples::parse_metrics_csv(std::string(samples::kMetricsHeader) + "\n1,2,3\n", "x.csv"),
      MG_CONTAINS("x.csv: line 2 ('1,2,3') is not epoch,train_loss"));
}

TEST_CASE("SVG plot: both panels, every epoch, axis labels and legends") {
  const std::vector<samples::EpochMetrics> history{
      {1, 0.52, 0.44, 0.84, 6}, {2, 0.38, 0.40, 0.855, 6}, {3, 0.34, 0.37, 0.868, 6}};
  const std::string svg = samples::training_plot_svg(history, "MLP <784-256-10> & SGD");
  REQUIRE(svg.rfind("<?xml", 0) == 0);
  REQUIRE_THAT(svg, MG_CONTAINS("</svg>"));
  REQUIRE_THAT(svg, MG_CONTAINS("MLP &lt;784-256-10&gt; &amp; SGD"));  // escaped
  REQUIRE_THAT(svg, MG_CONTAINS(">epoch</text>") && MG_CONTAINS(">loss</text>") &&
                        MG_CONTAINS(">accuracy (%)</text>"));
  REQUIRE_THAT(svg, MG_CONTAINS(">train loss</text>") && MG_CONTAINS(">test loss</text>") &&
                        MG_CONTAINS(">test accuracy</text>"));
  REQUIRE_THAT(svg, MG_CONTAINS("after epoch 3: test accuracy 86.80%"));
  size_t polylines = 0, circles = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1))
    ++polylines;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1))
    ++circles;
  REQUIRE(polylines == 3);
  REQUIRE(circles == 9);  // a dot per epoch on each of the three curves
  // One epoch still draws (a window is opened around the single point).
  REQUIRE_THAT(samples::training_plot_svg({history[0]}, "one"), MG_CONTAINS("<circle"));
  REQUIRE_THROWS_WITH(samples::training_plot_svg({}, "none"), MG_CONTAINS("no epochs to plot"));
}
