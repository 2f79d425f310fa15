// build/bin/train_gpt run as a user runs it, tiny: on a small corpus of fortune files made
// here (and once on the real one), a few steps; the losses, the sample, the files it
// writes, a checkpoint PyTorch's layout names, resuming, and its refusals; the vocabulary
// in the checkpoint (a sample from it alone, a resume on other characters refused).
#include "catch_compat.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <minigrad/minigrad.h>

#include "samples/run_program.h"
#include "temp_dir.h"
#include "train_gpt_runs.h"  // sample_of

using mg::testing::run_program;
using mg::testing::TempDir;

namespace {

const std::string kProgram = mg::testing::program_path("train_gpt");
// A model small enough to take a few steps in a second.
const std::string kTiny = " --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --batch-size 4 "
                          "--eval-iters 2";

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A few "fortunes", enough text for a training and a validation split.
std::string make_corpus(const TempDir& dir) {
  const std::string root = dir / "fortunes";
  std::filesystem::create_directory(root);
  std::string text;
  for (int i = 0; i < 60; ++i)
    text += "A fortune a day keeps the doctor away, said number " + std::to_string(i) + ".\n%\n";
  write_file(root + "/wisdom", text);
  write_file(root + "/wisdom.dat", "not text");
  return root;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// nanoGPT's way of overriding a config (`--iters 100000 ... --iters 2`): the last wins.
TEST_CASE("train_gpt: a flag given twice takes its last value") {
  TempDir dir;
  const std::string corpus = make_corpus(dir);
  const auto run = run_program(kProgram + kTiny + " --iters 100000 --n-layer 3 --sample-chars 0 "
                               "--eval-interval 1000 --data-dir " + corpus +
                               " --iters 2 --n-layer=2");  // kTiny gave 1, then 3
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output, MG_CONTAINS("GPT: n_layer=2, n_head=2, n_embd=16"));
  CHECK_THAT(run.output, MG_CONTAINS("trained 2 steps in "));
}

TEST_CASE("train_gpt: trains a few steps, evaluates, writes its files and a sample") {
  TempDir dir;
  const std::string corpus = make_corpus(dir);
  const auto run = run_program(kProgram + kTiny + " --iters 6 --eval-interval 3 --warmup 2 --sample-chars 40 --data-dir " +
                               corpus + " --tokens " + (dir / "c.tokens") + " --save " +
                               (dir / "ck.safetensors") + " --metrics " + (dir / "m.csv") +
                               " --plot " + (dir / "p.svg") + " --grad-accum 2");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output, MG_CONTAINS("fortunes: ") && MG_CONTAINS("GPT: n_layer=1, n_head=2, n_embd=16"));
  CHECK_THAT(run.output, MG_CONTAINS("step 0: train loss ") && MG_CONTAINS("step 3: train loss ") &&
                             MG_CONTAINS("step 6: train loss "));
  CHECK_THAT(run.output, MG_CONTAINS("trained 6 steps in ") && MG_CONTAINS(" tokens/s"));
  CHECK_THAT(run.output, MG_CONTAINS("---- a sample (temperature 0.8) ----"));
  const std::string csv = read(dir / "m.csv");
  CHECK(csv.rfind("step,train_loss,val_loss,lr,seconds\n0,", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 4);
  CHECK_THAT(read(dir / "p.svg"), MG_CONTAINS("<svg") && MG_CONTAINS("val loss"));
  // The token file was written, and is what the next run reads.
  const mg::data::TokenFile tokens = mg::data::read_token_file(dir / "c.tokens");
  CHECK(tokens.tokens.size() > 3000);
  // The checkpoint: nanoGPT's names, the head under both keys.
  const mg::nn::Checkpoint ck = mg::nn::load_tensors(dir / "ck.safetensors");
  CHECK(ck.tensors.count("model.transformer.wte.weight") == 1);
  CHECK(ck.tensors.count("model.lm_head.weight") == 1);
  CHECK(ck.tensors.count("model.transformer.h.0.attn.c_attn.weight") == 1);
  CHECK(ck.metadata.at("step") == "6");
}

TEST_CASE("train_gpt: a resumed run ends where an uninterrupted one does, bit for bit") {
  TempDir dir;
  const std::string corpus = make_corpus(dir);
  // One schedule for both runs (warmup and decay would otherwise follow --iters).
  const std::string common = kProgram + kTiny + " --sample-chars 0 --eval-interval 4 --dropout 0.1 --warmup 2 --decay-iters 8 --data-dir " + corpus;
  const auto whole = run_program(common + " --iters 8 --save " + (dir / "whole.safetensors"));
  INFO(whole.output);
  REQUIRE(whole.exit_code == 0);
  const auto first = run_program(common + " --iters 4 --save " + (dir / "half.safetensors"));
  REQUIRE(first.exit_code == 0);
  const auto second = run_program(common + " --iters 8 --resume " + (dir / "half.safetensors") +
                                  " --save " + (dir / "resumed.safetensors"));
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.output, MG_CONTAINS("resumed at step 4"));
  const auto a = mg::nn::load_tensors(dir / "whole.safetensors").get("model.");
  const auto b = mg::nn::load_tensors(dir / "resumed.safetensors").get("model.");
  for (const auto& [name, t] : a) {
    INFO(name);
    CHECK(t.to_vector<float>() == b.at(name).to_vector<float>());
  }
  // Another model than the checkpoint's is refused, naming both.
  const auto other = run_program(kProgram + " --n-layer 2 --n-head 2 --n-embd 16 --block-size 16 "
                                  "--batch-size 4 --dropout 0.1 --data-dir " + corpus +
                                  " --iters 8 --resume " + (dir / "half.safetensors"));
  CHECK(other.exit_code == 1);
  CHECK_THAT(other.output, MG_CONTAINS("the checkpoint's model is {\"block_size\": 16") &&
                               MG_CONTAINS("\"n_layer\": 1") && MG_CONTAINS("but the flags make") &&
                               MG_CONTAINS("\"n_layer\": 2"));
}

