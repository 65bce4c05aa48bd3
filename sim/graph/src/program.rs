//! The one lowering: a step graph becomes a [`Program`] of machine instructions
//! ([`faultline_hw::isa::Instr`]) over a buffer table, and its [`StepSchedule`] is the cost of
//! exactly those instructions. The executor (`train`) interprets the same program, so what is
//! costed is what is executed.
//!
//! # How ops lower
//! * `MatMul` -> one [`Instr::Gemm`] per product (rank 3: one per batch element, reading and
//!   writing at that element's offset); transposes are the operand's read order.
//! * Every other computing op -> a sequence of fp32 VPU instructions. Broadcasts (a row vector
//!   over leading dimensions, a per-row scalar across a row) are operand address patterns
//!   ([`View`]); im2col and repeats are `Copy` instructions through the lanes; col2im is the sum
//!   of one gathered tap per kernel offset. Op constants (`1/D`, learning rate, decay factors)
//!   are instruction immediates rounded once to fp32. Compositions: `x / s` is
//!   `x * recip(s)`, `sqrt(v)` is `recip(rsqrt(v))`, `tanh(u) = 1 - 2 / (exp(2u) + 1)`; the
//!   loss's log-sum-exp uses the VPU's `ln`, Adam's bias corrections its `bias_correction`.
//! * `Reshape` -> nothing: its buffer is its input's.
//! * Placeholders -> buffers the caller fills before the step (input, labels, step counter,
//!   parameters, optimizer state).
//!
//! No value of the step is computed anywhere but in an instruction.
//!
//! # Schedule
//! Each instruction costs [`faultline_hw::isa::cycles`], its unit's own schedule. The MXU and
//! the VPU each issue their instructions in program order and overlap each other as the data
//! dependencies allow ([`Program::issue_times`]): the step's cycles are the critical path, not
//! a sum.

use crate::error::GraphError;
use crate::op::{Mode, Op, Phase, Window};
pub use crate::residency::Home;
use crate::train_graph::TrainGraph;
use crate::{NodeIndex, OpGraph};
use faultline_hw::isa::{self, BufId, Dest, ExecUnit, Instr, MatOperand, Operand, View};
use faultline_hw::vpu::{Axis, Cmp, VpuOp};
use faultline_hw::HwConfig;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Role {
    /// The batch's features (filled by the caller).
    Input,
    /// The batch's targets (filled by the caller).
    Label,
    /// The 1-based step counter (filled by the caller).
    Step,
    /// The step's learning rate (filled from the optimizer's rate and the schedule).
    LearningRate,
    /// A parameter (filled from the model state).
    Param,
    /// Optimizer state (filled from the model state).
    OptState,
    /// A constant (filled from the graph: [`Op::Const`]).
    Const,
    /// A node's value.
    Value,
    /// An intermediate of a node's instruction sequence.
    Temp,
    /// An on-chip copy of a DRAM-homed buffer, loaded for (or stored after) one instruction
    /// ([`crate::residency`]).
    Staged,
}

impl Role {
    /// Whether the host fills the buffer before the step (the batch, step counter, parameters,
    /// optimizer state and constants), rather than an instruction computing it.
    pub fn is_placeholder(self) -> bool {
        matches!(
            self,
            Role::Input | Role::Label | Role::Step | Role::LearningRate | Role::Param | Role::OptState | Role::Const
        )
    }
}

/// One entry of the buffer table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Buffer {
    /// Name: the node's name, or `<node>#<k>` for the `k`-th intermediate of a node.
    pub name: String,
    /// Words (fp32 values).
    pub len: usize,
    /// What it holds.
    pub role: Role,
    /// The node it belongs to.
    #[serde(skip)]
    pub node: NodeIndex,
}

/// Where an instruction came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tag {
    /// The graph node it computes (part of).
    #[serde(skip)]
    pub node: NodeIndex,
    /// The node's phase.
    pub phase: Phase,
    /// The node's layer.
    pub layer: String,
    /// `(index, count)` when the instruction is one tile of an instruction placement cut along
    /// its rows to fit the SRAMs ([`crate::residency::place`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tile: Option<(usize, usize)>,
}

impl Tag {
    /// `" (tile k/n)"` for one tile of a cut instruction, else empty: what follows the node's
    /// name wherever an instruction is named.
    pub fn tile_suffix(&self) -> String {
        self.tile.map_or_else(String::new, |(k, n)| format!(" (tile {}/{n})", k + 1))
    }
}

/// A lowered step: instructions in issue order, each tagged, over a buffer table.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// The instructions, in issue order.
    pub instrs: Vec<Instr>,
    /// `tags[i]` says which node, phase and layer `instrs[i]` belongs to.
    pub tags: Vec<Tag>,
    /// Every buffer the program uses.
    pub buffers: Vec<Buffer>,
    /// `release[i]`: buffers no instruction after `i` reads and the caller does not keep; an
    /// interpreter may free them once `instrs[i]` has run.
    pub release: Vec<Vec<BufId>>,
    /// Buffers the caller reads after the step (never released).
    pub kept: Vec<BufId>,
    /// Buffers the host only watches (gradients and attention logits, whose norms and maxima
    /// the trace records), sorted: released as any other (the machine reuses their words, so
    /// placement is as without them), but the interpreter leaves their values for the host.
    pub observed: Vec<BufId>,
    /// Each buffer's home once placed ([`crate::residency::place`]); empty before.
    pub homes: Vec<Home>,
    /// For each buffer, the earlier buffers whose SRAM words it reuses: its writer waits until
    /// they are no longer read (empty before placement).
    pub reuses: Vec<Vec<BufId>>,
    /// Fixed cycles of a DMA transfer that overlap the previous transfer's data phase
    /// ([`faultline_hw::isa::occupancy`]); 0 before placement.
    pub dma_overhead: u64,
    /// The buffer of each node's value (`None` for nodes outside the program).
    pub(crate) node_buf: Vec<Option<BufId>>,
}

/// For each instruction, the buffers no later instruction touches and that are not `kept`
/// (`None`: an instruction that touches none).
pub(crate) fn releases<'a>(
    instrs: impl IntoIterator<Item = Option<&'a Instr>>,
    buffers: usize,
    kept: &[BufId],
) -> Vec<Vec<BufId>> {
    let mut last = vec![None; buffers];
    let mut count = 0;
    for (i, ins) in instrs.into_iter().enumerate() {
        count = i + 1;
        for buf in ins.into_iter().flat_map(|ins| ins.reads().into_iter().chain(ins.writes())) {
            last[buf.index()] = Some(i);
        }
    }
    let mut release = vec![Vec::new(); count];
    for (buf, l) in last.iter().enumerate() {
        let id = BufId(buf as u32);
        if let (Some(i), false) = (l, kept.contains(&id)) {
            release[*i].push(id);
        }
    }
    release
}

