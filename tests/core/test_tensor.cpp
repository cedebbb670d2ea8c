// Tensor: shapes, byte sizes, zero fill, CPU copies, and a clear Error for CUDA without a device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/tensor.h"

using namespace pagedattn;

TEST(Tensor, ShapeAndSizes) {
  const Tensor t = Tensor::empty({2, 3, 5}, DType::bf16);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(2), 5);
  EXPECT_THROW((void)t.dim(3), std::out_of_range);
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(t.dtype(), DType::bf16);
  EXPECT_EQ(t.device(), Device::cpu);
  EXPECT_EQ(t.shape_str(), "[2, 3, 5]");
  EXPECT_TRUE(t.defined());
  EXPECT_NE(t.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u) << "CPU storage is 64-byte aligned";
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3}) {
    EXPECT_EQ(Tensor::empty({7, 3}, d).nbytes(), 21 * dtype_size(d));
  }
}

TEST(Tensor, EmptyShapesAndScalars) {
  const Tensor z = Tensor::empty({4, 0, 3}, DType::f32);
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.nbytes(), 0u);
  EXPECT_TRUE(z.defined());
  const Tensor s = Tensor::zeros({}, DType::f32);  // a scalar: no dimensions, one element
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.data_as<float>()[0], 0.f);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, NegativeDimensionThrows) {
  try {
    (void)Tensor::empty({3, -1}, DType::f32);
    FAIL() << "no Error for a negative dimension";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("Tensor::empty:", 0), 0u) << e.what();
  }
}

TEST(Tensor, ZerosAreZero) {
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3}) {
    const Tensor t = Tensor::zeros({3, 17, 5}, d);
    const auto* p = static_cast<const uint8_t*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) ASSERT_EQ(p[i], 0) << dtype_name(d) << " byte " << i;
  }
}

TEST(Tensor, CpuCopyIsDeepAndEqual) {
  Tensor a = Tensor::empty({4, 6}, DType::f32);
  for (int i = 0; i < 24; ++i) a.data_as<float>()[i] = float(i) * 0.5f - 3.f;
  Tensor b = a.to(Device::cpu);
  EXPECT_NE(b.data(), a.data());
  EXPECT_EQ(b.shape(), a.shape());
  EXPECT_EQ(b.dtype(), a.dtype());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  a.data_as<float>()[5] = 1234.f;  // the copy owns its storage
  EXPECT_EQ(b.data_as<float>()[5], 5 * 0.5f - 3.f);
  // Copies of the handle share storage.
  Tensor c = a;
  EXPECT_EQ(c.data(), a.data());
}

TEST(Tensor, CopyBytesCpu) {
  std::vector<uint8_t> src(100), dst(100, 0);
  for (int i = 0; i < 100; ++i) src[size_t(i)] = uint8_t(i * 7);
  copy_bytes(dst.data(), Device::cpu, src.data(), Device::cpu, 60);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(dst[size_t(i)], i < 60 ? src[size_t(i)] : 0) << i;
  copy_bytes(nullptr, Device::cpu, nullptr, Device::cpu, 0);  // zero bytes: a no-op
}

TEST(Tensor, DeviceNames) {
  EXPECT_EQ(device_name(Device::cpu), "cpu");
  EXPECT_EQ(device_name(Device::cuda), "cuda");
}

TEST(Tensor, CudaWithoutDeviceRaisesError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_FALSE(cuda_available());
  // NOTE: in a CUDA build without a driver cudaMalloc fails; that must surface as an Error.
  for (bool zeros : {false, true}) {
    try {
      const Tensor t = zeros ? Tensor::zeros({16, 16}, DType::f32, Device::cuda)
                             : Tensor::empty({16, 16}, DType::f32, Device::cuda);
      FAIL() << "Device::cuda allocation succeeded without a device";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("Tensor::empty:", 0), 0u) << msg;
      EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
    }
  }
  const Tensor host = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW((void)host.to(Device::cuda), Error);
}

TEST(Tensor, CudaRoundTripWhenPresent) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Tensor a = Tensor::empty({3, 5}, DType::f16);
  for (int i = 0; i < 15; ++i) a.data_as<uint16_t>()[i] = uint16_t(i * 1000 + 7);
  const Tensor d = a.to(Device::cuda);
  EXPECT_EQ(d.device(), Device::cuda);
  const Tensor back = d.to(Device::cpu);
  EXPECT_EQ(std::memcmp(a.data(), back.data(), a.nbytes()), 0);
  const Tensor z = Tensor::zeros({9}, DType::f32, Device::cuda).to(Device::cpu);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(z.data_as<float>()[i], 0.f);
}
