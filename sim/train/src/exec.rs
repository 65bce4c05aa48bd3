//! The executor: runs a training-step graph on the machine, node by node in topological order.
//!
//! `MatMul` nodes (dense layers, convolutions after im2col, attention products) go through the
//! MXU ([`faultline_hw::mxu::gemm`]) in the chosen [`ExecMode`], with operands rounded to the
//! MXU input format; every other node runs as fp32 vector-unit instructions
//! ([`crate::vector`] lowers each op onto [`faultline_hw::vpu`]) in the same mode. Placeholders are
//! bound by node name from the batch and the [`ModelState`]; after the step every `next` node's
//! value is written back into the state.

use crate::error::{shape_str, Result, TrainError};
use crate::state::{ModelState, Tensor32};
use crate::vector::Vpu;
use faultline_graph::{NodeIndex, Op, OpGraph, Phase, TrainGraph};
use faultline_hw::{mxu, ExecMode, FaultSchedule, HwConfig, Matrix, Unit};
use faultline_num::{f32_to_bf16_bits, NumFormat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Input format of the MXU during training (accumulation is always fp32; the VPU is fp32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MxuFormat {
    /// bf16 x bf16 -> fp32 accumulate (TPU-like; the default).
    Bf16,
    /// fp32 x fp32 -> fp32 accumulate (for comparing against frameworks).
    Fp32,
}

impl MxuFormat {
    /// Name used on the command line: `bf16` or `fp32`.
    pub const fn name(self) -> &'static str {
        match self {
            MxuFormat::Bf16 => "bf16",
            MxuFormat::Fp32 => "fp32",
        }
    }

    /// The register format of MXU inputs.
    pub const fn input(self) -> NumFormat {
        match self {
            MxuFormat::Bf16 => NumFormat::Bf16,
            MxuFormat::Fp32 => NumFormat::Fp32,
        }
    }

    /// Rounds an fp32 value into input-register bits (nearest-even for bf16).
    #[inline]
    pub fn encode(self, x: f32) -> u32 {
        match self {
            MxuFormat::Bf16 => f32_to_bf16_bits(x),
            MxuFormat::Fp32 => x.to_bits(),
        }
    }
}

impl fmt::Display for MxuFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MxuFormat {
    type Err = TrainError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bf16" => Ok(MxuFormat::Bf16),
            "fp32" => Ok(MxuFormat::Fp32),
            _ => Err(TrainError::UnknownPrecision(s.into())),
        }
    }
}

/// What one executed step (or forward pass) produced besides the state update.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// The loss (NaN for a forward-only pass).
    pub loss: f32,
    /// The model output `[batch, outputs]` (logits or predictions).
    pub output: Vec<f32>,
    /// Hardware operations each computing node issued, in execution order.
    pub ops: Vec<NodeOps>,
}

impl StepOutput {
    /// Total GEMMs issued to the MXU.
    pub fn gemms(&self) -> usize {
        self.ops.iter().filter(|o| o.unit == Unit::Mxu).map(|o| o.count).sum()
    }

    /// Total VPU instructions issued.
    pub fn vpu_instructions(&self) -> usize {
        self.ops.iter().filter(|o| o.unit == Unit::Vpu).map(|o| o.count).sum()
    }

    /// Machine cycles of everything issued, operation after operation (MXU and VPU do not
    /// overlap in this executor).
    pub fn cycles(&self) -> u64 {
        self.ops.iter().map(|o| o.cycles).sum()
    }

    /// [`StepOutput::cycles`] split by the phase of the issuing node (every phase present).
    pub fn phase_cycles(&self, g: &OpGraph) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = Phase::ALL.iter().map(|p| (p.name().to_string(), 0)).collect();
        for o in &self.ops {
            *m.entry(g.node(o.node).phase.name().to_string()).or_default() += o.cycles;
        }
        m
    }
}

/// The hardware operations of one node: `count` GEMMs (MXU) or VPU instructions, numbered
/// `0..count` in issue order for [`NodeFault::op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeOps {
    /// The node.
    pub node: NodeIndex,
    /// `Mxu` or `Vpu`.
    pub unit: Unit,
    /// Operations issued.
    pub count: usize,
    /// Cycles of those operations, as issued one after another (the same in every mode).
    pub cycles: u64,
}

