//! Running a lowered graph on the CPU: every step with the reference ops
//! of [`crate::cpu`], and the host steps (the head's tail) that the GPU
//! executor also runs here after reading the device part back.

use super::graph::{Graph, Op, Step};
use crate::cpu;

/// Runs `graph` on `input` ([1, 3, h, w]); returns the graph outputs in
/// file order. Values are freed after their last use.
pub fn forward_cpu(graph: &Graph, input: &[f32]) -> Vec<Vec<f32>> {
    assert_eq!(
        input.len(),
        graph.values[graph.input].len(),
        "forward_cpu: input size"
    );
    let last = graph.last_use();
    let mut values: Vec<Option<Vec<f32>>> = vec![None; graph.values.len()];
    values[graph.input] = Some(input.to_vec());
    for (i, step) in graph.steps.iter().enumerate() {
        let outputs = {
            let inputs: Vec<&[f32]> = step
                .inputs
                .iter()
                .map(|&v| values[v].as_deref().expect("steps run in dependency order"))
                .collect();
            run_step(graph, step, &inputs)
        };
        for (&v, data) in step.outputs.iter().zip(outputs) {
            values[v] = Some(data);
        }
        for &v in &step.inputs {
            if last[v] == i {
                values[v] = None;
            }
        }
    }
    graph
        .outputs
        .iter()
        .map(|&v| values[v].take().expect("graph outputs are computed"))
        .collect()
}

/// One step on the CPU; `inputs` in the step's order.
pub fn run_step(graph: &Graph, step: &Step, inputs: &[&[f32]]) -> Vec<Vec<f32>> {
    let out = |k: usize| vec![0.0f32; graph.values[step.outputs[k]].len()];
    let x = inputs[0];
    match &step.op {
        Op::Conv {
            geom,
            weight,
            bias,
            act,
        } => {
            let mut y = out(0);
            if geom.groups == 1 {
                // 1x1 and full k x k layers: a matrix product.
                cpu::conv2d_gemm(geom, 1, x, weight, bias, *act, &mut y, |_, _| {});
            } else {
                cpu::conv2d_rows(geom, x, weight, bias, *act, &mut y);
            }
            vec![y]
        }
        Op::GlobalAvgPool => {
            let (c, h, w) = graph.values[step.inputs[0]].chw();
            let mut y = out(0);
            cpu::global_avg_pool(x, c, h * w, &mut y);
            vec![y]
        }
        Op::ScaleChannels => {
            let (_, h, w) = graph.values[step.inputs[0]].chw();
            let mut y = out(0);
            cpu::scale_channels(x, inputs[1], h * w, &mut y);
            vec![y]
        }
        Op::Add => {
            let mut y = out(0);
            cpu::add(x, inputs[1], &mut y);
            vec![y]
        }
        Op::ResizeNearest { scale } => {
            let (c, h, w) = graph.values[step.inputs[0]].chw();
            let (_, ho, wo) = graph.values[step.outputs[0]].chw();
            let mut y = out(0);
            cpu::resize_nearest(x, c, [h, w], [ho, wo], *scale, &mut y);
            vec![y]
        }
        Op::Concat => {
            let mut y = out(0);
            cpu::concat(inputs, &mut y);
            vec![y]
        }
        Op::Split { axis, sizes } => {
            let shape = &graph.values[step.inputs[0]].shape;
            split(x, shape, *axis, sizes)
        }
        Op::Sigmoid => vec![x
            .iter()
            .map(|&v| cpu::ConvActivation::Sigmoid.apply(v))
            .collect()],
        Op::Reshape => vec![x.to_vec()],
        Op::Transpose { perm } => vec![transpose(x, &graph.values[step.inputs[0]].shape, perm)],
    }
}

/// Splits `x` of `shape` along `axis` into parts of `sizes`.
fn split(x: &[f32], shape: &[usize], axis: usize, sizes: &[usize]) -> Vec<Vec<f32>> {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut parts: Vec<Vec<f32>> = sizes
        .iter()
        .map(|s| Vec::with_capacity(outer * s * inner))
        .collect();
    for o in 0..outer {
        let mut at = o * shape[axis] * inner;
        for (part, &s) in parts.iter_mut().zip(sizes) {
            part.extend_from_slice(&x[at..at + s * inner]);
            at += s * inner;
        }
    }
    parts
}

/// y = x permuted: y's axis k is x's axis perm[k].
fn transpose(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let rank = shape.len();
    let mut strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let out_strides: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut y = Vec::with_capacity(x.len());
    let mut idx = vec![0usize; rank];
    for _ in 0..x.len() {
        y.push(
            x[idx
                .iter()
                .zip(&out_strides)
                .map(|(i, s)| i * s)
                .sum::<usize>()],
        );
        for k in (0..rank).rev() {
            idx[k] += 1;
            if idx[k] < out_shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_transpose() {
        // [1, 3, 2] split on axis 1 into 1 and 2.
        let x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let parts = split(&x, &[1, 3, 2], 1, &[1, 2]);
        assert_eq!(parts, vec![vec![0.0, 1.0], vec![2.0, 3.0, 4.0, 5.0]]);
        // [1, 2, 3] -> [1, 3, 2]
        assert_eq!(
            transpose(&x, &[1, 2, 3], &[0, 2, 1]),
            [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
    }
}