TEST_CASE("train_gpt: the checkpoint holds the vocabulary: the same sample without the data, other characters refused") {
  TempDir dir;
  const std::string corpus = make_corpus(dir);
  const std::string ck = dir / "ck.safetensors";
  const std::string model = kTiny + " --warmup 2 --decay-iters 6 --sample-chars 60";
  const auto trained = run_program(kProgram + model + " --iters 6 --eval-interval 3 --data-dir " + corpus +
                                   " --save " + ck);
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const std::string sample = mg::testing::sample_of(trained.output);
  REQUIRE(sample.size() > 60);  // the newline it starts after, 60 characters, a newline
  // The metadata's "vocab": every character of the corpus, sorted, each byte in hex.
  const mg::data::CharTokenizer corpus_tokenizer =
      mg::data::CharTokenizer::from_text(mg::data::read_fortunes(corpus));
  std::string hex;
  for (uint8_t c : corpus_tokenizer.vocab()) hex += fmt::format("{:02x}", c);
  CHECK(mg::nn::load_tensors(ck).metadata.at("vocab") == hex);
  CHECK(hex.rfind("0a202c", 0) == 0);  // '\n', ' ', ',' first (the fortunes' '%' lines are not text)

  // The checkpoint alone (its data gone): the same text, decoded with its own vocabulary.
  const auto alone = run_program(kProgram + model + " --resume " + ck + " --sample-only --data-dir " +
                                 (dir / "gone") + " --tokens " + (dir / "gone.tokens"));
  INFO(alone.output);
  REQUIRE(alone.exit_code == 0);
  CHECK_THAT(alone.output, MG_CONTAINS("from " + ck + " (step 6), a vocabulary of 34 characters: \\n, space, ,, ., 0"));
  CHECK(mg::testing::sample_of(alone.output) == sample);
  CHECK(!std::filesystem::exists(dir / "gone.tokens"));  // no data read, none written

  // Resumed on other text of the same characters (the fortunes in reverse order): nothing
  // left to train, the same sample.
  std::string reversed;
  for (int i = 59; i >= 0; --i)
    reversed += "A fortune a day keeps the doctor away, said number " + std::to_string(i) + ".\n%\n";
  std::filesystem::create_directory(dir / "reversed");
  write_file(dir / "reversed/wisdom", reversed);
  const auto resumed = run_program(kProgram + model + " --iters 6 --eval-interval 3 --resume " + ck +
                                   " --data-dir " + (dir / "reversed"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, MG_CONTAINS("resumed at step 6"));
  CHECK(mg::testing::sample_of(resumed.output) == sample);

  // Resumed on text of other characters: refused, saying why, before any step.
  std::filesystem::create_directory(dir / "other");
  write_file(dir / "other/wisdom", reversed + "Zebras quickly jump over everything!\n%\n");
  const auto other = run_program(kProgram + model + " --iters 8 --resume " + ck + " --data-dir " + (dir / "other"));
  INFO(other.output);
  CHECK(other.exit_code == 1);
  CHECK_THAT(other.output,
             MG_CONTAINS("--resume " + ck + ": the checkpoint's vocabulary (34 characters: \\n, space, ,") &&
                 MG_CONTAINS("is not the corpus's (41 characters: \\n, space, !, ,") &&
                 MG_CONTAINS("token 2 is , in the checkpoint, ! in the corpus") &&
                 MG_CONTAINS("its token ids would stand for other characters"));
  CHECK_THAT(other.output, !MG_CONTAINS("step 6: train loss"));

  // --sample-only needs a checkpoint, and one that holds a vocabulary.
  const auto lonely = run_program(kProgram + " --sample-only");
  CHECK(lonely.exit_code == 2);
  CHECK_THAT(lonely.output, MG_CONTAINS("--sample-only samples from a checkpoint: it needs --resume CHECKPOINT"));
  mg::nn::Checkpoint stripped = mg::nn::load_tensors(ck);
  stripped.metadata.erase("vocab");
  mg::nn::save_tensors(stripped, dir / "old.safetensors");
  const auto old = run_program(kProgram + model + " --resume " + (dir / "old.safetensors") + " --sample-only");
  CHECK(old.exit_code == 1);
  CHECK_THAT(old.output, MG_CONTAINS("--sample-only: " + (dir / "old.safetensors") + " holds no vocabulary"));
  stripped.metadata["vocab"] = "0a20zz";
  mg::nn::save_tensors(stripped, dir / "bad.safetensors");
  const auto bad = run_program(kProgram + model + " --resume " + (dir / "bad.safetensors") + " --sample-only");
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.output, MG_CONTAINS("the checkpoint's vocabulary ('vocab' in its metadata) has 'zz' at offset 4"));
  // An older checkpoint without one still resumes on its corpus (nothing to check it against).
  const auto old_resume = run_program(kProgram + model + " --iters 6 --resume " + (dir / "old.safetensors") +
                                      " --data-dir " + corpus);
  CHECK(old_resume.exit_code == 0);
  CHECK(mg::testing::sample_of(old_resume.output) == sample);
}

