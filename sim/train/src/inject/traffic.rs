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
//! * a DMA transfer word by word at [`faultline_hw::isa::dma_word_cycle`], each word's source
//!   and destination address from the DMA's address registers
//!   ([`faultline_hw::memory::dma::AddrReg`], which a DMA fault strikes): the word moves the
//!   value it reads, wherever that comes from and lands;
//! * the host writes the step's inputs before the step and reads what it keeps after it.
//!
//! All of it goes to one [`Memory`] per unit in time order (within a cycle, a fold's read of
//! the partial sum it adds to, then writes, then reads, as [`faultline_hw::memory`] defines),
//! with the fault injected into the array (or its DMA register). Every other write stores a tag
//! of its buffer element, so a read that returns anything but what its element last held saw
//! the fault, or, with no fault, a word reused while it was still live (a residency error). A
//! DMA word that lands elsewhere than its destination element, or reads elsewhere than its
//! source element, changes what that transfer leaves in its destination: a *written* change.

use crate::error::{Result, TrainError};
use crate::inject::gemm_fold::element;
use crate::inject::memory::WbufSlots;
use faultline_graph::program::{Program, StepSchedule};
use faultline_hw::fault::{ActiveFault, DMA_ADDR_BITS};
use faultline_hw::isa::{self, BufId, Instr};
use faultline_hw::memory::dma::AddrReg;
use faultline_hw::memory::Memory;
use faultline_hw::mxu::Schedule;
use faultline_hw::{HwConfig, Register, Unit};
use std::collections::{BTreeMap, HashMap};

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
    /// The reads that returned something other than what their element last held, in time
    /// order.
    pub changed: Vec<Read>,
    /// The destination elements a misdirected DMA word left changed (`part` `None`): the
    /// element it should have written (holding its old value, or the value of the wrong
    /// source word) and any element of its destination buffer it wrote instead.
    pub written: Vec<Read>,
}

/// Within a cycle: a fold's read of the partial sum it adds to, then writes, then reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    AddRead,
    Write,
    Read,
}

/// One access to one memory word, in time order (`id`: the order it was listed in, so that
/// accesses of one cycle and kind keep an order that does not depend on their addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    cycle: u64,
    kind: Kind,
    id: usize,
    mem: Unit,
    addr: u64,
    read: Read,
    /// A DMA word's read: where it moves the value.
    dma: Option<DmaWord>,
}

