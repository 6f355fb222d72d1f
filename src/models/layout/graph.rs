//! Lowering an ONNX detector graph to a short list of fused steps that the
//! CPU and GPU executors run.
//!
//! The PicoDet export spells every layer out in primitive ONNX ops: Conv,
//! BatchNormalization, then hard-swish as Add(+3), Clip(0, 6), Mul, Div(/6).
//! Lowering folds batch norm into the convolution's weights and bias and
//! recognises the activation that follows (hard-swish in that spelling,
//! Relu, HardSigmoid, Sigmoid), so each layer becomes one convolution with
//! an activation epilogue. The other ops this family uses (global average
//! pooling, squeeze-and-excitation scaling, residual Add, nearest Resize,
//! channel Concat) map one to one; the head's Split, Sigmoid, Reshape and
//! Transpose become host steps, run on the CPU after the device part.
//! Anything else is an `Unsupported` error naming the node.
//!
//! Shapes are fixed at load time from the graph's declared input shape.

use crate::cpu::{Conv2d, ConvActivation};
use crate::error::{Error, Result};
use crate::formats::onnx::{Dim, OnnxGraph, OnnxModel, OnnxNode, OnnxTensor};
use std::collections::{HashMap, HashSet};
use std::path::Path;

pub type ValueId = usize;

/// A tensor flowing between steps; `shape` includes the batch of 1.
#[derive(Debug, Clone)]
pub struct Value {
    pub name: String,
    pub shape: Vec<usize>,
}

impl Value {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (channels, height, width) of a `[1, c, h, w]` value.
    pub fn chw(&self) -> (usize, usize, usize) {
        assert_eq!(self.shape.len(), 4, "{}: not [1, c, h, w]", self.name);
        (self.shape[1], self.shape[2], self.shape[3])
    }
}

#[derive(Debug, Clone)]
pub enum Op {
    /// Convolution with batch norm folded in and a fused activation.
    Conv {
        geom: Conv2d,
        /// [c_out, c_in / groups, kh, kw]
        weight: Vec<f32>,
        /// `[c_out]`
        bias: Vec<f32>,
        act: ConvActivation,
    },
    /// [1, c, h, w] -> [1, c, 1, 1]
    GlobalAvgPool,
    /// [1, c, h, w] * [1, c, 1, 1] (inputs in that order)
    ScaleChannels,
    /// Elementwise sum of two values of one shape.
    Add,
    /// Nearest neighbour, asymmetric coordinates, floor rounding.
    ResizeNearest {
        scale: [f32; 2],
    },
    /// Along channels.
    Concat,
    /// Host steps: the head's tail, run on the CPU.
    Split {
        axis: usize,
        sizes: Vec<usize>,
    },
    Sigmoid,
    /// A new shape for the same data (the output value holds it).
    Reshape,
    Transpose {
        perm: Vec<usize>,
    },
}

impl Op {
    /// Whether the GPU executor runs this step (the rest run on the CPU).
    pub fn on_device(&self) -> bool {
        !matches!(
            self,
            Op::Split { .. } | Op::Sigmoid | Op::Reshape | Op::Transpose { .. }
        )
    }
}

#[derive(Debug, Clone)]
pub struct Step {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The ONNX node the step came from (the first, when fused).
    pub node: String,
}

/// The lowered graph: device steps first, then host steps, each group in
/// the file's (topological) order.
#[derive(Debug, Clone)]
pub struct Graph {
    pub values: Vec<Value>,
    pub steps: Vec<Step>,
    pub input: ValueId,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    /// For each value, the index of the last step that reads it (graph
    /// outputs live to the end).
    pub fn last_use(&self) -> Vec<usize> {
        let mut last = vec![0; self.values.len()];
        for (i, s) in self.steps.iter().enumerate() {
            for &v in &s.inputs {
                last[v] = i;
            }
        }
        for &v in &self.outputs {
            last[v] = usize::MAX;
        }
        last
    }
}

/// Lowers `model`'s graph; errors name the file and node.
pub fn lower(model: &OnnxModel) -> Result<Graph> {
    Lowering::new(model)?.run()
}

