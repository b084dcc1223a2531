// The SP-loss plasticity (freeze/plasticity.h) on synthetic activations.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "freeze/plasticity.h"

namespace eg::freeze {
namespace {

TEST(SpLoss, ZeroForIdenticalAndScaledActivations) {
  Generator g(1);
  Tensor a = Tensor::randn({8, 4, 3, 3}, g);
  EXPECT_NEAR(sp_loss(a, a.clone()), 0.0, 1e-12);
  // Row normalisation makes the loss blind to a global scale of either side.
  Tensor a2 = a.clone();
  for (auto* p = a2.data<float>(); p != a2.data<float>() + a2.numel(); ++p) *p *= 3.f;
  EXPECT_NEAR(sp_loss(a, a2), 0.0, 1e-10);
}

TEST(SpLoss, MatchesTheFormulaOnASmallCase) {
  // Two samples, two features: Q_T = [[1, 0], [1, 1]], Q_R = [[1, 0], [0, 1]].
  Tensor t = Tensor::from_vector<double>({1, 0, 1, 1}, {2, 2});
  Tensor r = Tensor::from_vector<double>({1, 0, 0, 1}, {2, 2});
  // G_T = [[1, 1], [1, 2]] -> rows / [sqrt 2, sqrt 5]; G_R = I.
  const double s2 = std::sqrt(2.0), s5 = std::sqrt(5.0);
  const double gt[4] = {1 / s2, 1 / s2, 1 / s5, 2 / s5}, gr[4] = {1, 0, 0, 1};
  double want = 0;
  for (int i = 0; i < 4; ++i) want += (gt[i] - gr[i]) * (gt[i] - gr[i]);
  want /= 4;
  EXPECT_NEAR(sp_loss(t, r), want, 1e-12);
}

TEST(SpLoss, GrowsWithTheDistanceBetweenActivations) {
  Generator g(2);
  Tensor a = Tensor::randn({16, 32}, g), noise = Tensor::randn({16, 32}, g);
  double prev = 0;
  for (float eps : {0.05f, 0.2f, 0.8f}) {
    Tensor b = a.clone();
    for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] += eps * noise.data<float>()[i];
    const double p = sp_loss(a, b);
    EXPECT_GT(p, prev);
    prev = p;
  }
}

TEST(SpLoss, RejectsMismatchedShapesAndSingleSamples) {
  Generator g(3);
  try {
    sp_loss(Tensor::randn({4, 8}, g), Tensor::randn({4, 9}, g));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reference's is [4, 9]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sp_gram(Tensor::randn({1, 8}, g)), Error);
}

}  // namespace
}  // namespace eg::freeze