impl Program {
    /// Lowers `nodes` of `g` (in execution order, placeholders included) to a program. The
    /// values of `keep` stay available after the last instruction; every other buffer is
    /// released after its last reader.
    pub fn lower(g: &OpGraph, nodes: &[NodeIndex], keep: &[NodeIndex]) -> Program {
        Program::lower_in(g, nodes, keep, Mode::Train)
    }

    /// [`Program::lower`] in `mode`: [`Mode::Eval`] lowers batch normalisation with the
    /// running statistics ([`Op::BatchNorm`]).
    pub fn lower_in(g: &OpGraph, nodes: &[NodeIndex], keep: &[NodeIndex], mode: Mode) -> Program {
        let mut b = Builder {
            g,
            mode,
            p: Program {
                instrs: Vec::new(),
                tags: Vec::new(),
                buffers: Vec::new(),
                release: Vec::new(),
                kept: Vec::new(),
                observed: Vec::new(),
                homes: Vec::new(),
                reuses: Vec::new(),
                dma_overhead: 0,
                node_buf: vec![None; g.len()],
            },
            node: NodeIndex::new(0),
            temps: 0,
        };
        for &i in nodes {
            b.node(i);
        }
        let mut p = b.p;
        p.kept = keep.iter().filter_map(|&k| p.node_buf[k.index()]).collect();
        p.release = releases(p.instrs.iter().map(Some), p.buffers.len(), &p.kept);
        p
    }

    /// This program placed on `cfg`: every buffer given a home and DRAM accesses staged
    /// through DMA instructions ([`crate::residency::place`]).
    pub fn place(&self, cfg: &HwConfig) -> Result<Program, GraphError> {
        crate::residency::place(self, cfg)
    }

    /// The home of buffer `b`, once placed.
    pub fn home(&self, b: BufId) -> Option<Home> {
        self.homes.get(b.index()).copied()
    }

    /// Whether the host watches buffer `b` ([`Program::observed`]).
    pub fn observes(&self, b: BufId) -> bool {
        self.observed.binary_search(&b).is_ok()
    }

    /// The whole step of `tg` (unplaced): every node (each check's right after the node it
    /// guards, [`TrainGraph::execution_order`]), keeping the loss, the model output, every
    /// parameter's and optimizer-state tensor's next value and every check's residual; and
    /// observes ([`Program::observed`]) every gradient and attention logit tensor.
    pub fn step(tg: &TrainGraph) -> Program {
        let keep: Vec<NodeIndex> = [tg.loss, tg.output]
            .into_iter()
            .chain(tg.params.iter().map(|p| p.next))
            .chain(tg.opt_state.iter().map(|s| s.next))
            .chain(tg.checks().iter().map(|c| c.residual))
            .collect();
        let watched: Vec<NodeIndex> =
            tg.params.iter().map(|p| p.grad).chain(tg.attention_logits.iter().copied()).collect();
        let mut p = Program::lower(&tg.graph, &tg.execution_order(), &keep);
        p.observed = watched.iter().filter_map(|&k| p.node_buf[k.index()]).filter(|b| !p.kept.contains(b)).collect();
        p.observed.sort();
        p.observed.dedup();
        p
    }

    /// The forward pass of `tg` for inference (unplaced, [`Mode::Eval`]): only the nodes the
    /// model output depends on in inference (clamps included), in execution order, keeping the
    /// output.
    pub fn forward(tg: &TrainGraph) -> Program {
        let g = &tg.graph;
        let order = tg.execution_order();
        let mut needed = vec![false; g.len()];
        needed[tg.output.index()] = true;
        for &i in order.iter().rev() {
            if needed[i.index()] {
                let node = g.node(i);
                for k in node.op.reads(Mode::Eval) {
                    needed[node.inputs[k].index()] = true;
                }
            }
        }
        let nodes: Vec<NodeIndex> = order.into_iter().filter(|i| needed[i.index()]).collect();
        Program::lower_in(g, &nodes, &[tg.output], Mode::Eval)
    }

    /// The buffer holding node `i`'s value, if the program computes or binds it.
    pub fn buffer_of(&self, i: NodeIndex) -> Option<BufId> {
        self.node_buf.get(i.index()).copied().flatten()
    }

    /// When each instruction starts, given each one's cycles: the program's timing rule. Each
    /// unit (MXU, VPU, DMA) issues its instructions in program order, one at a time (a DMA
    /// transfer occupies the engine for its data phase only, [`faultline_hw::isa::occupancy`]);
    /// an instruction starts once its unit is free, every buffer it reads is complete (the last
    /// instruction writing it has ended), and every buffer whose SRAM words its outputs reuse
    /// is no longer accessed. Buffers are written once per step (parts of one buffer by several
    /// instructions at most), so there are no other hazards; the units overlap as far as these
    /// dependencies allow.
    pub fn issue_times(&self, cycles: &[u64]) -> Vec<Issue> {
        let mut ready = vec![0u64; self.buffers.len()];
        // When the last instruction so far touching each buffer ends.
        let mut done = vec![0u64; self.buffers.len()];
        let mut free = [0u64; 3];
        let mut issues = Vec::with_capacity(self.instrs.len());
        for (ins, &c) in self.instrs.iter().zip(cycles) {
            let u = ins.unit() as usize;
            let (reads, writes) = (ins.reads(), ins.writes());
            let war = writes.iter().flat_map(|b| self.reuses.get(b.index()).into_iter().flatten());
            let start =
                reads.iter().map(|b| ready[b.index()]).chain(war.map(|b| done[b.index()])).fold(free[u], u64::max);
            let end = start.saturating_add(c);
            issues.push(Issue { start, stall: start - free[u] });
            free[u] = start.saturating_add(self.occupancy(ins, c));
            for b in &writes {
                ready[b.index()] = ready[b.index()].max(end);
            }
            for b in reads.iter().chain(&writes) {
                done[b.index()] = done[b.index()].max(end);
            }
        }
        issues
    }

    /// Cycles instruction `ins`, taking `cycles`, keeps its unit from issuing the next
    /// ([`faultline_hw::isa::occupancy`] with this program's DMA overhead).
    pub fn occupancy(&self, ins: &Instr, cycles: u64) -> u64 {
        isa::occupancy(ins.unit(), cycles, self.dma_overhead)
    }

    /// The step's timeline for instructions that took `cycles` each (as the schedule costs
    /// them or as an execution measured them): their issue times, the step's cycles, each
    /// unit's busy and stall cycles and each phase's busy cycles. The one place these are
    /// counted, for the static schedule and for what a step issued alike.
    pub fn timeline(&self, cycles: &[u64]) -> Timeline {
        let issues = self.issue_times(cycles);
        // Summed per unit and phase index first (no map lookups per instruction).
        let mut units = [UnitCycles::default(); ExecUnit::ALL.len()];
        let mut phases = [0u64; Phase::ALL.len()];
        let mut total = 0;
        for ((ins, tag), (&c, is)) in self.instrs.iter().zip(&self.tags).zip(cycles.iter().zip(&issues)) {
            let busy = self.occupancy(ins, c);
            units[ins.unit() as usize].add(UnitCycles { busy, stall: is.stall });
            phases[tag.phase as usize] += busy;
            total = total.max(is.start.saturating_add(c));
        }
        Timeline {
            issues,
            total,
            units: ExecUnit::ALL.iter().map(|u| (u.name().to_string(), units[*u as usize])).collect(),
            phases: Phase::ALL.iter().map(|&p| (p, phases[p as usize])).collect(),
        }
    }

