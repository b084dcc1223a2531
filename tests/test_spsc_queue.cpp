#include <gtest/gtest.h>

#include <thread>

#include "freeze/spsc_queue.h"

// The controller's queues (freeze/spsc_queue.h): bounded, first in first out, and a
// full queue refuses an item at once without taking it; across two threads every
// item arrives once, in order.
TEST(SpscQueue, IsBoundedFifoAndRefusesWhenFull) {
  eg::freeze::SpscQueue<int> q(3);
  EXPECT_TRUE(q.empty());
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(q.full());
    EXPECT_TRUE(q.try_push(int(i)));
  }
  EXPECT_TRUE(q.full());
  int extra = 99;
  EXPECT_FALSE(q.try_push(std::move(extra)));
  EXPECT_EQ(extra, 99) << "a refused item is not taken";
  EXPECT_EQ(q.try_pop().value(), 0);
  EXPECT_FALSE(q.full());
  EXPECT_TRUE(q.try_push(3));
  for (int i = 1; i <= 3; ++i) EXPECT_EQ(q.try_pop().value(), i);
  EXPECT_FALSE(q.try_pop().has_value());
  EXPECT_TRUE(q.empty());

  eg::freeze::SpscQueue<std::vector<int>> big(4);
  const int n = 20000;
  std::thread producer([&] {
    for (int i = 0; i < n; ++i)
      while (!big.try_push(std::vector<int>{i, -i})) std::this_thread::yield();
  });
  int expect = 0;
  bool in_order = true;
  while (expect < n) {  // (no ASSERT here: the producer must be joined)
    if (auto v = big.try_pop()) {
      in_order &= *v == std::vector<int>{expect, -expect};
      ++expect;
    } else {
      std::this_thread::yield();
    }
  }
  producer.join();
  EXPECT_TRUE(in_order);
  EXPECT_TRUE(big.empty());
}
