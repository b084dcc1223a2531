// A bounded single-producer/single-consumer queue: the training thread never blocks
// on it (try_push fails when full and the caller drops the item and counts it).
#pragma once
#include <atomic>
#include <optional>
#include <vector>

namespace eg::freeze {

template <class T>
class SpscQueue {
 public:
  explicit SpscQueue(size_t capacity) : slots_(capacity + 1) {}
  // Producer only. False when full (the item is not taken).
  bool try_push(T&& v) {
    const size_t h = head_.load(std::memory_order_relaxed), n = (h + 1) % slots_.size();
    if (n == tail_.load(std::memory_order_acquire)) return false;
    slots_[h] = std::move(v);
    head_.store(n, std::memory_order_release);
    return true;
  }
  // Producer only: true when try_push would fail now (the consumer may make room after).
  bool full() const {
    return (head_.load(std::memory_order_relaxed) + 1) % slots_.size() == tail_.load(std::memory_order_acquire);
  }
  // Consumer only.
  std::optional<T> try_pop() {
    const size_t t = tail_.load(std::memory_order_relaxed);
    if (t == head_.load(std::memory_order_acquire)) return std::nullopt;
    std::optional<T> v(std::move(slots_[t]));
    slots_[t] = T();
    tail_.store((t + 1) % slots_.size(), std::memory_order_release);
    return v;
  }
  bool empty() const { return tail_.load(std::memory_order_acquire) == head_.load(std::memory_order_acquire); }

 private:
  std::vector<T> slots_;
  std::atomic<size_t> head_{0}, tail_{0};
};

}  // namespace eg::freeze