    /// Each instruction's cycles on `cfg`, from its unit's schedule ([`isa::cycles`]).
    pub fn costs(&self, cfg: &HwConfig) -> Vec<u64> {
        self.instrs.iter().map(|i| isa::cycles(cfg, i)).collect()
    }

    /// The program's cost on `cfg`: each instruction at its unit's schedule, issued by
    /// [`Program::issue_times`].
    pub fn schedule(&self, g: &OpGraph, cfg: &HwConfig) -> StepSchedule {
        let cycles = self.costs(cfg);
        let t = self.timeline(&cycles);
        let mut s = StepSchedule {
            hw: cfg.name.clone(),
            clock_mhz: cfg.clock_mhz,
            instrs: Vec::with_capacity(self.instrs.len()),
            nodes: Vec::new(),
            per_phase: t.phases,
            per_layer: BTreeMap::new(),
            per_layer_phase: BTreeMap::new(),
            per_phase_unit: BTreeMap::new(),
            per_layer_unit: BTreeMap::new(),
            mxu_cycles: t.units[ExecUnit::Mxu.name()].busy,
            vpu_cycles: t.units[ExecUnit::Vpu.name()].busy,
            dma_cycles: t.units[ExecUnit::Dma.name()].busy,
            total_cycles: t.total,
        };
        for (i, (ins, tag)) in self.instrs.iter().zip(&self.tags).enumerate() {
            let (c, Issue { start, stall }) = (cycles[i], t.issues[i]);
            s.instrs.push(InstrCost { start, cycles: c, unit: ins.unit(), stall });
            let busy = self.occupancy(ins, c);
            let cell = UnitCycles { busy, stall };
            s.per_phase_unit.entry(tag.phase).or_default().entry(ins.unit().name().to_string()).or_default().add(cell);
            s.per_layer_unit
                .entry(tag.layer.clone())
                .or_default()
                .entry(ins.unit().name().to_string())
                .or_default()
                .add(cell);
            *s.per_layer.entry(tag.layer.clone()).or_default() += busy;
            *s.per_layer_phase.entry(tag.layer.clone()).or_default().entry(tag.phase).or_default() += busy;
            match s.nodes.last_mut() {
                Some(n) if n.node == tag.node => {
                    n.instructions += 1;
                    n.cycles += busy;
                    n.end = n.end.max(start.saturating_add(c));
                    // A node's unit is where it computes; its DMA transfers only stage data.
                    if n.unit == ExecUnit::Dma {
                        n.unit = ins.unit();
                    }
                }
                _ => {
                    let node = g.node(tag.node);
                    s.nodes.push(NodeCost {
                        node: tag.node,
                        name: node.name.clone(),
                        layer: node.layer.clone(),
                        phase: node.phase,
                        op: node.op.name(),
                        unit: ins.unit(),
                        instructions: 1,
                        start,
                        end: start.saturating_add(c),
                        cycles: busy,
                    })
                }
            }
        }
        s
    }
}

/// Emits a node's instructions.
struct Builder<'g> {
    g: &'g OpGraph,
    /// Training step or inference (batch normalisation's statistics).
    mode: Mode,
    p: Program,
    /// The node being lowered.
    node: NodeIndex,
    /// Intermediates allocated for it so far.
    temps: usize,
}

fn w(b: BufId) -> Operand {
    Operand::whole(b)
}

/// The row width [`Builder::col_sum`] packs narrow columns into: one 128-lane vector (the
/// lowering is the same on every machine; a 1024-lane unit reads such a row in one vector too).
const PACKED_COLS: usize = 128;

/// `b`'s `len` words repeated over the rows: a per-column vector broadcast.
fn cycle(b: BufId, len: usize) -> Operand {
    Operand::view(b, View::Cycle { len })
}

fn per_row(b: BufId, cols: usize) -> Operand {
    Operand::view(b, View::PerRow { cols })
}

/// A pooling window's kernel offsets and its pooled output's elements (`pooled` its shape).
fn pool_sizes(window: &Window, pooled: &[usize]) -> (usize, usize) {
    (window.kh * window.kw, pooled.iter().product())
}

fn image4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_A: f64 = 0.044715;

