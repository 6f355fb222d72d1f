//! A general interpreter for the ONNX graphs of the PaddleOCR networks
//! (PP-OCRv4 detection and recognition, the mobile direction classifier).
//!
//! Unlike the layout detector's lowering ([`crate::models::layout::graph`]),
//! whose shapes are fixed by the file, these graphs take images of any size
//! (detection: any multiple of 32; recognition: any width) and compute
//! their own reshape targets at run time (`Shape`, `Cast`, `Slice`,
//! `Concat` over integer tensors). So shapes are found as the graph runs.
//!
//! Loading prepares each node once: batch norm is folded into the
//! convolution before it, a ReLU or hard-sigmoid right after a convolution
//! becomes its epilogue, a constant MatMul weight is transposed once (and a
//! constant bias Add after it fused). Every other op runs as ONNX defines
//! it, with numpy broadcasting for the elementwise ones. Any op outside the
//! list is an `Unsupported` error naming the node, at load time.

use crate::cpu::{self, Conv2d, ConvActivation, Pointwise};
use crate::error::{Error, Result};
use crate::formats::onnx::{OnnxModel, OnnxNode, OnnxTensor};
use crate::models::layout::graph::fold_batch_norm;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A tensor flowing through the graph: f32 data, or i64 for the shape
/// arithmetic. Row-major.
#[derive(Debug, Clone)]
pub enum Tensor {
    F32(Vec<f32>, Vec<usize>),
    I64(Vec<i64>, Vec<usize>),
}

impl Tensor {
    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::F32(_, s) | Tensor::I64(_, s) => s,
        }
    }

    fn floats(&self) -> Option<&[f32]> {
        match self {
            Tensor::F32(d, _) => Some(d),
            Tensor::I64(..) => None,
        }
    }

    fn ints(&self) -> Vec<i64> {
        match self {
            Tensor::F32(d, _) => d.iter().map(|&v| v as i64).collect(),
            Tensor::I64(d, _) => d.clone(),
        }
    }

    fn from_onnx(t: &OnnxTensor) -> Result<Tensor> {
        let shape: Vec<usize> = t.shape()?;
        if t.data_type.is_integer() {
            Ok(Tensor::I64(t.to_i64()?, shape))
        } else {
            Ok(Tensor::F32(t.to_f32()?, shape))
        }
    }

    /// Same data, `shape` (same element count) in place of the old one.
    fn reshaped(self, shape: Vec<usize>) -> Tensor {
        match self {
            Tensor::F32(d, _) => Tensor::F32(d, shape),
            Tensor::I64(d, _) => Tensor::I64(d, shape),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
}

impl Binary {
    #[inline]
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
            Binary::Pow if b == 2.0 => a * a,
            Binary::Pow => a.powf(b),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Unary {
    Sqrt,
    Identity,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Batch norm folded in; `act` fused.
    Conv {
        /// [c_out, c_in / groups, kh, kw]
        weight: Arc<Vec<f32>>,
        bias: Arc<Vec<f32>>,
        kernel: [usize; 2],
        stride: [usize; 2],
        pad: [usize; 4],
        dilation: [usize; 2],
        groups: usize,
        act: ConvActivation,
        /// The elementwise nodes after it, fused.
        tail: Chain,
    },
    ConvTranspose {
        /// [c_in, c_out / groups, kh, kw]
        weight: Arc<Vec<f32>>,
        bias: Arc<Vec<f32>>,
        kernel: [usize; 2],
        stride: [usize; 2],
        pad: [usize; 4],
        groups: usize,
        tail: Chain,
    },
    /// Elementwise steps on a float tensor (a unary op or a batch norm
    /// and the nodes fused after it).
    Chain(Chain),
    Binary(Binary),
    Unary(Unary),
    GlobalAveragePool,
    /// Average (count_include_pad false) or max pooling.
    Pool {
        max: bool,
        kernel: [usize; 2],
        stride: [usize; 2],
        pad: [usize; 4],
        count_include_pad: bool,
    },
    /// Nearest neighbour, asymmetric coordinates, floor rounding.
    ResizeNearest {
        scale: [f32; 2],
    },
    Concat {
        axis: i64,
    },
    Reshape,
    Transpose {
        perm: Vec<usize>,
    },
    Squeeze {
        axes: Vec<i64>,
    },
    Slice,
    Shape,
    Cast {
        to_float: bool,
    },
    ReduceMean {
        axes: Vec<i64>,
        keepdims: bool,
    },
    /// x @ W with a constant W, stored [n, k] (transposed once), and an
    /// optional bias fused from the Add after it.
    MatMulConst {
        weight: Arc<cpu::PackedMatrix>,
        k: usize,
        n: usize,
        bias: Option<Arc<Vec<f32>>>,
    },
    /// Both operands computed: batched over the leading axes.
    MatMul,
    /// Over the last axis (the only one accepted at run time).
    Softmax {
        axis: i64,
    },
}

/// Elementwise steps fused into the op before them (see
/// [`cpu::pointwise_chain`]); `affine` holds a batch norm's per-channel
/// scale then shift.
#[derive(Debug, Clone, Default)]
pub(super) struct Chain {
    pub steps: Vec<Pointwise>,
    pub affine: Arc<Vec<f32>>,
}

impl Chain {
    /// Runs the chain over `y` ([.., channels, plane]).
    fn apply(&self, plane: usize, y: &mut [f32]) {
        if self.steps.is_empty() {
            return;
        }
        let channels = self.affine.len() / 2;
        if channels == 0 {
            y.par_chunks_mut(1 << 14)
                .for_each(|part| cpu::pointwise_chain(&self.steps, &[], plane, part));
        } else {
            y.par_chunks_mut(plane.max(1))
                .enumerate()
                .for_each(|(k, part)| {
                    let ch = k % channels;
                    let affine = [self.affine[ch], self.affine[channels + ch]];
                    cpu::pointwise_chain(&self.steps, &affine, plane, part);
                });
        }
    }
}

impl Chain {
    /// Runs the chain over a piece of channel `o`'s plane.
    fn apply_channel(&self, o: usize, piece: &mut [f32]) {
        if self.steps.is_empty() {
            return;
        }
        let channels = self.affine.len() / 2;
        if channels == 0 {
            cpu::pointwise_chain(&self.steps, &[], piece.len(), piece);
        } else {
            let ch = o % channels;
            let affine = [self.affine[ch], self.affine[channels + ch]];
            cpu::pointwise_chain(&self.steps, &affine, piece.len(), piece);
        }
    }
}

impl Op {
    /// A short name of the operator, for timings.
    fn kind(&self) -> &'static str {
        match self {
            Op::Conv {
                groups: 1,
                kernel: [1, 1],
                ..
            } => "Conv 1x1",
            Op::Conv { groups: 1, .. } => "Conv",
            Op::Conv { .. } => "Conv grouped",
            Op::ConvTranspose { .. } => "ConvTranspose",
            Op::Chain(_) => "elementwise chain",
            Op::Binary(_) => "elementwise binary",
            Op::Unary(_) => "elementwise unary",
            Op::GlobalAveragePool => "GlobalAveragePool",
            Op::Pool { .. } => "Pool",
            Op::ResizeNearest { .. } => "Resize",
            Op::Concat { .. } => "Concat",
            Op::Reshape => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Squeeze { .. } => "Squeeze",
            Op::Slice => "Slice",
            Op::Shape => "Shape",
            Op::Cast { .. } => "Cast",
            Op::ReduceMean { .. } => "ReduceMean",
            Op::MatMulConst { .. } => "MatMul (constant)",
            Op::MatMul => "MatMul",
            Op::Softmax { .. } => "Softmax",
        }
    }
}

impl Op {
    /// Whether the op can write its output over its first input.
    fn reuses_input(&self) -> bool {
        matches!(
            self,
            Op::Chain(_)
                | Op::Binary(_)
                | Op::Unary(_)
                | Op::Reshape
                | Op::Squeeze { .. }
                | Op::Softmax { .. }
        )
    }
}

/// A node's first input: its own (the node is the value's last reader,
/// so the output may reuse the buffer) or shared.
enum First<'a> {
    Owned(Tensor),
    Shared(&'a Tensor),
}

impl First<'_> {
    fn get(&self) -> &Tensor {
        match self {
            First::Owned(t) => t,
            First::Shared(t) => t,
        }
    }

    fn into_tensor(self) -> Tensor {
        match self {
            First::Owned(t) => t,
            First::Shared(t) => t.clone(),
        }
    }

    /// The float data (moved or copied) and shape.
    fn into_floats(self, what: &str) -> std::result::Result<(Vec<f32>, Vec<usize>), String> {
        match self.into_tensor() {
            Tensor::F32(d, s) => Ok((d, s)),
            Tensor::I64(..) => Err(format!("{what}: integer tensor where floats are expected")),
        }
    }
}

/// One node's share of a [`Net::run_timed`].
#[derive(Debug, Clone)]
pub struct NodeTime {
    pub name: String,
    pub op: &'static str,
    /// The output's shape.
    pub shape: Vec<usize>,
    pub time: Duration,
}

#[derive(Debug, Clone)]
pub(super) struct Node {
    pub op: Op,
    /// Slots read, in the op's order.
    pub inputs: Vec<usize>,
    pub output: usize,
    pub name: String,
}

