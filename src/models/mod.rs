//! One file per architecture: config -> weights -> CPU forward, then the GPU plan.

pub mod bert;
