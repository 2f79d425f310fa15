// build/bin/train_fashion_mnist run as a user runs it, on a small synthetic dataset
// written as IDX files in a temporary directory: the files it writes, resuming, and the
// messages for bad input.
#include "catch_compat.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <minigrad/cuda/cuda.h>

#include "data/synthetic_fashion_mnist.h"
#include "samples/run_program.h"
#include "temp_dir.h"

using mg::testing::run_program;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_fashion_mnist");

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A run small enough for CI: 300 training and 100 test images, one small hidden layer.
std::string small_run(const std::string& data_dir) {
  return kProgram + " --data-dir " + data_dir + " --hidden 32 --batch-size 50";
}

}  // namespace

TEST_CASE("train_fashion_mnist: one epoch writes the metrics CSV, the SVG plot and a checkpoint") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  const auto run = run_program(small_run(dir.path()) + " --epochs 1 --metrics " + (dir / "m.csv") +
                               " --plot " + (dir / "p.svg") + " --save " + (dir / "ck.safetensors"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  // Not a terminal: plain per-epoch lines, no progress bar.
  REQUIRE_THAT(run.output, MG_CONTAINS("epoch  1/1  train_loss "));
  REQUIRE_THAT(run.output, MG_CONTAINS("test_accuracy "));
  REQUIRE(run.output.find('\r') == std::string::npos);
  // One epoch, in the singular.
  REQUIRE_THAT(run.output, MG_CONTAINS(", 1 epoch, seed 1\n") && MG_CONTAINS(" after 1 epoch ("));
  REQUIRE(run.output.find("1 epochs") == std::string::npos);

  const auto csv = lines(read_text(dir / "m.csv"));
  REQUIRE(csv.size() == 2);
  REQUIRE(csv[0] == "epoch,train_loss,test_loss,test_accuracy,seconds");
  REQUIRE(csv[1].rfind("1,", 0) == 0);
  // The synthetic classes are easy: one epoch should beat chance by far.
  double accuracy = 0;
  REQUIRE(std::sscanf(csv[1].c_str(), "%*d,%*f,%*f,%lf", &accuracy) == 1);
  REQUIRE(accuracy > 0.5);

  const std::string svg = read_text(dir / "p.svg");
  REQUIRE(svg.rfind("<?xml", 0) == 0);
  REQUIRE_THAT(svg, MG_CONTAINS("<svg") && MG_CONTAINS("</svg>") && MG_CONTAINS("<polyline") &&
                        MG_CONTAINS("test accuracy"));
  REQUIRE(std::filesystem::file_size(dir / "ck.safetensors") > 1000);
}

TEST_CASE("train_fashion_mnist: --resume continues after the saved epoch") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string ck = dir / "ck.safetensors";
  // A constant learning rate: the cosine schedule spans --epochs, so stopping a
  // 1-epoch run and extending it to 2 anneals differently from a 2-epoch run.
  const std::string flags = small_run(dir.path()) + " --lr-schedule constant";
  const auto first = run_program(flags + " --epochs 1 --save " + ck);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto second = run_program(flags + " --epochs 2 --resume " + ck +
                                  " --metrics " + (dir / "m.csv"));
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  REQUIRE_THAT(second.output, MG_CONTAINS("resumed from " + ck + " after epoch 1"));
  REQUIRE_THAT(second.output, MG_CONTAINS("epoch  2/2"));
  REQUIRE(second.output.find("epoch  1/2") == std::string::npos);
  // The CSV covers the whole run: epoch 1 came from the checkpoint.
  const auto csv = lines(read_text(dir / "m.csv"));
  REQUIRE(csv.size() == 3);
  REQUIRE(csv[1].rfind("1,", 0) == 0);
  REQUIRE(csv[2].rfind("2,", 0) == 0);
  // Same weights, momentum, shuffling and learning-rate schedule as a run that was never
  // stopped: epoch 2's numbers match it to the last printed digit (all but the seconds).
  const auto straight = run_program(flags + " --epochs 2 --metrics " +
                                    (dir / "straight.csv"));
  REQUIRE(straight.exit_code == 0);
  const auto without_seconds = [](const std::string& row) { return row.substr(0, row.rfind(',')); };
  REQUIRE(without_seconds(lines(read_text(dir / "straight.csv"))[2]) == without_seconds(csv[2]));

  const auto mismatch = run_program(kProgram + " --data-dir " + dir.path() +
                                    " --hidden 64 --epochs 3 --resume " + ck);
  REQUIRE(mismatch.exit_code != 0);
  REQUIRE_THAT(mismatch.output, MG_CONTAINS("--resume " + ck + ": the checkpoint's model has "
                                            "hidden layers 32 but --hidden is 64"));
}

