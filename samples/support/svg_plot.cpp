#include "svg_plot.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/core/files.h>

namespace mg::samples {

namespace {

constexpr double kWidth = 960, kHeight = 420;
constexpr const char* kFont = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

struct Series {
  std::string name;
  std::string color;
  std::vector<double> x, y;
};

// Tick positions covering [lo, hi] at a "nice" step (1, 2 or 5 times a power of ten),
// about `target` of them; lo and hi are widened to whole steps.
struct Axis {
  double lo, hi, step;
};

Axis nice_axis(double lo, double hi, int target, bool integer) {
  if (!(hi > lo)) {  // one value (or none): open a window around it
    const double pad = std::max(std::abs(lo) * 0.1, integer ? 1.0 : 0.05);
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  if (integer) step = std::max(1.0, std::round(step));
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

std::string number(double v, double step) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fmt::format("{:.{}f}", v, decimals);
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// One chart in the rectangle (left, top, width, height): frame, grid, ticks, axis
// labels, the series as lines with a dot per epoch, and a legend in the top right.
// The legend goes where the curves usually are not: top right for falling curves
// (losses), bottom right for rising ones (accuracy).
enum class Legend { TopRight, BottomRight };

std::string panel(double left, double top, double width, double height, const std::string& title,
                  const std::string& y_label, const std::vector<Series>& series, Axis xa, Axis ya,
                  Legend legend, const std::string& x_label = "epoch") {
  std::string svg;
  auto px = [&](double x) { return left + (x - xa.lo) / (xa.hi - xa.lo) * width; };
  auto py = [&](double y) { return top + height - (y - ya.lo) / (ya.hi - ya.lo) * height; };

  svg += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"15\" "
                     "font-weight=\"bold\" {}>{}</text>\n",
                     left + width / 2, top - 12, kFont, escape(title));
  svg += fmt::format("  <rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                     "fill=\"#ffffff\" stroke=\"#444444\" stroke-width=\"1\"/>\n",
                     left, top, width, height);
  // Grid lines and tick labels.
  for (double y = ya.lo; y <= ya.hi + ya.step * 1e-6; y += ya.step) {
    svg += fmt::format("  <line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                       "stroke=\"#e0e0e0\"/>\n",
                       left, py(y), left + width, py(y));
    svg += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"12\" "
                       "{}>{}</text>\n",
                       left - 6, py(y) + 4, kFont, number(y, ya.step));
  }
  for (double x = xa.lo; x <= xa.hi + xa.step * 1e-6; x += xa.step) {
    svg += fmt::format("  <line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                       "stroke=\"#e0e0e0\"/>\n",
                       px(x), top, px(x), top + height);
    svg += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"12\" "
                       "{}>{}</text>\n",
                       px(x), top + height + 16, kFont, number(x, xa.step));
  }
  svg += fmt::format("  <rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                     "fill=\"none\" stroke=\"#444444\" stroke-width=\"1\"/>\n",
                     left, top, width, height);
  // Axis labels.
  svg += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\" "
                     "{}>{}</text>\n",
                     left + width / 2, top + height + 36, kFont, escape(x_label));
  svg += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\" "
                     "transform=\"rotate(-90 {:.1f} {:.1f})\" {}>{}</text>\n",
                     left - 48, top + height / 2, left - 48, top + height / 2, kFont,
                     escape(y_label));
  // The curves.
  for (const Series& s : series) {
    std::string points;
    for (size_t i = 0; i < s.x.size(); ++i)
      points += fmt::format("{}{:.1f},{:.1f}", i == 0 ? "" : " ", px(s.x[i]), py(s.y[i]));
    svg += fmt::format("  <polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\" "
                       "stroke-linejoin=\"round\"/>\n",
                       points, s.color);
    for (size_t i = 0; i < s.x.size(); ++i)
      svg += fmt::format("  <circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>\n",
                         px(s.x[i]), py(s.y[i]), s.color);
  }
  // Legend, inside the frame.
  const double legend_w = 130, row = 20;
  const double legend_h = row * static_cast<double>(series.size()) + 8;
  const double lx = left + width - legend_w - 10;
  const double ly = legend == Legend::TopRight ? top + 10 : top + height - legend_h - 10;
  svg += fmt::format("  <rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
                     "fill=\"#ffffff\" fill-opacity=\"0.9\" stroke=\"#aaaaaa\"/>\n",
                     lx, ly, legend_w, legend_h);
  for (size_t i = 0; i < series.size(); ++i) {
    const double y = ly + 4 + row * (static_cast<double>(i) + 0.5);
    svg += fmt::format("  <line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                       "stroke=\"{}\" stroke-width=\"2.5\"/>\n",
                       lx + 8, y, lx + 32, y, series[i].color);
    svg += fmt::format("  <text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" {}>{}</text>\n", lx + 40,
                       y + 4, kFont, escape(series[i].name));
  }
  return svg;
}

}  // namespace