struct Lowering<'a> {
    path: &'a Path,
    g: &'a OnnxGraph,
    /// Non-constant nodes reading each value.
    consumers: HashMap<&'a str, Vec<usize>>,
    graph_outputs: HashSet<&'a str>,
    absorbed: Vec<bool>,
    values: Vec<Value>,
    ids: HashMap<String, ValueId>,
    steps: Vec<Step>,
}

impl<'a> Lowering<'a> {
    fn new(model: &'a OnnxModel) -> Result<Self> {
        let g = &model.graph;
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            if n.op_type == "Constant" {
                continue;
            }
            for input in n.inputs.iter().filter(|s| !s.is_empty()) {
                consumers.entry(input.as_str()).or_default().push(i);
            }
        }
        Ok(Lowering {
            path: &model.path,
            g,
            consumers,
            graph_outputs: g.outputs.iter().map(|o| o.name.as_str()).collect(),
            absorbed: vec![false; g.nodes.len()],
            values: Vec::new(),
            ids: HashMap::new(),
            steps: Vec::new(),
        })
    }

    fn unsupported(&self, what: impl std::fmt::Display) -> Error {
        Error::unsupported(self.path, what.to_string())
    }

    fn run(mut self) -> Result<Graph> {
        let input = self.declare_input()?;
        for i in 0..self.g.nodes.len() {
            let node = &self.g.nodes[i];
            if self.absorbed[i] || node.op_type == "Constant" {
                continue;
            }
            if !(node.domain.is_empty() || node.domain == "ai.onnx") {
                return Err(node.unsupported(format_args!("operator domain '{}'", node.domain)));
            }
            self.lower_node(i)?;
        }
        let mut outputs = Vec::new();
        for o in &self.g.outputs {
            outputs.push(*self.ids.get(&o.name).ok_or_else(|| {
                Error::format(
                    self.path,
                    format!("graph output '{}' is never computed", o.name),
                )
            })?);
        }
        // Device steps first: valid as long as no device step reads a host
        // step's output (true of the detectors this runs).
        let host_values: HashSet<ValueId> = self
            .steps
            .iter()
            .filter(|s| !s.op.on_device())
            .flat_map(|s| s.outputs.iter().copied())
            .collect();
        if let Some(s) = self
            .steps
            .iter()
            .find(|s| s.op.on_device() && s.inputs.iter().any(|v| host_values.contains(v)))
        {
            return Err(self.unsupported(format_args!(
                "node '{}' computes on the output of a head-only op ({:?})",
                s.node, s.op
            )));
        }
        let (mut steps, host): (Vec<Step>, Vec<Step>) =
            self.steps.into_iter().partition(|s| s.op.on_device());
        steps.extend(host);
        Ok(Graph {
            values: self.values,
            steps,
            input,
            outputs,
        })
    }

    fn declare_input(&mut self) -> Result<ValueId> {
        let inputs: Vec<_> = self
            .g
            .inputs
            .iter()
            .filter(|v| self.g.constant(&v.name).is_none())
            .collect();
        let [input] = inputs.as_slice() else {
            return Err(self.unsupported(format_args!(
                "the graph has {} inputs; an image detector has one",
                inputs.len()
            )));
        };
        let dims = input
            .tensor
            .as_ref()
            .and_then(|t| t.shape.as_ref())
            .ok_or_else(|| self.unsupported(format_args!("input '{}' has no shape", input.name)))?;
        let shape: Option<Vec<usize>> = dims
            .iter()
            .map(|d| match d {
                Dim::Value(v) if *v > 0 => Some(*v as usize),
                _ => None,
            })
            .collect();
        match shape {
            Some(s) if s.len() == 4 && s[0] == 1 && s[1] == 3 => Ok(self.define(&input.name, s)),
            _ => Err(self.unsupported(format_args!(
                "input '{}' has shape {dims:?}; expected a fixed [1, 3, height, width] image",
                input.name
            ))),
        }
    }

    fn define(&mut self, name: &str, shape: Vec<usize>) -> ValueId {
        let id = self.values.len();
        self.values.push(Value {
            name: name.to_string(),
            shape,
        });
        self.ids.insert(name.to_string(), id);
        id
    }

    /// A value computed by an earlier step (not a constant).
    fn value(&self, node: &OnnxNode, name: &str) -> Result<ValueId> {
        self.ids.get(name).copied().ok_or_else(|| {
            if self.g.constant(name).is_some() {
                node.unsupported(format_args!(
                    "constant input '{name}' where a computed value is expected"
                ))
            } else {
                node.error(format_args!(
                    "input '{name}' is not computed before this node"
                ))
            }
        })
    }

    fn constant(&self, node: &OnnxNode, index: usize) -> Result<&'a OnnxTensor> {
        let name = node
            .inputs
            .get(index)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| node.error(format_args!("input {index} is missing")))?;
        self.g
            .constant(name)
            .ok_or_else(|| node.unsupported(format_args!("input '{name}' must be a constant")))
    }

    fn optional_constant(&self, node: &OnnxNode, index: usize) -> Result<Option<&'a OnnxTensor>> {
        match node.inputs.get(index) {
            Some(name) if !name.is_empty() => self.constant(node, index).map(Some),
            _ => Ok(None),
        }
    }

    fn shape(&self, v: ValueId) -> &[usize] {
        &self.values[v].shape
    }

    fn push(&mut self, node: &OnnxNode, op: Op, inputs: Vec<ValueId>, outputs: Vec<ValueId>) {
        self.steps.push(Step {
            op,
            inputs,
            outputs,
            node: if node.name.is_empty() {
                node.outputs.first().cloned().unwrap_or_default()
            } else {
                node.name.clone()
            },
        });
    }

    /// The single node reading `value`, when there is exactly one and the
    /// value is not also a graph output.
    fn sole_consumer(&self, value: &str) -> Option<usize> {
        if self.graph_outputs.contains(value) {
            return None;
        }
        match self.consumers.get(value).map(Vec::as_slice) {
            Some(&[i]) if !self.absorbed[i] => Some(i),
            _ => None,
        }
    }

    /// A scalar constant input of `node`, if it is one.
    fn scalar(&self, node: &OnnxNode, index: usize) -> Option<f32> {
        let t = self.g.constant(node.inputs.get(index)?)?;
        match t.to_f32() {
            Ok(v) if v.len() == 1 => Some(v[0]),
            _ => None,
        }
    }

    fn lower_node(&mut self, i: usize) -> Result<()> {
        let g = self.g;
        let node = &g.nodes[i];
        let out_name = node.outputs.first().map(String::as_str).unwrap_or("");
        match node.op_type.as_str() {
            "Conv" => self.lower_conv(i),
            "GlobalAveragePool" => {
                let x = self.value(node, &node.inputs[0])?;
                let shape = self.shape(x).to_vec();
                if shape.len() != 4 {
                    return Err(node.unsupported(format_args!("input shape {shape:?}")));
                }
                let y = self.define(out_name, vec![1, shape[1], 1, 1]);
                self.push(node, Op::GlobalAvgPool, vec![x], vec![y]);
                Ok(())
            }
            "Mul" => {
                let (a, b) = self.two_values(node)?;
                let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
                let per_channel = |x: &[usize], s: &[usize]| {
                    x.len() == 4
                        && s.len() == 4
                        && s[0] == 1
                        && s[1] == x[1]
                        && s[2] == 1
                        && s[3] == 1
                };
                let (x, s) = if per_channel(&sa, &sb) {
                    (a, b)
                } else if per_channel(&sb, &sa) {
                    (b, a)
                } else {
                    return Err(node.unsupported(format_args!(
                        "Mul of shapes {sa:?} and {sb:?} (only per-channel scaling is supported)"
                    )));
                };
                let y = self.define(out_name, self.shape(x).to_vec());
                self.push(node, Op::ScaleChannels, vec![x, s], vec![y]);
                Ok(())
            }
            "Add" => {
                let (a, b) = self.two_values(node)?;
                if self.shape(a) != self.shape(b) {
                    return Err(node.unsupported(format_args!(
                        "Add of shapes {:?} and {:?} (broadcasting is not supported)",
                        self.shape(a),
                        self.shape(b)
                    )));
                }
                let y = self.define(out_name, self.shape(a).to_vec());
                self.push(node, Op::Add, vec![a, b], vec![y]);
                Ok(())
            }
            "Resize" => self.lower_resize(node),
            "Concat" => {
                let axis = node.int("axis")?;
                let xs: Vec<ValueId> = node
                    .inputs
                    .iter()
                    .map(|n| self.value(node, n))
                    .collect::<Result<_>>()?;
                let first = self.shape(xs[0]).to_vec();
                let same_hw = xs.iter().all(|&x| {
                    let s = self.shape(x);
                    s.len() == 4 && s[2..] == first[2..]
                });
                if !(axis == 1 || axis == -3) || first.len() != 4 || !same_hw {
                    return Err(node.unsupported(format_args!(
                        "Concat on axis {axis} of {:?} (only channels of [1, c, h, w] are supported)",
                        xs.iter().map(|&x| self.shape(x).to_vec()).collect::<Vec<_>>()
                    )));
                }
                let c: usize = xs.iter().map(|&x| self.shape(x)[1]).sum();
                let y = self.define(out_name, vec![1, c, first[2], first[3]]);
                self.push(node, Op::Concat, xs, vec![y]);
                Ok(())
            }
            "Split" => self.lower_split(node),
            "Sigmoid" => {
                let x = self.value(node, &node.inputs[0])?;
                let y = self.define(out_name, self.shape(x).to_vec());
                self.push(node, Op::Sigmoid, vec![x], vec![y]);
                Ok(())
            }
            "Reshape" => self.lower_reshape(node),
            "Transpose" => {
                let x = self.value(node, &node.inputs[0])?;
                let shape = self.shape(x).to_vec();
                let default: Vec<i64> = (0..shape.len() as i64).rev().collect();
                let perm = node.ints_or("perm", &default)?;
                let mut seen = vec![false; shape.len()];
                let perm: Vec<usize> = perm
                    .iter()
                    .map(|&p| {
                        let p = usize::try_from(p)
                            .ok()
                            .filter(|&p| p < shape.len() && !seen[p]);
                        if let Some(p) = p {
                            seen[p] = true;
                        }
                        p
                    })
                    .collect::<Option<_>>()
                    .filter(|p: &Vec<usize>| p.len() == shape.len())
                    .ok_or_else(|| node.error(format_args!("perm {perm:?} for shape {shape:?}")))?;
                let y = self.define(out_name, perm.iter().map(|&p| shape[p]).collect());
                self.push(node, Op::Transpose { perm }, vec![x], vec![y]);
                Ok(())
            }
            other => Err(node.unsupported(format_args!(
                "operator {other} is not one a PicoDet-style detector uses"
            ))),
        }
    }

    fn two_values(&self, node: &OnnxNode) -> Result<(ValueId, ValueId)> {
        match node.inputs.as_slice() {
            [a, b] => Ok((self.value(node, a)?, self.value(node, b)?)),
            _ => Err(node.error(format_args!("{} inputs, expected 2", node.inputs.len()))),
        }
    }

    fn lower_conv(&mut self, i: usize) -> Result<()> {
        let g = self.g;
        let node = &g.nodes[i];
        let x = self.value(node, &node.inputs[0])?;
        let w = self.constant(node, 1)?;
        let b = self.optional_constant(node, 2)?;
        if node.string_or("auto_pad", "NOTSET")? != "NOTSET" {
            return Err(node.unsupported("auto_pad (only explicit pads are supported)"));
        }
        let xs = self.shape(x).to_vec();
        let wd = w.shape()?;
        if xs.len() != 4 || wd.len() != 4 {
            return Err(node.unsupported(format_args!(
                "input {xs:?} and weight {wd:?}; only 2-D convolutions are supported"
            )));
        }
        let two = |name: &str, default: i64| -> Result<[usize; 2]> {
            match node.ints_or(name, &[default, default])?.as_slice() {
                &[a, b] if a >= 0 && b >= 0 => Ok([a as usize, b as usize]),
                other => Err(node.error(format_args!("{name} {other:?}"))),
            }
        };
        let pads = match node.ints_or("pads", &[0; 4])?.as_slice() {
            &[t, l, b, r] if t >= 0 && l >= 0 && b >= 0 && r >= 0 => {
                [t as usize, l as usize, b as usize, r as usize]
            }
            other => return Err(node.error(format_args!("pads {other:?}"))),
        };
        let groups =
            usize::try_from(node.int_or("group", 1)?).map_err(|_| node.error("negative group"))?;
        let geom = Conv2d {
            c_in: xs[1],
            h_in: xs[2],
            w_in: xs[3],
            c_out: wd[0],
            kh: wd[2],
            kw: wd[3],
            stride: two("strides", 1)?,
            pad: pads,
            dilation: two("dilations", 1)?,
            groups,
        };
        geom.check().map_err(|e| node.error(e))?;
        if wd[1] * groups.max(1) != xs[1] {
            return Err(node.error(format_args!(
                "weight {wd:?} does not fit input {xs:?} with {groups} groups"
            )));
        }
        if let Ok(k) = node.ints("kernel_shape") {
            if k != [wd[2] as i64, wd[3] as i64] {
                return Err(node.error(format_args!("kernel_shape {k:?} but weight {wd:?}")));
            }
        }
        let mut weight = w.to_f32()?;
        let mut bias = match b {
            Some(b) => b.to_f32()?,
            None => vec![0.0; geom.c_out],
        };
        if bias.len() != geom.c_out {
            return Err(node.error(format_args!(
                "bias of {} for {} outputs",
                bias.len(),
                geom.c_out
            )));
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
        let mut act = ConvActivation::None;
        if let Some((a, end, nodes)) = self.match_activation(out)? {
            act = a;
            for n in nodes {
                self.absorbed[n] = true;
            }
            out = end;
        }
        // Only the fused output is a value; the step keeps the conv's name.
        let y = self.define(out, vec![1, geom.c_out, geom.h_out(), geom.w_out()]);
        self.push(
            node,
            Op::Conv {
                geom,
                weight,
                bias,
                act,
            },
            vec![x],
            vec![y],
        );
        Ok(())
    }

    /// The activation applied to `value`, if its consumers spell one:
    /// (activation, its output value, the nodes to absorb).
    fn match_activation(
        &self,
        value: &str,
    ) -> Result<Option<(ConvActivation, &'a str, Vec<usize>)>> {
        let g = self.g;
        if let Some(j) = self.sole_consumer(value) {
            let n = &g.nodes[j];
            let act = match n.op_type.as_str() {
                "Relu" => ConvActivation::Relu,
                "Sigmoid" => ConvActivation::Sigmoid,
                "HardSwish" => ConvActivation::HardSwish,
                "HardSigmoid" => ConvActivation::HardSigmoid {
                    alpha: n.float_or("alpha", 0.2)?,
                    beta: n.float_or("beta", 0.5)?,
                },
                _ => return Ok(None),
            };
            return Ok(Some((act, n.outputs[0].as_str(), vec![j])));
        }
        // Hard-swish spelled out: Add(v, 3) -> Clip(0, 6) -> Mul(v, .) -> Div(., 6).
        if self.graph_outputs.contains(value) {
            return Ok(None);
        }
        let Some(users) = self.consumers.get(value) else {
            return Ok(None);
        };
        let [u0, u1] = users.as_slice() else {
            return Ok(None);
        };
        let (add, mul) = match (g.nodes[*u0].op_type.as_str(), g.nodes[*u1].op_type.as_str()) {
            ("Add", "Mul") => (*u0, *u1),
            ("Mul", "Add") => (*u1, *u0),
            _ => return Ok(None),
        };
        let add_n = &g.nodes[add];
        if add_n.inputs.first().map(String::as_str) != Some(value)
            || self.scalar(add_n, 1) != Some(3.0)
        {
            return Ok(None);
        }
        let Some(clip) = self.sole_consumer(&add_n.outputs[0]) else {
            return Ok(None);
        };
        let clip_n = &g.nodes[clip];
        let bounds = if clip_n.op_type != "Clip" {
            None
        } else if clip_n.inputs.len() >= 3 {
            self.scalar(clip_n, 1).zip(self.scalar(clip_n, 2))
        } else {
            // Opset < 11 keeps the bounds in attributes.
            clip_n.float("min").ok().zip(clip_n.float("max").ok())
        };
        if bounds != Some((0.0, 6.0)) || self.sole_consumer(&clip_n.outputs[0]) != Some(mul) {
            return Ok(None);
        }
        let mul_n = &g.nodes[mul];
        let mut mul_inputs: Vec<&str> = mul_n.inputs.iter().map(String::as_str).collect();
        mul_inputs.sort_unstable();
        let mut want = vec![value, clip_n.outputs[0].as_str()];
        want.sort_unstable();
        if mul_inputs != want {
            return Ok(None);
        }
        let Some(div) = self.sole_consumer(&mul_n.outputs[0]) else {
            return Ok(None);
        };
        let div_n = &g.nodes[div];
        if div_n.op_type != "Div" || self.scalar(div_n, 1) != Some(6.0) {
            return Ok(None);
        }
        Ok(Some((
            ConvActivation::HardSwish,
            div_n.outputs[0].as_str(),
            vec![add, clip, mul, div],
        )))
    }

    fn lower_resize(&mut self, node: &OnnxNode) -> Result<()> {
        let x = self.value(node, &node.inputs[0])?;
        let xs = self.shape(x).to_vec();
        let mode = node.string_or("mode", "nearest")?;
        let coords = node.string_or("coordinate_transformation_mode", "half_pixel")?;
        let rounding = node.string_or("nearest_mode", "round_prefer_floor")?;
        if mode != "nearest" || coords != "asymmetric" || rounding != "floor" || xs.len() != 4 {
            return Err(node.unsupported(format_args!(
                "Resize mode {mode}, {coords} coordinates, {rounding} rounding on {xs:?} \
                 (only nearest/asymmetric/floor on [1, c, h, w] is supported)"
            )));
        }
        let scales = match self.optional_constant(node, 2)? {
            Some(t) => t.to_f32()?,
            None => Vec::new(),
        };
        let (scale, out_hw) = if scales.len() == 4 {
            if scales[0] != 1.0 || scales[1] != 1.0 || scales[2] <= 0.0 || scales[3] <= 0.0 {
                return Err(node.unsupported(format_args!("scales {scales:?}")));
            }
            let out = |n: usize, s: f32| (n as f32 * s).floor() as usize;
            (
                [scales[2], scales[3]],
                [out(xs[2], scales[2]), out(xs[3], scales[3])],
            )
        } else {
            let sizes = match self.optional_constant(node, 3)? {
                Some(t) => t.to_i64()?,
                None => return Err(node.error("neither scales nor sizes are given")),
            };
            match sizes.as_slice() {
                &[1, c, h, w] if c as usize == xs[1] && h > 0 && w > 0 => (
                    [h as f32 / xs[2] as f32, w as f32 / xs[3] as f32],
                    [h as usize, w as usize],
                ),
                _ => return Err(node.unsupported(format_args!("sizes {sizes:?} for {xs:?}"))),
            }
        };
        if out_hw[0] == 0 || out_hw[1] == 0 {
            return Err(node.error(format_args!("empty output for scales {scale:?}")));
        }
        let y = self.define(&node.outputs[0], vec![1, xs[1], out_hw[0], out_hw[1]]);
        self.push(node, Op::ResizeNearest { scale }, vec![x], vec![y]);
        Ok(())
    }

    fn lower_split(&mut self, node: &OnnxNode) -> Result<()> {
        let x = self.value(node, &node.inputs[0])?;
        let xs = self.shape(x).to_vec();
        let rank = xs.len() as i64;
        let axis = node.int_or("axis", 0)?;
        let axis = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&axis) {
            return Err(node.error(format_args!("axis {axis} for shape {xs:?}")));
        }
        let axis = axis as usize;
        let sizes: Vec<i64> = match self.optional_constant(node, 1)? {
            Some(t) => t.to_i64()?,
            None => match node.attr("split") {
                Some(_) => node.ints("split")?.to_vec(),
                None => {
                    let n = node.outputs.len().max(1);
                    if !xs[axis].is_multiple_of(n) {
                        return Err(
                            node.error(format_args!("{} does not split into {n}", xs[axis]))
                        );
                    }
                    vec![(xs[axis] / n) as i64; n]
                }
            },
        };
        let ok = sizes.len() == node.outputs.len()
            && sizes.iter().all(|&s| s >= 0)
            && sizes.iter().sum::<i64>() == xs[axis] as i64;
        if !ok {
            return Err(node.error(format_args!("split {sizes:?} of {xs:?} on axis {axis}")));
        }
        let sizes: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
        let outs = node
            .outputs
            .iter()
            .zip(&sizes)
            .map(|(name, &s)| {
                let mut shape = xs.clone();
                shape[axis] = s;
                self.define(name, shape)
            })
            .collect();
        self.push(node, Op::Split { axis, sizes }, vec![x], outs);
        Ok(())
    }

    fn lower_reshape(&mut self, node: &OnnxNode) -> Result<()> {
        let x = self.value(node, &node.inputs[0])?;
        let xs = self.shape(x).to_vec();
        let target = self.constant(node, 1)?.to_i64()?;
        if node.int_or("allowzero", 0)? != 0 {
            return Err(node.unsupported("allowzero"));
        }
        let total: usize = xs.iter().product();
        let mut shape = Vec::with_capacity(target.len());
        let mut infer = None;
        for (k, &d) in target.iter().enumerate() {
            match d {
                0 => shape.push(
                    *xs.get(k)
                        .ok_or_else(|| node.error(format_args!("shape {target:?}")))?,
                ),
                -1 if infer.is_none() => {
                    infer = Some(k);
                    shape.push(1);
                }
                d if d > 0 => shape.push(d as usize),
                _ => return Err(node.error(format_args!("shape {target:?}"))),
            }
        }
        let known: usize = shape.iter().product();
        if let Some(k) = infer {
            if known == 0 || !total.is_multiple_of(known) {
                return Err(node.error(format_args!("cannot reshape {xs:?} to {target:?}")));
            }
            shape[k] = total / known;
        }
        if shape.iter().product::<usize>() != total {
            return Err(node.error(format_args!("cannot reshape {xs:?} to {target:?}")));
        }
        let y = self.define(&node.outputs[0], shape);
        self.push(node, Op::Reshape, vec![x], vec![y]);
        Ok(())
    }
}

