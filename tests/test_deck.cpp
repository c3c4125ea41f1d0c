// Input decks: defaults, overrides, the round trip of the effective configuration, and
// every kind of error, each naming the file and line (or the argument).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kqlora/core/error.hpp"
#include "kqlora/nn/model_registry.hpp"
#include "kqlora/train/config.hpp"

using kqlora::parse_deck_text;

namespace {

void expect_error(const std::string& text, const std::string& needle,
                  const std::vector<std::string>& overrides = {}, int world = 1) {
  try {
    parse_deck_text(text, "deck.in", overrides, world);
    ADD_FAILURE() << "accepted:\n" << text << "\nexpected: " << needle;
  } catch (const kqlora::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected: " << needle;
  }
}

}  // namespace

TEST(Deck, DefaultsFollowDesign) {
  const auto c = parse_deck_text("", "deck.in", {});
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.lora_rank, 64);  // dim / 2
  EXPECT_EQ(c.micro_bs, c.global_bs);
  EXPECT_EQ(c.optimizer, "adam");
  EXPECT_EQ(c.weight_decay, 0.0);
  EXPECT_EQ(c.checkpoint_layout, "per_rank");
  EXPECT_EQ(c.lora_b_init, "kaiming");
  const auto w = parse_deck_text("optimizer = adamw\nparallel = fsdp\ndim = 96\n", "d", {});
  EXPECT_EQ(w.weight_decay, 0.01);
  EXPECT_EQ(w.checkpoint_layout, "shared");
  EXPECT_EQ(w.lora_rank, 48);
}

TEST(Deck, CommentsBlanksAndOverrides) {
  const auto c =
      parse_deck_text("# a comment\n\n  dim = 64   # trailing\nlr=0.5\nbetas = 0.8, 0.95\n",
                      "deck.in", {"lr=0.25", "num_steps=7"});
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.lr, 0.25);
  EXPECT_EQ(c.num_steps, 7);
  EXPECT_EQ(c.betas[0], 0.8);
  EXPECT_EQ(c.betas[1], 0.95);
}

TEST(Deck, EffectiveConfigurationRoundTrips) {
  const auto c = parse_deck_text(
      "dim = 256\nlr = 3e-4\nactivation = gelu\ndtype = bfloat16\n"
      "betas = 0.9, 0.98\nmetrics_file = m.jsonl\n",
      "deck.in", {});
  const auto back = parse_deck_text(c.to_deck_text(), "echo", {});
  EXPECT_EQ(back.to_deck_text(), c.to_deck_text());
  EXPECT_EQ(back.lr, 3e-4);
  EXPECT_EQ(back.dtype, kqlora::DType::bfloat16);
  EXPECT_EQ(back.metrics_file, "m.jsonl");
}

TEST(Deck, EveryErrorNamesFileAndLine) {
  expect_error("dim = 64\nlearning_rate = 1\n", "deck.in:2: unknown key 'learning_rate'");
  expect_error("lrr = 1\n", "(did you mean 'lr'?)");
  expect_error("dim = 64\n\ndim = 32\n", "deck.in:3: duplicate key 'dim' (first set at deck.in:1)");
  expect_error("dim = sixty\n", "deck.in:1: dim: expected an integer, got 'sixty'");
  expect_error("lr = fast\n", "deck.in:1: lr: expected a finite number");
  expect_error("bias = maybe\n", "deck.in:1: bias: expected true or false");
  expect_error("optimizer = lion\n", "deck.in:1: optimizer: expected sgd|adam|adamw, got 'lion'");
  expect_error("dim 64\n", "deck.in:1: expected 'key = value'");
  expect_error("dim =\n", "deck.in:1: dim: missing value");
  expect_error("\n\ndim = 0\n", "deck.in:3: dim must be at least 1, got 0");
  expect_error("lora_dropout = 1\n", "deck.in:1: lora_dropout must be in [0, 1)");
  expect_error("betas = 0.9\n", "deck.in:1: betas: expected two numbers");
  expect_error("betas = 0.9, 1.0\n", "deck.in:1: betas must be in [0, 1)");
  expect_error("eps = 0\n", "deck.in:1: eps must be > 0");
  expect_error("lr = -1\n", "deck.in:1: lr must be >= 0");
  expect_error("dim = 64\nlora_rank = 65\n", "deck.in:2: lora_rank 65 > dim 64");
  expect_error("block_size = 7\n", "deck.in:1: block_size must be a positive even number");
  expect_error("dim = 10\nblock_size = 64\n", "deck.in:2: block_size 64 does not divide");
  expect_error("global_bs = 4\n", "deck.in:1: global_bs 4 is smaller than the 8 ranks", {}, 8);
  expect_error("optimizer = adam\nmomentum = 0.9\n",
               "deck.in:2: momentum applies to optimizer = sgd");
  expect_error("optimizer = sgd\nbetas = 0.9, 0.99\n", "deck.in:2: betas apply to adam and adamw");
  expect_error("eval_every = 5\n", "deck.in:1: eval_every 5 needs an eval_file");
  expect_error("shuffle = true\n", "deck.in:1: shuffle = true needs a data_file");
  expect_error("activation_dtype = bfloat16\n",
               "deck.in:1: activation_dtype does not apply to model lora_stack");
  const std::string gqa = std::string(KQLORA_TEST_DATA_DIR) + "/llama_reference/gqa";
  expect_error("model = causal_lm\nhf_model_dir = " + gqa + "\ndata_file = " + gqa +
                   "/data.h5\nactivation_dtype = bfloat16\n",
               "deck.in:4: activation_dtype = bfloat16 keeps a bfloat16 run's activations in 16 "
               "bits; this run's dtype is float32");
  expect_error("activation_dtype = half\n",
               "deck.in:1: activation_dtype: expected auto|float32|bfloat16, got 'half'");
  expect_error("init_file = /no/such/file.h5\n",
               "deck.in:1: init_file: cannot read '/no/such/file.h5'");
  expect_error("data_file = /no/such/data.h5\n", "deck.in:1: data_file: cannot read");
  // Preference objectives' keys (docs/TRAINING.md, "Preference training").
  const std::string pairs =
      std::string(KQLORA_TEST_DATA_DIR) + "/preference_reference/gqa/pairs.h5";
  const std::string pref =
      "model = causal_lm\nhf_model_dir = " + gqa + "\ndata_file = " + pairs + "\nobjective = dpo\n";
  expect_error(pref + "beta = 0\n", "deck.in:5: beta must be > 0, got 0");
  expect_error(pref + "beta = -0.1\n", "beta must be > 0, got -0.1");
  expect_error(pref + "loss_type = robust\nlabel_smoothing = 0.5\n",
               "deck.in:6: label_smoothing must be in [0, 0.5), got 0.5");
  expect_error(pref + "loss_type = kto\n",
               "deck.in:5: loss_type: expected sigmoid|hinge|ipo|robust, got 'kto'");
  expect_error("objective = kto\n", "objective: expected sft|dpo|simpo|orpo, got 'kto'");
  expect_error("objective = dpo\n",
               "deck.in:1: objective = dpo scores sequences of a causal_lm, not model = "
               "lora_stack");
  expect_error("", "argument 'dim=abc': dim: expected an integer", {"dim=abc"});
  expect_error("", "argument 'bogus=1': unknown key 'bogus'", {"bogus=1"});
  expect_error("", "argument 'dim': expected key=value", {"dim"});
}

