//! A step's memory traffic replayed through real memory arrays ([`faultline_hw::memory::Memory`]):
//! the executable definition that the calculated fault path ([`crate::inject::memory`]) is
//! checked against (`tests/memory_replay.rs`).
//!
//! The calculated path asks, for one faulted word, which reads see the fault. The replay goes
//! the other way: every instruction of the placed program issues all its reads and writes
//! forward, at the cycles its unit's schedule gives, to the words its buffers' homes name:
//! * a GEMM fold by fold from [`faultline_hw::mxu::access`]: each `A` word the fold reads, each
//!   weight of its tile read from its SRAM and written into its weight-buffer slot when the
//!   tile is loaded, then read from there into the array, each result line written (read
//!   first when the fold adds to earlier K folds);
//! * a VPU instruction through its operands' views ([`faultline_hw::isa::View::gather`]), at
//!   [`faultline_hw::vpu::element_cycle`] (a reduction reads everything when it issues and
//!   writes in its last cycle);
//! * a DMA transfer word by word at [`faultline_hw::isa::dma_word_cycle`];
//! * the host writes the step's inputs before the step and reads what it keeps after it.
//!
//! All of it goes to one [`Memory`] per unit in time order (within a cycle, a fold's read of
//! the partial sum it adds to, then writes, then reads, as [`faultline_hw::memory`] defines),
//! with the fault injected into the array. Every write stores a tag of its buffer element, so
//! a read that returns anything else saw the fault, or, with no fault, a word reused while it
//! was still live (a residency error).

use crate::error::{Result, TrainError};
use crate::inject::memory::{tile_written, wbuf_slots};
use faultline_graph::program::{Program, StepSchedule};
use faultline_hw::fault::ActiveFault;
use faultline_hw::isa::{self, BufId, Instr};
use faultline_hw::memory::Memory;
use faultline_hw::mxu::Schedule;
use faultline_hw::{HwConfig, Unit};
use std::collections::BTreeMap;

/// One read the replay issued: by which instruction (`None`: the host after the step), of
/// which buffer element, and which read of it ([`crate::inject::memory::WordHit::part`]: a
/// GEMM's fold, a VPU operand element `operand * n + element` when the instruction reads the
/// word more than once; `None` when it reads it once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Read {
    /// The reading instruction; `None`: the host, after the step.
    pub instr: Option<usize>,
    /// The buffer.
    pub buf: BufId,
    /// The element.
    pub elem: usize,
    /// Which of the instruction's reads of the word.
    pub part: Option<usize>,
}

/// What a replay saw.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    /// Reads issued.
    pub reads: usize,
    /// The reads that returned something other than what their element last wrote, in time
    /// order.
    pub changed: Vec<Read>,
}

/// Within a cycle: a fold's read of the partial sum it adds to, then writes, then reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    AddRead,
    Write,
    Read,
}

/// One access to one memory word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    cycle: u64,
    kind: Kind,
    mem: Unit,
    addr: u64,
    read: Read,
}

/// The accesses of a placed step program, listed forward instruction by instruction.
struct Traffic<'a> {
    p: &'a Program,
    sched: &'a StepSchedule,
    hw: &'a HwConfig,
    v: Vec<Access>,
}

