// generate-bench: Llama::generate or GPT::generate with and without the KV cache, on the CPU
// (or a GPU with --device cuda): the prompt once and then one token per step through the
// cache, against the whole context every step. Both give the same tokens
// (tests/models/llama_test.cpp, gpt_test.cpp); this times them and says whether they agreed
// here too. One JSON line per mode, then the speed-up. The GPT has --heads heads and no kv
// heads of its own (--kv-heads is the Llama's).
//
//   build/bin/generate-bench                          # the Llama: 200 new tokens after 16
//   build/bin/generate-bench --model gpt
//   build/bin/generate-bench --new-tokens 50 --layers 2
#include <chrono>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/models/gpt.h>
#include <minigrad/models/llama.h>

int main(int argc, char** argv) {
  int64_t new_tokens = 200, prompt = 16, layers = 4, hidden = 256, heads = 8, kv_heads = 2, vocab = 512;
  std::string device_name = "cpu", model_name = "llama";
  CLI::App app{"Times Llama::generate with and without the KV cache."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--new-tokens", new_tokens)->capture_default_str();
  app.add_option("--prompt", prompt)->capture_default_str();
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--hidden", hidden)->capture_default_str();
  app.add_option("--heads", heads)->capture_default_str();
  app.add_option("--kv-heads", kv_heads)->capture_default_str();
  app.add_option("--vocab", vocab)->capture_default_str();
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--model", model_name, "llama | gpt")->check(CLI::IsMember({"llama", "gpt"}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const mg::Device device = device_name == "cpu" ? mg::Device::cpu() : mg::Device::cuda(0);
  mg::models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = hidden * 8 / 3;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = prompt + new_tokens;
  mg::models::GPTConfig g;
  g.vocab_size = vocab;
  g.n_embd = hidden;
  g.n_layer = layers;
  g.n_head = heads;
  g.block_size = prompt + new_tokens;
  mg::manual_seed(0);
  const bool gpt = model_name == "gpt";
  std::shared_ptr<mg::nn::Module> model;
  if (gpt) model = std::make_shared<mg::models::GPT>(g);
  else model = std::make_shared<mg::models::Llama>(c);
  model->to(device);
  model->eval();
  const auto generate = [&](const mg::Tensor& idx, mg::Generator& gen, bool cached) {
    if (gpt) return static_cast<mg::models::GPT&>(*model).generate(idx, new_tokens, 1.0, 0, &gen, cached);
    return static_cast<mg::models::Llama&>(*model).generate(idx, new_tokens, 1.0, 0, &gen, cached);
  };
  const mg::Tensor start = mg::ops::copy_to(mg::randint(0, vocab, mg::Shape{1, prompt}), device);
  double ms[2] = {0, 0};
  mg::Tensor out[2];
  for (const bool cached : {false, true}) {
    mg::Generator gen(7);
    const auto t0 = std::chrono::steady_clock::now();
    out[cached] = generate(start, gen, cached);
    ms[cached] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("{{\"bench\":\"generate\",\"model\":\"{}\",\"kv_cache\":{},\"device\":\"{}\",\"prompt\":{},\"new_tokens\":{},"
               "\"layers\":{},\"hidden\":{},\"heads\":{},\"kv_heads\":{},\"ms\":{:.1f},\"tokens_per_s\":{:.1f}}}\n",
               model_name, cached ? "true" : "false", device.str(), prompt, new_tokens, layers, hidden, heads, kv_heads, ms[cached],
               1000.0 * static_cast<double>(new_tokens) / ms[cached]);
  }
  const bool same = out[0].to_vector<int64_t>() == out[1].to_vector<int64_t>();
  fmt::print("{{\"bench\":\"generate\",\"speedup\":{:.2f},\"same_tokens\":{}}}\n", ms[0] / ms[1], same ? "true" : "false");
  return same ? 0 : 1;
}
