//! Cycle-level execution: [`Machine`] moves an op's values through real memory arrays (DRAM,
//! unified buffer, accumulator, weight buffer) in DMA [`Block`]s and runs the MXU folds and VPU
//! chunks on them at the cycles of the op's schedule, faults included (see [`crate::op`]).

use crate::config::{Dataflow, HwConfig};
use crate::error::HwError;
use crate::fault::{addr_bits, Register, Unit, DMA_ADDR_BITS, TILE_COUNTER_BITS};
use crate::fault::{ActiveFault, FaultEvent, FaultSchedule};
use crate::matrix::Matrix;
use crate::memory::dma::{self, AddrReg, Direction, Transfer};
use crate::memory::Memory;
use crate::mxu::{self, Fold, Schedule};
use crate::timing::OpTiming;
use crate::vpu;
use crate::ExecMode;
use faultline_num::{with_precision, MacFormat};

use super::kind::vpu_ops;
use super::plan::Plan;
use super::{gemm_operands, vpu_compute, OpKind};

/// What one DMA transfer moves: a 2-D block of `rows x cols` words.
#[derive(Debug, Clone, Copy)]
struct Block {
    dir: Direction,
    /// On-chip memory (loads: destination; stores: source).
    sram: Unit,
    dram_base: u64,
    dram_stride: u64,
    sram_base: u64,
    sram_stride: u64,
    rows: usize,
    cols: usize,
    /// Bytes per element for the bandwidth model.
    eb: u64,
}

/// The memories and registers of one cycle-level op run.
pub(super) struct Machine<'a> {
    cfg: &'a HwConfig,
    kind: &'a OpKind,
    plan: &'a Plan,
    t: &'a OpTiming,
    dram: Memory,
    ub: Memory,
    acc: Memory,
    wbuf: Memory,
    /// DRAM base address of each input and output.
    in_base: Vec<u64>,
    out_base: Vec<u64>,
    /// With MXU faults: each fold's partial sums from the continuously pipelined array
    /// ([`mxu::fold_psums`]), which the folds take instead of running the array themselves.
    psums: Option<Vec<Matrix>>,
    vpu_faults: Vec<Vec<FaultEvent>>,
    acc_addr_faults: Vec<ActiveFault>,
    tile_faults: Vec<ActiveFault>,
    src_faults: Vec<ActiveFault>,
    dst_faults: Vec<ActiveFault>,
    /// Step the MXU/VPU only for tiles with a fault in them.
    pub(super) hybrid: bool,
}

