//! The executor: interprets a training step's [`Program`] on the machine, instruction by
//! instruction.
//!
//! The step graph is lowered once ([`Program::step`], and [`Program::forward`] for evaluation);
//! every instruction runs through [`faultline_hw::isa::execute`] in the chosen [`ExecMode`]
//! (GEMMs on the MXU with operands rounded to the MXU input format, everything else as fp32 VPU
//! instructions). Placeholder buffers are filled by node name from the batch and the
//! [`ModelState`]; after the step every `next` node's value is written back into the state.
//! The cycles a step issues are, instruction for instruction, its program's schedule.

use crate::error::{shape_str, Result, TrainError};
use crate::golden::{GoldenStep, Start};
use crate::inject::gemm_fold;
use crate::inject::memory::{self, WordHit};
use crate::inject::sequencer;
pub use crate::inject::Injection;
use crate::state::{ModelState, Tensor32};
use faultline_graph::direct::Direct;
use faultline_graph::program::{Program, Role, StepSchedule, UnitCycles};
use faultline_graph::{NodeIndex, OpGraph, TrainGraph};
use faultline_hw::fault::ActiveFault;
use faultline_hw::isa::{self, BufId};
use faultline_hw::{ExecMode, FaultSchedule, HwConfig};
use faultline_num::NumFormat;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Input format of the MXU during training (accumulation is always fp32; the VPU is fp32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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

    /// The format a run on `hw` uses when none is given: fp32 on an fp32 machine, else bf16.
    pub fn default_for(hw: &HwConfig) -> MxuFormat {
        if hw.mxu.input_format == NumFormat::Fp32 {
            MxuFormat::Fp32
        } else {
            MxuFormat::Bf16
        }
    }

    /// The register format of MXU inputs.
    pub const fn input(self) -> NumFormat {
        match self {
            MxuFormat::Bf16 => NumFormat::Bf16,
            MxuFormat::Fp32 => NumFormat::Fp32,
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
    /// Instructions issued.
    pub instructions: usize,
    /// Machine cycles of the step: the instructions' measured cycles, issued by the program's
    /// timing rule ([`Program::issue_times`]; the same in every mode).
    pub cycles: u64,
    /// Busy cycles (MXU + VPU) of the instructions of each phase (every phase present).
    pub phase_cycles: BTreeMap<String, u64>,
    /// Busy and stall cycles of each unit (`mxu`, `vpu`).
    pub unit_cycles: BTreeMap<String, UnitCycles>,
    /// What an injected fault did to its instruction's outputs (`None` without injection;
    /// with several faulted instructions, see [`Effect`]).
    pub effect: Option<Effect>,
    /// Each check's residual ([`faultline_graph::checks`]), in the graph's check order (empty
    /// for a forward-only pass).
    pub checks: Vec<f32>,
    /// The step's training signals (zero for a forward-only pass).
    pub signals: Signals,
}

/// What the LLM-training studies watch every step (Altenbernd et al. 2026: gradient-norm,
/// update-norm and attention-logit spikes), read by the host from the step's values in f64.
/// Watching costs the simulated machine nothing: its detectors that compute such norms are
/// protection mechanisms with their own instructions ([`faultline_graph::checks`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Signals {
    /// The global gradient norm `sqrt(sum g^2)` over every parameter's gradient (before any
    /// clipping), as the backward pass wrote them.
    pub grad_norm: f64,
    /// The norm of the step's update `sqrt(sum (w' - w)^2)` over every parameter.
    pub update_norm: f64,
    /// The largest `|q k^T / sqrt(d)|` of any attention layer (`None` without attention).
    pub max_attention_logit: Option<f64>,
}

/// The larger of `a` and `b`, NaN if either is.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `sum t^2` over eight-wide `lanes` then `rest` (at most 7 more), in f64 (NaN if any term
/// is; infinite if any is), as eight interleaved partial sums: one running f64 sum waits on
/// each add's latency, which made the signals 16% of mlp-digits' step.
fn sum_of_squares(lanes: impl Iterator<Item = [f64; 8]>, rest: impl Iterator<Item = f64>) -> f64 {
    let mut acc = [0.0f64; 8];
    for l in lanes {
        for (a, t) in acc.iter_mut().zip(l) {
            *a += t * t;
        }
    }
    for (a, t) in acc.iter_mut().zip(rest) {
        *a += t * t;
    }
    acc.iter().sum()
}

/// An fp32 word's value in f64.
fn value_of(word: u32) -> f64 {
    f64::from(f32::from_bits(word))
}

/// The effect of an injected fault on the outputs of the instruction it hit, against the same
/// instruction run without the fault. A register fault placed on several instructions reports
/// the first of them (program order) whose outputs differ, else the first (masked: each ran
/// exactly as without the fault, so the whole step did).
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The instruction.
    pub instr: usize,
    /// The buffer it writes (its first output): the first tensor a fault can corrupt.
    pub buffer: String,
    /// Output words it writes.
    pub elements: usize,
    /// Output words whose bits differ from the fault-free run.
    pub corrupted: usize,
    /// Largest `|faulty - golden|` over corrupted words (infinite if either is not finite).
    pub max_abs_error: f64,
    /// Largest `|faulty - golden| / |golden|` over corrupted words (infinite for golden 0).
    pub max_rel_error: f64,
}

impl Effect {
    /// The fault never left the hardware: every output bit equals the fault-free run's.
    pub fn masked(&self) -> bool {
        self.corrupted == 0
    }

    /// Nothing corrupted yet in buffer `buf` of `p`, by instruction `instr`.
    fn none(p: &Program, instr: usize, buf: BufId) -> Effect {
        let buffer = p.buffers[buf.index()].name.clone();
        Effect { instr, buffer, elements: 0, corrupted: 0, max_abs_error: 0.0, max_rel_error: 0.0 }
    }