/// A prepared network: image tensor in, output tensors out.
#[derive(Debug, Clone)]
pub struct Net {
    pub path: PathBuf,
    pub(super) nodes: Vec<Node>,
    /// The constants, by slot (None for computed values).
    pub(super) constants: Vec<Option<Arc<Tensor>>>,
    pub(super) input: usize,
    pub(super) outputs: Vec<usize>,
    /// For each slot, the last node reading it.
    pub(super) last_use: Vec<usize>,
    /// Float buffers of values that died, for the next outputs.
    pub(super) buffers: Arc<Mutex<Buffers>>,
}

/// Buffers of dead values, reused for new outputs so that a large output
/// is neither zeroed nor faulted in afresh: a buffer taken from here holds
/// stale values, so only outputs that every kernel overwrites whole take
/// one.
#[derive(Debug, Default)]
pub(super) struct Buffers(Vec<Vec<f32>>);

impl Buffers {
    /// Buffers below this many floats are left to the allocator.
    const SMALL: usize = 1 << 12;
    /// Buffers kept at most.
    const KEPT: usize = 16;

    /// `n` floats of stale values: the smallest kept buffer that holds
    /// them, or a new one.
    fn take(&mut self, n: usize) -> Vec<f32> {
        let best = (n >= Self::SMALL)
            .then(|| {
                (0..self.0.len())
                    .filter(|&i| self.0[i].capacity() >= n)
                    .min_by_key(|&i| self.0[i].capacity())
            })
            .flatten();
        match best {
            Some(i) => {
                let mut v = self.0.swap_remove(i);
                v.resize(n, 0.0);
                v
            }
            None => vec![0.0; n],
        }
    }

    /// Keeps the buffers of `other` (a run's, back in the net's pool).
    fn merge(&mut self, other: Buffers) {
        for v in other.0 {
            self.give(Tensor::F32(v, Vec::new()));
        }
    }

    /// Keeps `t`'s buffer if it is a large float one.
    fn give(&mut self, t: Tensor) {
        if let Tensor::F32(v, _) = t {
            if v.capacity() >= Self::SMALL {
                if self.0.len() == Self::KEPT {
                    let smallest = (0..self.0.len())
                        .min_by_key(|&i| self.0[i].capacity())
                        .expect("KEPT > 0");
                    self.0.swap_remove(smallest);
                }
                self.0.push(v);
            }
        }
    }
}

impl Net {
    /// Reads and prepares `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<(Net, OnnxModel)> {
        let onnx = OnnxModel::open(path.as_ref())?;
        let net = Net::prepare(&onnx)?;
        Ok((net, onnx))
    }

    pub fn prepare(model: &OnnxModel) -> Result<Net> {
        Preparer::new(model).run()
    }

    /// Nodes after preparation (fused chains count once).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Runs the graph on `input` (the image tensor, [n, 3, h, w]); returns
    /// the graph outputs in file order.
    pub fn run(&self, input: Tensor) -> Result<Vec<Tensor>> {
        let mut values: Vec<Option<Arc<Tensor>>> = self.constants.clone();
        values[self.input] = Some(Arc::new(input));
        self.run_from(0, values)
    }

    /// Runs nodes `start..` on `values` (by slot: the constants and every
    /// value the nodes before `start` computed that later ones read).
    pub(super) fn run_from(
        &self,
        start: usize,
        values: Vec<Option<Arc<Tensor>>>,
    ) -> Result<Vec<Tensor>> {
        self.run_observed(start, values, |_, _, _| {})
    }

    /// [`Net::run`], timing each node: the outputs and, for each node in
    /// order, its name, operator, output shape and time.
    pub fn run_timed(&self, input: Tensor) -> Result<(Vec<Tensor>, Vec<NodeTime>)> {
        let mut values: Vec<Option<Arc<Tensor>>> = self.constants.clone();
        values[self.input] = Some(Arc::new(input));
        let mut times = Vec::with_capacity(self.nodes.len());
        let out = self.run_observed(0, values, |node, y, time| {
            times.push(NodeTime {
                name: node.name.clone(),
                op: node.op.kind(),
                shape: y.shape().to_vec(),
                time,
            })
        })?;
        Ok((out, times))
    }

    /// Runs nodes `start..`, telling `observe` each node, its output and
    /// how long it took.
    fn run_observed(
        &self,
        start: usize,
        mut values: Vec<Option<Arc<Tensor>>>,
        mut observe: impl FnMut(&Node, &Tensor, Duration),
    ) -> Result<Vec<Tensor>> {
        // This run's pool (a concurrent run of the same net starts with an
        // empty one; both go back at the end).
        let mut buffers = std::mem::take(&mut *self.buffers.lock().expect("not poisoned"));
        for (i, node) in self.nodes.iter().enumerate().skip(start) {
            let (&first, rest) = node
                .inputs
                .split_first()
                .expect("every node reads an input");
            // The node's output may take over its first input's buffer when
            // nothing reads that value after it.
            let mut owned = None;
            if node.op.reuses_input()
                && self.last_use[first] == i
                && self.constants[first].is_none()
                && !rest.contains(&first)
            {
                if let Some(t) = values[first].take() {
                    match Arc::try_unwrap(t) {
                        Ok(t) => owned = Some(t),
                        Err(t) => values[first] = Some(t),
                    }
                }
            }
            let get = |s: usize| values[s].as_deref().expect("nodes run in dependency order");
            let x = match owned {
                Some(t) => First::Owned(t),
                None => First::Shared(get(first)),
            };
            let rest: Vec<&Tensor> = rest.iter().map(|&s| get(s)).collect();
            let t = Instant::now();
            let y = eval(node, x, &rest, &mut buffers)
                .map_err(|e| Error::format(&self.path, format!("node '{}': {e}", node.name)))?;
            observe(node, &y, t.elapsed());
            values[node.output] = Some(Arc::new(y));
            for &s in &node.inputs {
                if self.last_use[s] == i && self.constants[s].is_none() {
                    if let Some(t) = values[s].take().and_then(|t| Arc::try_unwrap(t).ok()) {
                        buffers.give(t);
                    }
                }
            }
        }
        self.buffers.lock().expect("not poisoned").merge(buffers);
        Ok(self
            .outputs
            .iter()
            .map(|&s| {
                let t = values[s].take().expect("graph outputs are computed");
                Arc::try_unwrap(t).unwrap_or_else(|t| (*t).clone())
            })
            .collect())
    }
}

/// A per-channel bias added after a convolution (see
/// `Preparer::bias_add_after`): the Add node, the Reshape feeding it the
/// bias (if any) and the bias.
struct BiasAdd {
    add: usize,
    reshape: Option<usize>,
    bias: Vec<f32>,
}

struct Preparer<'a> {
    model: &'a OnnxModel,
    consumers: HashMap<&'a str, Vec<usize>>,
    absorbed: Vec<bool>,
    slots: HashMap<String, usize>,
    constants: Vec<Option<Arc<Tensor>>>,
    nodes: Vec<Node>,
}

impl<'a> Preparer<'a> {
    fn new(model: &'a OnnxModel) -> Self {
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in model.graph.nodes.iter().enumerate() {
            for input in n.inputs.iter().filter(|s| !s.is_empty()) {
                consumers.entry(input.as_str()).or_default().push(i);
            }
        }
        Preparer {
            model,
            consumers,
            absorbed: vec![false; model.graph.nodes.len()],
            slots: HashMap::new(),
            constants: Vec::new(),
            nodes: Vec::new(),
        }
    }

    fn path(&self) -> &Path {
        &self.model.path
    }

    fn slot(&mut self, name: &str) -> usize {
        if let Some(&s) = self.slots.get(name) {
            return s;
        }
        let s = self.constants.len();
        self.constants.push(None);
        self.slots.insert(name.to_string(), s);
        s
    }

    /// The slot of an input value: a computed one, or a constant loaded now.
    fn input_slot(&mut self, node: &OnnxNode, name: &str) -> Result<usize> {
        if let Some(&s) = self.slots.get(name) {
            return Ok(s);
        }
        match self.model.graph.constant(name) {
            Some(t) => {
                let t = Tensor::from_onnx(t)?;
                let s = self.slot(name);
                self.constants[s] = Some(Arc::new(t));
                Ok(s)
            }
            None => Err(node.error(format_args!(
                "input '{name}' is not computed before this node"
            ))),
        }
    }