impl Traffic<'_> {
    /// An access to element `elem` of `buf` in its home.
    fn push(&mut self, cycle: u64, kind: Kind, instr: Option<usize>, buf: BufId, elem: usize, part: Option<usize>) {
        let h = self.p.homes[buf.index()];
        let read = Read { instr, buf, elem, part };
        self.v.push(Access { cycle, kind, mem: h.mem, addr: h.base + elem as u64, read });
    }

    fn host(&mut self) {
        for (b, buf) in self.p.buffers.iter().enumerate() {
            if buf.role.is_placeholder() {
                (0..buf.len).for_each(|x| self.push(0, Kind::Write, None, BufId(b as u32), x, None));
            }
        }
        for &b in &self.p.kept {
            let end = self.sched.total_cycles;
            (0..self.p.buffers[b.index()].len).for_each(|x| self.push(end, Kind::Read, None, b, x, None));
        }
    }

    fn gemm(&mut self, g: usize) -> Result<()> {
        let Instr::Gemm { a, b, out, m, k, n, acc } = self.p.instrs[g] else { return Ok(()) };
        let s = Schedule::new(&self.hw.mxu, m, k, n)?;
        let s = if acc { s.accumulating() } else { s };
        let start = self.sched.instrs[g].start;
        let a_elem = |mm: usize, kk: usize| a.offset + if a.transposed { kk * m + mm } else { mm * k + kk };
        let b_elem = |kk: usize, nn: usize| b.offset + if b.transposed { nn * k + kk } else { kk * n + nn };
        let (slot_words, slots) = wbuf_slots(self.hw, &s);
        for (c, f) in s.folds.iter().enumerate() {
            let (t0, part) = (start + f.start, Some(c));
            for (mm, kk) in (f.m0..f.m0 + f.mr).flat_map(|mm| (f.k0..f.k0 + f.kr).map(move |kk| (mm, kk))) {
                if let Some(t) = s.a_read(c, mm, kk) {
                    self.push(t0 + t, Kind::Read, Some(g), a.buf, a_elem(mm, kk), part);
                }
            }
            // The tile: each weight from its SRAM into its slot, then into the array.
            let loaded = start + tile_written(&s, slots, c);
            let slot = (c as u64 % slots) * slot_words;
            for (kk, nn) in (f.k0..f.k0 + f.kr).flat_map(|kk| (f.n0..f.n0 + f.nc).map(move |nn| (kk, nn))) {
                let (Some(word), Some(t)) = (s.weight_word(c, kk, nn), s.w_read(c, kk, nn)) else { continue };
                self.push(loaded, Kind::Read, Some(g), b.buf, b_elem(kk, nn), part);
                let read = Read { instr: Some(g), buf: b.buf, elem: b_elem(kk, nn), part };
                let addr = slot + word as u64;
                self.v.push(Access { cycle: loaded, kind: Kind::Write, mem: Unit::Wbuf, addr, read });
                self.v.push(Access { cycle: t0 + t, kind: Kind::Read, mem: Unit::Wbuf, addr, read });
            }
            for line in s.result_lines(c) {
                for j in 0..line.len {
                    let (mm, nn) = line.element(j);
                    let e = out.offset + mm * n + nn;
                    if !f.overwrite {
                        self.push(t0 + line.cycle, Kind::AddRead, Some(g), out.buf, e, part);
                    }
                    self.push(t0 + line.cycle, Kind::Write, Some(g), out.buf, e, part);
                }
            }
        }
        Ok(())
    }

    fn vpu(&mut self, i: usize) {
        let ins = &self.p.instrs[i];
        let Instr::Vpu { op, n, ins: operands, outs, acc } = ins else { return };
        let (start, len) = (self.sched.instrs[i].start, ins.out_len());
        let last = start + self.sched.instrs[i].cycles.saturating_sub(1);
        // Each word's readers (operand, element), found forward through the views' gathers.
        let mut readers: BTreeMap<(BufId, usize), Vec<(usize, usize)>> = BTreeMap::new();
        for (k, o) in operands.iter().enumerate() {
            // Word w tagged w + 1: the zeros a view reads no word for stay 0.
            let tags: Vec<u32> = (1..=o.view.span(*n) as u32).collect();
            for (e, &w) in o.view.gather(&tags, *n).iter().enumerate() {
                if w > 0 {
                    readers.entry((o.buf, o.offset + w as usize - 1)).or_default().push((k, e));
                }
            }
        }
        if *acc {
            for d in outs {
                (0..len).for_each(|e| readers.entry((d.buf, d.offset + e)).or_default().push((operands.len(), e)));
            }
        }
        let read_at = |e: usize| faultline_hw::vpu::element_cycle(self.hw, op, e, None).map(|r| start + r);
        for ((buf, x), who) in readers {
            match who.as_slice() {
                [(_, e)] => self.push(read_at(*e).unwrap_or(start), Kind::Read, Some(i), buf, x, None),
                [(_, e), ..] if read_at(*e).is_none() => self.push(start, Kind::Read, Some(i), buf, x, None),
                _ => {
                    for &(k, e) in &who {
                        self.push(read_at(e).unwrap_or(start), Kind::Read, Some(i), buf, x, Some(k * n + e));
                    }
                }
            }
        }
        for (j, d) in outs.iter().enumerate() {
            for e in 0..len {
                let t = faultline_hw::vpu::element_cycle(self.hw, op, e, Some(j)).map_or(last, |w| start + w);
                self.push(t, Kind::Write, Some(i), d.buf, d.offset + e, None);
            }
        }
    }

    fn dma(&mut self, i: usize) {
        let ins = &self.p.instrs[i];
        let Instr::Dma { src, src_offset, dst, dst_offset, len, .. } = *ins else { return };
        for w in 0..len {
            let t = isa::dma_word_cycle(self.hw, ins, self.sched.instrs[i].start, w as u64).unwrap_or(0);
            self.push(t, Kind::Read, Some(i), src, src_offset + w, None);
            self.push(t, Kind::Write, Some(i), dst, dst_offset + w, None);
        }
    }
}