impl Builder<'_> {
    fn buffer(&mut self, name: String, len: usize, role: Role) -> BufId {
        let id = BufId(self.p.buffers.len() as u32);
        self.p.buffers.push(Buffer { name, len, role, node: self.node });
        id
    }

    /// A new intermediate of `len` words for the current node.
    fn temp(&mut self, len: usize) -> BufId {
        self.temps += 1;
        let name = format!("{}#{}", self.g.node(self.node).name, self.temps);
        self.buffer(name, len, Role::Temp)
    }

    fn emit(&mut self, ins: Instr) {
        let node = self.g.node(self.node);
        self.p.instrs.push(ins);
        self.p.tags.push(Tag { node: self.node, phase: node.phase, layer: node.layer.clone(), tile: None });
    }

    /// `op` on `n` elements of `ins`, into a new intermediate.
    fn vpu(&mut self, op: VpuOp, ins: Vec<Operand>, n: usize) -> BufId {
        let mut instr = Instr::Vpu { op, n, ins, outs: vec![], acc: false };
        let out = self.temp(instr.out_len());
        if let Instr::Vpu { outs, .. } = &mut instr {
            outs.push(Dest::whole(out));
        }
        self.emit(instr);
        out
    }

    fn bin(&mut self, op: VpuOp, a: Operand, b: Operand, n: usize) -> BufId {
        self.vpu(op, vec![a, b], n)
    }
    fn add(&mut self, a: BufId, b: BufId, n: usize) -> BufId {
        self.bin(VpuOp::Add, w(a), w(b), n)
    }
    fn sub(&mut self, a: BufId, b: BufId, n: usize) -> BufId {
        self.bin(VpuOp::Sub, w(a), w(b), n)
    }
    fn mul(&mut self, a: BufId, b: BufId, n: usize) -> BufId {
        self.bin(VpuOp::Mul, w(a), w(b), n)
    }
    fn un(&mut self, op: VpuOp, a: BufId, n: usize) -> BufId {
        self.vpu(op, vec![w(a)], n)
    }
    fn muls(&mut self, a: BufId, s: f64, n: usize) -> BufId {
        self.un(VpuOp::MulScalar(s as f32), a, n)
    }
    fn adds(&mut self, a: BufId, s: f64, n: usize) -> BufId {
        self.un(VpuOp::AddScalar(s as f32), a, n)
    }
    /// Adam's step direction `(m * c1) / (sqrt(v * c2) + eps)`, `c = 1 / (1 - beta^t)` from the
    /// step counter `t`: the part Adam and AdamW share.
    fn adam_direction(
        &mut self,
        m: BufId,
        v: BufId,
        t: BufId,
        (beta1, beta2, eps): (f64, f64, f64),
        n: usize,
    ) -> BufId {
        let one = |b: BufId| Operand::view(b, View::Cycle { len: 1 });
        let c1 = self.un(VpuOp::BiasCorrection { beta: beta1 }, t, 1);
        let mh = self.bin(VpuOp::Mul, w(m), one(c1), n);
        let c2 = self.un(VpuOp::BiasCorrection { beta: beta2 }, t, 1);
        let vh = self.bin(VpuOp::Mul, w(v), one(c2), n);
        let rs = self.un(VpuOp::Rsqrt, vh, n);
        let sq = self.un(VpuOp::Recip, rs, n);
        let den = self.adds(sq, eps, n);
        let rd = self.un(VpuOp::Recip, den, n);
        self.mul(mh, rd, n)
    }
    fn row_sum(&mut self, x: BufId, cols: usize, n: usize) -> BufId {
        self.un(VpuOp::ReduceSum { cols, axis: Axis::Row }, x, n)
    }
    fn row_max(&mut self, x: BufId, cols: usize, n: usize) -> BufId {
        self.un(VpuOp::ReduceMax { cols, axis: Axis::Row }, x, n)
    }
    /// `x - s` with `s` one scalar per row of `c`.
    fn sub_rows(&mut self, x: BufId, s: BufId, c: usize, n: usize) -> BufId {
        self.bin(VpuOp::Sub, w(x), per_row(s, c), n)
    }
    /// `x * s` with `s` one scalar per row of `c`.
    fn mul_rows(&mut self, x: BufId, s: BufId, c: usize, n: usize) -> BufId {
        self.bin(VpuOp::Mul, w(x), per_row(s, c), n)
    }

    /// The column sums of each of `blocks` consecutive blocks of `rows` rows of `cols` columns
    /// of `x` (`[blocks, cols]`): one column reduction per block.
    fn block_col_sums(&mut self, x: BufId, blocks: usize, rows: usize, cols: usize) -> BufId {
        let s = self.temp(blocks * cols);
        for b in 0..blocks {
            self.emit(Instr::Vpu {
                op: VpuOp::ReduceSum { cols, axis: Axis::Col },
                n: rows * cols,
                ins: vec![Operand { buf: x, offset: b * rows * cols, view: View::Whole }],
                outs: vec![Dest { buf: s, offset: b * cols }],
                acc: false,
            });
        }
        s
    }

    /// `max |x|` over `n` elements, one word: `max(x, -x)` then a reduction (NaN propagates).
    fn max_abs(&mut self, x: BufId, n: usize) -> BufId {
        let neg = self.un(VpuOp::Neg, x, n);
        let abs = self.bin(VpuOp::Max, w(x), w(neg), n);
        self.un(VpuOp::ReduceMax { cols: n, axis: Axis::Row }, abs, n)
    }

    /// `1 - 2 / (exp(2u) + 1)`: saturates to ±1 without overflow trouble.
    fn tanh(&mut self, u: BufId, n: usize) -> BufId {
        let u2 = self.muls(u, 2.0, n);
        let e = self.un(VpuOp::Exp, u2, n);
        let e1 = self.adds(e, 1.0, n);
        let r = self.un(VpuOp::Recip, e1, n);
        let m = self.muls(r, -2.0, n);
        self.adds(m, 1.0, n)
    }

    fn softmax(&mut self, x: BufId, c: usize, n: usize) -> BufId {
        let m = self.row_max(x, c, n);
        let s = self.sub_rows(x, m, c, n);
        let e = self.un(VpuOp::Exp, s, n);
        let se = self.row_sum(e, c, n);
        let r = self.un(VpuOp::Recip, se, n / c);
        self.mul_rows(e, r, c, n)
    }

    /// `1 / (1 + exp(-x))`: saturates to 0 (`exp` overflows to inf) and 1 without NaN.
    fn sigmoid(&mut self, x: BufId, n: usize) -> BufId {
        let nx = self.un(VpuOp::Neg, x, n);
        let e = self.un(VpuOp::Exp, nx, n);
        let e1 = self.adds(e, 1.0, n);
        self.un(VpuOp::Recip, e1, n)
    }

    /// `1 / sqrt(mean(x^2) + eps)` per row of `d`.
    fn rms_inv(&mut self, x: BufId, d: usize, eps: f64, n: usize) -> BufId {
        let rows = n / d;
        let sq = self.mul(x, x, n);
        let ss = self.row_sum(sq, d, n);
        let ms = self.muls(ss, 1.0 / d as f64, rows);
        self.inv_std(ms, eps, rows)
    }

    /// `(x - mean, 1 / sqrt(var + eps))` per row of `d`.
    fn centre_and_inv_std(&mut self, x: BufId, d: usize, eps: f64, n: usize) -> (BufId, BufId) {
        let rows = n / d;
        let s = self.row_sum(x, d, n);
        let mean = self.muls(s, 1.0 / d as f64, rows);
        let xc = self.sub_rows(x, mean, d, n);
        let sq = self.mul(xc, xc, n);
        let ss = self.row_sum(sq, d, n);
        let var = self.muls(ss, 1.0 / d as f64, rows);
        (xc, self.inv_std(var, eps, rows))
    }

    /// The column sums of `x [rows, c]`. A column reduction issues one vector per row, so
    /// narrow rows leave most lanes idle (16 channels use 16 of 128): `k` rows are first summed
    /// as one row of `k*c` columns (up to 128, `k` dividing `rows`), then the `k` partial sums
    /// of each column.
    fn col_sum(&mut self, x: BufId, rows: usize, c: usize) -> BufId {
        let k = (1..=(PACKED_COLS / c.max(1)).max(1)).rev().find(|k| rows.is_multiple_of(*k)).unwrap_or(1);
        let s = self.un(VpuOp::ReduceSum { cols: k * c, axis: Axis::Col }, x, rows * c);
        if k == 1 {
            return s;
        }
        self.un(VpuOp::ReduceSum { cols: c, axis: Axis::Col }, s, k * c)
    }

    /// `(1 / sqrt(v + eps), (x - m) / sqrt(v + eps))` for the columns of `x [R, C]` (`xs`) and
    /// per-column statistics `m`, `v`.
    fn batch_normalize(&mut self, x: BufId, m: BufId, v: BufId, eps: f64, xs: &[usize]) -> (BufId, BufId) {
        let (c, n) = (xs[1], xs[0] * xs[1]);
        let xc = self.bin(VpuOp::Sub, w(x), cycle(m, c), n);
        let inv = self.inv_std(v, eps, c);
        (inv, self.bin(VpuOp::Mul, w(xc), cycle(inv, c), n))
    }

    /// `1 / sqrt(v + eps)` for `c` variances (or mean squares).
    fn inv_std(&mut self, v: BufId, eps: f64, c: usize) -> BufId {
        let ve = self.adds(v, eps, c);
        self.un(VpuOp::Rsqrt, ve, c)
    }

    /// `(x^2, sqrt(2/pi) * (x + 0.044715 x^3))` for GELU and its derivative.
    fn gelu_arg(&mut self, x: BufId, n: usize) -> (BufId, BufId) {
        let x2 = self.mul(x, x, n);
        let x3 = self.mul(x2, x, n);
        let ax3 = self.muls(x3, GELU_A, n);
        let inner = self.add(x, ax3, n);
        (x2, self.muls(inner, GELU_C, n))
    }

    /// Lowers node `i` and records its value's buffer.
    fn node(&mut self, i: NodeIndex) {
        let g = self.g;
        let node = g.node(i);
        self.node = i;
        self.temps = 0;
        let role = match node.op {
            Op::Input => Some(Role::Input),
            Op::Label => Some(Role::Label),
            Op::Step => Some(Role::Step),
            Op::LearningRate => Some(Role::LearningRate),
            Op::Param => Some(Role::Param),
            Op::OptState => Some(Role::OptState),
            Op::Const { .. } => Some(Role::Const),
            _ => None,
        };
        let numel: usize = node.shape.iter().product();
        if let Some(role) = role {
            let b = self.buffer(node.name.clone(), numel, role);
            self.p.node_buf[i.index()] = Some(b);
            return;
        }
        // An input the op does not read in this mode (batch statistics in inference) need not
        // be lowered; its stand-in is never read.
        let reads = node.op.reads(self.mode);
        let input = |k: usize| match self.p.node_buf[node.inputs[k].index()] {
            Some(b) => b,
            None if !reads.contains(&k) => BufId(u32::MAX),
            None => panic!("inputs are lowered before their consumers"),
        };
        let shape = |k: usize| g.node(node.inputs[k]).shape.as_slice();
        let ins: Vec<BufId> = (0..node.inputs.len()).map(input).collect();
        let (x, y) = (ins.first().copied(), ins.get(1).copied());
        let xs = node.inputs.first().map(|_| shape(0)).unwrap_or(&[]);
        let nx: usize = xs.iter().product();
        let last = *xs.last().unwrap_or(&1);
        let (x, y) = (x.unwrap_or(BufId(0)), y.unwrap_or(BufId(0)));
        let out = match &node.op {
            Op::Input | Op::Label | Op::Step | Op::LearningRate | Op::Param | Op::OptState | Op::Const { .. } => {
                unreachable!("placeholders return above")
            }
            Op::Reshape { .. } => x,
            Op::OneHot => {
                let c = shape(1)[0];
                let (ids, classes) = (Operand::view(x, View::PerRow { cols: c }), cycle(y, c));
                self.bin(VpuOp::Compare(Cmp::Eq), ids, classes, nx * c)
            }
            Op::SwapAxes => {
                let r = xs.len();
                let view = View::Transpose { a: xs[r - 3], b: xs[r - 2], c: xs[r - 1] };
                self.vpu(VpuOp::Copy, vec![Operand::view(x, view)], nx)
            }
            Op::MatMul { trans_a, trans_b } => self.matmul(x, shape(0), y, shape(1), *trans_a, *trans_b, &node.shape),
            Op::Im2Col { window } => self.vpu(
                VpuOp::Copy,
                vec![Operand::view(x, View::Im2Col { window: *window, image: image4(xs) })],
                numel,
            ),
            Op::Col2Im { window, image } => self.col2im(x, *window, image4(image)),
            Op::BiasAdd => {
                self.bin(VpuOp::Add, w(x), Operand::view(y, View::Cycle { len: shape(1).iter().product() }), nx)
            }
            Op::RowScale => {
                self.bin(VpuOp::Mul, w(x), Operand::view(y, View::Cycle { len: shape(1).iter().product() }), nx)
            }
            Op::Add => self.add(x, y, nx),
            Op::Mul => self.mul(x, y, nx),
            Op::Scale { factor } => self.muls(x, *factor, nx),
            Op::SumToShape { shape } => {
                self.un(VpuOp::ReduceSum { cols: shape.iter().product(), axis: Axis::Col }, x, nx)
            }
            Op::Relu => self.un(VpuOp::Relu, x, nx),
            Op::ReluGrad => self.bin(VpuOp::ReluGrad, w(x), w(y), nx),
            Op::Gelu => {
                let (_, u) = self.gelu_arg(x, nx);
                let t = self.tanh(u, nx);
                let t1 = self.adds(t, 1.0, nx);
                let hx = self.muls(x, 0.5, nx);
                self.mul(hx, t1, nx)
            }
            Op::GeluGrad => {
                // dy * (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2))
                let (x2, u) = self.gelu_arg(x, nx);
                let t = self.tanh(u, nx);
                let t1 = self.adds(t, 1.0, nx);
                let left = self.muls(t1, 0.5, nx);
                let tt = self.mul(t, t, nx);
                let ntt = self.muls(tt, -1.0, nx);
                let sech2 = self.adds(ntt, 1.0, nx);
                let p = self.muls(x2, 3.0 * GELU_A, nx);
                let p1 = self.adds(p, 1.0, nx);
                let hx = self.muls(x, 0.5 * GELU_C, nx);
                let r1 = self.mul(sech2, p1, nx);
                let right = self.mul(hx, r1, nx);
                let d = self.add(left, right, nx);
                self.mul(y, d, nx)
            }
            Op::Silu => {
                let s = self.sigmoid(x, nx);
                self.mul(x, s, nx)
            }
            Op::SiluGrad => {
                // dy * s * (1 + x (1 - s))
                let s = self.sigmoid(x, nx);
                let ns = self.muls(s, -1.0, nx);
                let oms = self.adds(ns, 1.0, nx);
                let xo = self.mul(x, oms, nx);
                let t = self.adds(xo, 1.0, nx);
                let st = self.mul(s, t, nx);
                self.mul(y, st, nx)
            }
            Op::RmsNorm { eps } => {
                let r = self.rms_inv(x, last, *eps, nx);
                self.mul_rows(x, r, last, nx)
            }
            Op::RmsNormGrad { eps } => {
                let d = last;
                let r = self.rms_inv(x, d, *eps, nx);
                let yn = self.mul_rows(x, r, d, nx);
                let dyy = self.mul(y, yn, nx);
                let sdyy = self.row_sum(dyy, d, nx);
                let mdyy = self.muls(sdyy, 1.0 / d as f64, nx / d);
                let b = self.mul_rows(yn, mdyy, d, nx);
                let t = self.sub(y, b, nx);
                self.mul_rows(t, r, d, nx)
            }
            Op::Softmax => self.softmax(x, last, nx),
            Op::SoftmaxGrad => {
                let p = self.mul(y, x, nx);
                let s = self.row_sum(p, last, nx);
                let d = self.sub_rows(y, s, last, nx);
                self.mul(x, d, nx)
            }
            Op::LayerNorm { eps } => {
                let (xc, inv) = self.centre_and_inv_std(x, last, *eps, nx);
                self.mul_rows(xc, inv, last, nx)
            }
            Op::LayerNormGrad { eps } => {
                let d = last;
                let rows = nx / d;
                let (xc, inv) = self.centre_and_inv_std(x, d, *eps, nx);
                let yn = self.mul_rows(xc, inv, d, nx);
                let sdy = self.row_sum(y, d, nx);
                let mdy = self.muls(sdy, 1.0 / d as f64, rows);
                let dyy = self.mul(y, yn, nx);
                let sdyy = self.row_sum(dyy, d, nx);
                let mdyy = self.muls(sdyy, 1.0 / d as f64, rows);
                let a = self.sub_rows(y, mdy, d, nx);
                let b = self.mul_rows(yn, mdyy, d, nx);
                let t = self.sub(a, b, nx);
                self.mul_rows(t, inv, d, nx)
            }
            Op::MeanPool => {
                let (n, t, d) = (xs[0], xs[1], xs[2]);
                let s = self.block_col_sums(x, n, t, d);
                self.muls(s, 1.0 / t as f64, n * d)
            }
            Op::MeanPoolGrad { len } => {
                let v = self.muls(x, 1.0 / *len as f64, nx);
                self.vpu(VpuOp::Copy, vec![Operand::view(v, View::RepeatRows { d: xs[1], t: *len })], numel)
            }
            Op::MaxPool { window } => {
                let (taps, n) = pool_sizes(window, &node.shape);
                let tap = |t: usize| Operand::view(x, View::Im2ColTap { window: *window, image: image4(xs), tap: t });
                self.fold(VpuOp::Max, taps, n, tap)
            }
            Op::MaxPoolGrad { window } => {
                // Offset by offset: the elements equal to the window's max take what `dy` the
                // earlier offsets left (`rem`), and leave none of it to later ones.
                let (taps, n) = pool_sizes(window, shape(1));
                let image = image4(xs);
                let mut rem = ins[2];
                let mut parts = Vec::with_capacity(taps);
                for t in 0..taps {
                    let tap = Operand::view(x, View::Im2ColTap { window: *window, image, tap: t });
                    let eq = self.bin(VpuOp::Compare(Cmp::Eq), tap.clone(), w(y), n);
                    parts.push(self.bin(VpuOp::ReluGrad, w(eq), w(rem), n));
                    if t + 1 < taps {
                        let ne = self.bin(VpuOp::Compare(Cmp::Ne), tap, w(y), n);
                        rem = self.bin(VpuOp::ReluGrad, w(ne), w(rem), n);
                    }
                }
                self.tap_sum(*window, image, |t| parts[t])
            }
            Op::AvgPool { window } => {
                let (taps, n) = pool_sizes(window, &node.shape);
                let tap = |t: usize| Operand::view(x, View::Im2ColTap { window: *window, image: image4(xs), tap: t });
                let sum = self.fold(VpuOp::Add, taps, n, tap);
                self.muls(sum, 1.0 / taps as f64, n)
            }
            Op::AvgPoolGrad { window, image } => {
                let (taps, n) = pool_sizes(window, xs);
                let s = self.muls(x, 1.0 / taps as f64, n);
                self.tap_sum(*window, image4(image), |_| s)
            }
            Op::BatchMean => {
                let (rows, c) = (xs[0], xs[1]);
                let s = self.col_sum(x, rows, c);
                self.muls(s, 1.0 / rows as f64, c)
            }
            Op::BatchVar => {
                let (rows, c) = (xs[0], xs[1]);
                let xc = self.bin(VpuOp::Sub, w(x), cycle(y, c), nx);
                let sq = self.mul(xc, xc, nx);
                let s = self.col_sum(sq, rows, c);
                self.muls(s, 1.0 / rows as f64, c)
            }
            Op::BatchNorm { eps } => {
                // (x - m) * (gamma / sqrt(v + eps)) + beta
                let (m, v) = match self.mode {
                    Mode::Train => (ins[1], ins[2]),
                    Mode::Eval => (ins[3], ins[4]),
                };
                let c = xs[1];
                let inv = self.inv_std(v, *eps, c);
                let scale = self.mul(ins[5], inv, c);
                let xc = self.bin(VpuOp::Sub, w(x), cycle(m, c), nx);
                let s = self.bin(VpuOp::Mul, w(xc), cycle(scale, c), nx);
                self.bin(VpuOp::Add, w(s), cycle(ins[6], c), nx)
            }
            Op::BatchNormGrad { eps } => {
                // (dy - dbeta / R - y * dgamma / R) * (gamma / sqrt(var + eps))
                let (rows, c) = (xs[0], xs[1]);
                let (gamma, dy, dgamma, dbeta) = (ins[3], ins[4], ins[5], ins[6]);
                let (inv, yn) = self.batch_normalize(x, y, ins[2], *eps, xs);
                let mdb = self.muls(dbeta, 1.0 / rows as f64, c);
                let mdg = self.muls(dgamma, 1.0 / rows as f64, c);
                let a = self.bin(VpuOp::Sub, w(dy), cycle(mdb, c), nx);
                let b = self.bin(VpuOp::Mul, w(yn), cycle(mdg, c), nx);
                let t = self.sub(a, b, nx);
                let scale = self.mul(gamma, inv, c);
                self.bin(VpuOp::Mul, w(t), cycle(scale, c), nx)
            }
            Op::BatchNormGammaGrad { eps } => {
                let (_, yn) = self.batch_normalize(x, y, ins[2], *eps, xs);
                let p = self.mul(ins[3], yn, nx);
                self.col_sum(p, xs[0], xs[1])
            }
            Op::ColSum => self.col_sum(x, xs[0], xs[1]),
            Op::SoftmaxCrossEntropy => {
                // -(1/N) sum y * (z - max - ln(sum exp(z - max)))
                let (z, c) = (x, last);
                let rows = nx / c;
                let m = self.row_max(z, c, nx);
                let s = self.sub_rows(z, m, c, nx);
                let e = self.un(VpuOp::Exp, s, nx);
                let se = self.row_sum(e, c, nx);
                let lse = self.un(VpuOp::Ln, se, rows);
                let logp = self.sub_rows(s, lse, c, nx);
                let t = self.mul(y, logp, nx);
                let total = self.row_sum(t, nx, nx);
                self.muls(total, -1.0 / rows as f64, 1)
            }
            Op::SoftmaxCrossEntropyGrad => {
                let p = self.softmax(x, last, nx);
                let sy = self.row_sum(y, last, nx);
                let t = self.mul_rows(p, sy, last, nx);
                let d = self.sub(t, y, nx);
                self.muls(d, 1.0 / (nx / last) as f64, nx)
            }
            Op::Mse => {
                let d = self.sub(x, y, nx);
                let sq = self.mul(d, d, nx);
                let s = self.row_sum(sq, nx, nx);
                self.muls(s, 1.0 / nx as f64, 1)
            }
            Op::MseGrad => {
                let d = self.sub(x, y, nx);
                self.muls(d, 2.0 / nx as f64, nx)
            }
            Op::SgdUpdate { lr } => self.bin(VpuOp::Sgd { lr: *lr as f32 }, w(x), w(y), nx),
            Op::MomentumVelocity { momentum } => {
                let mv = self.muls(x, *momentum, nx);
                self.add(mv, y, nx)
            }
            Op::AdamMoment { beta } => {
                let a = self.muls(x, *beta, nx);
                let b = self.muls(y, 1.0 - beta, nx);
                self.add(a, b, nx)
            }
            Op::AdamSecondMoment { beta } => {
                let a = self.muls(x, *beta, nx);
                let gg = self.mul(y, y, nx);
                let b = self.muls(gg, 1.0 - beta, nx);
                self.add(a, b, nx)
            }
            Op::AdamUpdate { lr, beta1, beta2, eps } => {
                // p - lr * (m * c1) / (sqrt(v * c2) + eps), c = 1 / (1 - beta^t)
                let q = self.adam_direction(y, ins[2], ins[3], (*beta1, *beta2, *eps), nx);
                let step = self.muls(q, *lr, nx);
                self.sub(x, step, nx)
            }
            Op::AdamWUpdate { beta1, beta2, eps, weight_decay } => {
                // p (1 - lr wd) - lr * (m * c1) / (sqrt(v * c2) + eps), lr read from memory.
                let lr = ins[4];
                let one = |b: BufId| Operand::view(b, View::Cycle { len: 1 });
                let q = self.adam_direction(y, ins[2], ins[3], (*beta1, *beta2, *eps), nx);
                let step = self.bin(VpuOp::Mul, w(q), one(lr), nx);
                let decayed = if *weight_decay == 0.0 {
                    x
                } else {
                    let d = self.muls(lr, -*weight_decay, 1);
                    let keep = self.adds(d, 1.0, 1);
                    self.bin(VpuOp::Mul, w(x), one(keep), nx)
                };
                self.sub(decayed, step, nx)
            }
            Op::ScaleBy => self.bin(VpuOp::Mul, w(x), Operand::view(y, View::Cycle { len: 1 }), nx),
            Op::SumSquares => {
                let sq = self.mul(x, x, nx);
                self.row_sum(sq, nx, nx)
            }
            Op::SumSquaredDiff => {
                let d = self.sub(x, y, nx);
                let sq = self.mul(d, d, nx);
                self.row_sum(sq, nx, nx)
            }
            Op::ClipCoef { max_norm } => {
                // min(1, max_norm / (sqrt(s) + eps)); sqrt as 1 / rsqrt, as Adam's; the factor
                // is positive, so clamping to [-1, 1] caps it at 1.
                let rs = self.un(VpuOp::Rsqrt, x, 1);
                let norm = self.un(VpuOp::Recip, rs, 1);
                let den = self.adds(norm, crate::reference::CLIP_EPS, 1);
                let r = self.un(VpuOp::Recip, den, 1);
                let c = self.muls(r, *max_norm, 1);
                self.un(VpuOp::Clamp(1.0), c, 1)
            }
            Op::TileSum { tile, rows: false } => self.un(VpuOp::ReduceSum { cols: *tile, axis: Axis::Row }, x, nx),
            Op::TileSum { tile, rows: true } => self.block_col_sums(x, xs[0] / tile, *tile, xs[1]),
            Op::MaxAbs => self.max_abs(x, nx),
            Op::Clamp { bound } => self.un(VpuOp::Clamp(*bound), x, nx),
            Op::MaxAbsDiff => {
                let d = self.sub(x, y, nx);
                self.max_abs(d, nx)
            }
        };
        // The node's value is its last intermediate (a reshape's is its input's): name it.
        let buf = &mut self.p.buffers[out.index()];
        if buf.node == i && buf.role == Role::Temp {
            buf.name = node.name.clone();
            buf.role = Role::Value;
        }
        self.p.node_buf[i.index()] = Some(out);
    }

    /// `op(A) * op(B)`: one GEMM, or one per batch element for rank 3.
    #[allow(clippy::too_many_arguments)]
    fn matmul(&mut self, a: BufId, sa: &[usize], b: BufId, sb: &[usize], ta: bool, tb: bool, out: &[usize]) -> BufId {
        let r = sa.len();
        let groups = if r == 3 { sa[0] } else { 1 };
        let (ar, ac, br, bc) = (sa[r - 2], sa[r - 1], sb[r - 2], sb[r - 1]);
        let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
        let n = if tb { br } else { bc };
        let c = self.temp(out.iter().product());
        for gi in 0..groups {
            self.emit(Instr::Gemm {
                a: MatOperand { buf: a, offset: gi * ar * ac, transposed: ta },
                b: MatOperand { buf: b, offset: gi * br * bc, transposed: tb },
                out: Dest { buf: c, offset: gi * m * n },
                m,
                k,
                n,
                acc: false,
            });
        }
        c
    }

    /// `part(0) op part(1) op ...` over `parts` operands of `n` elements, left to right (a copy
    /// of `part(0)` if it is the only one): kernel offsets summed or maxed in offset order.
    fn fold(&mut self, op: VpuOp, parts: usize, n: usize, part: impl Fn(usize) -> Operand) -> BufId {
        if parts == 1 {
            return self.vpu(VpuOp::Copy, vec![part(0)], n);
        }
        let mut acc = self.bin(op, part(0), part(1), n);
        for t in 2..parts {
            acc = self.bin(op, w(acc), part(t), n);
        }
        acc
    }

    /// The image-shaped sum over kernel offsets `t` of `part(t)`, a buffer of offset `t`'s
    /// entries per window (`[N*OH*OW, C]`, [`View::TapToImage`]).
    fn tap_sum(&mut self, window: Window, image: [usize; 4], part: impl Fn(usize) -> BufId) -> BufId {
        let tap = |t: usize| Operand::view(part(t), View::TapToImage { window, image, tap: t });
        self.fold(VpuOp::Add, window.kh * window.kw, image.iter().product(), tap)
    }

    /// col2im: the image-shaped contributions of each kernel offset, summed in offset order.
    fn col2im(&mut self, cols: BufId, window: Window, image: [usize; 4]) -> BufId {
        let tap = |t: usize| Operand::view(cols, View::Col2ImTap { window, image, tap: t });
        self.fold(VpuOp::Add, window.kh * window.kw, image.iter().product(), tap)
    }
}