TEST(Deck, EveryKeyIsDocumentedInTheEcho) {
  const std::string text = parse_deck_text("", "d", {}).to_deck_text();
  for (const auto& k : kqlora::deck_keys()) EXPECT_NE(text.find(k + " = "), std::string::npos) << k;
  EXPECT_EQ(kqlora::deck_keys().size(), 61u);  // the keys kqlora-train --help lists
}

TEST(TrainApp, BadDeckExitsTwoAndWritesNothing) {
  const std::string dir = std::string(KQLORA_TEST_BIN_DIR) + "/../tests/tmp_deck";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  {
    std::ofstream(dir + "/bad.in") << "dim = 64\nlora_rank = 100\nsave_dir = " << dir << "/ckpt\n";
  }
  const std::string bin = std::string(KQLORA_TEST_BIN_DIR) + "/kqlora-train";
  const std::string log = dir + "/log";
  for (const std::string& args :
       {dir + "/bad.in", dir + "/missing.in", dir + "/bad.in lora_rank=8 nope=1"}) {
    const int rc = std::system((bin + " " + args + " > " + log + " 2>&1").c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << args;
    std::ifstream l(log);
    const std::string text((std::istreambuf_iterator<char>(l)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("kqlora-train: error:"), std::string::npos) << text;
  }
  EXPECT_FALSE(std::ifstream(dir + "/ckpt/latest").good());
  EXPECT_EQ(
      std::system((bin + " " + dir + "/bad.in lora_rank=8 num_steps=1 > " + log + " 2>&1").c_str()),
      0);
  EXPECT_TRUE(std::ifstream(dir + "/ckpt/latest").good());
}

TEST(Deck, OneKeyTableForHelpEchoAndRestart) {
  // A model kind that reads only dim: the echo comments out the model keys it ignores
  // (and still parses back to the same text), a restart does not compare them, and
  // --help lists every key.
  kqlora::ModelKind kind = kqlora::model_kind("lora_stack");
  kind.deck_keys = {"dim", "dtype"};
  kqlora::register_model("deck_test_model", kind);
  const auto c = parse_deck_text("model = deck_test_model\ndim = 32\n", "d", {});
  const std::string text = c.to_deck_text();
  EXPECT_NE(text.find("\ndim = 32\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# num_linears = 1  (not used by model deck_test_model)"), std::string::npos)
      << text;
  EXPECT_EQ(parse_deck_text(text, "echo", {}).to_deck_text(), text);
  const auto fixed = kqlora::restart_fixed_keys(c);
  auto has = [&](const char* k) { return std::find(fixed.begin(), fixed.end(), k) != fixed.end(); };
  EXPECT_TRUE(has("dim") && has("dtype") && has("model") && has("optimizer"));
  EXPECT_FALSE(has("num_linears") || has("lora_rank") || has("seed") || has("num_steps"));
  const auto stack = kqlora::restart_fixed_keys(parse_deck_text("", "d", {}));
  EXPECT_NE(std::find(stack.begin(), stack.end(), "num_linears"), stack.end());
  const std::string help = kqlora::deck_help(80);
  for (const auto& k : kqlora::deck_keys())
    EXPECT_NE(help.find(" " + k + " "), std::string::npos) << k;
  std::istringstream lines(help);
  for (std::string l; std::getline(lines, l);) EXPECT_LE(l.size(), 80u) << l;
  expect_error("model = nonesuch\n", "deck.in:1: model: expected");
}