    fn constant(&self, node: &OnnxNode, index: usize) -> Result<&'a OnnxTensor> {
        let name = node
            .inputs
            .get(index)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| node.error(format_args!("input {index} is missing")))?;
        self.model
            .graph
            .constant(name)
            .ok_or_else(|| node.unsupported(format_args!("input '{name}' must be a constant")))
    }

    fn sole_consumer(&self, value: &str) -> Option<usize> {
        if self.model.graph.outputs.iter().any(|o| o.name == value) {
            return None;
        }
        match self.consumers.get(value).map(Vec::as_slice) {
            Some(&[i]) if !self.absorbed[i] => Some(i),
            _ => None,
        }
    }

    fn run(mut self) -> Result<Net> {
        let g = &self.model.graph;
        let inputs: Vec<_> = g
            .inputs
            .iter()
            .filter(|v| g.constant(&v.name).is_none())
            .collect();
        let [input] = inputs.as_slice() else {
            return Err(Error::unsupported(
                self.path(),
                format!(
                    "the graph has {} inputs; an image network has one",
                    inputs.len()
                ),
            ));
        };
        let input = self.slot(&input.name);
        for i in 0..g.nodes.len() {
            let node = &g.nodes[i];
            if self.absorbed[i]
                || (node.op_type == "Constant" && g.constant(&node.outputs[0]).is_some())
            {
                continue;
            }
            if !(node.domain.is_empty() || node.domain == "ai.onnx") {
                return Err(node.unsupported(format_args!("operator domain '{}'", node.domain)));
            }
            self.prepare_node(i)?;
        }
        let mut outputs = Vec::new();
        for o in &g.outputs {
            outputs.push(*self.slots.get(&o.name).ok_or_else(|| {
                Error::format(
                    self.path(),
                    format!("graph output '{}' is never computed", o.name),
                )
            })?);
        }
        let mut last_use = vec![0usize; self.constants.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &s in &n.inputs {
                last_use[s] = i;
            }
        }
        for &s in &outputs {
            last_use[s] = usize::MAX;
        }
        Ok(Net {
            path: self.path().to_path_buf(),
            nodes: self.nodes,
            constants: self.constants,
            input,
            outputs,
            last_use,
            buffers: Arc::default(),
        })
    }

    fn push(&mut self, node: &OnnxNode, op: Op, inputs: Vec<usize>, out: &str) {
        let output = self.slot(out);
        self.nodes.push(Node {
            op,
            inputs,
            output,
            name: if node.name.is_empty() {
                node.outputs.first().cloned().unwrap_or_default()
            } else {
                node.name.clone()
            },
        });
    }

    fn inputs(&mut self, node: &OnnxNode) -> Result<Vec<usize>> {
        node.inputs
            .iter()
            .filter(|s| !s.is_empty())
            .map(|n| self.input_slot(node, n))
            .collect()
    }

    fn prepare_node(&mut self, i: usize) -> Result<()> {
        let node = &self.model.graph.nodes[i];
        let out = node
            .outputs
            .first()
            .ok_or_else(|| node.error("no output"))?
            .clone();
        let op = match node.op_type.as_str() {
            "Conv" => return self.prepare_conv(i),
            "ConvTranspose" => return self.prepare_conv_transpose(i),
            "MatMul" => return self.prepare_matmul(node),
            "Add" => Op::Binary(Binary::Add),
            "Sub" => Op::Binary(Binary::Sub),
            "Mul" => Op::Binary(Binary::Mul),
            "Div" => Op::Binary(Binary::Div),
            "Pow" => Op::Binary(Binary::Pow),
            "Sqrt" => Op::Unary(Unary::Sqrt),
            "Identity" => Op::Unary(Unary::Identity),
            "Relu" | "Sigmoid" | "HardSigmoid" | "Clip" => {
                let step = self
                    .unary_step(node)?
                    .expect("the four are elementwise steps");
                let mut chain = Chain {
                    steps: vec![step],
                    ..Chain::default()
                };
                let out = self.absorb_chain(&node.outputs[0], &mut chain)?;
                let x = self.input_slot(node, &node.inputs[0])?;
                self.push(node, Op::Chain(chain), vec![x], out);
                return Ok(());
            }
            "GlobalAveragePool" => Op::GlobalAveragePool,
            "AveragePool" | "MaxPool" => {
                let max = node.op_type == "MaxPool";
                if node.int_or("ceil_mode", 0)? != 0 {
                    return Err(node.unsupported("ceil_mode"));
                }
                if node.string_or("auto_pad", "NOTSET")? != "NOTSET" {
                    return Err(node.unsupported("auto_pad"));
                }
                let kernel = pair(node, "kernel_shape", None)?;
                let stride = pair(node, "strides", Some(1))?;
                let pad = pads(node)?;
                Op::Pool {
                    max,
                    kernel,
                    stride,
                    pad,
                    count_include_pad: node.int_or("count_include_pad", 0)? != 0,
                }
            }
            "Resize" => {
                let mode = node.string_or("mode", "nearest")?;
                let coords = node.string_or("coordinate_transformation_mode", "half_pixel")?;
                let rounding = node.string_or("nearest_mode", "round_prefer_floor")?;
                if mode != "nearest" || coords != "asymmetric" || rounding != "floor" {
                    return Err(node.unsupported(format_args!(
                        "Resize mode {mode}, {coords} coordinates, {rounding} rounding \
                         (only nearest/asymmetric/floor is supported)"
                    )));
                }
                let scales = self.constant(node, 2)?.to_f32()?;
                match scales.as_slice() {
                    &[1.0, 1.0, h, w] if h > 0.0 && w > 0.0 => {
                        let x = self.input_slot(node, &node.inputs[0])?;
                        self.push(node, Op::ResizeNearest { scale: [h, w] }, vec![x], &out);
                        return Ok(());
                    }
                    other => return Err(node.unsupported(format_args!("Resize scales {other:?}"))),
                }
            }
            "Concat" => Op::Concat {
                axis: node.int("axis")?,
            },
            "Reshape" => {
                if node.int_or("allowzero", 0)? != 0 {
                    return Err(node.unsupported("allowzero"));
                }
                Op::Reshape
            }
            "Transpose" => Op::Transpose {
                perm: node
                    .ints("perm")?
                    .iter()
                    .map(|&p| usize::try_from(p).map_err(|_| node.error("negative perm")))
                    .collect::<Result<_>>()?,
            },
            "Squeeze" => {
                let axes = match node.inputs.get(1).filter(|s| !s.is_empty()) {
                    Some(_) => self.constant(node, 1)?.to_i64()?,
                    None => node.ints_or("axes", &[])?,
                };
                let x = self.input_slot(node, &node.inputs[0])?;
                self.push(node, Op::Squeeze { axes }, vec![x], &out);
                return Ok(());
            }
            "Slice" => Op::Slice,
            "Shape" => Op::Shape,
            "Cast" => {
                // 1 FLOAT, 11 DOUBLE, 10 FLOAT16; the integer types otherwise.
                let to = node.int("to")?;
                Op::Cast {
                    to_float: matches!(to, 1 | 10 | 11 | 16),
                }
            }
            "ReduceMean" => {
                let axes = match node.inputs.get(1).filter(|s| !s.is_empty()) {
                    Some(_) => self.constant(node, 1)?.to_i64()?,
                    None => node.ints_or("axes", &[])?,
                };
                Op::ReduceMean {
                    axes,
                    keepdims: node.int_or("keepdims", 1)? != 0,
                }
            }
            "Softmax" => Op::Softmax {
                axis: node.int_or("axis", -1)?,
            },
            "BatchNormalization" => {
                let c = self.constant(node, 1)?.to_f32()?.len();
                let (mut scale, mut shift) = (vec![1.0f32; c], vec![0.0f32; c]);
                fold_batch_norm(node, |k| self.constant(node, k), &mut scale, &mut shift)?;
                scale.extend_from_slice(&shift);
                let mut chain = Chain {
                    steps: vec![Pointwise::ChannelAffine],
                    affine: Arc::new(scale),
                };
                let out = self.absorb_chain(&node.outputs[0], &mut chain)?;
                let x = self.input_slot(node, &node.inputs[0])?;
                self.push(node, Op::Chain(chain), vec![x], out);
                return Ok(());
            }
            other => {
                return Err(node.unsupported(format_args!(
                    "operator {other} is not one the PaddleOCR networks use"
                )))
            }
        };
        let inputs = self.inputs(node)?;
        self.push(node, op, inputs, &out);
        Ok(())
    }

    fn prepare_conv(&mut self, i: usize) -> Result<()> {
        let g = &self.model.graph;
        let node = &g.nodes[i];
        let w = self.constant(node, 1)?;
        let wd = w.shape()?;
        if wd.len() != 4 {
            return Err(node.unsupported(format_args!("weight {wd:?}: only 2-D convolutions")));
        }
        if node.string_or("auto_pad", "NOTSET")? != "NOTSET" {
            return Err(node.unsupported("auto_pad"));
        }
        let mut weight = w.to_f32()?;
        let mut bias = match node.inputs.get(2).filter(|s| !s.is_empty()) {
            Some(_) => self.constant(node, 2)?.to_f32()?,
            None => vec![0.0; wd[0]],
        };
        if bias.len() != wd[0] {
            return Err(node.error(format_args!("bias of {} for {} outputs", bias.len(), wd[0])));
        }
        let groups =
            usize::try_from(node.int_or("group", 1)?).map_err(|_| node.error("negative group"))?;
        if groups == 0 || !wd[0].is_multiple_of(groups) {
            return Err(node.error(format_args!("group {groups} for weight {wd:?}")));
        }
        let mut out = node.outputs[0].as_str();
        if let Some(j) = self
            .sole_consumer(out)
            .filter(|&j| g.nodes[j].op_type == "BatchNormalization")
        {
            let bn = &g.nodes[j];
            fold_batch_norm(bn, |k| self.constant(bn, k), &mut weight, &mut bias)?;
            self.absorbed[j] = true;
            out = bn.outputs[0].as_str();
        }
        // A bias added after a convolution without one: acc + 0 + b is
        // acc + b exactly.
        if node.inputs.get(2).is_none_or(|s| s.is_empty()) && out == node.outputs[0] {
            out = self.absorb_bias_add(i, out, &mut bias)?;
        }
        let mut act = ConvActivation::None;
        if let Some(j) = self.sole_consumer(out) {
            let n = &g.nodes[j];
            let fused = match n.op_type.as_str() {
                "Relu" => Some(ConvActivation::Relu),
                "HardSigmoid" => Some(ConvActivation::HardSigmoid {
                    alpha: n.float_or("alpha", 0.2)?,
                    beta: n.float_or("beta", 0.5)?,
                }),
                _ => None,
            };
            if let Some(a) = fused {
                act = a;
                self.absorbed[j] = true;
                out = n.outputs[0].as_str();
            }
        }
        let mut tail = Chain::default();
        let out = self.absorb_chain(out, &mut tail)?;
        let x = self.input_slot(node, &node.inputs[0])?;
        let stride = pair(node, "strides", Some(1))?;
        let pad = pads(node)?;
        let op = Op::Conv {
            weight: Arc::new(weight),
            bias: Arc::new(bias),
            kernel: [wd[2], wd[3]],
            stride,
            pad,
            dilation: pair(node, "dilations", Some(1))?,
            groups,
            act,
            tail,
        };
        self.push(node, op, vec![x], out);
        Ok(())
    }

    /// The one scalar of a constant input, if `name` is one.
    fn scalar(&self, name: &str) -> Option<f32> {
        let t = self.model.graph.constant(name)?;
        if t.data_type.is_integer() {
            return None;
        }
        match t.to_f32().ok()?.as_slice() {
            &[v] => Some(v),
            _ => None,
        }
    }

    /// `node` as a chain step when it is an elementwise op on its first
    /// input alone (constants aside).
    fn unary_step(&self, node: &OnnxNode) -> Result<Option<Pointwise>> {
        let x = node.inputs.first().map(String::as_str).unwrap_or("");
        let other = |k: usize| node.inputs.get(k).map(String::as_str).unwrap_or("");
        let step = match node.op_type.as_str() {
            "Relu" => Pointwise::Relu,
            "Sigmoid" => Pointwise::Sigmoid,
            "HardSigmoid" => Pointwise::HardSigmoid {
                alpha: node.float_or("alpha", 0.2)?,
                beta: node.float_or("beta", 0.5)?,
            },
            "Clip" => {
                let bound = |k: usize, attr: &str, default: f32| -> Result<f32> {
                    match node.inputs.get(k).filter(|s| !s.is_empty()) {
                        Some(_) => {
                            let v = self.constant(node, k)?.to_f32()?;
                            v.first()
                                .copied()
                                .ok_or_else(|| node.error("empty clip bound"))
                        }
                        None => node.float_or(attr, default),
                    }
                };
                Pointwise::Clip {
                    min: bound(1, "min", f32::NEG_INFINITY)?,
                    max: bound(2, "max", f32::INFINITY)?,
                }
            }
            // Multiplication and addition commute in IEEE arithmetic: the
            // constant may be either operand.
            "Mul" | "Add" if node.inputs.len() == 2 => {
                let c = match (self.scalar(other(1)), self.scalar(x)) {
                    (Some(c), _) | (None, Some(c)) => c,
                    (None, None) => return Ok(None),
                };
                if node.op_type == "Mul" {
                    Pointwise::Mul(c)
                } else {
                    Pointwise::Add(c)
                }
            }
            "Sub" | "Div" if node.inputs.len() == 2 => match self.scalar(other(1)) {
                Some(c) if node.op_type == "Sub" => Pointwise::Sub(c),
                Some(c) => Pointwise::Div(c),
                None => return Ok(None),
            },
            _ => return Ok(None),
        };
        Ok(Some(step))
    }

    /// Absorbs into `chain` the elementwise nodes after value `out`, each
    /// the sole consumer of the value before (and the hard-swish diamond
    /// `x * clip(x + 3, 0, 6) / 6`); returns the chain's last value.
    fn absorb_chain(&mut self, mut out: &'a str, chain: &mut Chain) -> Result<&'a str> {
        let g = &self.model.graph;
        while chain.steps.len() < Pointwise::MAX_STEPS {
            if let Some((last, nodes)) = self.hard_swish_after(out) {
                for j in nodes {
                    self.absorbed[j] = true;
                }
                chain.steps.push(Pointwise::HardSwish);
                out = last;
                continue;
            }
            let Some(j) = self.sole_consumer(out) else {
                break;
            };
            let n = &g.nodes[j];
            // The chain's value must be the op's operand (not a Clip bound).
            let operand = n.inputs.first().map(String::as_str) == Some(out)
                || (matches!(n.op_type.as_str(), "Mul" | "Add")
                    && n.inputs.get(1).map(String::as_str) == Some(out));
            let step = match n.op_type.as_str() {
                "BatchNormalization" if chain.affine.is_empty() && operand => {
                    let c = self.constant(n, 1)?.to_f32()?.len();
                    let (mut scale, mut shift) = (vec![1.0f32; c], vec![0.0f32; c]);
                    fold_batch_norm(n, |k| self.constant(n, k), &mut scale, &mut shift)?;
                    scale.extend_from_slice(&shift);
                    chain.affine = Arc::new(scale);
                    Some(Pointwise::ChannelAffine)
                }
                _ if operand => self.unary_step(n)?,
                _ => None,
            };
            let Some(step) = step else {
                break;
            };
            chain.steps.push(step);
            self.absorbed[j] = true;
            out = n.outputs[0].as_str();
        }
        Ok(out)
    }

    /// The nodes of `x * clip(x + 3, 0, 6) / 6` on value `x` (Add, Clip,
    /// Mul, Div) and the value it yields, when `x` feeds only them.
    fn hard_swish_after(&self, x: &'a str) -> Option<(&'a str, [usize; 4])> {
        let g = &self.model.graph;
        if g.outputs.iter().any(|o| o.name == x) {
            return None;
        }
        let users = self.consumers.get(x)?;
        let [u, v] = users.as_slice() else {
            return None;
        };
        let is = |j: usize, op: &str| g.nodes[j].op_type == op && !self.absorbed[j];
        let (add, mul) = if is(*u, "Add") { (*u, *v) } else { (*v, *u) };
        if !is(add, "Add") || !is(mul, "Mul") {
            return None;
        }
        let an = &g.nodes[add];
        let three = an.inputs.iter().find(|s| s.as_str() != x)?;
        if self.scalar(three) != Some(3.0) || an.inputs.len() != 2 {
            return None;
        }
        let clip = self
            .sole_consumer(&an.outputs[0])
            .filter(|&j| is(j, "Clip"))?;
        let cn = &g.nodes[clip];
        if cn.inputs.first() != an.outputs.first()
            || self.unary_step(cn).ok()? != Some(Pointwise::Clip { min: 0.0, max: 6.0 })
        {
            return None;
        }
        let mn = &g.nodes[mul];
        // x * clip, in that order (the product is the same either way).
        let operands_ok = mn.inputs.len() == 2
            && mn.inputs.iter().any(|s| s == x)
            && mn.inputs.iter().any(|s| Some(s) == cn.outputs.first());
        if !operands_ok || self.sole_consumer(&cn.outputs[0]) != Some(mul) {
            return None;
        }
        let div = self
            .sole_consumer(&mn.outputs[0])
            .filter(|&j| is(j, "Div"))?;
        let dn = &g.nodes[div];
        if dn.inputs.first() != mn.outputs.first() || self.scalar(dn.inputs.get(1)?) != Some(6.0) {
            return None;
        }
        Some((dn.outputs[0].as_str(), [add, clip, mul, div]))
    }

    /// Paddle's export adds a convolution's bias as a constant after it:
    /// a [1, c, 1, 1] tensor, or a [c] one reshaped to that by a Reshape
    /// of its own. When node `i`'s output `out` (of `c` channels) goes
    /// only to such an Add: the Add's index, the Reshape's (when there is
    /// one, after `i`, feeding only the Add) and the bias.
    fn bias_add_after(&self, i: usize, out: &str, c: usize) -> Result<Option<BiasAdd>> {
        let g = &self.model.graph;
        let Some(j) = self
            .sole_consumer(out)
            .filter(|&j| g.nodes[j].op_type == "Add" && g.nodes[j].inputs.len() == 2)
        else {
            return Ok(None);
        };
        let add = &g.nodes[j];
        let Some(other) = add.inputs.iter().find(|s| s.as_str() != out) else {
            return Ok(None);
        };
        let per_channel = |shape: &[usize]| {
            shape.len() >= 3 && shape[shape.len() - 3] == c && shape.iter().product::<usize>() == c
        };
        if let Some(t) = g.constant(other) {
            let ok = per_channel(&t.shape()?) && !t.data_type.is_integer();
            let bias = ok.then(|| t.to_f32()).transpose()?;
            return Ok(bias.map(|bias| BiasAdd {
                add: j,
                reshape: None,
                bias,
            }));
        }
        let reshape = (i + 1..j).find(|&r| {
            let n = &g.nodes[r];
            n.op_type == "Reshape" && n.outputs.first() == Some(other) && !self.absorbed[r]
        });
        let Some(r) = reshape.filter(|_| self.sole_consumer(other) == Some(j)) else {
            return Ok(None);
        };
        let rn = &g.nodes[r];
        let (Some(data), Some(shape)) = (
            rn.inputs.first().and_then(|d| g.constant(d)),
            rn.inputs.get(1).and_then(|d| g.constant(d)),
        ) else {
            return Ok(None);
        };
        let target: Option<Vec<usize>> = shape
            .to_i64()?
            .iter()
            .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
            .collect();
        let ok = target.is_some_and(|t| per_channel(&t))
            && data.shape()?.iter().product::<usize>() == c
            && !data.data_type.is_integer();
        let bias = ok.then(|| data.to_f32()).transpose()?;
        Ok(bias.map(|bias| BiasAdd {
            add: j,
            reshape: Some(r),
            bias,
        }))
    }

    /// Adds the bias of [`Self::bias_add_after`] (if node `i`'s output
    /// `out` goes to one) into `bias`, absorbing its Add and Reshape; the
    /// value that then stands for the node's output.
    fn absorb_bias_add(&mut self, i: usize, out: &'a str, bias: &mut [f32]) -> Result<&'a str> {
        let Some(found) = self.bias_add_after(i, out, bias.len())? else {
            return Ok(out);
        };
        for (acc, v) in bias.iter_mut().zip(found.bias) {
            *acc += v;
        }
        self.absorbed[found.add] = true;
        if let Some(r) = found.reshape {
            self.absorbed[r] = true;
        }
        Ok(self.model.graph.nodes[found.add].outputs[0].as_str())
    }

    fn prepare_conv_transpose(&mut self, i: usize) -> Result<()> {
        let node = &self.model.graph.nodes[i];
        let w = self.constant(node, 1)?;
        let wd = w.shape()?;
        let groups =
            usize::try_from(node.int_or("group", 1)?).map_err(|_| node.error("negative group"))?;
        if wd.len() != 4 || groups == 0 {
            return Err(node.unsupported(format_args!("weight {wd:?}, group {groups}")));
        }
        if pair(node, "dilations", Some(1))? != [1, 1]
            || node.ints_or("output_padding", &[0, 0])? != [0, 0]
            || node.attr("output_shape").is_some()
        {
            return Err(node.unsupported("dilation, output padding or output shape"));
        }
        let c_out = wd[1] * groups;
        let mut bias = match node.inputs.get(2).filter(|s| !s.is_empty()) {
            Some(_) => self.constant(node, 2)?.to_f32()?,
            None => vec![0.0; c_out],
        };
        if bias.len() != c_out {
            return Err(node.error(format_args!("bias of {} for {c_out} outputs", bias.len())));
        }
        let x = self.input_slot(node, &node.inputs[0])?;
        let mut out = node.outputs[0].as_str();
        // Paddle's export adds the bias as a [1, c, 1, 1] constant after
        // the op: into the bias (acc + 0 + b is acc + b exactly).
        out = self.absorb_bias_add(i, out, &mut bias)?;
        let mut tail = Chain::default();
        let out = self.absorb_chain(out, &mut tail)?;
        let op = Op::ConvTranspose {
            weight: Arc::new(w.to_f32()?),
            bias: Arc::new(bias),
            kernel: [wd[2], wd[3]],
            stride: pair(node, "strides", Some(1))?,
            pad: pads(node)?,
            groups,
            tail,
        };
        self.push(node, op, vec![x], out);
        Ok(())
    }

    fn prepare_matmul(&mut self, node: &OnnxNode) -> Result<()> {
        let g = &self.model.graph;
        let b_name = node.inputs.get(1).ok_or_else(|| node.error("one input"))?;
        let Some(b) = g.constant(b_name) else {
            let inputs = self.inputs(node)?;
            self.push(node, Op::MatMul, inputs, &node.outputs[0]);
            return Ok(());
        };
        let bd = b.shape()?;
        let [k, n] = bd.as_slice() else {
            return Err(node.unsupported(format_args!("constant operand of shape {bd:?}")));
        };
        let (k, n) = (*k, *n);
        let data = b.to_f32()?;
        let mut weight = vec![0.0f32; k * n];
        for r in 0..k {
            for c in 0..n {
                weight[c * k + r] = data[r * n + c];
            }
        }
        let mut out = node.outputs[0].as_str();
        let mut bias = None;
        if let Some(j) = self
            .sole_consumer(out)
            .filter(|&j| g.nodes[j].op_type == "Add")
        {
            let add = &g.nodes[j];
            let other = add.inputs.iter().find(|s| s.as_str() != out);
            if let Some(t) = other.and_then(|s| g.constant(s)) {
                if t.shape()? == [n] {
                    bias = Some(Arc::new(t.to_f32()?));
                    self.absorbed[j] = true;
                    out = add.outputs[0].as_str();
                }
            }
        }
        let x = self.input_slot(node, &node.inputs[0])?;
        let op = Op::MatMulConst {
            weight: Arc::new(cpu::PackedMatrix::pack(&weight, n, k)),
            k,
            n,
            bias,
        };
        self.push(node, op, vec![x], out);
        Ok(())
    }
}

fn pair(node: &OnnxNode, name: &str, default: Option<i64>) -> Result<[usize; 2]> {
    let v = match default {
        Some(d) => node.ints_or(name, &[d, d])?,
        None => node.ints(name)?.to_vec(),
    };
    match v.as_slice() {
        &[a, b] if a > 0 && b > 0 => Ok([a as usize, b as usize]),
        other => Err(node.error(format_args!("{name} {other:?}"))),
    }
}

fn pads(node: &OnnxNode) -> Result<[usize; 4]> {
    match node.ints_or("pads", &[0; 4])?.as_slice() {
        &[t, l, b, r] if t >= 0 && l >= 0 && b >= 0 && r >= 0 => {
            Ok([t as usize, l as usize, b as usize, r as usize])
        }
        other => Err(node.error(format_args!("pads {other:?}"))),
    }
}

type EvalResult = std::result::Result<Tensor, String>;

fn float_input<'t>(t: &'t Tensor, what: &str) -> std::result::Result<&'t [f32], String> {
    t.floats()
        .ok_or_else(|| format!("{what}: integer tensor where floats are expected"))
}