    /// Counts one corrupted word: fp32 bits `faulty` where the fault-free run has `golden`.
    fn record(&mut self, golden: u32, faulty: u32) {
        let (gv, fv) = (f32::from_bits(golden) as f64, f32::from_bits(faulty) as f64);
        let abs = if gv.is_finite() && fv.is_finite() { (fv - gv).abs() } else { f64::INFINITY };
        self.corrupted += 1;
        self.max_abs_error = self.max_abs_error.max(abs);
        self.max_rel_error = self.max_rel_error.max(abs / gv.abs());
    }
}

/// Host bytes one step of `tg` needs, estimated from its shapes alone (checked arithmetic;
/// `None` if it overflows): every node's fp32 value is kept for the step, and the largest node
/// needs about eight more copies of itself while it runs (raw-bit operands, the twins' decoded
/// values, outputs and their bit copies).
pub fn host_bytes(tg: &TrainGraph) -> Option<u64> {
    graph_host_bytes(&tg.graph)
}

/// Host bytes of one training state of `tg` (`None` if it overflows): every parameter's and
/// optimizer-state tensor's fp32 values, what a campaign's golden run snapshots per step.
pub fn state_bytes(tg: &TrainGraph) -> Option<u64> {
    let shapes = tg.params().iter().map(|p| &p.shape).chain(tg.opt_state.iter().map(|s| &s.shape));
    shapes.map(|s| faultline_hw::budget::product(s)).try_fold(0u64, |a, n| a.checked_add(n?))?.checked_mul(4)
}

/// [`host_bytes`] of a run of any graph's program (one op's, say).
pub fn graph_host_bytes(g: &OpGraph) -> Option<u64> {
    let sizes: Vec<u64> =
        g.indices().map(|i| faultline_hw::budget::product(&g.node(i).shape)).collect::<Option<_>>()?;
    let all = sizes.iter().try_fold(0u64, |a, &n| a.checked_add(n))?;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    all.checked_add(largest.checked_mul(8)?)?.checked_mul(4)
}

/// Runs a [`TrainGraph`]'s programs on one machine configuration in one mode.
#[derive(Debug, Clone)]
pub struct Executor {
    /// The step graph.
    pub tg: TrainGraph,
    /// The machine, with the MXU set to `format` inputs and fp32 accumulation.
    pub hw: HwConfig,
    /// Functional or cycle-level execution (bit-identical results).
    pub mode: ExecMode,
    /// MXU input format.
    pub format: MxuFormat,
    /// The whole step, lowered once.
    step: Program,
    /// The forward pass (nodes the model output depends on), lowered once.
    fwd: Program,
    /// The direct forms of `step` and `fwd` ([`Program::direct`]): what runs without an
    /// injection.
    direct: (DirectRun, DirectRun),
    /// Buffers from this many words keep their vectors for later ones of the same step
    /// ([`Pool`]).
    pooled_words: usize,
}

impl Executor {
    /// An executor of `tg` on `hw` with the MXU input format overridden by `format`.
    pub fn new(tg: TrainGraph, hw: &HwConfig, mode: ExecMode, format: MxuFormat) -> Result<Executor> {
        let hw = Executor::machine(hw, format);
        tg.topo_order().map_err(|e| TrainError::Model(e.to_string()))?;
        let place = |p: Program| p.place(&hw).map_err(|e| TrainError::Config(format!("{e} (a smaller batch may fit)")));
        let (step, fwd) = (place(Program::step(&tg))?, place(Program::forward(&tg))?);
        let direct = (DirectRun::new(step.direct()), DirectRun::new(fwd.direct()));
        Ok(Executor { tg, hw, mode, format, step, fwd, direct, pooled_words: POOLED_WORDS })
    }

    /// Reuses released buffers' vectors from `words` words on (default 1 MiB's worth): any
    /// value gives the same bits and speed is the only difference, so tests lower it to run
    /// every buffer through the reuse.
    #[doc(hidden)]
    pub fn pool_from(&mut self, words: usize) {
        self.pooled_words = words;
    }

    /// The machine an executor of `format` inputs runs on: `hw` with the MXU set to `format`
    /// inputs and fp32 accumulation, and weight-buffer words wide enough for its inputs.
    pub fn machine(hw: &HwConfig, format: MxuFormat) -> HwConfig {
        let mut hw = hw.clone();
        hw.mxu.input_format = format.input();
        hw.mxu.acc_format = NumFormat::Fp32;
        // The weight buffer holds MXU input words: fp32 inputs take 32-bit words.
        hw.memory.weight_buffer.word_bits = hw.memory.weight_buffer.word_bits.max(format.input().bits());
        hw
    }

    /// The step's program (what [`Executor::step`] interprets).
    pub fn program(&self) -> &Program {
        &self.step
    }