/// Cost of one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InstrCost {
    /// First cycle (step-relative).
    pub start: u64,
    /// Cycles.
    pub cycles: u64,
    /// The unit it occupies.
    pub unit: ExecUnit,
    /// Cycles its unit sat idle before it, waiting for an input (0 if the unit went straight
    /// from its previous instruction to this one).
    pub stall: u64,
}

/// When an instruction starts, and how long its unit waited for its inputs before that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issue {
    /// First cycle.
    pub start: u64,
    /// Cycles the unit was free but the instruction's inputs were not ready.
    pub stall: u64,
}

/// A step's timeline ([`Program::timeline`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// When each instruction starts, and its stall.
    pub issues: Vec<Issue>,
    /// The step's cycles: the last instruction's end.
    pub total: u64,
    /// Busy and stall cycles per unit (`mxu`, `vpu`; both present).
    pub units: BTreeMap<String, UnitCycles>,
    /// Busy cycles (MXU + VPU) per phase (every phase present).
    pub phases: BTreeMap<Phase, u64>,
}

/// A unit's cycles in some part of a step: running instructions, and waiting for data with an
/// instruction next in line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct UnitCycles {
    /// Cycles running instructions.
    pub busy: u64,
    /// Cycles stalled: free, with its next instruction waiting for an input.
    pub stall: u64,
}

