// A training process for tests that kill one with SIGKILL (tests/test_run.cpp): trains
// the run a config.json describes, as `egeria train --config FILE` does, and a
// Transformer with the architecture of the file's "arch" key when it has one (a tiny
// model no preset names). Usage: eg_fit CONFIG.json [--resume]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/transformer.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: eg_fit CONFIG.json [--resume]\n");
    return 2;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(argv[1]));
    eg::train::TrainConfig c = eg::train::from_json(j, {}, {"arch"});
    c.resume = argc > 2 && std::strcmp(argv[2], "--resume") == 0;
    if (!j.contains("arch")) return eg::train::run_training(c).completed ? 0 : 1;
    eg::models::TransformerConfig a;
    const auto& s = j["arch"];
    a.d_model = s.at("d_model"), a.heads = s.at("heads"), a.ffn = s.at("ffn"), a.max_len = s.at("max_len");
    a.enc_layers = s.at("enc_layers"), a.dec_layers = s.at("dec_layers"), a.dropout = s.at("dropout");
    return eg::train::run_translation(c, &a).completed ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "eg_fit: error: %s\n", e.what());
    return 1;
  }
}