    /// The step program's schedule on this machine: the cycles [`Executor::step`] issues.
    pub fn schedule(&self) -> StepSchedule {
        self.step.schedule(&self.tg.graph, &self.hw)
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

    /// [`Executor::step`] with an optional fault in one or more instructions. Errors (and
    /// leaves `state` untouched) if the injection names no instruction of the step or a fault
    /// the instruction's unit cannot take.
    pub fn step_with_fault(
        &self,
        state: &mut ModelState,
        x: &[f32],
        labels: &[u32],
        fault: Option<&Injection>,
    ) -> Result<StepOutput> {
        self.step_with_fault_from(state, x, labels, fault, None)
    }

    /// [`Executor::step_with_fault`] starting, if `golden` is given, from that fault-free run
    /// of the same step ([`Executor::golden_step`] on the same state and batch: else an error)
    /// at the first instruction the fault reaches ([`crate::golden`]). The same result, bit for
    /// bit, without recomputing the fault-free prefix.
    pub fn step_with_fault_from(
        &self,
        state: &mut ModelState,
        x: &[f32],
        labels: &[u32],
        fault: Option<&Injection>,
        golden: Option<&GoldenStep>,
    ) -> Result<StepOutput> {
        let p = &self.step;
        let (mut out, mut bufs) = self.run_injected(state, x, Some(labels), fault, golden)?;
        let value = |bufs: &mut [Vec<u32>], i: NodeIndex| -> Vec<f32> {
            let b = p.buffer_of(i).expect("kept nodes have buffers");
            std::mem::take(&mut bufs[b.index()]).into_iter().map(f32::from_bits).collect()
        };
        out.loss = value(&mut bufs, self.tg.loss).first().copied().unwrap_or(f32::NAN);
        out.output = value(&mut bufs, self.tg.output);
        out.checks = self.tg.checks().iter().map(|c| value(&mut bufs, c.residual)[0]).collect();
        let words = |i: NodeIndex| &bufs[p.buffer_of(i).expect("watched nodes have buffers").index()];
        let grad_sq: f64 = (self.tg.params.iter())
            .map(|q| {
                let g = words(q.grad).chunks_exact(8);
                let lanes = g.clone().map(|c| std::array::from_fn(|k| value_of(c[k])));
                sum_of_squares(lanes, g.remainder().iter().map(|&b| value_of(b)))
            })
            .sum();
        let logits =
            (self.tg.attention_logits.iter()).map(|&l| words(l).iter().map(|&b| value_of(b).abs()).fold(0.0, nan_max));
        let max_logit = logits.reduce(nan_max);
        let update_sq: f64 = (self.tg.params.iter())
            .map(|q| {
                let (new, old) = (words(q.next).chunks_exact(8), state.tensors[&q.name].data.chunks_exact(8));
                let diff = |n: u32, o: f32| value_of(n) - f64::from(o);
                let lanes = new.clone().zip(old.clone()).map(|(n, o)| std::array::from_fn(|k| diff(n[k], o[k])));
                sum_of_squares(lanes, new.remainder().iter().zip(old.remainder()).map(|(&n, &o)| diff(n, o)))
            })
            .sum();
        out.signals =
            Signals { grad_norm: grad_sq.sqrt(), update_norm: update_sq.sqrt(), max_attention_logit: max_logit };
        let g = &self.tg.graph;
        let writes =
            self.tg.params.iter().map(|p| (&p.name, p.next)).chain(self.tg.opt_state.iter().map(|s| (&s.name, s.next)));
        for (name, next) in writes {
            let data = value(&mut bufs, next);
            state.tensors.insert(name.clone(), Tensor32 { shape: g.node(next).shape.clone(), data });
        }
        state.step += 1;
        Ok(out)
    }

    /// Runs the step program (with `labels` when it has a label input) on a batch with an
    /// optional fault; returns what it measured and every buffer as the run left it.
    fn run_injected(
        &self,
        state: &ModelState,
        x: &[f32],
        labels: Option<&[u32]>,
        fault: Option<&Injection>,
        golden: Option<&GoldenStep>,
    ) -> Result<(StepOutput, Vec<Vec<u32>>)> {
        let bind = || self.bind(&self.step, state, x, labels);
        let direct = (&self.direct.0, self.pooled_words);
        run_bound(&self.hw, self.mode, &self.tg.graph, &self.step, direct, &bind, fault, golden)
    }

    /// The fault-free run of the program (the step's; the forward pass's on an executor from
    /// [`Executor::inference`]) on a batch (`labels` `None` for an inference program), kept
    /// whole for faulted runs of the same step to start from
    /// ([`Executor::step_with_fault_from`]); `state` is not changed.
    pub fn golden_step(&self, state: &ModelState, x: &[f32], labels: Option<&[u32]>) -> Result<GoldenStep> {
        let p = &self.step;
        let bound = self.bind(p, state, x, labels)?;
        let mut bufs = bound.clone();
        let durations = run_keeping_buffers(&self.hw, ExecMode::Functional, p, &mut bufs, None)?;
        Ok(GoldenStep::new(p, &bound, bufs, durations))
    }

    /// Host bytes a [`GoldenStep`] of this executor's program holds: every buffer.
    pub fn golden_step_bytes(&self) -> u64 {
        self.step.buffers.iter().map(|b| b.len as u64 * 4).sum::<u64>() + self.step.instrs.len() as u64 * 8
    }

    /// This executor for inference: its program (what [`Executor::program`],
    /// [`Executor::schedule`] and injection see) is the forward pass, run by
    /// [`Executor::infer_with_fault`].
    pub fn inference(&self) -> Executor {
        Executor { step: self.fwd.clone(), direct: (self.direct.1.clone(), self.direct.1.clone()), ..self.clone() }
    }

    /// The model output for a batch with an optional fault placed on the forward program, on
    /// an executor from [`Executor::inference`] (errors on a training executor).
    pub fn infer_with_fault(&self, state: &ModelState, x: &[f32], fault: Option<&Injection>) -> Result<StepOutput> {
        self.infer_with_fault_from(state, x, fault, None)
    }

    /// [`Executor::infer_with_fault`] starting, if `golden` is given, from that fault-free pass
    /// ([`Executor::golden_step`] of this executor on the same state and batch) where the
    /// fault does, as [`Executor::step_with_fault_from`] does.
    pub fn infer_with_fault_from(
        &self,
        state: &ModelState,
        x: &[f32],
        fault: Option<&Injection>,
        golden: Option<&GoldenStep>,
    ) -> Result<StepOutput> {
        if self.step.instrs.len() != self.fwd.instrs.len() || self.step.buffer_of(self.tg.loss).is_some() {
            return Err(TrainError::Config(
                "infer_with_fault runs on an inference executor (Executor::inference)".into(),
            ));
        }
        let (mut out, mut bufs) = self.run_injected(state, x, None, fault, golden)?;
        let b = self.step.buffer_of(self.tg.output).expect("the forward program computes the output");
        out.output = std::mem::take(&mut bufs[b.index()]).into_iter().map(f32::from_bits).collect();
        Ok(out)
    }

    /// Every buffer of a fault-free step on a batch (nothing released), as the program's
    /// buffer table numbers them; `state` is not changed.
    pub fn step_buffers(&self, state: &ModelState, x: &[f32], labels: &[u32]) -> Result<Vec<Vec<u32>>> {
        self.buffers(state, x, Some(labels))
    }

    /// The buffers as instruction `i` of the program (the step's; the forward pass's on an
    /// executor from [`Executor::inference`]) finds them in a fault-free run on a batch:
    /// placeholders bound from `state`, `x` and `labels` (`None` for an inference program),
    /// instructions `0..i` run functionally, nothing released. What a replay of instruction
    /// `i` on its own (at cycle level, for a waveform) takes its operands from; `state` is not
    /// changed. Errors for `i` past the program's end.
    pub fn buffers_before(
        &self,
        state: &ModelState,
        x: &[f32],
        labels: Option<&[u32]>,
        i: usize,
    ) -> Result<Vec<Vec<u32>>> {
        let p = &self.step;
        if i > p.instrs.len() {
            return Err(TrainError::Config(format!(
                "instruction {i} is past the program's end ({} instructions)",
                p.instrs.len()
            )));
        }
        let mut bufs = self.bind(p, state, x, labels)?;
        for ins in &p.instrs[..i] {
            size_dests(p, ins, &mut bufs);
            isa::execute(&self.hw, ins, &mut bufs, ExecMode::Functional, &FaultSchedule::none())?;
        }
        Ok(bufs)
    }

    /// [`Executor::step_buffers`], labels optional (an inference program has none).
    fn buffers(&self, state: &ModelState, x: &[f32], labels: Option<&[u32]>) -> Result<Vec<Vec<u32>>> {
        let mut bufs = self.bind(&self.step, state, x, labels)?;
        run_keeping_buffers(&self.hw, ExecMode::Functional, &self.step, &mut bufs, None)?;
        Ok(bufs)
    }

    /// The injection of sequencer fault `f` in GEMM `g` of the step program: the words it
    /// changes ([`crate::inject::sequencer`]), given the fault-free step's buffers
    /// ([`Executor::step_buffers`]).
    pub fn words_of_sequencer_fault(&self, g: usize, f: ActiveFault, golden: &[Vec<u32>]) -> Result<Injection> {
        let sched = self.schedule();
        let map = memory::StepMap::new(&self.step, &sched, &self.hw)?;
        Ok(Injection::words(g, gemm_words(&self.step, &map, g, f, golden)?))
    }

    /// The model output for a batch of inputs, running only the forward program.
    pub fn forward(&self, state: &ModelState, x: &[f32]) -> Result<StepOutput> {
        let p = &self.fwd;
        let mut bufs = self.bind(p, state, x, None)?;
        let mut out = run_direct(&self.hw, self.mode, p, (&self.direct.1, self.pooled_words), &mut bufs)?;
        let b = p.buffer_of(self.tg.output).expect("the forward program computes the output");
        out.output = std::mem::take(&mut bufs[b.index()]).into_iter().map(f32::from_bits).collect();
        Ok(out)
    }

    /// The program's buffers with the placeholders filled; everything else empty until written.
    fn bind(&self, p: &Program, state: &ModelState, x: &[f32], labels: Option<&[u32]>) -> Result<Vec<Vec<u32>>> {
        let g = &self.tg.graph;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        let mut bufs = vec![Vec::new(); p.buffers.len()];
        for (b, buf) in p.buffers.iter().enumerate() {
            let node = g.node(buf.node);
            bufs[b] = match buf.role {
                Role::Input => {
                    if x.len() != buf.len {
                        return Err(TrainError::Shape {
                            file: "<batch input>".into(),
                            expected: format!("{} values {}", buf.len, shape_str(&node.shape)),
                            found: format!("{} values", x.len()),
                        });
                    }
                    bits(x)
                }
                Role::Label => match labels {
                    Some(l) => bits(&one_hot(l, &node.shape)?),
                    None => vec![0; buf.len],
                },
                Role::Step => vec![((state.step + 1) as f32).to_bits(); buf.len],
                Role::LearningRate => vec![(self.tg.lr_at(state.step + 1) as f32).to_bits(); buf.len],
                Role::Param | Role::OptState => {
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
                    bits(&t.data)
                }
                Role::Const => match &node.op {
                    faultline_graph::Op::Const { values } => values.iter().map(|&v| (v as f32).to_bits()).collect(),
                    op => return Err(TrainError::Model(format!("constant `{}` is a {} node", node.name, op.name()))),
                },
                Role::Value | Role::Temp | Role::Staged => continue,
            };
        }
        Ok(bufs)
    }
}

/// A placed program on its machine, with the graph that names its instructions: what a fault
/// is resolved against ([`crate::inject::resolve`]). A training step's or inference pass's
/// [`Executor`] is one, one op's [`crate::kernel::Kernel`] another.
pub trait Placed {
    /// The machine.
    fn hw(&self) -> &HwConfig;
    /// The placed program.
    fn program(&self) -> &Program;
    /// The graph whose nodes the program's tags name.
    fn graph(&self) -> &OpGraph;
}

impl Placed for Executor {
    fn hw(&self) -> &HwConfig {
        &self.hw
    }
    fn program(&self) -> &Program {
        &self.step
    }
    fn graph(&self) -> &OpGraph {
        &self.tg.graph
    }
}

/// Runs placed program `p` in `mode` on the buffers `bind` gives (placeholders filled), with an
/// optional fault: none runs the direct form `direct`; a sequencer fault first finds the words
/// it changes (`g` names `p`'s nodes). Returns what the run measured and every buffer as it left them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_bound(
    hw: &HwConfig,
    mode: ExecMode,
    g: &OpGraph,
    p: &Program,
    direct: (&DirectRun, usize),
    bind: &dyn Fn() -> Result<Vec<Vec<u32>>>,
    fault: Option<&Injection>,
    golden: Option<&GoldenStep>,
) -> Result<(StepOutput, Vec<Vec<u32>>)> {
    let (seq, groups) = match fault {
        Some(Injection::Sequencer { gemms, fault }) => {
            let (inj, groups) = sequencer_words(hw, g, p, gemms, *fault, bind, golden)?;
            (Some(inj), groups)
        }
        _ => (None, Vec::new()),
    };
    let mut bufs = bind()?;
    let mut out = match (seq.as_ref().or(fault), golden) {
        (None, _) => run_direct(hw, mode, p, direct, &mut bufs)?,
        (Some(f), Some(golden)) => {
            let start = golden.start(p, f, &mut bufs)?;
            run(hw, mode, p, &mut bufs, Some(f), &groups, Some(start))?
        }
        (fault, None) => run(hw, mode, p, &mut bufs, fault, &groups, None)?,
    };
    if let Some(inj) = &seq {
        // The GEMM's result is what the fault corrupts first.
        let g = inj.instr();
        let e = out.effect.get_or_insert_with(|| Effect::none(p, g, p.instrs[g].writes()[0]));
        e.elements = p.instrs[e.instr].out_len();
    }
    Ok((out, bufs))
}