TEST_CASE("train_fashion_mnist --optimizer adamw: one epoch learns, with its defaults or flags") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  const auto run = run_program(small_run(dir.path()) + " --epochs 1 --optimizer adamw --metrics " +
                               (dir / "m.csv"));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("AdamW lr 0.001 (cosine) weight_decay 0.01, batch size 50"));
  const auto csv = lines(read_text(dir / "m.csv"));
  REQUIRE(csv.size() == 2);
  double accuracy = 0;
  REQUIRE(std::sscanf(csv[1].c_str(), "%*d,%*f,%*f,%lf", &accuracy) == 1);
  REQUIRE(accuracy > 0.5);

  const auto tuned = run_program(small_run(dir.path()) + " --epochs 1 --optimizer adamw --lr "
                                 "0.003 --weight-decay 0.1 --lr-schedule constant");
  INFO(tuned.output);
  REQUIRE(tuned.exit_code == 0);
  REQUIRE_THAT(tuned.output, MG_CONTAINS("AdamW lr 0.003 (constant) weight_decay 0.1"));
  const auto sgd = run_program(small_run(dir.path()) + " --epochs 1 --weight-decay 1e-4");
  INFO(sgd.output);
  REQUIRE(sgd.exit_code == 0);
  REQUIRE_THAT(sgd.output, MG_CONTAINS("SGD lr 0.05 (cosine) momentum 0.9 weight_decay 0.0001"));
}

TEST_CASE("train_fashion_mnist: --optimizer and its flags refuse what they cannot take") {
  auto run = run_program(kProgram + " --optimizer adam");
  INFO(run.output);
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("--optimizer: adam not in {sgd,adamw}"));
  run = run_program(kProgram + " --optimizer adamw --momentum 0.5");
  INFO(run.output);
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: --momentum is SGD's"));
  run = run_program(kProgram + " --optimizer adamw --weight-decay -1");
  REQUIRE(run.exit_code == 2);
  REQUIRE_THAT(run.output, MG_CONTAINS("--weight-decay"));
}

TEST_CASE("train_fashion_mnist: bad flag values are refused by CLI11") {
  for (const char* flags : {"--epochs abc", "--epochs 0", "--batch-size -4", "--lr -0.1",
                            "--hidden 256,x", "--no-such-flag"}) {
    const auto run = run_program(kProgram + " " + flags);
    INFO(flags << "\n" << run.output);
    REQUIRE(run.exit_code != 0);
    const std::string flag = std::string(flags).substr(0, std::string(flags).find(' '));
    REQUIRE_THAT(run.output, MG_CONTAINS(flag));
    REQUIRE(run.output.find("train_loss") == std::string::npos);
  }
}

