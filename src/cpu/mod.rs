//! The CPU reference: plain f32 loops, one function per op, named like the GPU
//! kernel it is the oracle for. Shapes are given in comments as `[rows, cols]`,
//! row-major.

pub mod elementwise;
pub mod norm;

pub use elementwise::*;
pub use norm::*;