/// [`sequencer::words`] of GEMM `g` of `p`, refusing an instruction that is not a GEMM.
fn gemm_words(
    p: &Program,
    map: &memory::StepMap,
    g: usize,
    f: ActiveFault,
    golden: &[Vec<u32>],
) -> Result<Vec<WordHit>> {
    if !matches!(p.instrs.get(g), Some(isa::Instr::Gemm { .. })) {
        return Err(TrainError::Config(format!("a sequencer fault targets a GEMM; instruction {g} is not one")));
    }
    sequencer::words(map, g, f, golden)
}

/// The words sequencer fault `f` changes in `gemms` of `p` (program order, non-empty), as one
/// word injection on the first GEMM, with the GEMM each run of words comes from (its first
/// word's index, the GEMM; see [`run`]). [`sequencer::words`] takes a GEMM's operands and the
/// words it overwrites from a run of the program, which must be the faulty run up to that GEMM:
/// the fault-free run for the first, and for a later one the run repeated with the words found
/// so far (when there are new ones). `bind` gives the buffers a run starts from; `graph`
/// names `p`'s nodes.
fn sequencer_words(
    hw: &HwConfig,
    graph: &OpGraph,
    p: &Program,
    gemms: &[usize],
    f: ActiveFault,
    bind: &dyn Fn() -> Result<Vec<Vec<u32>>>,
    from: Option<&GoldenStep>,
) -> Result<(Injection, Vec<(usize, usize)>)> {
    let Some(&first) = gemms.first() else {
        return Err(TrainError::Config("a sequencer fault must reach at least one GEMM".into()));
    };
    let sched = p.schedule(graph, hw);
    let map = memory::StepMap::new(p, &sched, hw)?;
    let mut golden = match from {
        Some(g) => g.bufs.clone(),
        None => {
            let mut bufs = bind()?;
            run_keeping_buffers(hw, ExecMode::Functional, p, &mut bufs, None)?;
            bufs
        }
    };
    let (mut words, mut groups, mut stale) = (Vec::new(), Vec::new(), false);
    for &g in gemms {
        if stale {
            let mut bufs = bind()?;
            let so_far = Injection::words(first, words.clone());
            run_keeping_buffers(hw, ExecMode::Functional, p, &mut bufs, Some(&so_far))?;
            (golden, stale) = (bufs, false);
        }
        let w = gemm_words(p, &map, g, f, &golden)?;
        if !w.is_empty() {
            groups.push((words.len(), g));
            stale = true;
        }
        words.extend(w);
    }
    Ok((Injection::words(first, words), groups))
}