fn nchw(shape: &[usize]) -> std::result::Result<[usize; 4], String> {
    match shape {
        &[n, c, h, w] => Ok([n, c, h, w]),
        other => Err(format!("shape {other:?} is not [n, c, h, w]")),
    }
}

/// Runs `node` on its first input `first` and the `rest`; outputs that
/// are written whole come from `buffers`.
fn eval(node: &Node, first: First<'_>, rest: &[&Tensor], buffers: &mut Buffers) -> EvalResult {
    let x = first.get();
    let all = || -> Vec<&Tensor> { std::iter::once(x).chain(rest.iter().copied()).collect() };
    match &node.op {
        Op::Conv {
            weight,
            bias,
            kernel,
            stride,
            pad,
            dilation,
            groups,
            act,
            tail,
        } => {
            let [n, c, h, w] = nchw(x.shape())?;
            let geom = Conv2d {
                c_in: c,
                h_in: h,
                w_in: w,
                c_out: bias.len(),
                kh: kernel[0],
                kw: kernel[1],
                stride: *stride,
                pad: *pad,
                dilation: *dilation,
                groups: *groups,
            };
            geom.check()?;
            if geom.weight_len() != weight.len() {
                return Err(format!("weight does not fit input {:?}", x.shape()));
            }
            let data = float_input(x, "Conv")?;
            let (ho, wo) = (geom.h_out(), geom.w_out());
            chain_plane(tail, &[n, geom.c_out, ho, wo])?;
            let per_out = geom.c_out * ho * wo;
            let mut y = buffers.take(n * per_out);
            // Every image of the batch in one parallel pass.
            if geom.groups == 1 {
                // 1x1 and full k x k layers: a matrix product.
                cpu::conv2d_gemm(&geom, n, data, weight, bias, *act, &mut y, |o, piece| {
                    tail.apply_channel(o, piece)
                });
            } else if geom.is_depthwise() {
                cpu::conv2d_depthwise(&geom, n, data, weight, bias, *act, &mut y, |o, plane| {
                    tail.apply_channel(o, plane)
                });
            } else {
                for (img, out) in data
                    .chunks_exact(c * h * w)
                    .zip(y.chunks_exact_mut(per_out))
                {
                    cpu::conv2d_rows(&geom, img, weight, bias, *act, out);
                    tail.apply(ho * wo, out);
                }
            }
            Ok(Tensor::F32(y, vec![n, geom.c_out, ho, wo]))
        }
        Op::ConvTranspose {
            weight,
            bias,
            kernel,
            stride,
            pad,
            groups,
            tail,
        } => {
            let [n, c, h, w] = nchw(x.shape())?;
            let shape = cpu::ConvTranspose2d {
                c_in: c,
                h_in: h,
                w_in: w,
                c_out: bias.len(),
                kh: kernel[0],
                kw: kernel[1],
                stride: *stride,
                pad: *pad,
                groups: *groups,
            };
            shape.check()?;
            if shape.weight_len() != weight.len() {
                return Err(format!("weight does not fit input {:?}", x.shape()));
            }
            let data = float_input(x, "ConvTranspose")?;
            let (ho, wo) = (shape.h_out(), shape.w_out());
            let per_out = shape.c_out * ho * wo;
            let mut y = buffers.take(n * per_out);
            let plane = chain_plane(tail, &[n, shape.c_out, ho, wo])?;
            for (img, out) in data
                .chunks_exact(c * h * w)
                .zip(y.chunks_exact_mut(per_out))
            {
                if shape.groups == 1 {
                    cpu::conv_transpose2d_gemm(&shape, img, weight, bias, out, |o, piece| {
                        tail.apply_channel(o, piece)
                    });
                } else {
                    cpu::conv_transpose2d(&shape, img, weight, bias, out);
                    tail.apply(plane, out);
                }
            }
            Ok(Tensor::F32(y, vec![n, shape.c_out, ho, wo]))
        }
        Op::Binary(op) => binary(*op, first, rest[0], buffers),
        Op::Unary(op) => {
            let (mut y, shape) = first.into_floats("elementwise")?;
            if let Unary::Sqrt = op {
                y.par_iter_mut()
                    .with_min_len(1 << 14)
                    .for_each(|v| *v = v.sqrt());
            }
            Ok(Tensor::F32(y, shape))
        }
        Op::Chain(chain) => {
            let plane = chain_plane(chain, x.shape())?;
            let (mut y, shape) = first.into_floats("elementwise")?;
            chain.apply(plane, &mut y);
            Ok(Tensor::F32(y, shape))
        }
        Op::GlobalAveragePool => {
            let [n, c, h, w] = nchw(x.shape())?;
            let data = float_input(x, "GlobalAveragePool")?;
            let mut y = buffers.take(n * c);
            // Every plane of the batch alike: groups of planes in parallel.
            const GROUP: usize = 16;
            y.par_chunks_mut(GROUP)
                .zip(data.par_chunks(GROUP * h * w))
                .for_each(|(out, planes)| cpu::global_avg_pool(planes, out.len(), h * w, out));
            Ok(Tensor::F32(y, vec![n, c, 1, 1]))
        }
        Op::Pool {
            max,
            kernel,
            stride,
            pad,
            count_include_pad,
        } => {
            let [n, c, h, w] = nchw(x.shape())?;
            let p = cpu::Pool2d {
                h_in: h,
                w_in: w,
                kernel: *kernel,
                stride: *stride,
                pad: *pad,
            };
            p.check()?;
            let data = float_input(x, "Pool")?;
            let (ho, wo) = (p.h_out(), p.w_out());
            let mut y = buffers.take(n * c * ho * wo);
            y.par_chunks_mut(ho * wo)
                .zip(data.par_chunks(h * w))
                .for_each(|(out, plane)| {
                    if *max {
                        cpu::max_pool2d(&p, plane, out);
                    } else {
                        cpu::avg_pool2d(&p, plane, *count_include_pad, out);
                    }
                });
            Ok(Tensor::F32(y, vec![n, c, ho, wo]))
        }
        Op::ResizeNearest { scale } => {
            let [n, c, h, w] = nchw(x.shape())?;
            let (ho, wo) = (
                (h as f32 * scale[0]).floor() as usize,
                (w as f32 * scale[1]).floor() as usize,
            );
            if ho == 0 || wo == 0 {
                return Err(format!("empty output for scales {scale:?}"));
            }
            let data = float_input(x, "Resize")?;
            let mut y = buffers.take(n * c * ho * wo);
            y.par_chunks_mut(ho * wo)
                .zip(data.par_chunks(h * w))
                .for_each(|(out, plane)| {
                    cpu::resize_nearest(plane, 1, [h, w], [ho, wo], *scale, out)
                });
            Ok(Tensor::F32(y, vec![n, c, ho, wo]))
        }
        Op::Concat { axis } => concat(&all(), *axis),
        Op::Reshape => {
            let target = rest[0].ints();
            let xs = x.shape();
            let total: usize = xs.iter().product();
            let mut shape = Vec::with_capacity(target.len());
            let mut infer = None;
            for (k, &d) in target.iter().enumerate() {
                match d {
                    0 => shape.push(*xs.get(k).ok_or(format!("reshape {xs:?} to {target:?}"))?),
                    -1 if infer.is_none() => {
                        infer = Some(k);
                        shape.push(1);
                    }
                    d if d > 0 => shape.push(d as usize),
                    _ => return Err(format!("reshape {xs:?} to {target:?}")),
                }
            }
            let known: usize = shape.iter().product();
            if let Some(k) = infer {
                if known == 0 || !total.is_multiple_of(known) {
                    return Err(format!("reshape {xs:?} to {target:?}"));
                }
                shape[k] = total / known;
            }
            if shape.iter().product::<usize>() != total {
                return Err(format!("reshape {xs:?} to {target:?}"));
            }
            Ok(first.into_tensor().reshaped(shape))
        }
        Op::Transpose { perm } => {
            let shape = x.shape();
            let mut seen = vec![false; shape.len()];
            if perm.len() != shape.len()
                || perm
                    .iter()
                    .any(|&p| p >= shape.len() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!("perm {perm:?} for shape {shape:?}"));
            }
            Ok(transpose(x, perm))
        }
        Op::Squeeze { axes } => {
            let shape = x.shape();
            let rank = shape.len() as i64;
            let axes: Vec<usize> = axes
                .iter()
                .map(|&a| if a < 0 { a + rank } else { a })
                .filter(|&a| (0..rank).contains(&a))
                .map(|a| a as usize)
                .collect();
            let out: Vec<usize> = shape
                .iter()
                .enumerate()
                .filter(|&(k, &d)| {
                    if axes.is_empty() {
                        d != 1
                    } else {
                        !axes.contains(&k)
                    }
                })
                .map(|(_, &d)| d)
                .collect();
            if axes.iter().any(|&a| shape[a] != 1) {
                return Err(format!("squeeze axes {axes:?} of {shape:?}"));
            }
            Ok(first.into_tensor().reshaped(out))
        }
        Op::Slice => slice(&all()),
        Op::Shape => {
            let s = x.shape();
            Ok(Tensor::I64(
                s.iter().map(|&d| d as i64).collect(),
                vec![s.len()],
            ))
        }
        Op::Cast { to_float } => Ok(match (x, to_float) {
            (Tensor::I64(d, s), true) => {
                Tensor::F32(d.iter().map(|&v| v as f32).collect(), s.clone())
            }
            (Tensor::F32(d, s), false) => {
                Tensor::I64(d.iter().map(|&v| v as i64).collect(), s.clone())
            }
            (t, _) => t.clone(),
        }),
        Op::ReduceMean { axes, keepdims } => {
            let shape = x.shape();
            let rank = shape.len() as i64;
            let last = rank - 1;
            if axes.len() != 1 || !(axes[0] == -1 || axes[0] == last) {
                return Err(format!(
                    "ReduceMean over {axes:?} of {shape:?} (only the last axis)"
                ));
            }
            let n = *shape.last().ok_or("ReduceMean of a scalar")?;
            let data = float_input(x, "ReduceMean")?;
            let y: Vec<f32> = data
                .chunks_exact(n.max(1))
                .map(|r| r.iter().sum::<f32>() / n as f32)
                .collect();
            let mut out = shape.to_vec();
            if *keepdims {
                *out.last_mut().expect("rank >= 1") = 1;
            } else {
                out.pop();
            }
            Ok(Tensor::F32(y, out))
        }
        Op::MatMulConst { weight, k, n, bias } => {
            let shape = x.shape();
            if shape.last() != Some(k) {
                return Err(format!("MatMul of {shape:?} with [{k}, {n}]"));
            }
            let data = float_input(x, "MatMul")?;
            let m = data.len() / k;
            let mut y = buffers.take(m * n);
            cpu::matmul_packed(data, weight, bias.as_deref().map(Vec::as_slice), m, &mut y);
            let mut out = shape.to_vec();
            *out.last_mut().expect("rank >= 1") = *n;
            Ok(Tensor::F32(y, out))
        }
        Op::MatMul => {
            let (a, b) = (x, rest[0]);
            let (sa, sb) = (a.shape(), b.shape());
            let ra = sa.len();
            if ra < 2 || sb.len() != ra || sa[..ra - 2] != sb[..ra - 2] || sa[ra - 1] != sb[ra - 2]
            {
                return Err(format!("MatMul of {sa:?} and {sb:?}"));
            }
            let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[ra - 1]);
            let batches: usize = sa[..ra - 2].iter().product();
            let (da, db) = (float_input(a, "MatMul")?, float_input(b, "MatMul")?);
            let mut y = buffers.take(batches * m * n);
            y.par_chunks_mut(m * n).enumerate().for_each(|(i, out)| {
                let bt: Vec<f32> = {
                    let bm = &db[i * k * n..(i + 1) * k * n];
                    let mut t = vec![0.0f32; k * n];
                    for r in 0..k {
                        for c in 0..n {
                            t[c * k + r] = bm[r * n + c];
                        }
                    }
                    t
                };
                let am = &da[i * m * k..(i + 1) * m * k];
                for (row, yr) in am
                    .chunks_exact(k.max(1))
                    .zip(out.chunks_exact_mut(n.max(1)))
                {
                    for (j, v) in yr.iter_mut().enumerate() {
                        *v = cpu::dot(row, &bt[j * k..(j + 1) * k]);
                    }
                }
            });
            let mut out = sa.to_vec();
            out[ra - 1] = n;
            Ok(Tensor::F32(y, out))
        }
        Op::Softmax { axis } => {
            let shape = x.shape();
            let rank = shape.len() as i64;
            let axis = *axis;
            if !(axis == -1 || axis == rank - 1) {
                return Err(format!(
                    "Softmax on axis {axis} of {shape:?} (only the last axis)"
                ));
            }
            let n = *shape.last().ok_or("Softmax of a scalar")?;
            let (mut y, shape) = first.into_floats("Softmax")?;
            if n > 0 {
                cpu::softmax_rows_fast(&mut y, n);
            }
            Ok(Tensor::F32(y, shape))
        }
    }
}

