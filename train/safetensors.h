// The safetensors format (https://github.com/huggingface/safetensors), so Python users
// can load egeria weights with `safetensors.torch.load_file`: an 8-byte little-endian
// header size, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}}, then the raw little-endian data.
//
// Files are written atomically: to a temporary file beside the target, flushed and
// fsync'ed, then renamed over it (and the directory fsync'ed). A crash or a full disk
// leaves the previous file untouched; the error names the path and the reason.
#pragma once
#include <map>
#include <string>

#include "core/tensor.h"

namespace eg::train {

using TensorMap = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& meta = {});
// Loads every tensor (to the CPU). Throws naming the file and the problem:
// missing, truncated, bad header, unknown dtype, offsets out of range.
TensorMap load_safetensors(const std::string& path, Metadata* meta = nullptr);

// Writes `bytes` to `path` atomically (temp file PATH.tmp.PID, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, const std::string& bytes);
// Removes the temporary files in `dir` that write_file_atomic calls of processes no
// longer running left (killed while writing): PATH.tmp.PID with no process PID.
void remove_stale_temporaries(const std::string& dir);

}  // namespace eg::train