impl UnitCycles {
    fn add(&mut self, o: UnitCycles) {
        self.busy = self.busy.saturating_add(o.busy);
        self.stall = self.stall.saturating_add(o.stall);
    }
}

/// Cost of one node: the instructions it lowered to, which issue consecutively.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeCost {
    /// The node.
    #[serde(skip)]
    pub node: NodeIndex,
    /// Node name.
    pub name: String,
    /// Layer.
    pub layer: String,
    /// Phase.
    pub phase: Phase,
    /// Op name.
    pub op: &'static str,
    /// The unit of its instructions.
    pub unit: ExecUnit,
    /// Instructions.
    pub instructions: usize,
    /// First cycle (step-relative).
    pub start: u64,
    /// One past its last instruction's last cycle.
    pub end: u64,
    /// Busy cycles of its instructions.
    pub cycles: u64,
}

/// Timing of one training step: the schedule of its program's instructions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepSchedule {
    /// Hardware config name.
    pub hw: String,
    /// Clock in MHz (for [`StepSchedule::seconds`]).
    pub clock_mhz: f64,
    /// Every instruction, in issue order.
    pub instrs: Vec<InstrCost>,
    /// Every node that issues instructions, in execution order.
    pub nodes: Vec<NodeCost>,
    /// Busy cycles (MXU + VPU) per phase.
    pub per_phase: BTreeMap<Phase, u64>,
    /// Busy cycles per layer.
    pub per_layer: BTreeMap<String, u64>,
    /// Busy cycles per layer and phase (layers with no work in a phase are absent).
    pub per_layer_phase: BTreeMap<String, BTreeMap<Phase, u64>>,
    /// Busy and stall cycles per phase and unit (a stall is counted where the waiting
    /// instruction belongs).
    pub per_phase_unit: BTreeMap<Phase, BTreeMap<String, UnitCycles>>,
    /// Busy and stall cycles per layer and unit.
    pub per_layer_unit: BTreeMap<String, BTreeMap<String, UnitCycles>>,
    /// Cycles the MXU is busy.
    pub mxu_cycles: u64,
    /// Cycles the VPU is busy.
    pub vpu_cycles: u64,
    /// Cycles DMA transfers take, issue to last word (transfers overlap each other's fixed
    /// overhead, so the engine is occupied for less).
    pub dma_cycles: u64,
    /// Cycles of the whole step: the last instruction's end (the units overlap, so this is at
    /// most the sum of the busy cycles).
    pub total_cycles: u64,
}