/// A fault injected into one hardware operation of one node during a step. That operation
/// runs cycle-level with `faults` (sites of its unit, times relative to its own schedule);
/// everything else runs in the executor's mode, which is exact by the bit-exact-twin invariant.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFault {
    /// The node whose operation is hit.
    pub node: NodeIndex,
    /// Which of the node's operations (see [`NodeOps`]): the GEMM of a rank-3 group, or the
    /// VPU instruction, in issue order.
    pub op: usize,
    /// The fault events.
    pub faults: FaultSchedule,
}

/// Host bytes one step of `tg` needs, estimated from its shapes alone (checked arithmetic;
/// `None` if it overflows): every node's fp32 value is kept for the step, and the largest node
/// needs about eight more copies of itself while it runs (raw-bit operands, the twins' decoded
/// values, outputs and their bit copies).
pub fn host_bytes(tg: &TrainGraph) -> Option<u64> {
    let g = &tg.graph;
    let sizes: Vec<u64> =
        g.indices().map(|i| faultline_hw::budget::product(&g.node(i).shape)).collect::<Option<_>>()?;
    let all = sizes.iter().try_fold(0u64, |a, &n| a.checked_add(n))?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    all.checked_add(largest.checked_mul(8)?)?.checked_mul(4)
}

/// Runs a [`TrainGraph`] on one machine configuration in one mode.
#[derive(Debug, Clone)]
pub struct Executor {
    /// The step graph.
    pub tg: TrainGraph,
    /// The machine, with the MXU set to `format` inputs and fp32 accumulation.
    pub hw: HwConfig,
    /// Functional or cycle-level MXU execution (bit-identical results).
    pub mode: ExecMode,
    /// MXU input format.
    pub format: MxuFormat,
    /// Nodes the model output depends on, in execution order (a forward-only pass).
    forward: Vec<NodeIndex>,
    /// Every node in execution order.
    order: Vec<NodeIndex>,
}

impl Executor {
    /// An executor of `tg` on `hw` with the MXU input format overridden by `format`.
    pub fn new(tg: TrainGraph, hw: &HwConfig, mode: ExecMode, format: MxuFormat) -> Result<Executor> {
        let mut hw = hw.clone();
        hw.mxu.input_format = format.input();
        hw.mxu.acc_format = NumFormat::Fp32;
        let order = tg.topo_order().map_err(|e| TrainError::Model(e.to_string()))?;
        let g = &tg.graph;
        let mut needed = vec![false; g.len()];
        needed[tg.output.index()] = true;
        for &i in order.iter().rev() {
            if needed[i.index()] {
                for j in &g.node(i).inputs {
                    needed[j.index()] = true;
                }
            }
        }
        let forward = order.iter().copied().filter(|i| needed[i.index()]).collect();
        Ok(Executor { tg, hw, mode, format, forward, order })
    }

    /// Batch size of the graph.
    pub fn batch(&self) -> usize {
        self.tg.batch
    }

    /// Values per sample the input placeholder expects.
    pub fn sample_len(&self) -> usize {
        self.tg.graph.node(self.tg.input).shape[1..].iter().product()
    }

    /// Width of the model output (classes).
    pub fn outputs(&self) -> usize {
        *self.tg.graph.node(self.tg.output).shape.last().unwrap_or(&1)
    }

    /// One training step on a batch: updates `state` in place (parameters, optimizer state,
    /// step counter) and returns the loss and output.
    pub fn step(&self, state: &mut ModelState, x: &[f32], labels: &[u32]) -> Result<StepOutput> {
        self.step_with_fault(state, x, labels, None)
    }