std::string training_plot_svg(const std::vector<EpochMetrics>& history, const std::string& title) {
  MG_CHECK(!history.empty(), "training_plot_svg: no epochs to plot");
  Series train{"train loss", "#1f77b4", {}, {}}, test{"test loss", "#ff7f0e", {}, {}},
      accuracy{"test accuracy", "#2ca02c", {}, {}};
  for (const EpochMetrics& m : history) {
    train.x.push_back(m.epoch);
    train.y.push_back(m.train_loss);
    test.x.push_back(m.epoch);
    test.y.push_back(m.test_loss);
    accuracy.x.push_back(m.epoch);
    accuracy.y.push_back(100.0 * m.test_accuracy);
  }
  const auto [x_lo, x_hi] = std::minmax_element(train.x.begin(), train.x.end());
  const Axis xa = nice_axis(*x_lo, *x_hi, 8, true);
  double loss_lo = std::min(*std::min_element(train.y.begin(), train.y.end()),
                            *std::min_element(test.y.begin(), test.y.end()));
  double loss_hi = std::max(*std::max_element(train.y.begin(), train.y.end()),
                            *std::max_element(test.y.begin(), test.y.end()));
  const Axis loss_axis = nice_axis(std::max(0.0, loss_lo), loss_hi, 6, false);
  const auto [acc_lo, acc_hi] = std::minmax_element(accuracy.y.begin(), accuracy.y.end());
  Axis acc_axis = nice_axis(*acc_lo, *acc_hi, 6, false);
  acc_axis.lo = std::max(acc_axis.lo, 0.0);
  acc_axis.hi = std::min(acc_axis.hi, 100.0);
  if (!(acc_axis.hi > acc_axis.lo)) acc_axis = {acc_axis.hi - acc_axis.step, acc_axis.hi, acc_axis.step};

  const EpochMetrics& last = history.back();
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\">\n"
      "  <rect width=\"{0}\" height=\"{1}\" fill=\"#fafafa\"/>\n"
      "  <text x=\"{2}\" y=\"26\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\" "
      "{3}>{4}</text>\n"
      "  <text x=\"{2}\" y=\"46\" text-anchor=\"middle\" font-size=\"12\" fill=\"#555555\" "
      "{3}>after epoch {5}: test accuracy {6:.2f}%, test loss {7:.4f}</text>\n",
      kWidth, kHeight, kWidth / 2, kFont, escape(title), last.epoch, 100.0 * last.test_accuracy,
      last.test_loss);
  svg += panel(80, 90, 360, 270, "Loss (cross-entropy)", "loss", {train, test}, xa, loss_axis,
               Legend::TopRight);
  svg += panel(570, 90, 360, 270, "Test accuracy", "accuracy (%)", {accuracy}, xa, acc_axis,
               Legend::BottomRight);
  svg += "</svg>\n";
  return svg;
}

std::string loss_plot_svg(const std::vector<LossPoint>& points, const std::string& x_label,
                          const std::string& title) {
  MG_CHECK(!points.empty(), "loss_plot_svg: no points to plot");
  Series train{"train loss", "#1f77b4", {}, {}}, val{"val loss", "#ff7f0e", {}, {}};
  for (const LossPoint& p : points) {
    train.x.push_back(p.x);
    train.y.push_back(p.train_loss);
    val.x.push_back(p.x);
    val.y.push_back(p.val_loss);
  }
  const Axis xa = nice_axis(train.x.front(), train.x.back(), 8, true);
  const double lo = std::min(*std::min_element(train.y.begin(), train.y.end()),
                             *std::min_element(val.y.begin(), val.y.end()));
  const double hi = std::max(*std::max_element(train.y.begin(), train.y.end()),
                             *std::max_element(val.y.begin(), val.y.end()));
  const Axis ya = nice_axis(std::max(0.0, lo), hi, 6, false);
  const LossPoint& last = points.back();
  const double width = 640;
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\">\n"
      "  <rect width=\"{0}\" height=\"{1}\" fill=\"#fafafa\"/>\n"
      "  <text x=\"{2}\" y=\"26\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\" "
      "{3}>{4}</text>\n"
      "  <text x=\"{2}\" y=\"46\" text-anchor=\"middle\" font-size=\"12\" fill=\"#555555\" "
      "{3}>at {5} {6}: train loss {7:.4f}, val loss {8:.4f}</text>\n",
      width, kHeight, width / 2, kFont, escape(title), escape(x_label), last.x, last.train_loss,
      last.val_loss);
  svg += panel(90, 90, 500, 270, "Loss (cross-entropy)", "loss", {train, val}, xa, ya,
               Legend::TopRight, x_label);
  svg += "</svg>\n";
  return svg;
}

void write_loss_plot(const std::string& path, const std::vector<LossPoint>& points,
                     const std::string& x_label, const std::string& title) {
  files::write_atomically("write_loss_plot", path, loss_plot_svg(points, x_label, title));
}

void write_training_plot(const std::string& path, const std::vector<EpochMetrics>& history,
                         const std::string& title) {
  files::write_atomically("write_training_plot", path, training_plot_svg(history, title));
}

}  // namespace mg::samples
