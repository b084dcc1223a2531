// The generator's state on a device (Note [Random state on the device] in core/rng.h).
#include "core/rng.h"

#include <memory>
#include <vector>

#include "core/staged_upload.h"
#include "core/tensor.h"

namespace eg {

// One entry a device the generator has drawn on: the tensor kernels read, what it holds,
// and on a GPU the upload that rewrites it.
struct Generator::OnDevice {
  struct Entry {
    Tensor state;
    uint64_t seed = 0, base = 0;
    std::unique_ptr<StagedUpload> upload;
  };
  std::vector<Entry> entries;
};

Generator::~Generator() { delete on_device_; }

const Tensor& Generator::state_on(const Device& device) {
  if (!on_device_) on_device_ = new OnDevice();
  OnDevice::Entry* e = nullptr;
  for (auto& x : on_device_->entries)
    if (x.state.device() == device) e = &x;
  if (!e) {
    on_device_->entries.push_back({Tensor::empty({2}, DType::s64, device), 0, 0, nullptr});
    e = &on_device_->entries.back();
  } else if (e->seed == seed_ && e->base == step_base_) {
    return e->state;
  }
  // Written in place: Tensor::from_vector would count as an upload (Note [Host syncs]).
  auto write = [this](Tensor& t) {
    int64_t* v = t.data<int64_t>();
    v[0] = int64_t(seed_), v[1] = int64_t(step_base_);
  };
  if (device.is_cpu()) {
    write(e->state);
  } else {
    Tensor host = Tensor::empty({2}, DType::s64);
    write(host);
    if (!e->upload) e->upload = std::make_unique<StagedUpload>(device);
    e->upload->stage(host);
    Tensor& dst = e->state;
    e->upload->take([&dst](const Tensor& staged) {
      dst.copy_(staged);
      return dst;
    });
  }
  e->seed = seed_, e->base = step_base_;
  return e->state;
}

}  // namespace eg
