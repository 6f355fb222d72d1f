//! Text detection, direction classification and recognition with
//! PaddleOCR's PP-OCRv4 networks, run from their ONNX exports as RapidOCR
//! 1.4.4 runs them.

pub mod net;