TEST_CASE("train_gpt: bad flags and missing data are refused, naming them") {
  TempDir dir;
  const auto heads = run_program(kProgram + " --n-embd 30 --n-head 4");
  CHECK(heads.exit_code == 2);
  CHECK_THAT(heads.output, MG_CONTAINS("train_gpt: error: --n-embd 30 does not divide into --n-head 4 heads"));
  const auto lr = run_program(kProgram + " --lr 1e-4 --min-lr 1e-3");
  CHECK(lr.exit_code == 2);
  CHECK_THAT(lr.output, MG_CONTAINS("--min-lr 0.001 is above --lr 0.0001"));
  const auto save = run_program(kProgram + " --save " + dir.path());
  CHECK(save.exit_code == 2);
  CHECK_THAT(save.output, MG_CONTAINS("--save"));
  const auto data = run_program(kProgram + " --data-dir " + (dir / "none"));
  CHECK(data.exit_code == 1);
  CHECK_THAT(data.output, MG_CONTAINS("read_fortunes: cannot list " + (dir / "none")));
  write_file(dir / "bad.tokens", "MGTOKENS nonsense");
  const auto tokens = run_program(kProgram + " --tokens " + (dir / "bad.tokens"));
  CHECK(tokens.exit_code == 1);
  CHECK_THAT(tokens.output, MG_CONTAINS(dir / "bad.tokens"));
}

TEST_CASE("train_gpt: a few steps on the fortunes corpus itself") {
  INFO("Debian's fortunes package (scripts/install-deps.sh) installs " << mg::data::kFortunesDir);
  REQUIRE(std::filesystem::is_directory(mg::data::kFortunesDir));
  const auto run = run_program(kProgram + kTiny + " --iters 2 --eval-interval 2 --sample-chars 20");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output, MG_CONTAINS(" characters, a vocabulary of ") && MG_CONTAINS("step 2: train loss "));
}

TEST_CASE("train_gpt: --devices cpu,cpu trains through DataParallel over two CPU replicas") {
  TempDir dir;
  const std::string corpus = make_corpus(dir);
  const auto run = run_program(kProgram + kTiny + " --iters 3 --eval-interval 3 --sample-chars 10 " +
                               "--devices cpu,cpu --data-dir " + corpus);
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  CHECK_THAT(run.output, MG_CONTAINS("parameters on cpu, cpu") && MG_CONTAINS("step 3: train loss "));
}