/// Interprets `p` on `hw` in `mode` over `bufs` (one per buffer of `p`, placeholders filled,
/// the rest empty), with an optional injection; the loss and output of the result are left
/// empty for the caller to read from `bufs` (released buffers are emptied as the program goes).
pub fn run_program(
    hw: &HwConfig,
    mode: ExecMode,
    p: &Program,
    bufs: &mut [Vec<u32>],
    fault: Option<&Injection>,
) -> Result<StepOutput> {
    run(hw, mode, p, bufs, fault, &[], None)
}

/// [`run_program`], freeing each buffer once no later instruction reads it (`p.release`).
/// `groups` splits the injection's words by the instruction they come from (the first word's
/// index, the instruction: the GEMMs a sequencer fault strikes), each counted apart: the effect
/// reported is the first group's that changed a word, on its instruction. Empty: one group, the
/// effect on the instruction that first sees a changed word. With `start`, the run begins there
/// (`bufs` completed by [`GoldenStep::start`]).
fn run(
    hw: &HwConfig,
    mode: ExecMode,
    p: &Program,
    bufs: &mut [Vec<u32>],
    fault: Option<&Injection>,
    groups: &[(usize, usize)],
    start: Option<Start<'_>>,
) -> Result<StepOutput> {
    let (durations, effect) = interpret(hw, mode, p, bufs, fault, &p.release, groups, start)?;
    Ok(output(p, &durations, effect))
}