/// Where a DMA word's value goes: `addr` in `mem`, meant for element `dst` at `intended`; and
/// the address its source element lives at (`addr` of the access may be another under a
/// source-register fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct DmaWord {
    mem: Unit,
    addr: u64,
    intended: u64,
    dst: Read,
    src_addr: u64,
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
        self.raw(cycle, kind, h.mem, h.base + elem as u64, Read { instr, buf, elem, part }, None);
    }

    fn raw(&mut self, cycle: u64, kind: Kind, mem: Unit, addr: u64, read: Read, dma: Option<DmaWord>) {
        let id = self.v.len();
        self.v.push(Access { cycle, kind, id, mem, addr, read, dma });
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
        let a_elem = |mm: usize, kk: usize| element(&a, mm, kk, m, k);
        let b_elem = |kk: usize, nn: usize| element(&b, kk, nn, k, n);
        let wbuf = WbufSlots::new(self.hw, &s);
        for (c, f) in s.folds.iter().enumerate() {
            let (t0, part) = (start + f.start, Some(c));
            for (mm, kk) in (f.m0..f.m0 + f.mr).flat_map(|mm| (f.k0..f.k0 + f.kr).map(move |kk| (mm, kk))) {
                if let Some(t) = s.a_read(c, mm, kk) {
                    self.push(t0 + t, Kind::Read, Some(g), a.buf, a_elem(mm, kk), part);
                }
            }
            // The tile: each weight from its SRAM into its slot, then into the array.
            let (loaded, slot) = (start + wbuf.written(&s, c), wbuf.base(c));
            for (kk, nn) in (f.k0..f.k0 + f.kr).flat_map(|kk| (f.n0..f.n0 + f.nc).map(move |nn| (kk, nn))) {
                let (Some(word), Some(t)) = (s.weight_word(c, kk, nn), s.w_read(c, kk, nn)) else { continue };
                self.push(loaded, Kind::Read, Some(g), b.buf, b_elem(kk, nn), part);
                let read = Read { instr: Some(g), buf: b.buf, elem: b_elem(kk, nn), part };
                let addr = slot + word as u64;
                self.raw(loaded, Kind::Write, Unit::Wbuf, addr, read, None);
                self.raw(t0 + t, Kind::Read, Unit::Wbuf, addr, read, None);
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

    /// DMA transfer `i`, its addresses from the DMA's registers with `faults` (those on
    /// `dma.src_addr` and `dma.dst_addr`).
    fn dma(&mut self, i: usize, faults: &[ActiveFault]) {
        let ins = &self.p.instrs[i];
        let Instr::Dma { src, src_offset, dst, dst_offset, len, .. } = *ins else { return };
        let (hs, hd) = (self.p.homes[src.index()], self.p.homes[dst.index()]);
        let (start, load) = (self.sched.instrs[i].start, self.sched.instrs[i].start + self.p.dma_overhead);
        let on = |r: Register| faults.iter().copied().filter(|f| f.event.site.register == r).collect::<Vec<_>>();
        let (on_src, on_dst) = (on(Register::SrcAddr), on(Register::DstAddr));
        let mut src_reg = AddrReg::new(hs.base + src_offset as u64, DMA_ADDR_BITS, load, &on_src);
        let mut dst_reg = AddrReg::new(hd.base + dst_offset as u64, DMA_ADDR_BITS, load, &on_dst);
        for w in 0..len {
            let t = isa::dma_word_cycle(self.hw, ins, start, w as u64).unwrap_or(0);
            let (from, to) = (src_reg.use_at(t), dst_reg.use_at(t));
            src_reg.advance(1);
            dst_reg.advance(1);
            let dst = Read { instr: Some(i), buf: dst, elem: dst_offset + w, part: None };
            let word = DmaWord { mem: hd.mem, addr: to, intended: hd.base + (dst_offset + w) as u64, dst, src_addr: 0 };
            let read = Read { instr: Some(i), buf: src, elem: src_offset + w, part: None };
            let src_addr = hs.base + (src_offset + w) as u64;
            self.raw(t, Kind::Read, hs.mem, from, read, Some(DmaWord { src_addr, ..word }));
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
/// real memory arrays, with `fault` (a word of `ub`, `acc`, `wbuf` or `dram`, or a DMA address
/// register) injected.
pub fn replay(p: &Program, sched: &StepSchedule, hw: &HwConfig, fault: Option<ActiveFault>) -> Result<Replay> {
    let dma_faults: Vec<ActiveFault> = fault.filter(|f| f.event.site.unit == Unit::Dma).into_iter().collect();
    let mut t = Traffic { p, sched, hw, v: Vec::new() };
    t.host();
    for i in 0..p.instrs.len() {
        match p.instrs[i] {
            Instr::Gemm { .. } => t.gemm(i)?,
            Instr::Vpu { .. } => t.vpu(i),
            Instr::Dma { .. } => t.dma(i, &dma_faults),
        }
    }
    let mut v = t.v;
    v.sort();
    let mut mems = arrays(hw, &v, fault.filter(|f| f.event.site.unit != Unit::Dma))?;
    // What each element last held, by its own writes (a DMA word's value is what it read), per
    // memory: a weight's copy in the weight buffer is apart from the weight in its home.
    let mut held: HashMap<(Unit, BufId, usize), u32> = HashMap::new();
    let mut out = Replay::default();
    for a in v {
        let m = mems.get_mut(&a.mem).expect("every unit touched has an array");
        if a.kind == Kind::Write {
            let value = tag(a.read.buf, a.read.elem, m.word_bits);
            m.write(a.addr, value, a.cycle);
            held.insert((a.mem, a.read.buf, a.read.elem), value);
            continue;
        }
        out.reads += 1;
        let got = m.read(a.addr, a.cycle);
        let own = a.dma.is_none_or(|c| c.src_addr == a.addr);
        if own && held.get(&(a.mem, a.read.buf, a.read.elem)) != Some(&got) {
            out.changed.push(a.read);
        }
        let Some(c) = a.dma else { continue };
        let dst = mems.get_mut(&c.mem).expect("every unit touched has an array");
        dst.write(c.addr, got, a.cycle);
        if own && c.addr == c.intended {
            held.insert((c.mem, c.dst.buf, c.dst.elem), got);
            continue;
        }
        // Misdirected: the destination element holds what its word holds now, and a word of
        // the destination buffer written instead holds the value moved.
        held.insert((c.mem, c.dst.buf, c.dst.elem), dst.peek(c.intended).unwrap_or(0));
        out.written.push(c.dst);
        let home = p.homes[c.dst.buf.index()];
        let len = p.buffers[c.dst.buf.index()].len as u64;
        if c.addr != c.intended && c.addr >= home.base && c.addr - home.base < len {
            let elem = (c.addr - home.base) as usize;
            held.insert((c.mem, c.dst.buf, elem), got);
            out.written.push(Read { elem, ..c.dst });
        }
    }
    Ok(out)
}

/// The machine's arrays for the traffic `v`, with `fault` (a memory word's) injected. DRAM
/// holds what the program homes there, and a second weight-buffer slot may lie past the
/// buffer's end (see `WbufSlots`): an array grows to the words the fault-free traffic and the
/// fault touch. A misdirected DMA word past them reads 0 and writes nothing, as
/// [`faultline_hw::memory`] defines.
fn arrays(hw: &HwConfig, v: &[Access], fault: Option<ActiveFault>) -> Result<BTreeMap<Unit, Memory>> {
    let mut mems: BTreeMap<Unit, Memory> =
        [Memory::unified_buffer(hw), Memory::accumulator(hw), Memory::weight_buffer(hw), Memory::dram(0)]
            .into_iter()
            .map(|m| (m.unit, m))
            .collect();
    let own = v.iter().flat_map(|a| match a.dma {
        Some(c) => vec![(a.mem, c.src_addr), (c.mem, c.intended)],
        None => vec![(a.mem, a.addr)],
    });
    let mut top: BTreeMap<Unit, u64> = BTreeMap::new();
    for (u, addr) in own.chain(fault.map(|f| (f.event.site.unit, f.event.site.instance[0] as u64))) {
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
    Ok(mems)
}