/// The plane size a chain runs over for a tensor of `shape`, checking
/// that a batch norm step fits its channels.
fn chain_plane(chain: &Chain, shape: &[usize]) -> std::result::Result<usize, String> {
    let channels = chain.affine.len() / 2;
    if channels > 0 && (shape.len() < 2 || shape[1] != channels) {
        return Err(format!("batch norm of {channels} channels on {shape:?}"));
    }
    Ok(shape.get(2..).map_or(1, |s| s.iter().product()))
}

/// numpy broadcasting of two shapes.
fn broadcast(a: &[usize], b: &[usize]) -> std::result::Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for k in 0..rank {
        let da = if k + a.len() >= rank {
            a[k + a.len() - rank]
        } else {
            1
        };
        let db = if k + b.len() >= rank {
            b[k + b.len() - rank]
        } else {
            1
        };
        out[k] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        };
    }
    Ok(out)
}

/// Strides of `shape` seen from a broadcast `out` shape (0 on broadcast axes).
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let rank = out.len();
    let mut strides = vec![0; rank];
    let mut s = 1;
    for k in (0..shape.len()).rev() {
        let o = k + rank - shape.len();
        strides[o] = if shape[k] == 1 { 0 } else { s };
        s *= shape[k];
    }
    strides
}

/// a op b with numpy broadcasting; written over a's buffer when a is the
/// node's own and already has the output's shape.
fn binary(op: Binary, a: First<'_>, b: &Tensor, buffers: &mut Buffers) -> EvalResult {
    if let (Tensor::I64(da, sa), Tensor::I64(db, sb)) = (a.get(), b) {
        // Shape arithmetic: only equal shapes or scalars.
        let out = broadcast(sa, sb)?;
        let f = |x: i64, y: i64| match op {
            Binary::Add => x + y,
            Binary::Sub => x - y,
            Binary::Mul => x * y,
            Binary::Div if y != 0 => x / y,
            _ => 0,
        };
        let n: usize = out.iter().product();
        let y = (0..n)
            .map(|i| {
                f(
                    da[if da.len() == 1 { 0 } else { i }],
                    db[if db.len() == 1 { 0 } else { i }],
                )
            })
            .collect();
        return Ok(Tensor::I64(y, out));
    }
    let db = float_input(b, "elementwise")?;
    let sb = b.shape();
    let sa = a.get().shape().to_vec();
    float_input(a.get(), "elementwise")?;
    let out = broadcast(&sa, sb)?;
    if out == sa {
        if let First::Owned(Tensor::F32(mut y, _)) = a {
            binary_in_place(op, &mut y, &out, db, sb);
            return Ok(Tensor::F32(y, out));
        }
    }
    let da = float_input(a.get(), "elementwise")?;
    let n: usize = out.iter().product();
    let mut y = buffers.take(n);
    if sa == sb {
        y.par_iter_mut()
            .with_min_len(1 << 14)
            .zip(da.par_iter().zip(db.par_iter()))
            .for_each(|(o, (&x, &z))| *o = op.apply(x, z));
    } else if db.len() == 1 {
        let z = db[0];
        y.par_iter_mut()
            .with_min_len(1 << 14)
            .zip(da.par_iter())
            .for_each(|(o, &x)| *o = op.apply(x, z));
    } else if da.len() == 1 {
        let x = da[0];
        y.par_iter_mut()
            .with_min_len(1 << 14)
            .zip(db.par_iter())
            .for_each(|(o, &z)| *o = op.apply(x, z));
    } else {
        // General case, row by row over the last axis.
        let (st_a, st_b) = (broadcast_strides(&sa, &out), broadcast_strides(sb, &out));
        let last = *out.last().unwrap_or(&1);
        let rank = out.len();
        y.par_chunks_mut(last.max(1))
            .enumerate()
            .for_each(|(row, ys)| {
                let (mut ia, mut ib) = (0usize, 0usize);
                let mut rem = row;
                for k in (0..rank.saturating_sub(1)).rev() {
                    let idx = rem % out[k];
                    rem /= out[k];
                    ia += idx * st_a[k];
                    ib += idx * st_b[k];
                }
                let (sa_l, sb_l) = (st_a[rank - 1], st_b[rank - 1]);
                for (j, o) in ys.iter_mut().enumerate() {
                    *o = op.apply(da[ia + j * sa_l], db[ib + j * sb_l]);
                }
            });
    }
    Ok(Tensor::F32(y, out))
}