/// [`run`] with every buffer kept: what the step leaves in all of them, as operands of a
/// replay or of a fault's next GEMM. Returns each instruction's cycles.
fn run_keeping_buffers(
    hw: &HwConfig,
    mode: ExecMode,
    p: &Program,
    bufs: &mut [Vec<u32>],
    fault: Option<&Injection>,
) -> Result<Vec<u64>> {
    Ok(interpret(hw, mode, p, bufs, fault, &[], &[], None)?.0)
}

/// Interprets `p`, freeing the buffers `release[i]` after instruction `i` (none past the
/// slice's end); see [`run`]. Returns each instruction's cycles and the fault's effect.
#[allow(clippy::too_many_arguments)]
fn interpret(
    hw: &HwConfig,
    mode: ExecMode,
    p: &Program,
    bufs: &mut [Vec<u32>],
    fault: Option<&Injection>,
    release: &[Vec<BufId>],
    groups: &[(usize, usize)],
    start: Option<Start<'_>>,
) -> Result<(Vec<u64>, Option<Effect>)> {
    if let Some(f) = fault {
        if matches!(f, Injection::Sequencer { .. }) {
            return Err(TrainError::Config("a sequencer fault runs through Executor::step_with_fault".into()));
        }
        if f.instrs().next().is_none() {
            return Err(TrainError::Config("an injection must reach at least one instruction".into()));
        }
        if let Some(i) = f.instrs().find(|&i| i >= p.instrs.len()) {
            return Err(TrainError::Config(format!(
                "fault targets instruction {i}, but the step has {} instructions (0..{})",
                p.instrs.len(),
                p.instrs.len()
            )));
        }
    }
    let none = FaultSchedule::none();
    let mut effect = None;
    let first = start.as_ref().map_or(0, |s| s.at);
    let mut durations = Vec::with_capacity(p.instrs.len());
    // The golden step's cycles for the instructions a late start skips.
    durations.extend_from_slice(start.as_ref().map_or(&[][..], |s| &s.golden.durations[..first]));
    let words = fault.map_or(&[][..], |f| f.hits());
    let groups = if groups.is_empty() { vec![(0, None)] } else { groups.iter().map(|&(k, i)| (k, Some(i))).collect() };
    let mut mem = words.first().map(|_| {
        let mut by_instr = vec![Vec::new(); p.instrs.len() + 1];
        for (k, h) in words.iter().enumerate() {
            by_instr[h.instr.unwrap_or(p.instrs.len())].push(k);
        }
        WordEffect { hw, p, words, effects: vec![None; groups.len()], groups, by_instr }
    });
    for (i, ins) in p.instrs.iter().enumerate().skip(first) {
        size_dests(p, ins, bufs);
        let restore = mem.as_mut().map(|m| m.apply(bufs, Some(i), false)).unwrap_or_default();
        let parts: Vec<(usize, &WordHit)> = mem.as_ref().map_or(Vec::new(), |m| {
            m.by_instr[i].iter().map(|&k| (k, &words[k])).filter(|(_, h)| h.part.is_some()).collect()
        });
        let c = match fault.and_then(|f| f.register_faults(i)) {
            Some(faults) => {
                let (c, e) = inject(hw, p, i, bufs, faults)?;
                // The first faulted instruction (program order) whose outputs differ is what
                // the fault did; with none, the first's masked effect: then every faulted
                // instruction's outputs, and so the whole step, are fault-free.
                if effect.as_ref().is_none_or(|x: &Effect| x.masked() && !e.masked()) {
                    effect = Some(e);
                }
                c
            }
            None if !parts.is_empty() => {
                let m = mem.as_mut().expect("part hits are word hits");
                m.parts(bufs, i, &parts, mode)?
            }
            None => isa::execute(hw, ins, bufs, mode, &none)?,
        };
        durations.push(c);
        for (b, x, old) in restore.into_iter().rev() {
            bufs[b.index()][x] = old;
        }
        if let Some(m) = mem.as_mut() {
            m.apply(bufs, Some(i), true);
        } else {
            // A memory fault may read any earlier buffer's words: nothing is freed then.
            for r in release.get(i).into_iter().flatten().filter(|r| !p.observes(**r)) {
                bufs[r.index()] = Vec::new();
            }
        }
        if let Some(s) = start.as_ref().filter(|s| s.masked_after == Some(i)) {
            if effect.as_ref().is_some_and(Effect::masked) {
                // Every faulted instruction's outputs are fault-free: so is the rest of the step.
                durations.extend_from_slice(&s.golden.durations[i + 1..]);
                for &b in p.kept.iter().chain(&p.observed) {
                    bufs[b.index()].clone_from(&s.golden.bufs[b.index()]);
                }
                break;
            }
        }
    }
    if let Some(mut m) = mem {
        m.apply(bufs, None, false);
        // Nothing changed: the fault is reported against the instruction it was placed on.
        m.effect(0, fault.map_or(0, |f| f.instr()), words[0].buf);
        let first = m.effects.iter().position(|e| e.as_ref().is_some_and(|e| !e.masked()));
        effect = m.effects.swap_remove(first.unwrap_or(0));
    }
    Ok((durations, effect))
}

