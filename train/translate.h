// The translation loop behind `egeria train --model transformer-tiny|transformer-base`:
// a Transformer trained on sentence pairs (DIR/{train,valid,test}.tsv, "source<TAB>target"),
// tokenised by a SentencePiece model kept beside the data (DIR/spm-<vocab>.model,
// trained on first use). It writes what the image loop writes (config.json,
// metrics.jsonl, checkpoint.safetensors, model.safetensors, summary.json) and resumes the
// same way; evaluation is the validation loss and BLEU each epoch, test at the end.
#pragma once
#include <string>

#include "train/trainer.h"

namespace eg::models {
struct TransformerConfig;
}

namespace eg::train {

bool is_translation_model(const std::string& model);  // "transformer-*"

// The directory a translation run reads: --data-dir, else datasets/en-es (where
// `tools/get-data datasets` puts it). A directory holding en-es/train.tsv is also accepted.
std::string translation_data_dir(const std::string& data_dir);

// Trains c.model on c.data_dir; run_training() calls it for Transformers. `arch`, when
// given, replaces the preset named by c.model (its vocab is set from the tokenizer): tests
// train small models this way. The checkpoint records the architecture it was built with.
Summary run_translation(const TrainConfig& c, const models::TransformerConfig* arch = nullptr);

// Test loss and BLEU of a translation run's checkpoint (evaluate_checkpoint() calls it);
// precision "int8" evaluates the int8 reference model built from it.
EvalResult evaluate_translation_checkpoint(const std::string& out_dir, const std::string& data_dir,
                                           int64_t test_limit, const std::string& precision = "fp32");

}  // namespace eg::train