TEST_CASE("train_fashion_mnist: --devices with a GPU that does not exist says which devices do") {
  const int gpus = mg::cuda::device_count();
  const int missing = gpus <= 3 ? 3 : gpus;
  const auto run = run_program(kProgram + " --devices " + std::to_string(missing));
  INFO(run.output);
  REQUIRE(run.exit_code == 2);
  std::string available = "cpu";
  for (int i = 0; i < gpus; ++i) available += ", " + std::to_string(i);
  if (gpus > 0) available += ", all";
  const std::string why =
      mg::cuda::is_built()
          ? "this machine has " + std::to_string(gpus) + " CUDA device" + (gpus == 1 ? "" : "s") +
                " (available: " + available + ")"
          : "minigrad was built without CUDA (available: cpu)";
  REQUIRE_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: --devices " +
                                       std::to_string(missing) + ": no CUDA device " +
                                       std::to_string(missing) + "; " + why));
}

// Whatever finds a bad flag -- CLI11's parser, a validator, or --devices looking at the
// machine -- the user sees one prefix, the hint to --help, and exit code 2.
TEST_CASE("train_fashion_mnist: every option error has one prefix and exit code 2") {
  for (const char* flags : {"--epochs abc", "--epochs 0", "--batch-size -4", "--lr -0.1",
                            "--hidden 256,x", "--no-such-flag", "--lr-schedule linear",
                            "--devices gpu", "--devices cpu,0", "--devices 99"}) {
    const auto run = run_program(kProgram + " " + flags);
    INFO(flags << "\n" << run.output);
    CHECK(run.exit_code == 2);
    CHECK(run.output.rfind("train_fashion_mnist: error: ", 0) == 0);
    CHECK_THAT(run.output, MG_CONTAINS("\nRun with --help for more information.\n"));
  }
  const auto help = run_program(kProgram + " --help");
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.output, MG_CONTAINS("--devices") && MG_CONTAINS("cpu,cpu"));
  // Not a flag's fault: a missing dataset is an error of the run, exit code 1.
  TempDir dir;
  const auto missing = run_program(kProgram + " --data-dir " + (dir / "nowhere"));
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.rfind("train_fashion_mnist: error: FashionMNIST: cannot find", 0) == 0);
}

TEST_CASE("train_fashion_mnist: a missing or corrupt dataset file is named, with the fault") {
  TempDir dir;
  const std::string nowhere = dir / "nowhere";
  auto run = run_program(kProgram + " --data-dir " + nowhere);
  INFO(run.output);
  REQUIRE(run.exit_code != 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("cannot find train-images-idx3-ubyte (tried " + nowhere +
                                       "/train-images-idx3-ubyte and " + nowhere +
                                       "/train-images-idx3-ubyte.gz)"));

  mg::testing::write_synthetic_fashion_mnist(dir.path(), 20, 10, false);
  const std::string images = dir / "train-images-idx3-ubyte";
  std::filesystem::resize_file(images, 16 + 28 * 28 * 19);  // 19 of 20 images
  run = run_program(kProgram + " --data-dir " + dir.path());
  INFO(run.output);
  REQUIRE(run.exit_code != 0);
  REQUIRE_THAT(run.output, MG_CONTAINS(images + ": truncated: the header describes 20 x 28 x 28 "
                                                "values (15696 bytes with the 16-byte header), but "
                                                "the file has 14912 bytes"));
}

TEST_CASE("train_fashion_mnist: --devices cpu,cpu,cpu trains with DataParallel to the same numbers") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  std::vector<std::vector<double>> rows;
  for (const std::string devices : {"cpu", "cpu,cpu,cpu"}) {
    // Batches of 50 on 3 replicas: uneven pieces of 17, 17 and 16 rows.
    const auto run = run_program(small_run(dir.path()) + " --epochs 2 --devices " + devices +
                                 " --metrics " + (dir / "m.csv"));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    REQUIRE_THAT(run.output, MG_CONTAINS("on " + std::string(devices == "cpu" ? "cpu\n" : "cpu, cpu, cpu\n")));
    const auto csv = lines(read_text(dir / "m.csv"));
    REQUIRE(csv.size() == 3);
    std::vector<double> values;
    for (size_t i = 1; i < csv.size(); ++i) {
      double train_loss = 0, test_loss = 0, accuracy = 0;
      REQUIRE(std::sscanf(csv[i].c_str(), "%*d,%lf,%lf,%lf", &train_loss, &test_loss, &accuracy) == 3);
      values.insert(values.end(), {train_loss, test_loss, accuracy});
    }
    rows.push_back(values);
  }
  // The replicas' summed gradients are the whole batch's gradient: only float rounding
  // (a different summation order) may differ.
  for (size_t i = 0; i < rows[0].size(); ++i) REQUIRE(rows[1][i] == Approx(rows[0][i]).margin(1e-4));
}

