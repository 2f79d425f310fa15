// The support library of the sample programs: the command line's policy on a flag given
// twice, --devices parsing, the metrics CSV, the SVG plot.
#include "catch_compat.h"

#include <minigrad/core/error.h>
#include "../../samples/support/command_line.h"
#include "../../samples/support/devices.h"
#include "../../samples/support/metrics.h"
#include "../../samples/support/svg_plot.h"

using namespace mg;
using samples::parse_devices;

// torchrun's and nanoGPT's users override a script's flag by giving it again: the last
// value wins, where CLI11 refuses ("At Most 1 required but received 2"); an option of
// several values keeps every one, and every value given is still checked.
TEST_CASE("parse_command_line: a flag given twice takes its last value, a list keeps them all") {
  const auto parse = [](CLI::App& app, std::vector<std::string> args) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return samples::parse_command_line(app, "prog", static_cast<int>(argv.size()), argv.data());
  };
  CLI::App app{"test"};
  int64_t iters = 0;
  std::string name;
  std::vector<int64_t> hidden;
  bool flag = false;
  app.add_option("--iters", iters)->check(samples::positive_integer());
  app.add_option("--name", name);
  app.add_option("--hidden", hidden)->delimiter(',');
  app.add_flag("--flag", flag);
  REQUIRE_FALSE(parse(app, {"--iters", "100000", "--name", "a", "--hidden", "64,32", "--flag",
                            "--iters", "2", "--name=b", "--hidden", "16", "--flag"})
                    .has_value());
  REQUIRE(iters == 2);
  REQUIRE(name == "b");
  REQUIRE(hidden == std::vector<int64_t>{64, 32, 16});
  REQUIRE(flag);
  // Every value given is still checked, not only the last.
  CLI::App strict{"test"};
  strict.add_option("--iters", iters)->check(samples::positive_integer());
  REQUIRE(parse(strict, {"--iters", "0", "--iters", "2"}) == samples::kExitBadOption);
}

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
