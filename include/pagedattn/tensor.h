// An owning, contiguous, row-major tensor on the CPU or on a CUDA device.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/dtype.h"

namespace pagedattn {

enum class Device : uint8_t { cpu, cuda };
std::string device_name(Device d);

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage for the shape (throws Error if CUDA is unavailable for Device::cuda).
  static Tensor empty(std::vector<int64_t> shape, DType dtype, Device device = Device::cpu);
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, Device device = Device::cpu);
  // A tensor over storage the caller allocated on `device` (at least numel * dtype size bytes),
  // shared with the caller: the shared_ptr's deleter frees it after the last user lets go (how
  // page-locked host buffers are handed out and reused).
  static Tensor wrap(std::shared_ptr<void> storage, std::vector<int64_t> shape, DType dtype,
                     Device device);

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <class T>
  T* data_as() { return static_cast<T*>(data()); }
  template <class T>
  const T* data_as() const { return static_cast<const T*>(data()); }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(size_t(i)); }
  int ndim() const { return int(shape_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  // A copy on another device (or the same one).
  Tensor to(Device device) const;
  std::string shape_str() const;

 private:
  std::shared_ptr<void> data_;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// CUDA helpers that work in builds without CUDA (they report no device).
// Number of usable CUDA devices; 0 on any error (no driver, no device, built without CUDA).
int cuda_device_count();
bool cuda_available();
// Copies nbytes between any two devices (kinds given by the pointers' devices).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);

}  // namespace pagedattn