/// The schedule of `tg`'s whole step program, placed on `cfg`.
pub fn schedule(tg: &TrainGraph, cfg: &HwConfig) -> Result<StepSchedule, GraphError> {
    Ok(Program::step(tg).place(cfg)?.schedule(&tg.graph, cfg))
}

impl StepSchedule {
    /// Wall time of the step at the configured clock.
    pub fn seconds(&self) -> f64 {
        self.total_cycles as f64 / (self.clock_mhz * 1e6)
    }

    /// The instruction `unit` runs at step cycle `cycle` and the cycle within it; `None` while
    /// the unit is idle or past the step's end.
    pub fn locate(&self, unit: ExecUnit, cycle: u64) -> Option<(usize, u64)> {
        self.instrs
            .iter()
            .position(|c| c.unit == unit && c.start <= cycle && cycle - c.start < c.cycles)
            .map(|i| (i, cycle - self.instrs[i].start))
    }

    /// One CSV row per node: `name,layer,phase,op,unit,instructions,start,end,cycles`, quoted
    /// where a field needs it (layer names come from the model file and may hold commas).
    pub fn to_csv(&self) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        let head = ["name", "layer", "phase", "op", "unit", "instructions", "start", "end", "cycles"].map(String::from);
        let rows = self.nodes.iter().map(|n| {
            [
                n.name.clone(),
                n.layer.clone(),
                n.phase.to_string(),
                n.op.to_string(),
                n.unit.name().to_string(),
                n.instructions.to_string(),
                n.start.to_string(),
                n.end.to_string(),
                n.cycles.to_string(),
            ]
        });
        for r in std::iter::once(head).chain(rows) {
            // Writing to memory has no I/O to fail, and every record has the header's width.
            w.write_record(&r).expect("a CSV record written to memory");
        }
        let bytes = w.into_inner().expect("a CSV writer on memory flushes");
        String::from_utf8(bytes).expect("CSV of UTF-8 fields is UTF-8")
    }
}