/// [`run_program`] without a fault, interpreting `p`'s direct form `d` ([`Program::direct`]):
/// staged copies read and written in their DRAM words, their transfers skipped but costed.
/// Leaves the same bits as `run_program` in every buffer `p` keeps (property-tested).
fn run_direct(
    hw: &HwConfig,
    mode: ExecMode,
    p: &Program,
    (d, pooled_words): (&DirectRun, usize),
    bufs: &mut [Vec<u32>],
) -> Result<StepOutput> {
    let none = FaultSchedule::none();
    let mut durations = Vec::with_capacity(p.instrs.len());
    let mut pool = Pool { kept: Default::default(), from: pooled_words };
    let (timing, d) = (&d.timing, &d.form);
    for (i, ins) in d.instrs.iter().enumerate() {
        durations.push(match ins {
            Some(ins) => {
                pool.provide_dests(p, ins, bufs);
                isa::execute(hw, ins, bufs, mode, &none)?
            }
            None => isa::cycles(hw, &p.instrs[i]),
        });
        for r in d.release[i].iter().filter(|r| !p.observes(**r)) {
            pool.keep(std::mem::take(&mut bufs[r.index()]));
        }
    }
    if let Some((_, out)) = timing.get().filter(|(cycles, _)| *cycles == durations) {
        return Ok(out.clone());
    }
    let out = output(p, &durations, None);
    let _ = timing.set((durations, out.clone()));
    Ok(out)
}

/// A program's direct form ([`Program::direct`]) with the timing of its runs: every fault-free
/// run issues the same instructions with the same cycles, so the step's timeline (tens of
/// microseconds on a small model's step, a tenth of it) is computed once.
#[derive(Debug, Clone)]
pub(crate) struct DirectRun {
    /// The direct form.
    form: Direct,
    /// The first run's instruction cycles and what they add up to.
    timing: std::sync::OnceLock<(Vec<u64>, StepOutput)>,
}

impl DirectRun {
    /// `form` with no run timed yet.
    pub(crate) fn new(form: Direct) -> DirectRun {
        DirectRun { form, timing: Default::default() }
    }
}

/// The vectors of a step's released buffers, handed to later destinations of the same step:
/// a buffer that an instruction writes whole takes one as it is (its stale words are all
/// overwritten), so that a fault-free step does not allocate, zero and first-touch every
/// temporary it writes (an im2col matrix is tens of MB). Only buffers of at least `from`
/// words ([`POOLED_WORDS`]) go through it: a smaller one the allocator hands back from its
/// recently freed (cache-warm) memory faster than a kept vector comes back (the 16-32-64
/// CNN's tiles on tpu-32x32 ran 10% slower through it).
struct Pool {
    /// Kept vectors by length.
    kept: std::collections::BTreeMap<usize, Vec<Vec<u32>>>,
    /// The fewest words a buffer has to go through the pool.
    from: usize,
}

/// Words from which a buffer's vector is kept for reuse ([`Pool`]): 1 MiB.
pub(crate) const POOLED_WORDS: usize = 1 << 18;

impl Pool {
    fn keep(&mut self, v: Vec<u32>) {
        if v.len() >= self.from.max(1) {
            self.kept.entry(v.len()).or_default().push(v);
        }
    }

    /// The smallest kept vector of at least `len` words, cut to `len`.
    fn take(&mut self, len: usize) -> Option<Vec<u32>> {
        let e = self.kept.range_mut(len..).next()?;
        let mut v = e.1.pop().expect("a kept length holds a vector");
        let have = *e.0;
        if e.1.is_empty() {
            self.kept.remove(&have);
        }
        v.truncate(len);
        Some(v)
    }

    /// Gives each empty destination of `ins` its vector: a kept one where there is one, as it
    /// is where `ins` writes all of it (from word 0, not adding to it), zeroed where it writes
    /// parts (batched GEMMs, per-sample reductions: [`size_dests`]); else a new zeroed one for
    /// parts, and none for a whole write (the instruction makes its own).
    fn provide_dests(&mut self, p: &Program, ins: &isa::Instr, bufs: &mut [Vec<u32>]) {
        let adds = match ins {
            isa::Instr::Gemm { acc, .. } | isa::Instr::Vpu { acc, .. } => *acc,
            isa::Instr::Dma { .. } => false,
        };
        for d in ins.dests() {
            let (b, len) = (d.buf.index(), p.buffers[d.buf.index()].len);
            if !bufs[b].is_empty() || len == 0 {
                continue;
            }
            if len < self.from {
                size_dest(ins, b, len, bufs);
                continue;
            }
            let whole = ins.out_len() == len && d.offset == 0 && !adds;
            match self.take(len) {
                Some(v) if whole => bufs[b] = v,
                Some(mut v) => {
                    v.fill(0);
                    bufs[b] = v;
                }
                None if !whole => bufs[b] = vec![0; len],
                None => {}
            }
        }
    }
}

/// What a run of `p` measured: its instructions' `durations` issued by the program's timing
/// rule, and the fault's `effect`; the loss and output are left for the caller.
fn output(p: &Program, durations: &[u64], effect: Option<Effect>) -> StepOutput {
    let t = p.timeline(durations);
    StepOutput {
        loss: f32::NAN,
        output: Vec::new(),
        instructions: p.instrs.len(),
        cycles: t.total,
        phase_cycles: t.phases.iter().map(|(p, &c)| (p.name().to_string(), c)).collect(),
        unit_cycles: t.units,
        effect,
        checks: Vec::new(),
        signals: Signals::default(),
    }
}