TEST_CASE("train_fashion_mnist: --pipeline 2 and 3 train to the numbers of one device, either schedule") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  std::vector<std::vector<double>> rows;
  // Batches of 50 in 3 chunks: micro-batches of 17, 17 and 16 rows.
  for (const std::string flags :
       {"--devices cpu", "--pipeline 2 --chunks 3 --devices cpu,cpu",
        "--pipeline 3 --chunks 3 --schedule 1f1b --devices cpu"}) {
    const auto run = run_program(small_run(dir.path()) + " --epochs 2 " + flags + " --metrics " +
                                 (dir / "m.csv"));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    if (flags.find("--pipeline 2") != std::string::npos)
      REQUIRE_THAT(run.output, MG_CONTAINS("pipeline: 2 stages of [2, 1] layers, 3 micro-batches "
                                           "per batch, schedule gpipe"));
    if (flags.find("--pipeline 3") != std::string::npos)
      REQUIRE_THAT(run.output, MG_CONTAINS("pipeline: 3 stages of [1, 1, 1] layers, 3 "
                                           "micro-batches per batch, schedule 1f1b"));
    const auto csv = lines(read_text(dir / "m.csv"));
    REQUIRE(csv.size() == 3);
    std::vector<double> values;
    for (size_t i = 1; i < csv.size(); ++i) {
      double train_loss = 0, test_loss = 0, accuracy = 0;
      REQUIRE(std::sscanf(csv[i].c_str(), "%*d,%lf,%lf,%lf", &train_loss, &test_loss, &accuracy) == 3);
      values.insert(values.end(), {train_loss, test_loss, accuracy});
    }
    rows.push_back(values);
  }
  // The pipeline's micro-batch gradients add up to the batch's: float rounding only.
  for (size_t r = 1; r < rows.size(); ++r)
    for (size_t i = 0; i < rows[0].size(); ++i) REQUIRE(rows[r][i] == Approx(rows[0][i]).margin(1e-4));

  const auto both = run_program(small_run(dir.path()) + " --pipeline 2 --distributed");
  REQUIRE(both.exit_code != 0);
  REQUIRE_THAT(both.output, MG_CONTAINS("--pipeline and --distributed do not go together"));
  const auto three = run_program(small_run(dir.path()) + " --pipeline 2 --devices cpu,cpu,cpu");
  REQUIRE(three.exit_code != 0);
  REQUIRE_THAT(three.output,
               MG_CONTAINS("--pipeline 2: --devices cpu,cpu,cpu names 3 devices; give one per stage"));
}
namespace {

// Every number of a metrics CSV but the seconds.
std::vector<double> metrics_values(const std::string& path) {
  std::vector<double> values;
  const auto csv = lines(read_text(path));
  for (size_t i = 1; i < csv.size(); ++i) {
    double train_loss = 0, test_loss = 0, accuracy = 0;
    if (std::sscanf(csv[i].c_str(), "%*d,%lf,%lf,%lf", &train_loss, &test_loss, &accuracy) == 3)
      values.insert(values.end(), {train_loss, test_loss, accuracy});
  }
  return values;
}

void require_same_metrics(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  REQUIRE(!got.empty());
  // Tensor parallelism changes where the sums run, never the numbers, up to rounding.
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-4));
}

}  // namespace