impl<'a> Machine<'a> {
    pub(super) fn new(
        cfg: &'a HwConfig,
        kind: &'a OpKind,
        inputs: &[&[u32]],
        plan: &'a Plan,
        t: &'a OpTiming,
        faults: &FaultSchedule,
    ) -> Result<Machine<'a>, HwError> {
        let mut base = 0u64;
        let mut in_base = Vec::new();
        for x in inputs {
            in_base.push(base);
            base += x.len() as u64;
        }
        let mut out_base = Vec::new();
        for l in kind.output_lens() {
            out_base.push(base);
            base += l as u64;
        }
        // Only the op's footprint is materialised; DRAM words outside it hold nothing the op
        // reads (a read through a faulty address there returns 0), so faults there are dead.
        let dram_words = base;
        let mut m = Machine {
            cfg,
            kind,
            plan,
            t,
            dram: Memory::dram(dram_words),
            ub: Memory::unified_buffer(cfg),
            acc: Memory::accumulator(cfg),
            wbuf: Memory::weight_buffer(cfg),
            in_base,
            out_base,
            psums: None,
            vpu_faults: vec![vec![]; plan.count],
            acc_addr_faults: vec![],
            tile_faults: vec![],
            src_faults: vec![],
            dst_faults: vec![],
            hybrid: false,
        };
        for (x, &b) in inputs.iter().zip(&m.in_base) {
            m.dram.poke_slice(b, x);
        }
        for e in &faults.events {
            let tile = e.at.tile;
            let active = e.activate(t.tiles[tile].origin);
            match (e.site.unit, e.site.register) {
                // Run below, as one pipelined GEMM.
                (Unit::Mxu, _) => {}
                (Unit::Vpu, _) => m.vpu_faults[tile].push(*e),
                (Unit::Ub, _) => m.ub.inject(active)?,
                (Unit::Acc, _) => m.acc.inject(active)?,
                (Unit::Wbuf, _) => m.wbuf.inject(active)?,
                (Unit::Dram, _) if (e.site.instance[0] as u64) < m.dram.words() => m.dram.inject(active)?,
                (Unit::Dram, _) => {}
                (Unit::Seq, Register::AccAddr) => m.acc_addr_faults.push(active),
                (Unit::Seq, _) => m.tile_faults.push(active),
                (Unit::Dma, Register::SrcAddr) => m.src_faults.push(active),
                (Unit::Dma, _) => m.dst_faults.push(active),
            }
        }
        // MXU faults: the array runs the op's folds as one continuously pipelined GEMM (fault
        // times from each fold's start, as `gemm` and training count them), fed the operands
        // the memories hold; a fault after the array's last cycle is dead.
        let mxu: Vec<FaultEvent> = faults.events.iter().filter(|e| e.site.unit == Unit::Mxu).copied().collect();
        if let (Some(s), false) = (&plan.sched, mxu.is_empty()) {
            if mxu.len() != faults.events.len() {
                return Err(HwError::BadSite {
                    site: mxu[0].site.to_string(),
                    why: "an op run takes MXU register faults or faults elsewhere, not both".into(),
                });
            }
            let live = mxu.into_iter().filter(|e| s.folds[e.at.tile].start.saturating_add(e.at.cycle) < s.total_cycles);
            let (a, w) = gemm_operands(kind, inputs).expect("an op with MXU faults is a GEMM");
            let events = FaultSchedule { events: live.collect() };
            m.psums = Some(mxu::fold_psums(cfg, &a, &w, ExecMode::CycleLevel, &events)?);
        }
        Ok(m)
    }

    pub(super) fn outputs(&self) -> Vec<Vec<u32>> {
        self.kind
            .output_lens()
            .iter()
            .zip(&self.out_base)
            .map(|(&l, &b)| (0..l as u64).map(|i| self.dram.peek(b + i).unwrap_or(0)).collect())
            .collect()
    }

    fn sram(&mut self, u: Unit) -> &mut Memory {
        match u {
            Unit::Acc => &mut self.acc,
            Unit::Wbuf => &mut self.wbuf,
            _ => &mut self.ub,
        }
    }

    fn sram_cfg(&self, u: Unit) -> &crate::config::SramConfig {
        self.cfg.memory.sram(u).unwrap_or(&self.cfg.memory.unified_buffer)
    }

    /// Moves a block word by word through the DMA address registers.
    fn transfer(&mut self, tr: &Transfer, b: &Block) {
        let bw = dma::bandwidth(self.cfg, self.sram_cfg(b.sram), b.dir);
        let dram_addr = |i: usize| b.dram_base + (i / b.cols) as u64 * b.dram_stride + (i % b.cols) as u64;
        let sram_addr = |i: usize| b.sram_base + (i / b.cols) as u64 * b.sram_stride + (i % b.cols) as u64;
        let (src_g, dst_g): (&dyn Fn(usize) -> u64, &dyn Fn(usize) -> u64) = match b.dir {
            Direction::Load => (&dram_addr, &sram_addr),
            Direction::Store => (&sram_addr, &dram_addr),
        };
        let n = b.rows * b.cols;
        let src_faults = std::mem::take(&mut self.src_faults);
        let dst_faults = std::mem::take(&mut self.dst_faults);
        // The registers belong to the transfer in its data phase (requests are pipelined), which
        // starts when word 0 moves.
        let load = dma::word_cycle(self.cfg, tr.start, 0, b.eb, bw);
        let mut src = AddrReg::new(src_g(0), DMA_ADDR_BITS, load, &src_faults);
        let mut dst = AddrReg::new(dst_g(0), DMA_ADDR_BITS, load, &dst_faults);
        for i in 0..n {
            let t = dma::word_cycle(self.cfg, tr.start, i as u64, b.eb, bw);
            let (s, d) = (src.use_at(t), dst.use_at(t));
            match b.dir {
                Direction::Load => {
                    let v = self.dram.read(s, t);
                    self.sram(b.sram).write(d, v, t);
                }
                Direction::Store => {
                    let v = self.sram(b.sram).read(s, t);
                    self.dram.write(d, v, t);
                }
            }
            if i + 1 < n {
                src.advance(src_g(i + 1) as i64 - src_g(i) as i64);
                dst.advance(dst_g(i + 1) as i64 - dst_g(i) as i64);
            }
        }
        self.src_faults = src_faults;
        self.dst_faults = dst_faults;
    }

    fn gemm_block(&self, tr: &Transfer) -> Block {
        let s = self.plan.sched.as_ref().expect("gemm plan");
        let (m, k, n) = (s.m, s.k, s.n);
        let c = self.cfg.mxu.cols;
        let eb = self.cfg.mxu.input_format.bits() as u64 / 8;
        let fold = &s.folds[tr.tile];
        match tr.dir {
            Direction::Load if tr.tile == 0 && tr.part == 0 => {
                let len = self.kind.input_lens()[0];
                Block {
                    dir: tr.dir,
                    sram: Unit::Ub,
                    dram_base: 0,
                    dram_stride: len as u64,
                    sram_base: 0,
                    sram_stride: len as u64,
                    rows: 1,
                    cols: len,
                    eb,
                }
            }
            Direction::Load => {
                let slot = (tr.tile % self.plan.buffers) as u64 * self.plan.slot_words;
                let (k0, rows, stride) = match self.cfg.mxu.dataflow {
                    Dataflow::WeightStationary => (fold.k0, fold.kr, c),
                    Dataflow::OutputStationary => (0, k, c),
                    // All N columns of the fold's rows of W, `N` words apart.
                    Dataflow::InputStationary => (fold.k0, fold.kr, n),
                };
                Block {
                    dir: tr.dir,
                    sram: Unit::Wbuf,
                    dram_base: self.in_base[1] + (k0 * n + fold.n0) as u64,
                    dram_stride: n as u64,
                    sram_base: slot,
                    sram_stride: stride as u64,
                    rows,
                    cols: fold.nc,
                    eb,
                }
            }
            Direction::Store => {
                let (m0, rows) = match self.cfg.mxu.dataflow {
                    Dataflow::WeightStationary => (0, m),
                    Dataflow::OutputStationary | Dataflow::InputStationary => (fold.m0, fold.mr),
                };
                let off = (m0 * n + fold.n0) as u64;
                Block {
                    dir: tr.dir,
                    sram: Unit::Acc,
                    dram_base: self.out_base[0] + off,
                    dram_stride: n as u64,
                    sram_base: off,
                    sram_stride: n as u64,
                    rows,
                    cols: fold.nc,
                    eb: 4,
                }
            }
        }
    }

    pub(super) fn run_gemm(&mut self) -> Result<(), HwError> {
        let prec = self.cfg.mxu.precision();
        with_precision!(prec, F => self.run_gemm_typed::<F>())
    }

    fn run_gemm_typed<F: MacFormat>(&mut self) -> Result<(), HwError> {
        let s = self.plan.sched.clone().expect("gemm plan");
        self.run_schedule(Machine::gemm_block, |m, q, c| {
            let cs = m.t.tiles[q].compute_start;
            m.fold::<F>(&s, c, cs)
        })
    }

    /// Runs the op's schedule in time order: DMA transfers (each moving the [`Block`] that
    /// `block` names for it) and tile slots. At each slot the sequencer's tile counter
    /// (`seq.tile`, faults included) names the tile that `compute(machine, slot, tile)` runs;
    /// a counter value past the last tile ends the loop.
    fn run_schedule(
        &mut self,
        block: impl Fn(&Self, &Transfer) -> Block,
        mut compute: impl FnMut(&mut Self, usize, usize) -> Result<(), HwError>,
    ) -> Result<(), HwError> {
        // Actions in time order: transfers (DMA order) and tile slots; ties: transfers first.
        let mut actions: Vec<(u64, usize, usize)> = Vec::with_capacity(self.t.transfers.len() + self.t.tiles.len());
        actions.extend(self.t.transfers.iter().enumerate().map(|(i, tr)| (tr.start, 0, i)));
        actions.extend(self.t.tiles.iter().enumerate().map(|(q, tt)| (tt.compute_start, 1, q)));
        actions.sort();
        let tile_faults = std::mem::take(&mut self.tile_faults);
        let mut counter = AddrReg::new(0, TILE_COUNTER_BITS, 0, &tile_faults);
        let mut halted = false;
        for (_, kind, i) in actions {
            if kind == 0 {
                let tr = self.t.transfers[i];
                let b = block(self, &tr);
                self.transfer(&tr, &b);
                continue;
            }
            let c = counter.use_at(self.t.tiles[i].compute_start) as usize;
            counter.advance(1);
            if halted || c >= self.plan.count {
                halted = true;
                continue;
            }
            compute(self, i, c)?;
        }
        self.tile_faults = tile_faults;
        Ok(())
    }

    /// Executes fold `c` of the schedule in a fold slot starting at cycle `cs`: its operands
    /// read from the SRAMs at the cycles the array takes them, its partial sums (those of
    /// [`Machine::psums`] when the array has faults) added into the accumulators.
    fn fold<F: MacFormat>(&mut self, s: &Schedule, c: usize, cs: u64) -> Result<(), HwError> {
        let fold: Fold = s.folds[c];
        let cfg = self.cfg;
        let (k, n) = (s.k, s.n);
        let mask = cfg.mxu.input_format.mask();
        let slot = (c % self.plan.buffers) as u64 * self.plan.slot_words;
        let conv = match self.kind {
            OpKind::Conv2d(cv) => Some(*cv),
            _ => None,
        };
        let ub = &self.ub;
        let a_at = |mi: usize, ki: usize, t: u64| -> u32 {
            let addr = match conv {
                Some(cv) => cv.im2col_index(mi, ki).map(|e| e as u64),
                None => Some((mi * k + ki) as u64),
            };
            addr.map_or(0, |a| ub.read(a, t) & mask)
        };
        let ps = match &self.psums {
            Some(p) => p[c].clone(),
            None => {
                // The fold's operands as the array reads them, each at its cycle
                // ([`mxu::access`]): `A[m0..m0+mr][k0..k0+kr]` and `W[k0..k0+kr][n0..n0+nc]`.
                let sk = s.skew(c);
                let a = Matrix::from_fn(fold.mr, fold.kr, |i, j| {
                    a_at(fold.m0 + i, fold.k0 + j, cs + sk.a + (i + j) as u64)
                });
                let w = Matrix::from_fn(fold.kr, fold.nc, |i, j| {
                    self.wbuf.read(slot + (i * sk.row + j) as u64, cs + sk.w + (i + j) as u64) & mask
                });
                mxu::gemm(cfg, &a, &w, ExecMode::Functional, &FaultSchedule::none())?.out
            }
        };
        // Accumulator writes, in time order, at the addresses seq.acc_addr gives each line.
        let (psum_m, psum_n) = (fold.m0, fold.n0);
        let bits = addr_bits(cfg.memory.accumulator.words());
        for (l, t, base) in s.line_addresses(c, cs, 0, bits, &self.acc_addr_faults) {
            let stride = l.stride(n) as u64;
            // The line's partial sums: a row of `ps`, or (IS) a column.
            let (pm, pn) = (l.m - psum_m, l.n - psum_n);
            for j in 0..l.len {
                let addr = base + j as u64 * stride;
                let p = if l.down { ps.get(pm + j, pn) } else { ps.get(pm, pn + j) };
                let v = if fold.overwrite { p } else { F::add(self.acc.read(addr, t), p) };
                self.acc.write(addr, v, t);
            }
        }
        Ok(())
    }

    pub(super) fn run_vpu(&mut self) -> Result<(), HwError> {
        let lens = self.kind.input_lens();
        let (ni, no) = (lens.len(), self.kind.output_lens().len());
        let unit = match *self.kind {
            OpKind::Softmax { cols, .. } => cols,
            _ => 1,
        };
        let chunk_elems = self.plan.chunk * unit;
        let total = lens[0];
        let elems_of = |f: usize| chunk_elems.min(total - f * chunk_elems);
        let buffers = self.plan.buffers;
        let slot_base = |f: usize| (f % buffers) as u64 * ((ni + no) * chunk_elems) as u64;
        let block = |m: &Machine, tr: &Transfer| -> Block {
            let f = tr.tile;
            let len = elems_of(f);
            let (dram, sram) = match tr.dir {
                Direction::Load => (m.in_base[tr.part], slot_base(f) + (tr.part * chunk_elems) as u64),
                Direction::Store => (m.out_base[tr.part], slot_base(f) + ((ni + tr.part) * chunk_elems) as u64),
            };
            Block {
                dir: tr.dir,
                sram: Unit::Ub,
                dram_base: dram + (f * chunk_elems) as u64,
                dram_stride: len as u64,
                sram_base: sram,
                sram_stride: len as u64,
                rows: 1,
                cols: len,
                eb: 4,
            }
        };
        self.run_schedule(block, |m, q, c| {
            let tt = m.t.tiles[q];
            let len = elems_of(c);
            let base = slot_base(c);
            let cs = tt.compute_start;
            // Single-instruction ops read each vector's operands at its issue and write each
            // result at its write-back; softmax reads at the chunk start, writes at the end.
            let times = match m.kind {
                OpKind::Softmax { .. } => None,
                k => vpu::element_cycles(m.cfg, &vpu_ops(k, 1)[0], len),
            };
            let ins: Vec<Vec<u32>> = (0..ni)
                .map(|p| {
                    (0..len)
                        .map(|e| {
                            let t = times.as_ref().map_or(cs, |(r, _)| cs + r[e]);
                            m.ub.read(base + (p * chunk_elems + e) as u64, t)
                        })
                        .collect()
                })
                .collect();
            let refs: Vec<&[u32]> = ins.iter().map(|v| v.as_slice()).collect();
            let faults = std::mem::take(&mut m.vpu_faults[q]);
            let mode = if m.hybrid && faults.is_empty() { ExecMode::Functional } else { ExecMode::CycleLevel };
            let outs = vpu_compute(m.cfg, m.kind, &refs, mode, &faults)?;
            let end = tt.ready.saturating_sub(1).max(cs);
            for (o, vals) in outs.iter().enumerate() {
                for (e, &v) in vals.iter().enumerate() {
                    let t = times.as_ref().map_or(end, |(_, w)| cs + w[o][e]);
                    m.ub.write(base + ((ni + o) * chunk_elems + e) as u64, v, t);
                }
            }
            Ok(())
        })
    }
}
