#include "pagedattn/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "pagedattn/error.h"
#include "cuda_memory.h"

namespace pagedattn {

std::string device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  for (int64_t s : shape) PA_CHECK(s >= 0, "Tensor::empty: negative dimension in shape");
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  const size_t bytes = t.nbytes();
  if (device == Device::cpu) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    PA_CHECK(p || !rounded, "Tensor::empty: out of host memory allocating ", bytes, " bytes");
    t.data_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    PA_CHECK(cuda_available(), "Tensor::empty: device cuda requested but no CUDA device is usable");
    void* p = bytes ? detail::cuda_malloc(bytes) : nullptr;
    t.data_ = std::shared_ptr<void>(p, [](void* q) {
      if (q) detail::cuda_free(q);
    });
  }
  return t;
}

Tensor Tensor::wrap(std::shared_ptr<void> storage, std::vector<int64_t> shape, DType dtype,
                    Device device) {
  Tensor t;
  for (int64_t s : shape) PA_CHECK(s >= 0, "Tensor::wrap: negative dimension in shape");
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  PA_CHECK(storage || t.numel() == 0, "Tensor::wrap: no storage for shape ", t.shape_str());
  t.data_ = std::move(storage);
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (device == Device::cpu) {
    if (t.nbytes()) std::memset(t.data(), 0, t.nbytes());
  } else {
    detail::cuda_memset(t.data(), 0, t.nbytes());
  }
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(t.data(), device, data(), device_, nbytes());
  return t;
}

std::string Tensor::shape_str() const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? ", " : "") << shape_[i];
  os << "]";
  return os.str();
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_dev == Device::cpu && src_dev == Device::cpu) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  detail::cuda_memcpy(dst, src, nbytes);
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace pagedattn