TEST_CASE("train_fashion_mnist: --tensor-parallel 2 in one process trains to the plain run's numbers") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  const std::string flags = small_run(dir.path()) + " --epochs 2 --metrics ";
  const auto plain = run_program(flags + (dir / "plain.csv"));
  INFO(plain.output);
  REQUIRE(plain.exit_code == 0);
  const auto tp = run_program(flags + (dir / "tp.csv") + " --devices cpu,cpu --tensor-parallel 2");
  INFO(tp.output);
  REQUIRE(tp.exit_code == 0);
  REQUIRE_THAT(tp.output, MG_CONTAINS("tensor parallel: the Linear layers in column/row pairs over "
                                      "2 ranks in one process (devices=[cpu, cpu], "
                                      "communicator=host); 12730 parameters per rank (of 25450)"));
  require_same_metrics(metrics_values(dir / "tp.csv"), metrics_values(dir / "plain.csv"));
}

TEST_CASE("train_fashion_mnist: --tensor-parallel refuses what it cannot do") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 20, 10, false);
  const std::string flags = small_run(dir.path()) + " --epochs 1 --tensor-parallel 2";
  const auto one_device = run_program(flags);
  REQUIRE(one_device.exit_code == 2);
  REQUIRE_THAT(one_device.output,
               MG_CONTAINS("train_fashion_mnist: error: --tensor-parallel 2 in one process takes "
                           "one device per rank, but --devices cpu names 1; pass 2 devices (e.g. "
                           "--devices cpu,cpu), or use --distributed for data parallelism as well"));
  const auto save = run_program(flags + " --devices cpu,cpu --save " + (dir / "ck.safetensors"));
  REQUIRE(save.exit_code == 2);
  REQUIRE_THAT(save.output, MG_CONTAINS("--tensor-parallel 2: --save and --resume are not "
                                        "supported with tensor parallelism"));
  const auto with_pipeline = run_program(flags + " --devices cpu,cpu --pipeline 2");
  REQUIRE(with_pipeline.exit_code == 2);
  REQUIRE_THAT(with_pipeline.output, MG_CONTAINS("--tensor-parallel 2 and --pipeline 2 do not go "
                                                 "together: choose one split of the model"));
  const auto with_zero = run_program(flags + " --distributed --zero 1");
  REQUIRE(with_zero.exit_code == 2);
  REQUIRE_THAT(with_zero.output, MG_CONTAINS("--tensor-parallel 2 and --zero 1 do not go together"));
  const auto odd = run_program(kProgram + " --data-dir " + dir.path() +
                               " --hidden 33 --epochs 1 --devices cpu,cpu --tensor-parallel 2");
  REQUIRE(odd.exit_code == 1);
  REQUIRE_THAT(odd.output, MG_CONTAINS("ColumnParallelLinear: out_features = 33 is not divisible "
                                       "by the tensor-parallel size 2"));
}

#if MINIGRAD_WITH_GLOO
TEST_CASE("train_fashion_mnist --distributed --tensor-parallel 2 on 4 ranks (2 x 2) trains to the "
          "numbers of data parallelism on 2") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, true);
  const std::string run = mg::testing::program_path("minigrad-run");
  const std::string flags = small_run(dir.path()) + " --distributed --epochs 2 --metrics ";
  // The same two data-parallel ranks, the same shards of every epoch: only the split of
  // each layer over the tensor-parallel pairs differs.
  const auto ddp = run_program(run + " --nproc-per-node 2 " + flags + (dir / "ddp.csv"));
  INFO(ddp.output);
  REQUIRE(ddp.exit_code == 0);
  const auto mesh = run_program(run + " --nproc-per-node 4 " + flags + (dir / "mesh.csv") +
                                " --tensor-parallel 2");
  INFO(mesh.output);
  REQUIRE(mesh.exit_code == 0);
  REQUIRE_THAT(mesh.output, MG_CONTAINS("[rank 3] distributed: rank 3 of 4 (gloo), global batch "
                                        "50 = 2 x 25 per data-parallel rank"));
  REQUIRE_THAT(mesh.output, MG_CONTAINS("[rank 0] tensor parallel: the Linear layers in column/row "
                                        "pairs over 2 ranks, data parallel over 2; 12730 "
                                        "parameters per rank (of 25450)"));
  require_same_metrics(metrics_values(dir / "mesh.csv"), metrics_values(dir / "ddp.csv"));
  const auto uneven = run_program(run + " --nproc-per-node 3 " + flags + (dir / "x.csv") +
                                  " --tensor-parallel 2");
  REQUIRE(uneven.exit_code != 0);
  REQUIRE_THAT(uneven.output, MG_CONTAINS("--tensor-parallel 2 does not divide the 3 ranks of the job"));
}
#endif