/// y = y op b in place, y of shape `out`, b broadcast to it.
fn binary_in_place(op: Binary, y: &mut [f32], out: &[usize], db: &[f32], sb: &[usize]) {
    if db.len() == y.len() {
        y.par_iter_mut()
            .with_min_len(1 << 14)
            .zip(db.par_iter())
            .for_each(|(o, &z)| *o = op.apply(*o, z));
        return;
    }
    if db.len() == 1 {
        let z = db[0];
        y.par_iter_mut()
            .with_min_len(1 << 14)
            .for_each(|o| *o = op.apply(*o, z));
        return;
    }
    let st_b = broadcast_strides(sb, out);
    let last = *out.last().unwrap_or(&1);
    let rank = out.len();
    y.par_chunks_mut(last.max(1))
        .with_min_len((1 << 12) / last.max(1) + 1)
        .enumerate()
        .for_each(|(row, ys)| {
            let mut ib = 0usize;
            let mut rem = row;
            for k in (0..rank.saturating_sub(1)).rev() {
                ib += (rem % out[k]) * st_b[k];
                rem /= out[k];
            }
            match st_b[rank - 1] {
                // One value along the row (a per-channel scale).
                0 => {
                    let z = db[ib];
                    ys.iter_mut().for_each(|o| *o = op.apply(*o, z));
                }
                _ => {
                    let len = ys.len();
                    for (o, &z) in ys.iter_mut().zip(&db[ib..ib + len]) {
                        *o = op.apply(*o, z);
                    }
                }
            }
        });
}

