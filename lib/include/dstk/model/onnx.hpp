#pragma once
// ONNX export of a saved model, written directly in protobuf's wire format
// (no ONNX or protobuf library needed): IR version 7, opset 13. One input
// "input", float [N, C, H, W] in the training data's stored units (the graph
// normalises it with the model's mean and std), one output "logits" [N,
// classes]. Layers map to Conv, BatchNormalization (inference), Relu,
// MaxPool, AveragePool, GlobalAveragePool, Flatten, Gemm (transB) and Add
// (residuals); dropout is the identity at inference and has no node.
#include <cstdint>
#include <vector>

namespace dstk::model {

struct SavedModel;

std::vector<std::uint8_t> encode_onnx(const SavedModel& m);

} // namespace dstk::model