/// Folds `BatchNormalization(scale, B, mean, var, epsilon)` into the
/// preceding convolution: w' = w * s, b' = (b - mean) * s + B with
/// s = scale / sqrt(var + epsilon), per output channel. `constant(k)` is
/// the node's input k as a constant (the layout and OCR lowerings each
/// have their own reader).
pub(crate) fn fold_batch_norm<'t>(
    bn: &OnnxNode,
    constant: impl Fn(usize) -> Result<&'t OnnxTensor>,
    weight: &mut [f32],
    bias: &mut [f32],
) -> Result<()> {
    let c = bias.len();
    let mut p = Vec::new();
    for k in 1..=4 {
        let t = constant(k)?.to_f32()?;
        if t.len() != c {
            return Err(bn.error(format_args!(
                "parameter {k} has {} values for {c} channels",
                t.len()
            )));
        }
        p.push(t);
    }
    let eps = bn.float_or("epsilon", 1e-5)?;
    if bn.outputs.len() > 1 && bn.outputs[1..].iter().any(|o| !o.is_empty()) {
        return Err(bn.unsupported("training-mode outputs"));
    }
    let per_out = weight.len() / c;
    for o in 0..c {
        let s = p[0][o] / (p[3][o] + eps).sqrt();
        for w in &mut weight[o * per_out..(o + 1) * per_out] {
            *w *= s;
        }
        bias[o] = (bias[o] - p[2][o]) * s + p[1][o];
    }
    Ok(())
}