fn concat(inputs: &[&Tensor], axis: i64) -> EvalResult {
    let first = inputs[0].shape();
    let rank = first.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return Err(format!("Concat axis {axis} of {first:?}"));
    }
    let axis = axis as usize;
    let outer: usize = first[..axis].iter().product();
    let mut out = first.to_vec();
    out[axis] = 0;
    for t in inputs {
        let s = t.shape();
        if s.len() != first.len()
            || s.iter()
                .enumerate()
                .any(|(k, &d)| k != axis && d != first[k])
        {
            return Err(format!("Concat of {first:?} and {s:?} on axis {axis}"));
        }
        out[axis] += s[axis];
    }
    let ints = inputs.iter().all(|t| matches!(t, Tensor::I64(..)));
    if ints {
        let mut y = Vec::new();
        for o in 0..outer {
            for t in inputs {
                let s = t.shape();
                let inner: usize = s[axis..].iter().product();
                y.extend_from_slice(&t.ints()[o * inner..(o + 1) * inner]);
            }
        }
        return Ok(Tensor::I64(y, out));
    }
    let mut y = Vec::with_capacity(out.iter().product());
    for o in 0..outer {
        for t in inputs {
            let s = t.shape();
            let inner: usize = s[axis..].iter().product();
            let d = float_input(t, "Concat")?;
            y.extend_from_slice(&d[o * inner..(o + 1) * inner]);
        }
    }
    Ok(Tensor::F32(y, out))
}

fn slice(inputs: &[&Tensor]) -> EvalResult {
    let x = inputs[0];
    let shape = x.shape();
    let rank = shape.len();
    let starts = inputs.get(1).ok_or("Slice without starts")?.ints();
    let ends = inputs.get(2).ok_or("Slice without ends")?.ints();
    let axes: Vec<i64> = match inputs.get(3) {
        Some(t) => t.ints(),
        None => (0..starts.len() as i64).collect(),
    };
    let steps: Vec<i64> = match inputs.get(4) {
        Some(t) => t.ints(),
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("Slice: starts, ends, axes and steps differ in length".into());
    }
    let mut begin = vec![0usize; rank];
    let mut count = shape.to_vec();
    for k in 0..starts.len() {
        let a = if axes[k] < 0 {
            axes[k] + rank as i64
        } else {
            axes[k]
        };
        if !(0..rank as i64).contains(&a) || steps[k] != 1 {
            return Err(format!(
                "Slice axis {} step {} of {shape:?}",
                axes[k], steps[k]
            ));
        }
        let a = a as usize;
        let d = shape[a] as i64;
        let clamp = |v: i64| if v < 0 { (v + d).max(0) } else { v.min(d) };
        let (s, e) = (clamp(starts[k]), clamp(ends[k]));
        begin[a] = s as usize;
        count[a] = (e - s).max(0) as usize;
    }
    Ok(match x {
        Tensor::F32(d, _) => Tensor::F32(slice_rows(d, shape, &begin, &count), count),
        Tensor::I64(d, _) => Tensor::I64(slice_rows(d, shape, &begin, &count), count),
    })
}

