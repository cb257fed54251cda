#pragma once
// ONNX export of a saved model, written directly in protobuf's wire format
// (no ONNX or protobuf library needed): IR version 7, opset 13. Inputs:
// "input", float [N, C, H, W] in the training data's stored units, and with a
// side input "side", float [N, values] (the graph normalises both with the
// model's mean and std). One output per head, its raw outputs [N, width]
// (logits for ce and bce, the value for mse, the rate before its softplus or
// exp for the Poisson losses): "logits" for a model without heads(...), else
// the head's name. Layers map to Conv, BatchNormalization (inference), Relu,
// Tanh, MaxPool, AveragePool, GlobalAveragePool, Flatten, Gemm (transB), Add
// (residuals) and Concat (the side input); dropout is the identity at
// inference and has no node.
#include <cstdint>
#include <vector>

namespace dstk::model {

struct SavedModel;

std::vector<std::uint8_t> encode_onnx(const SavedModel& m);

} // namespace dstk::model