/// Sizes the destinations of `ins` that it fills in parts (batched GEMMs, per-sample
/// reductions) before it runs: a whole-buffer write takes its output vector as it is.
fn size_dests(p: &Program, ins: &isa::Instr, bufs: &mut [Vec<u32>]) {
    for d in ins.writes() {
        size_dest(ins, d.index(), p.buffers[d.index()].len, bufs);
    }
}

/// [`size_dests`] for destination buffer `b` of `len` words.
fn size_dest(ins: &isa::Instr, b: usize, len: usize, bufs: &mut [Vec<u32>]) {
    if bufs[b].is_empty() && ins.out_len() != len {
        bufs[b] = vec![0; len];
    }
}

/// The words a memory or DMA fault changes, applied as the step runs, and what they did.
struct WordEffect<'a> {
    hw: &'a HwConfig,
    p: &'a Program,
    words: &'a [WordHit],
    /// The words' groups: each one's first word, and the instruction its effect is reported on
    /// (`None`: the one that first sees a changed word).
    groups: Vec<(usize, Option<usize>)>,
    /// Each group's effect so far.
    effects: Vec<Option<Effect>>,
    /// The words each instruction reads (by index, in order; last, the host's), so that each
    /// instruction looks at its own only (a DMA-address fault changes tens of thousands).
    by_instr: Vec<Vec<usize>>,
}

impl WordEffect<'_> {
    /// Applies the hits read by instruction `at` (`None`: the host after the step): before it
    /// runs (`written` false; returns the old values to restore afterwards) or the words it
    /// wrote (`written` true). Counts every word whose bits change.
    fn apply(&mut self, bufs: &mut [Vec<u32>], at: Option<usize>, written: bool) -> Vec<(BufId, usize, u32)> {
        let mut restore = Vec::new();
        let words = self.words;
        let mine = &self.by_instr[at.unwrap_or(self.p.instrs.len())];
        let hits = mine.iter().map(|&k| (k, &words[k])).filter(|(_, h)| h.written == written && h.part.is_none());
        for (k, h, old, new) in memory::compose(hits, bufs, self.hw.mxu.input_format) {
            if new == old {
                continue;
            }
            bufs[h.buf.index()][h.elem] = new;
            if !written && at.is_some() {
                restore.push((h.buf, h.elem, old));
            }
            self.effect(k, at.unwrap_or(self.p.instrs.len()), h.buf).record(old, new);
        }
        restore
    }

    /// The effect so far of the group of word `k`; its first changed word (of `buf`, seen by
    /// instruction `instr`) starts it.
    fn effect(&mut self, k: usize, instr: usize, buf: BufId) -> &mut Effect {
        let g = self.groups.partition_point(|&(first, _)| first <= k).saturating_sub(1);
        let (p, words) = (self.p, self.words.len());
        let instr = self.groups[g].1.unwrap_or(instr);
        self.effects[g].get_or_insert_with(|| Effect { elements: words, ..Effect::none(p, instr, buf) })
    }

    /// Runs instruction `i` with only some of its reads of a word changed (`parts`): a GEMM
    /// fold by fold ([`crate::inject::gemm_fold`]), a VPU op with some operand elements changed.
    /// Counts every read that sees a changed word (in the group of the first part: the reads
    /// of one instruction are not told apart).
    fn parts(&mut self, bufs: &mut [Vec<u32>], i: usize, parts: &[(usize, &WordHit)], mode: ExecMode) -> Result<u64> {
        let (k, parts): (Vec<usize>, Vec<&WordHit>) = parts.iter().copied().unzip();
        let ins = &self.p.instrs[i];
        let (c, seen) = match ins {
            isa::Instr::Vpu { n, .. } => {
                let fmt = self.hw.mxu.input_format;
                // (operand, element, changed value) for each read, from the words as they are.
                let changes: Vec<(usize, usize, u32, u32)> =
                    memory::compose(parts.iter().copied().enumerate(), bufs, fmt)
                        .into_iter()
                        .filter_map(|(_, h, old, new)| Some((h.part? / n, h.part? % n, old, new)))
                        .collect();
                let mut edit = |inputs: &mut [Vec<u32>]| {
                    for &(k, e, _, new) in &changes {
                        inputs[k][e] = new;
                    }
                };
                let c = isa::execute_vpu_edited(self.hw, ins, bufs, mode, &FaultSchedule::none(), &mut edit)?;
                (c, changes.iter().map(|&(_, _, old, new)| (old, new)).collect())
            }
            _ => gemm_fold::run(self.hw, ins, bufs, &parts)?,
        };
        for (old, new) in seen.into_iter().filter(|(o, n)| o != n) {
            self.effect(k[0], i, parts[0].buf).record(old, new);
        }
        Ok(c)
    }
}

/// Runs instruction `i` with `faults` at cycle level, and without them functionally, and
/// reports the difference (the faulty outputs are what the step goes on with).
fn inject(
    hw: &HwConfig,
    p: &Program,
    i: usize,
    bufs: &mut [Vec<u32>],
    faults: &FaultSchedule,
) -> Result<(u64, Effect)> {
    let ins = &p.instrs[i];
    let dests = ins.dests();
    let (c, golden) = isa::execute_faulty(hw, ins, bufs, faults)?;
    let len = ins.out_len();
    let mut e = Effect { elements: len * dests.len(), ..Effect::none(p, i, dests[0].buf) };
    for (d, g) in dests.iter().zip(&golden) {
        let (f, off) = (&bufs[d.buf.index()], d.offset);
        for (&gb, &fb) in g.iter().zip(&f[off..off + len]) {
            if gb != fb {
                e.record(gb, fb);
            }
        }
    }
    Ok((c, e))
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