/// The box `begin..begin + count` of `d` (of `shape`, row-major), copied
/// a run along the last axis at a time.
fn slice_rows<T: Copy>(d: &[T], shape: &[usize], begin: &[usize], count: &[usize]) -> Vec<T> {
    let rank = shape.len();
    let n: usize = count.iter().product();
    let mut y = Vec::with_capacity(n);
    if n == 0 {
        return y;
    }
    if rank == 0 {
        y.push(d[0]);
        return y;
    }
    let mut strides = vec![1usize; rank];
    for k in (0..rank - 1).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    let run = count[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    for _ in 0..n / run {
        let at = (0..rank - 1)
            .map(|k| (begin[k] + idx[k]) * strides[k])
            .sum::<usize>()
            + begin[rank - 1];
        y.extend_from_slice(&d[at..at + run]);
        for k in (0..rank - 1).rev() {
            idx[k] += 1;
            if idx[k] < count[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    y
}

/// `x` with its axes permuted by `perm` (a valid permutation).
fn transpose(x: &Tensor, perm: &[usize]) -> Tensor {
    match x {
        Tensor::F32(d, s) => {
            let (y, out) = transpose_data(d, s, perm);
            Tensor::F32(y, out)
        }
        Tensor::I64(d, s) => {
            let (y, out) = transpose_data(d, s, perm);
            Tensor::I64(y, out)
        }
    }
}

/// The data of a transpose of `d` (of `shape`) and its shape: the output
/// in order, a run along its last axis at a time (a strided read).
fn transpose_data<T: Copy>(d: &[T], shape: &[usize], perm: &[usize]) -> (Vec<T>, Vec<usize>) {
    let rank = shape.len();
    let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let n: usize = shape.iter().product();
    let mut y = Vec::with_capacity(n);
    if n == 0 || rank == 0 {
        y.extend_from_slice(&d[..n]);
        return (y, out);
    }
    let mut strides = vec![1usize; rank];
    for k in (0..rank - 1).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    let from: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let (run, step) = (out[rank - 1], from[rank - 1]);
    let mut idx = vec![0usize; rank - 1];
    for _ in 0..n / run {
        let at: usize = idx.iter().zip(&from).map(|(i, s)| i * s).sum();
        if step == 1 {
            y.extend_from_slice(&d[at..at + run]);
        } else {
            y.extend((0..run).map(|j| d[at + j * step]));
        }
        for k in (0..rank - 1).rev() {
            idx[k] += 1;
            if idx[k] < out[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    (y, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_matches_numpy() {
        let a = Tensor::F32((0..6).map(|v| v as f32).collect(), vec![2, 3]);
        let b = Tensor::F32(vec![10.0, 20.0, 30.0], vec![3]);
        let Tensor::F32(y, s) =
            binary(Binary::Add, First::Shared(&a), &b, &mut Buffers::default()).unwrap()
        else {
            panic!()
        };
        assert_eq!(s, [2, 3]);
        assert_eq!(y, [10.0, 21.0, 32.0, 13.0, 24.0, 35.0]);
        let c = Tensor::F32(vec![1.0, 2.0], vec![2, 1]);
        let Tensor::F32(y, _) =
            binary(Binary::Mul, First::Shared(&a), &c, &mut Buffers::default()).unwrap()
        else {
            panic!()
        };
        assert_eq!(y, [0.0, 1.0, 2.0, 6.0, 8.0, 10.0]);
        let wrong = Tensor::F32(vec![1.0; 2], vec![2]);
        assert!(binary(
            Binary::Add,
            First::Shared(&a),
            &wrong,
            &mut Buffers::default()
        )
        .is_err());
        assert!(binary(
            Binary::Add,
            First::Owned(a.clone()),
            &wrong,
            &mut Buffers::default()
        )
        .is_err());
    }

    #[test]
    fn binary_ops_in_place_equal_the_copying_ones() {
        let mut rng = crate::util::rng::Rng::new(2);
        let x = Tensor::F32(rng.vec(2 * 3 * 40 * 50, -2.0, 2.0), vec![2, 3, 40, 50]);
        // Outputs written over stale buffers: poisoned ones.
        let mut stale = Buffers::default();
        for _ in 0..4 {
            stale.give(Tensor::F32(
                vec![f32::NAN; 4 * Buffers::SMALL],
                vec![4 * Buffers::SMALL],
            ));
        }
        // Same shape, a scalar, per channel, along the last axis, and a
        // first operand smaller than the output (never in place).
        for shape in [
            vec![2, 3, 40, 50],
            vec![1],
            vec![1, 3, 1, 1],
            vec![50],
            vec![2, 3, 1, 50],
        ] {
            let n = shape.iter().product();
            let b = Tensor::F32(rng.vec(n, 0.5, 2.0), shape);
            for op in [
                Binary::Add,
                Binary::Sub,
                Binary::Mul,
                Binary::Div,
                Binary::Pow,
            ] {
                let Tensor::F32(want, ws) = binary(op, First::Shared(&x), &b, &mut stale).unwrap()
                else {
                    panic!()
                };
                let Tensor::F32(got, gs) =
                    binary(op, First::Owned(x.clone()), &b, &mut stale).unwrap()
                else {
                    panic!()
                };
                // Bit for bit (Pow of a negative base is NaN in both).
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(
                    (bits(got), gs),
                    (bits(want), ws),
                    "{op:?} with {:?}",
                    b.shape()
                );
            }
        }
        let small = Tensor::F32(vec![1.0, 2.0, 3.0], vec![3, 1]);
        let wide = Tensor::F32(vec![1.0, 10.0], vec![2]);
        let Tensor::F32(y, s) = binary(
            Binary::Mul,
            First::Owned(small),
            &wide,
            &mut Buffers::default(),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!((y, s), (vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0], vec![3, 2]));
    }

    #[test]
    fn slice_concat_transpose() {
        let x = Tensor::I64(vec![1, 3, 48, 320], vec![4]);
        let s = slice(&[
            &x,
            &Tensor::I64(vec![1], vec![1]),
            &Tensor::I64(vec![-1], vec![1]),
        ])
        .unwrap();
        assert_eq!(s.ints(), [3, 48]);
        let c = concat(&[&s, &Tensor::I64(vec![-1], vec![1])], 0).unwrap();
        assert_eq!(c.ints(), [3, 48, -1]);
        let t = Tensor::F32((0..6).map(|v| v as f32).collect(), vec![1, 2, 3]);
        let Tensor::F32(y, shape) = transpose(&t, &[0, 2, 1]) else {
            panic!()
        };
        assert_eq!(shape, [1, 3, 2]);
        assert_eq!(y, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        // Against the definition, on a 4-axis tensor: y[i, j, k, l] =
        // x[perm^-1 ...]; and a slice of the middle axes.
        let dims = [2, 3, 4, 5];
        let x: Vec<i64> = (0..120).collect();
        let at = |i: [usize; 4]| ((i[0] * 3 + i[1]) * 4 + i[2]) * 5 + i[3];
        for perm in [[2, 0, 3, 1], [0, 1, 3, 2], [3, 2, 1, 0]] {
            let Tensor::I64(y, shape) = transpose(&Tensor::I64(x.clone(), dims.to_vec()), &perm)
            else {
                panic!()
            };
            assert_eq!(shape, perm.map(|p| dims[p]));
            let mut o = 0;
            for a in 0..shape[0] {
                for b in 0..shape[1] {
                    for c in 0..shape[2] {
                        for d in 0..shape[3] {
                            let mut i = [0; 4];
                            for (k, v) in [a, b, c, d].into_iter().enumerate() {
                                i[perm[k]] = v;
                            }
                            assert_eq!(y[o], x[at(i)], "{perm:?}");
                            o += 1;
                        }
                    }
                }
            }
        }
        let s = slice(&[
            &Tensor::I64(x.clone(), dims.to_vec()),
            &Tensor::I64(vec![1, 1], vec![2]),
            &Tensor::I64(vec![3, 3], vec![2]),
            &Tensor::I64(vec![1, 2], vec![2]),
        ])
        .unwrap();
        assert_eq!(s.shape(), [2, 2, 2, 5]);
        let want: Vec<i64> = (0..2)
            .flat_map(|a| {
                (1..3)
                    .flat_map(move |b| (1..3).flat_map(move |c| (0..5).map(move |d| (a, b, c, d))))
            })
            .map(|(a, b, c, d)| x[at([a, b, c, d])])
            .collect();
        assert_eq!(s.ints(), want);
    }
}