impl fmt::Display for StepSchedule {
    /// A summary: per-phase and per-layer cycles and the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |c: u64| if self.total_cycles == 0 { 0.0 } else { 100.0 * c as f64 / self.total_cycles as f64 };
        writeln!(f, "step schedule on {} ({} MHz)", self.hw, self.clock_mhz)?;
        writeln!(f, "{:<12} {:>12} {:>7}", "phase", "cycles", "share")?;
        for (p, &c) in &self.per_phase {
            writeln!(f, "{:<12} {:>12} {:>6.1}%", p.name(), c, pct(c))?;
        }
        writeln!(
            f,
            "{:<12} {:>12} {:>7} {:>10} {:>10} {:>10}",
            "layer", "cycles", "share", "forward", "backward", "update"
        )?;
        for (l, &c) in &self.per_layer {
            let ph = |p: Phase| self.per_layer_phase.get(l).and_then(|m| m.get(&p)).copied().unwrap_or(0);
            writeln!(
                f,
                "{:<12} {:>12} {:>6.1}% {:>10} {:>10} {:>10}",
                l,
                c,
                pct(c),
                ph(Phase::Forward),
                ph(Phase::Backward),
                ph(Phase::Update)
            )?;
        }
        writeln!(f, "mxu {} cycles, vpu {} cycles", self.mxu_cycles, self.vpu_cycles)?;
        write!(f, "total {} cycles = {:.3} us", self.total_cycles, self.seconds() * 1e6)
    }
}
