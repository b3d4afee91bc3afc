#include <gtest/gtest.h>
#include <map>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/types.h>

#include "meta/MetaMode.h"
#include "meta/MetaTensor.h"

namespace metamem {
namespace {

TEST(MetaMode, FactoriesMakeMetaTensorsOnTheFakeDevice) {
  MetaMode mode(c10::Device(c10::kCUDA));
  at::Tensor t = torch::zeros({3, 5}, torch::kHalf);
  EXPECT_TRUE(is_meta_tensor(t));
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(t.scalar_type(), at::kHalf);
  EXPECT_EQ(t.sizes(), at::IntArrayRef({3, 5}));
  EXPECT_EQ(t.t().strides(), at::IntArrayRef({1, 5}));
  EXPECT_TRUE(inner_tensor(t).is_meta());
  at::Tensor g = torch::ones({2}).requires_grad_();
  EXPECT_TRUE(g.requires_grad());
}

// Counts the bytes the observer is told are live.
class LiveBytes final : public MetaObserver {
 public:
  void on_alloc(BufferId id, std::size_t bytes) override { live_[id] = bytes; }
  void on_free(BufferId id) override { live_.erase(id); }
  void on_op(const c10::OperatorHandle&, c10::ArrayRef<BufferId>, c10::ArrayRef<BufferId>,
             c10::ArrayRef<c10::IValue>, c10::ArrayRef<c10::IValue>) override {}
  std::size_t bytes() const {
    std::size_t sum = 0;
    for (const auto& [id, bytes] : live_) sum += bytes;
    return sum;
  }

 private:
  std::map<BufferId, std::size_t> live_;
};

TEST(MetaMode, HostTensorsStayOnTheHostWhenAsked) {
  LiveBytes device;
  MetaMode mode(c10::Device(c10::kCUDA), &device, HostTensors::OnHost);
  const at::Tensor dataset = torch::randn({1024, 256});  // no device named: the host's
  const at::Tensor batch = dataset.slice(0, 0, 8) * 2;  // an op on host tensors stays there
  EXPECT_TRUE(is_meta_tensor(dataset) && dataset.is_cpu() && batch.is_cpu());
  EXPECT_EQ(device.bytes(), 0u);
  const at::Tensor x = batch.to(c10::Device(c10::kCUDA));
  EXPECT_TRUE(x.is_cuda());
  EXPECT_EQ(device.bytes(), 8u * 256 * 4);
  const at::Tensor y = x * torch::ones({});  // a 0-dim host tensor goes with a device one
  EXPECT_TRUE(y.is_cuda());
  EXPECT_EQ(device.bytes(), 2u * 8 * 256 * 4);
  const at::Tensor logged = y.sum().cpu();
  EXPECT_TRUE(logged.is_cpu());
  EXPECT_EQ(device.bytes(), 2u * 8 * 256 * 4);  // the sum came and went
}

TEST(MetaMode, LeavingRestoresThreadLocalState) {
  const auto before = c10::impl::tls_local_dispatch_key_set();
  { MetaMode mode(c10::Device(c10::kCPU)); }
  const auto after = c10::impl::tls_local_dispatch_key_set();
  EXPECT_EQ(before.included_, after.included_);
  EXPECT_EQ(before.excluded_, after.excluded_);
  at::Tensor real = torch::ones({2}) + 1;
  EXPECT_FALSE(is_meta_tensor(real));
  EXPECT_EQ(real[0].item<float>(), 2.0f);
}

TEST(MetaMode, OnlyOneAtATime) {
  MetaMode mode(c10::Device(c10::kCPU));
  EXPECT_THROW(MetaMode(c10::Device(c10::kCUDA)), std::logic_error);
}

TEST(MetaMode, RejectsOtherFakeDevices) {
  EXPECT_THROW(MetaMode(c10::Device(c10::kMeta)), std::invalid_argument);
}

TEST(MetaMode, OpWithoutMetaKernelIsNamed) {
  MetaMode mode(c10::Device(c10::kCPU));
  at::Tensor x = torch::randn({16});
  try {
    at::_unique2(x);
    FAIL() << "_unique2 has no meta kernel (its size depends on values); expected UnsupportedOpError";
  } catch (const UnsupportedOpError& e) {
    EXPECT_EQ(e.op(), "aten::_unique2");
    EXPECT_NE(std::string(e.what()).find("aten::_unique2(Tensor self"), std::string::npos);
  }
}

TEST(MetaMode, ReadingAValueIsNamedUnlessPlaceholdersAreAsked) {
  MetaMode mode(c10::Device(c10::kCUDA));
  const at::Tensor loss = torch::randn({8}).sum();
  try {
    loss.item<float>();
    FAIL() << "a trace has no values; expected UnsupportedOpError";
  } catch (const UnsupportedOpError& e) {
    EXPECT_EQ(e.op(), "aten::_local_scalar_dense");
  }
  {
    PlaceholderValues zeros;
    EXPECT_EQ(loss.item<float>(), 0.0f);
    EXPECT_FALSE(loss.isnan().item<bool>());
    EXPECT_EQ(loss.to(at::kLong).item<std::int64_t>(), 0);
  }
  EXPECT_THROW(loss.item<float>(), UnsupportedOpError);  // placeholders end with their scope
}

}  // namespace
}  // namespace metamem
