#include "train/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace eg::train {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::s8: return "I8";
    case DType::u8: return "U8";
    case DType::s32: return "I32";
    case DType::s64: return "I64";
  }
  return "?";
}

DType from_st_dtype(const std::string& s, const std::string& path) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::s8, DType::u8, DType::s32, DType::s64})
    if (s == st_dtype(t)) return t;
  EG_THROW("'", path, "': unsupported safetensors dtype '", s, "'");
}

std::string dir_of(const std::string& p) {
  auto k = p.find_last_of('/');
  return k == std::string::npos ? "." : (k == 0 ? "/" : p.substr(0, k));
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  EG_CHECK(fd >= 0, "cannot write '", tmp, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      EG_THROW("writing '", path, "' failed after ", done, " of ", bytes.size(),
               " bytes: ", n == 0 ? "no progress" : std::strerror(e), e == ENOSPC ? " (the disk is full)" : "",
               e == EFBIG ? " (over the process's file size limit, ulimit -f)" : "",
               "; the previous file, if any, is unchanged");
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    EG_THROW("flushing '", path, "' failed: ", std::strerror(e), e == ENOSPC ? " (the disk is full)" : "",
             "; the previous file, if any, is unchanged");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    EG_THROW("cannot replace '", path, "': ", std::strerror(e));
  }
  int dfd = ::open(dir_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void remove_stale_temporaries(const std::string& dir) {
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 >= name.size()) continue;
    const std::string pid = name.substr(at + 5);
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
    if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH) std::filesystem::remove(e.path(), ec);
  }
}

void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& meta) {
  nlohmann::json h = nlohmann::json::object();
  size_t off = 0;
  for (auto& [name, t] : tensors) {
    h[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  if (!meta.empty()) h["__metadata__"] = meta;
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  out += header;
  out.reserve(out.size() + off);
  for (auto& [name, t] : tensors) {
    Tensor c = t.to(Device::cpu());
    out.append(static_cast<const char*>(c.raw()), c.nbytes());
  }
  write_file_atomic(path, out);
}

TensorMap load_safetensors(const std::string& path, Metadata* meta) {
  std::error_code ec;
  EG_CHECK(!std::filesystem::is_directory(path, ec), "'", path, "' is a directory, not a safetensors file");
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EG_CHECK(f.good(), "cannot open '", path, "': no such file or not readable");
  const std::streamoff end = f.tellg();
  EG_CHECK(end >= 0, "cannot read '", path, "': not a regular file");
  const auto size = uint64_t(end);
  f.seekg(0);
  std::string b(size, '\0');
  f.read(b.data(), std::streamsize(size));
  EG_CHECK(f.good() || size == 0, "cannot read '", path, "'");
  EG_CHECK(size >= 8, "'", path, "' is truncated (", size, " bytes): not a safetensors file");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(b[size_t(i)])) << (8 * i);
  EG_CHECK(n <= size - 8, "'", path,
           "' is not a safetensors file, or is truncated: its first 8 bytes give a header of ", n,
           " bytes, and the file has ", size);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(b.substr(8, n));
  } catch (const std::exception& e) {
    EG_THROW("'", path, "' has a corrupt header: ", e.what());
  }
  const uint64_t data0 = 8 + n;
  TensorMap out;
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (meta)
        for (auto& [k, s] : v.items()) {
          EG_CHECK(s.is_string(), "'", path, "' has a corrupt header: its metadata '", k, "' is not a string");
          (*meta)[k] = s.get<std::string>();
        }
      continue;
    }
    try {
      DType dt = from_st_dtype(v.at("dtype").get<std::string>(), path);
      Shape s = v.at("shape").get<Shape>();
      auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
      EG_CHECK(offs.size() == 2 && offs[0] <= offs[1] && offs[1] - offs[0] == uint64_t(shape_numel(s)) * dtype_size(dt),
               "'", path, "': tensor '", name, "' has inconsistent offsets for shape ", shape_str(s));
      EG_CHECK(data0 + offs[1] <= size, "'", path, "' is truncated: tensor '", name, "' ends at byte ", data0 + offs[1],
               " but the file has ", size);
      Tensor t = Tensor::empty(s, dt);
      if (t.nbytes()) std::memcpy(t.raw(), b.data() + data0 + offs[0], t.nbytes());
      out[name] = t;
    } catch (const nlohmann::json::exception& e) {
      EG_THROW("'", path, "': bad header entry for '", name, "': ", e.what());
    }
  }
  return out;
}

}  // namespace eg::train