// An epoch's last batch may have fewer rows than --chunks: it is cut into fewer
// micro-batches, as torch.chunk does, instead of failing after the epoch's work.
TEST_CASE("train_fashion_mnist --pipeline: a last batch smaller than --chunks trains") {
  TempDir dir;
  // 303 images in batches of 50: six of 50, then one of 3, with --chunks 8.
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 303, 100, false);
  const auto run = run_program(small_run(dir.path()) +
                               " --epochs 1 --pipeline 2 --chunks 8 --devices cpu,cpu");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  REQUIRE_THAT(run.output, MG_CONTAINS("epoch  1/1  train_loss"));
}

// Flags that would do nothing, counts far beyond what exists, and numbers that are not
// numbers: each refused before any work, in a short message that names the flag.
TEST_CASE("train_fashion_mnist: pointless flags, impossible counts and bad numbers are usage "
          "errors") {
  TempDir dir;
  mg::testing::write_synthetic_fashion_mnist(dir.path(), 300, 100, false);
  const std::string huge(400, '9');
  const struct {
    std::string flags, message;
  } cases[] = {
      {"--chunks 4", "--chunks requires --pipeline"},
      {"--schedule 1f1b", "--schedule requires --pipeline"},
      {"--trace-warmup 3", "--trace-warmup requires --trace"},
      {"--pipeline 2000000000",
       "--pipeline 2000000000: the model (--hidden 32) has 3 layers, and every stage needs at "
       "least one; give at most --pipeline 3"},
      {"--tensor-parallel 2000000000",
       "--tensor-parallel 2000000000 in one process takes one device per rank, but --devices "
       "cpu names 1; pass 2000000000 devices, or use --distributed"},
      {"--dist-timeout nan", "--dist-timeout: expects a number in [0, 3.1536e+07], got 'nan'"},
      {"--dist-timeout inf", "--dist-timeout: expects a number in [0, 3.1536e+07], got 'inf'"},
      {"--dist-timeout -1", "--dist-timeout: expects a number in [0, 3.1536e+07], got '-1'"},
      {"--epochs 3x", "--epochs: expects an integer >= 1, got '3x'"},
      {"--lr 0.1abc", "--lr: expects a finite number >= 0, got '0.1abc'"},
      {"--seed " + huge, "--seed: expects an integer >= 0, got '9999999999999999999999999999999999999999"
                         "... (400 characters)'"},
      {"--trace " + (dir / "t.json") + " --trace-warmup 100",
       "--trace-warmup 100: the run has 6 training steps left, so --trace " + (dir / "t.json") +
           " would record nothing"},
  };
  for (const auto& c : cases) {
    const auto run = run_program(small_run(dir.path()) + " --epochs 1 " + c.flags);
    INFO(c.flags.substr(0, 60) << "\n" << run.output.substr(0, 2000));
    CHECK(run.exit_code == 2);
    CHECK_THAT(run.output, MG_CONTAINS("train_fashion_mnist: error: " + c.message));
    CHECK(run.output.size() < 800);
    CHECK(run.output.find("train_loss") == std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "t.json"));
}
