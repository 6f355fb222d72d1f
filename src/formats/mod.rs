pub mod onnx;