    /// [`Executor::step`] with an optional fault in one hardware operation. Errors (and leaves
    /// `state` untouched) if the fault names an operation the node does not issue.
    pub fn step_with_fault(
        &self,
        state: &mut ModelState,
        x: &[f32],
        labels: &[u32],
        fault: Option<&NodeFault>,
    ) -> Result<StepOutput> {
        let mut vals = self.bind(state, x, Some(labels))?;
        let ops = self.run(&self.order, &mut vals, fault)?;
        let loss = vals[self.tg.loss.index()].as_ref().and_then(|v| v.first().copied()).unwrap_or(f32::NAN);
        let output = vals[self.tg.output.index()].clone().unwrap_or_default();
        let g = &self.tg.graph;
        let writes =
            self.tg.params.iter().map(|p| (&p.name, p.next)).chain(self.tg.opt_state.iter().map(|s| (&s.name, s.next)));
        for (name, next) in writes {
            let data = vals[next.index()].take().expect("every node was executed");
            state.tensors.insert(name.clone(), Tensor32 { shape: g.node(next).shape.clone(), data });
        }
        state.step += 1;
        Ok(StepOutput { loss, output, ops })
    }

    /// The model output for a batch of inputs, running only the nodes it depends on.
    pub fn forward(&self, state: &ModelState, x: &[f32]) -> Result<StepOutput> {
        let mut vals = self.bind(state, x, None)?;
        let ops = self.run(&self.forward, &mut vals, None)?;
        let output = vals[self.tg.output.index()].take().unwrap_or_default();
        Ok(StepOutput { loss: f32::NAN, output, ops })
    }

    /// Values of the placeholders; everything else `None` until run.
    fn bind(&self, state: &ModelState, x: &[f32], labels: Option<&[u32]>) -> Result<Vec<Option<Vec<f32>>>> {
        let g = &self.tg.graph;
        let mut vals: Vec<Option<Vec<f32>>> = vec![None; g.len()];
        for i in g.indices() {
            let node = g.node(i);
            let numel: usize = node.shape.iter().product();
            let v = match node.op {
                Op::Input => {
                    if x.len() != numel {
                        return Err(TrainError::Shape {
                            file: "<batch input>".into(),
                            expected: format!("{} values {}", numel, shape_str(&node.shape)),
                            found: format!("{} values", x.len()),
                        });
                    }
                    x.to_vec()
                }
                Op::Label => match labels {
                    Some(l) => one_hot(l, &node.shape)?,
                    None => vec![0.0; numel],
                },
                Op::Step => vec![(state.step + 1) as f32; numel],
                Op::Param | Op::OptState => {
                    let t = state
                        .tensors
                        .get(&node.name)
                        .ok_or_else(|| TrainError::Model(format!("state has no tensor `{}`", node.name)))?;
                    if t.shape != node.shape {
                        return Err(TrainError::Shape {
                            file: format!("<state {}>", node.name).into(),
                            expected: shape_str(&node.shape),
                            found: shape_str(&t.shape),
                        });
                    }
                    t.data.clone()
                }
                _ => continue,
            };
            vals[i.index()] = Some(v);
        }
        Ok(vals)
    }

    /// Executes `nodes` in order; returns the hardware operations each node issued.
    fn run(
        &self,
        nodes: &[NodeIndex],
        vals: &mut [Option<Vec<f32>>],
        fault: Option<&NodeFault>,
    ) -> Result<Vec<NodeOps>> {
        let g = &self.tg.graph;
        let mut ops = Vec::new();
        let mut vpu = Vpu::new(&self.hw, self.mode);
        for &i in nodes {
            let node = g.node(i);
            if node.op.is_placeholder() {
                continue;
            }
            let ins: Vec<(&[f32], &[usize])> = node
                .inputs
                .iter()
                .map(|j| {
                    (
                        vals[j.index()].as_deref().expect("inputs run before their consumers"),
                        g.node(*j).shape.as_slice(),
                    )
                })
                .collect();
            let here = fault.filter(|f| f.node == i);
            let (out, unit, count, cycles) = match node.op {
                Op::MatMul { trans_a, trans_b } => {
                    let (out, n, cycles) = self.matmul(ins[0], ins[1], trans_a, trans_b, here)?;
                    (out, Unit::Mxu, n, cycles)
                }
                ref op => {
                    let (base, base_cycles) = (vpu.instructions, vpu.cycles);
                    if let Some(f) = here {
                        vpu.arm(base + f.op as u64, f.faults.clone());
                    }
                    let out = vpu.apply(op, &ins, &node.shape)?.expect("non-placeholder, non-matmul op");
                    vpu.disarm();
                    (out, Unit::Vpu, (vpu.instructions - base) as usize, vpu.cycles - base_cycles)
                }
            };
            if let Some(f) = here {
                if f.op >= count {
                    return Err(TrainError::Config(format!(
                        "fault targets operation {} of node `{}`, which issues {count} {} operation(s)",
                        f.op,
                        node.name,
                        if unit == Unit::Mxu { "MXU" } else { "VPU" }
                    )));
                }
            }
            debug_assert_eq!(out.len(), node.shape.iter().product::<usize>(), "{}", node.name);
            vals[i.index()] = Some(out);
            if count > 0 {
                ops.push(NodeOps { node: i, unit, count, cycles });
            }
        }
        if let Some(f) = fault {
            if !nodes.contains(&f.node) || g.node(f.node).op.is_placeholder() {
                return Err(TrainError::Config(format!(
                    "fault targets node {:?}, which issues no hardware operation",
                    f.node
                )));
            }
        }
        Ok(ops)
    }

