//! The CPU reference: plain f32 loops, one function per op, named like the GPU
//! kernel it is the oracle for. Shapes are given in comments as `[rows, cols]`,
//! row-major; weights use the PyTorch `[out, in]` layout.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod conv1d;
pub mod elementwise;
pub mod gemm;
pub mod llm;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod speech;
pub mod whisper;

pub use activation::*;
pub use attention::*;
pub use conv::*;
pub use conv1d::*;
pub use elementwise::*;
pub use gemm::*;
pub use llm::*;
pub use matmul::*;
pub use norm::*;
pub use pool::*;
pub use speech::*;