/// The tag a write of element `x` of buffer `b` stores (masked to the word), so that a read
/// of another element's value or of a changed one is told apart.
fn tag(b: BufId, x: usize, bits: u32) -> u32 {
    let v = (b.0.wrapping_add(1)).wrapping_mul(0x9E37_79B1) ^ (x as u32).wrapping_mul(0x85EB_CA77).rotate_left(7);
    if bits >= 32 {
        v
    } else {
        v & ((1 << bits) - 1)
    }
}

/// Replays program `p` with schedule `sched` on `hw` (with the executor's MXU format) through
/// real memory arrays, with `fault` (a word of `ub`, `acc`, `wbuf` or `dram`) injected.
pub fn replay(p: &Program, sched: &StepSchedule, hw: &HwConfig, fault: Option<ActiveFault>) -> Result<Replay> {
    let mut t = Traffic { p, sched, hw, v: Vec::new() };
    t.host();
    for i in 0..p.instrs.len() {
        match p.instrs[i] {
            Instr::Gemm { .. } => t.gemm(i)?,
            Instr::Vpu { .. } => t.vpu(i),
            Instr::Dma { .. } => t.dma(i),
        }
    }
    let mut v = t.v;
    v.sort();
    // The machine's arrays; DRAM holds what the program homes there, and a second
    // weight-buffer slot may lie past the buffer's end (see `wbuf_slots`): each array grows to
    // the words the traffic (and the fault) touch.
    let mut mems: BTreeMap<Unit, Memory> =
        [Memory::unified_buffer(hw), Memory::accumulator(hw), Memory::weight_buffer(hw), Memory::dram(0)]
            .into_iter()
            .map(|m| (m.unit, m))
            .collect();
    let touched =
        v.iter().map(|a| (a.mem, a.addr)).chain(fault.map(|f| (f.event.site.unit, f.event.site.instance[0] as u64)));
    let mut top: BTreeMap<Unit, u64> = BTreeMap::new();
    for (u, addr) in touched {
        top.entry(u).and_modify(|w| *w = (*w).max(addr + 1)).or_insert(addr + 1);
    }
    for (u, words) in top {
        if let Some(m) = mems.get_mut(&u).filter(|m| words > m.words()) {
            *m = Memory::new(u, words, m.word_bits);
        }
    }
    if let Some(f) = fault {
        let u = f.event.site.unit;
        mems.get_mut(&u).ok_or_else(|| TrainError::Config(format!("`{}` is not a memory", u.name())))?.inject(f)?;
    }
    let mut out = Replay::default();
    for a in v {
        let m = mems.get_mut(&a.mem).expect("every unit touched has an array");
        let want = tag(a.read.buf, a.read.elem, m.word_bits);
        match a.kind {
            Kind::Write => m.write(a.addr, want, a.cycle),
            Kind::Read | Kind::AddRead => {
                out.reads += 1;
                if m.read(a.addr, a.cycle) != want {
                    out.changed.push(a.read);
                }
            }
        }
    }
    Ok(out)
}