    /// `op(A) * op(B)` on the MXU, rank 2 or a rank-3 batch of independent GEMMs.
    fn matmul(
        &self,
        a: (&[f32], &[usize]),
        b: (&[f32], &[usize]),
        ta: bool,
        tb: bool,
        fault: Option<&NodeFault>,
    ) -> Result<(Vec<f32>, usize, u64)> {
        let r = a.1.len();
        let groups = if r == 3 { a.1[0] } else { 1 };
        let (ar, ac, br, bc) = (a.1[r - 2], a.1[r - 1], b.1[r - 2], b.1[r - 1]);
        let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
        let n = if tb { br } else { bc };
        let f = self.format;
        let mut out = Vec::with_capacity(groups * m * n);
        let mut cycles = 0;
        for gi in 0..groups {
            let sa = &a.0[gi * ar * ac..(gi + 1) * ar * ac];
            let sb = &b.0[gi * br * bc..(gi + 1) * br * bc];
            // Transposes are data movement (the DMA/UB layout), not arithmetic: exact.
            let am = Matrix::from_fn(m, k, |i, p| f.encode(if ta { sa[p * ac + i] } else { sa[i * ac + p] }));
            let bm = Matrix::from_fn(k, n, |p, j| f.encode(if tb { sb[j * bc + p] } else { sb[p * bc + j] }));
            let res = match fault.filter(|f| f.op == gi) {
                Some(f) => mxu::gemm(&self.hw, &am, &bm, ExecMode::CycleLevel, &f.faults)?,
                None => mxu::gemm(&self.hw, &am, &bm, self.mode, &FaultSchedule::none())?,
            };
            out.extend(res.out.data.iter().map(|&bits| f32::from_bits(bits)));
            cycles += res.stats.total_cycles;
        }
        Ok((out, groups, cycles))
    }
}

/// One-hot rows for class labels; errors if a label does not fit the output width.
fn one_hot(labels: &[u32], shape: &[usize]) -> Result<Vec<f32>> {
    let (n, c) = (shape[0], shape[1..].iter().product::<usize>());
    if labels.len() != n {
        return Err(TrainError::Data(format!("batch has {} labels, the graph expects {n}", labels.len())));
    }
    let mut v = vec![0f32; n * c];
    for (r, &l) in labels.iter().enumerate() {
        if l as usize >= c {
            return Err(TrainError::Data(format!("label {l} does not fit the model's {c} outputs")));
        }
        v[r * c + l as usize] = 1.0;
    }
    Ok(v)
}

/// Fraction of rows of `output [N, C]` whose argmax (first on ties) equals the label.
pub fn accuracy(output: &[f32], labels: &[u32], c: usize) -> f64 {
    let hits = output.chunks(c).zip(labels).filter(|(row, &l)| argmax(row) == l as usize).count();
    hits as f64 / labels.len().max(1) as f64
}

/// Index of the largest value (first on ties; NaN never wins).
pub fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &v)| if v > row[best] { i } else { best })
}
