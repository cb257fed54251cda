#pragma once
// The step's input buffers twice over, and a stream of their own for the
// batch's conversion into them (dstk/train/trainer.hpp: convert + normalise).
// While a step reads one set on the main stream, the next batch is gathered
// by the data path and converted into the other set on the input stream, so
// that neither waits at the start of the next step; the training and
// evaluation graphs are captured once per set. The events below keep a set
// from being written while a step that reads it may still run.
#include <cuda_runtime.h>

namespace dstk::train::cuda {

class InputSets {
  public:
    // priority: the input stream's (below the main stream's, so that the
    // conversion fills gaps in a step rather than slowing it).
    InputSets(cudaStream_t main, int priority);
    ~InputSets();
    InputSets(const InputSets&) = delete;
    InputSets& operator=(const InputSets&) = delete;

    static constexpr unsigned count = 2;
    // Where batches are read (Trainer::input_stream): the data path orders
    // its gathers and copies before work on it, the conversion runs on it.
    cudaStream_t stream() const { return input_; }
    // The set the steps enqueued from now on read.
    unsigned current() const { return set_; }
    // Before a batch is converted: the other set becomes current, and the
    // input stream waits for every step that read it. serial: for every
    // step on the main stream so far (a conversion that writes outside the
    // sets, into the network's own activations).
    void take(bool serial);
    // Set k current, ordering nothing: while graphs are captured for each set.
    void select(unsigned k) { set_ = k; }
    // After the conversion: `to` (the main stream, or the stream that runs
    // the step) waits for it.
    void hand_over(cudaStream_t to);
    // The point of a step (its end on s, a stream of the main stream's step,
    // in a captured graph an external event node) after which the next
    // batch's conversion starts: take() waits for its last record. Where the
    // conversion ran beside a step's forward pass, its kernels took the SMs
    // the forward's own convolutions had a use for.
    void open_gate(cudaStream_t s);

  private:
    cudaStream_t main_ = nullptr, input_ = nullptr;
    cudaEvent_t ready_ = nullptr, gate_ = nullptr;
    cudaEvent_t read_[count] = {}; // main stream: every step that read set k, recorded when k stopped being current
    unsigned set_ = 0;
};

} // namespace dstk::train::cuda
