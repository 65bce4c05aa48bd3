//! Faults in the memories (unified buffer, accumulators, weight buffer, DRAM) and the DMA
//! engine's address registers during a training step.
//!
//! Every buffer of the placed step program has a home ([`faultline_graph::residency`]), so a
//! memory word names, at any cycle, the element of the buffer living there. When each word is
//! written and read comes from the step's schedule:
//! * an elementwise VPU instruction reads element `e`'s operands when its vector issues and
//!   writes each result at its write-back ([`faultline_hw::vpu::element_cycle`]); a word several
//!   elements read (a broadcast operand) is read once per element, and a fault between those
//!   reads changes only the later elements; a reduction reads when it issues and writes in
//!   its last cycle;
//! * a GEMM reads and writes fold by fold ([`crate::inject::gemm_fold`]): an activation word once per
//!   fold that uses it, a weight word when its tile is written into the weight buffer, a result
//!   word once per K fold (reading the partial sum first to add to it); a fault that only
//!   later folds see changes only what they compute;
//! * a DMA transfer reads and writes word `i` at [`faultline_hw::isa::dma_word_cycle`];
//! * the batch, parameters and optimizer state are in DRAM before the step, and the host
//!   reads the values it keeps (loss, output, next parameters and optimizer state) from DRAM
//!   after the step's last cycle;
//! * a GEMM's weight operand passes through the weight buffer fold by fold: fold `f`'s tile is
//!   written into slot `f mod slots` (the slot's size and each weight's word in it are
//!   [`faultline_hw::mxu::access`]'s: WS `R x C` words, `W[k0+i][n0+j]` at `i * C + j`) when
//!   fold `f - 1` starts (fold 0's when the GEMM issues) or, if later, once the slot's previous
//!   tile has been read ([`WbufSlots::written`]), and each weight is read into the array at its
//!   cycle of the fold (WS: `i + j` cycles after fold `f` starts, the skewed weight load).
//!
//! As in [`faultline_hw::memory`], within a cycle writes come first, then reads, then faults: a
//! read sees a fault that acted in `[its word's last write, the read)`. A fault on a word no
//! buffer occupies then, or that is rewritten before it is read, is masked. These rules are
//! calculated here for one word; [`crate::inject::traffic`] runs the step's whole traffic
//! through real arrays, and a proptest holds the two equal.
//!
//! A DMA address-register fault changes `dma.src_addr` or `dma.dst_addr` of the transfer in
//! its data phase at that cycle, and through the address generator's increments every later
//! word of that transfer: words are read from (or written to) the wrong address, whatever
//! buffer lives there then (a word no buffer has written reads as 0), and the intended
//! destination words keep their previous contents. A stuck-at does so in every transfer whose
//! data phase it overlaps: each reloads the register, and the stuck bit is forced again.

use crate::error::{Result, TrainError};
use crate::inject::gemm_fold::{self, GemmMap};
use faultline_graph::program::{Program, StepSchedule};
use faultline_graph::touch::Touch;
use faultline_hw::fault::ActiveFault;
use faultline_hw::fault::DMA_ADDR_BITS;
use faultline_hw::isa::{self, BufId, ExecUnit, Instr};
use faultline_hw::memory::dma::AddrReg;
use faultline_hw::mxu::Schedule;
use faultline_hw::{HwConfig, Register, Unit};
use faultline_num::NumFormat;
use std::collections::BTreeMap;

/// Where a word's new value comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WordSource {
    /// The fault's bit operation on the word's value.
    Fault(ActiveFault),
    /// The value of another buffer's word (0 if that buffer holds nothing yet).
    Copy(BufId, usize),
    /// A fixed raw value.
    Bits(u32),
}

/// One word an instruction sees changed: while instruction `instr` runs (or, for `None`, when
/// the host reads the step's results), element `elem` of `buf` holds what `source` gives; `part`
/// names the one read of it that sees the change when the instruction reads the word more than
/// once at different cycles.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WordHit {
    /// The instruction that reads the changed word; `None`: the host, after the step.
    pub instr: Option<usize>,
    /// The buffer.
    pub buf: BufId,
    /// The element.
    pub elem: usize,
    /// What the word holds instead.
    pub source: WordSource,
    /// Whether the change stays after the instruction (a DMA writing the wrong value into
    /// its own destination) rather than being seen by that one read only.
    pub written: bool,
    /// The read that sees the change: a GEMM's fold ([`crate::inject::gemm_fold`]) or a VPU
    /// instruction's operand element (`operand * n + element`); `None`: every read by `instr`.
    pub part: Option<usize>,
}

impl WordHit {
    /// `source`'s value seen by every read of element `elem` of `buf` by `instr`.
    pub fn read(instr: Option<usize>, buf: BufId, elem: usize, source: WordSource) -> WordHit {
        WordHit { instr, buf, elem, source, written: false, part: None }
    }
}

/// One access to a word: its cycle, its kind, and by which instruction (`None`: before the
/// step for a write, the host after the step for a read) and part ([`WordHit::part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    cycle: u64,
    /// Within a cycle: a GEMM fold reading a result word to add to it, then writes, then reads.
    kind: Kind,
    instr: Option<usize>,
    part: Option<usize>,
}

/// What an [`Access`] does, in the order accesses of one cycle happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A GEMM fold reading the partial sum it adds to (then writing it in the same cycle).
    AddRead,
    Write,
    Read,
}

impl Access {
    fn reads(&self) -> bool {
        self.kind != Kind::Write
    }
}

/// The program and its timing, for locating words in time.
pub struct StepMap<'a> {
    /// The placed program.
    pub p: &'a Program,
    /// Its schedule.
    pub sched: &'a StepSchedule,
    /// The machine (with the executor's MXU format).
    pub hw: &'a HwConfig,
    /// Each GEMM's fold timing (`None` for other instructions).
    gemms: Vec<Option<GemmMap<'a>>>,
    /// Each instruction's destinations (looked up per word, so listed once).
    dests: Vec<Vec<isa::Dest>>,
    /// Per buffer, every instruction's reads and writes of its words in program order
    /// ([`Program::touches`]): a word's accesses are found among these instead of the whole
    /// program (a DMA-address fault asks for tens of thousands of words).
    touches: Vec<Vec<Touch>>,
    /// Per memory, its buffers' homes sorted by base, and the longest.
    homes: BTreeMap<Unit, (Vec<HomeSpan>, u64)>,
}

/// A buffer's words in its memory: `(base, end, buffer)`.
type HomeSpan = (u64, u64, usize);

impl<'a> StepMap<'a> {
    /// The map of program `p` with schedule `sched` on `hw`.
    pub fn new(p: &'a Program, sched: &'a StepSchedule, hw: &'a HwConfig) -> Result<StepMap<'a>> {
        let gemms =
            p.instrs.iter().zip(&sched.instrs).map(|(i, c)| GemmMap::new(hw, i, c.start)).collect::<Result<_>>()?;
        let dests: Vec<Vec<isa::Dest>> = p.instrs.iter().map(|i| i.dests()).collect();
        let mut homes: BTreeMap<Unit, (Vec<HomeSpan>, u64)> = BTreeMap::new();
        for (b, h) in p.homes.iter().enumerate() {
            let len = p.buffers[b].len as u64;
            let m = homes.entry(h.mem).or_default();
            m.0.push((h.base, h.base + len, b));
            m.1 = m.1.max(len);
        }
        homes.values_mut().for_each(|m| m.0.sort_unstable());
        Ok(StepMap { p, sched, hw, gemms, dests, touches: p.touches(), homes })
    }

    /// The instructions that touch (with `writes`, write) word `x` of `b`, each once, in
    /// program order.
    fn touching(&self, b: BufId, x: usize, writes: bool) -> impl Iterator<Item = usize> + '_ {
        let mut last = None;
        self.touches[b.index()]
            .iter()
            .filter(move |t| (t.write || !writes) && t.words.contains(&x) && last.replace(t.instr) != Some(t.instr))
            .map(|t| t.instr)
    }

    pub(crate) fn start(&self, i: usize) -> u64 {
        self.sched.instrs[i].start
    }

    /// The fold timing of GEMM `i` (`None` for other instructions).
    pub(crate) fn gemm(&self, i: usize) -> Option<&GemmMap<'a>> {
        self.gemms[i].as_ref()
    }

    /// The cycle instruction `i` writes word `x` of its output (counted from its destination's
    /// offset).
    fn write_cycle(&self, i: usize, x: usize) -> u64 {
        let ins = &self.p.instrs[i];
        isa::dma_word_cycle(self.hw, ins, self.start(i), x as u64)
            .unwrap_or_else(|| self.start(i) + self.sched.instrs[i].cycles.saturating_sub(1))
    }

    /// The accesses by instruction `i` writing element `x` of `b` (a GEMM writes a result word
    /// once per K fold, reading it first to add to it after the first).
    fn write_accesses(&self, i: usize, b: BufId, x: usize) -> Vec<Access> {
        let ins = &self.p.instrs[i];
        let len = ins.out_len();
        let Some(d) = self.dests[i].iter().find(|d| d.buf == b && (d.offset..d.offset + len).contains(&x)) else {
            return Vec::new();
        };
        let at = |cycle, kind, part| Access { cycle, kind, instr: Some(i), part };
        if let Some(g) = self.gemm(i) {
            return g
                .writes(x - d.offset)
                .into_iter()
                .flat_map(|(t, c, add)| {
                    add.then(|| at(t, Kind::AddRead, Some(c))).into_iter().chain([at(t, Kind::Write, Some(c))])
                })
                .collect();
        }
        // An elementwise VPU op writes output `j` of element `e` at its write-back cycle.
        let vpu = match ins {
            Instr::Vpu { op, .. } => {
                let j = self.dests[i].iter().position(|e| e == d).unwrap_or(0);
                faultline_hw::vpu::element_cycle(self.hw, op, x - d.offset, Some(j)).map(|w| self.start(i) + w)
            }
            _ => None,
        };
        vec![at(vpu.unwrap_or_else(|| self.write_cycle(i, x - d.offset)), Kind::Write, None)]
    }

    /// The reads of element `x` of `b` by VPU instruction `i`: an elementwise op reads operand
    /// element `e` when its vector issues, a reduction everything when it issues. A word more
    /// than one element reads (a broadcast operand) is read once per element, each its own
    /// part (`operand * n + element`).
    fn vpu_reads(&self, i: usize, b: BufId, x: usize) -> Vec<(u64, Option<usize>)> {
        let instr = &self.p.instrs[i];
        let Instr::Vpu { op, n, ins, outs, acc } = instr else { return Vec::new() };
        let mut readers: Vec<(usize, usize)> = ins
            .iter()
            .enumerate()
            .filter(|(_, o)| o.buf == b && x >= o.offset)
            .flat_map(|(k, o)| o.view.readers(x - o.offset, *n).into_iter().map(move |e| (k, e)))
            .collect();
        // An accumulating reduction reads its output's words first.
        let len = instr.out_len();
        let own = outs.iter().filter(|d| *acc && d.buf == b && (d.offset..d.offset + len).contains(&x));
        readers.extend(own.map(|d| (ins.len(), x - d.offset)));
        let start = self.start(i);
        let read = |e: usize| faultline_hw::vpu::element_cycle(self.hw, op, e, None).map(|r| start + r);
        match readers.as_slice() {
            [] => Vec::new(),
            [(_, e)] => vec![(read(*e).unwrap_or(start), None)],
            // A reduction reads everything when it issues (no element has its own cycle).
            [(_, e), ..] if read(*e).is_none() => vec![(start, None)],
            _ => readers.iter().map(|&(k, e)| (read(e).unwrap_or(start), Some(k * n + e))).collect(),
        }
    }

    /// The writes of element `x` of `b` by instructions that start by cycle `until`, in
    /// program order (the host's before the step first).
    fn writes(&self, b: BufId, x: usize, until: u64) -> impl Iterator<Item = Access> + '_ {
        let p = self.p;
        let host = p.buffers[b.index()].role.is_placeholder().then_some(Access {
            cycle: 0,
            kind: Kind::Write,
            instr: None,
            part: None,
        });
        host.into_iter().chain(
            self.touching(b, x, true)
                .filter(move |&i| self.start(i) <= until)
                .flat_map(move |i| self.write_accesses(i, b, x).into_iter().filter(|a| a.kind == Kind::Write)),
        )
    }

    /// Every access to element `x` of `b` in time order.
    fn accesses(&self, b: BufId, x: usize) -> Vec<Access> {
        let p = self.p;
        let mut v: Vec<Access> = self.writes(b, x, u64::MAX).collect();
        for i in self.touching(b, x, false) {
            let ins = &p.instrs[i];
            if self.dests[i].iter().any(|d| d.buf == b) {
                v.extend(self.write_accesses(i, b, x).into_iter().filter(|a| a.kind == Kind::AddRead));
            }
            let read = |cycle, part| Access { cycle, kind: Kind::Read, instr: Some(i), part };
            match (self.gemm(i), ins) {
                (Some(g), _) => v.extend(g.reads(b, x).into_iter().map(|(t, c)| read(t, Some(c)))),
                (None, &Instr::Dma { src, src_offset, len, .. })
                    if src == b && (src_offset..src_offset + len).contains(&x) =>
                {
                    let word = (x - src_offset) as u64;
                    v.push(read(isa::dma_word_cycle(self.hw, ins, self.start(i), word).unwrap_or(0), None))
                }
                (None, Instr::Vpu { .. }) => v.extend(self.vpu_reads(i, b, x).into_iter().map(|(t, p)| read(t, p))),
                _ => {}
            }
        }
        if p.kept.contains(&b) {
            v.push(Access { cycle: self.sched.total_cycles, kind: Kind::Read, instr: None, part: None });
        }
        v.sort();
        v
    }

    /// Buffers homed in `mem` whose words cover `addr`, with the element there.
    /// In order of base address.
    fn at(&self, mem: Unit, addr: u64) -> impl Iterator<Item = (BufId, usize)> + '_ {
        let homes = self.homes.get(&mem).map_or(&[][..], |(homes, longest)| {
            // Only homes based in (addr - longest, addr] can cover it.
            let lo = homes.partition_point(|h| h.0 + longest <= addr);
            &homes[lo..homes.partition_point(|h| h.0 <= addr)]
        });
        homes.iter().filter(move |h| addr < h.1).map(move |&(base, _, b)| (BufId(b as u32), (addr - base) as usize))
    }

    /// The buffer element `(mem, addr)` holds at cycle `t` (after that cycle's writes): the one
    /// written last at or before `t`, if any.
    pub(crate) fn holder(&self, mem: Unit, addr: u64, t: u64) -> Option<(BufId, usize)> {
        self.at(mem, addr)
            .filter_map(|(b, x)| {
                // Only writes matter here: no read's address pattern needs walking, nor a write
                // by an instruction that starts after `t`.
                let w = self.writes(b, x, t).filter(|a| a.cycle <= t).map(|a| a.cycle).max()?;
                Some((w, b, x))
            })
            .max_by_key(|&(w, b, _)| (w, b))
            .map(|(_, b, x)| (b, x))
    }

    /// The reads of element `x` of `b` that see `op` applied at cycle `t` (a value written into
    /// the word at `t`): those after `t` and before the word's next write.
    pub(crate) fn reads_after(&self, b: BufId, x: usize, t: u64, op: WordSource) -> Vec<WordHit> {
        let mut hits = Vec::new();
        for a in self.accesses(b, x).into_iter().filter(|a| a.cycle > t) {
            if !a.reads() {
                break;
            }
            hits.push(WordHit { part: a.part, ..WordHit::read(a.instr, b, x, op) });
        }
        hits
    }
}

/// The words a memory-word fault (`ub`, `acc`, `dram`) changes: every read of the buffer
/// element living in the word that follows a cycle the fault acts on since that element's
/// last write.
pub fn word_hits(m: &StepMap, f: ActiveFault) -> Vec<WordHit> {
    let (mem, addr) = (f.event.site.unit, f.event.site.instance[0] as u64);
    let mut hits = Vec::new();
    let mut at: Vec<(BufId, usize)> = m.at(mem, addr).collect();
    // In buffer order, as the hits have always been listed.
    at.sort_unstable();
    for (b, x) in at {
        let mut last_write = None;
        for a in m.accesses(b, x) {
            if !a.reads() {
                last_write = Some(a.cycle);
            } else if last_write.is_some_and(|w| f.acts_between(w, a.cycle)) {
                hits.push(WordHit { part: a.part, ..WordHit::read(a.instr, b, x, WordSource::Fault(f)) });
            }
        }
    }
    hits
}

/// The words a weight-buffer fault changes: the weight of the GEMM fold whose tile sits in
/// the faulted word while the fault acts (see the module docs), as that fold reads it.
pub fn wbuf_hits(m: &StepMap, f: ActiveFault) -> Result<Vec<WordHit>> {
    let word = f.event.site.instance[0] as u64;
    let mut hits = Vec::new();
    for (g, ins) in m.p.instrs.iter().enumerate() {
        let (Instr::Gemm { b, k, n, .. }, Some(map)) = (ins, m.gemm(g)) else { continue };
        let (s, start, w) = (&map.s, map.start, map.wbuf);
        let (slot, off) = (word / w.words, (word % w.words) as usize);
        for (fi, fold) in s.folds.iter().enumerate() {
            if fi as u64 % w.slots != slot {
                continue;
            }
            let Some((kk, nn)) = s.weight_at(fi, off) else { continue };
            let written = start + w.written(s, fi);
            let read = start + fold.start + s.w_read(fi, kk, nn).expect("a tile's weights are read");
            if f.acts_between(written, read) {
                let elem = gemm_fold::element(b, kk, nn, *k, *n);
                // Only this fold reads the word in its slot (an OS or IS weight is used by
                // every row tile's fold, each from its own copy of the tile).
                hits.push(WordHit { part: Some(fi), ..WordHit::read(Some(g), b.buf, elem, WordSource::Fault(f)) });
            }
        }
    }
    Ok(hits)
}

/// The weight buffer's tile slots as a GEMM uses them: words per slot
/// ([`faultline_hw::mxu::access`]: WS `R x C`, OS `K x C`, IS `R x N`) and how many slots
/// the buffer holds. At least two: a fold's tile is written while the fold before computes,
/// so the step's schedule double-buffers tiles; where two OS or IS tiles do not fit the
/// buffer, the second slot lies past its last word (a fault can reach only the words that
/// exist). Fold `f`'s tile lives in slot `f mod slots`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WbufSlots {
    /// Words per slot.
    pub words: u64,
    /// Slots.
    pub slots: u64,
}

impl WbufSlots {
    /// The slots of a GEMM with schedule `s` on `hw`.
    pub fn new(hw: &HwConfig, s: &Schedule) -> WbufSlots {
        let words = s.weight_slot_words() as u64;
        WbufSlots { words, slots: (hw.memory.weight_buffer.words() / words).max(2) }
    }

    /// The first word of fold `f`'s slot.
    pub fn base(&self, f: usize) -> u64 {
        (f as u64 % self.slots) * self.words
    }

    /// When fold `f` of `s` writes its tile into its slot, from the GEMM's issue: when the
    /// previous fold starts (fold 0's at issue), or, if that is earlier, the cycle after the
    /// tile in its slot before it (fold `f - slots`'s) was last read. Folds overlap: an IS fold
    /// streams its weights for `N + R - 1` cycles, longer than its period, so with two slots
    /// fold `f`'s tile would otherwise overwrite weights fold `f - 2` still reads.
    pub fn written(&self, s: &Schedule, f: usize) -> u64 {
        let previous = f.checked_sub(1).map_or(0, |p| s.folds[p].start);
        let freed = f.checked_sub(self.slots as usize).map_or(0, |o| s.folds[o].start + s.last_w_read(o) + 1);
        previous.max(freed)
    }
}

/// The words a DMA address-register fault changes (see the module docs): in every transfer
/// whose data phase the fault overlaps (a stuck-at may outlast one transfer: each reloads the
/// register, and the bit is forced again), its destination words after the fault and any word
/// its misdirected writes land in. Returns the transfer to report, the first whose words
/// change (else the first struck), and the hits of all of them in program order (hits on one
/// word apply in turn); `None` when no data phase overlaps the fault.
pub fn dma_hits(m: &StepMap, f: ActiveFault) -> Option<(usize, Vec<WordHit>)> {
    let ovh = m.p.dma_overhead;
    let struck: Vec<usize> = (0..m.p.instrs.len())
        .filter(|&i| {
            let c = &m.sched.instrs[i];
            c.unit == ExecUnit::Dma && f.acts_between(c.start + ovh, c.start + c.cycles)
        })
        .collect();
    let mut hits = Vec::new();
    let mut named = None;
    for &d in &struck {
        let h = transfer_hits(m, d, f);
        if !h.is_empty() {
            named.get_or_insert(d);
        }
        hits.extend(h);
    }
    Some((named.or(struck.first().copied())?, hits))
}

/// [`dma_hits`] of one transfer `d`.
fn transfer_hits(m: &StepMap, d: usize, f: ActiveFault) -> Vec<WordHit> {
    let ovh = m.p.dma_overhead;
    let Instr::Dma { src, src_offset, dst, dst_offset, len, .. } = m.p.instrs[d] else { return Vec::new() };
    let (hs, hd) = (m.p.homes[src.index()], m.p.homes[dst.index()]);
    let src_reg = f.event.site.register == Register::SrcAddr;
    let first = if src_reg { hs.base + src_offset as u64 } else { hd.base + dst_offset as u64 };
    let faults = [f];
    let mut reg = AddrReg::new(first, DMA_ADDR_BITS, m.start(d) + ovh, &faults);
    let mut hits = Vec::new();
    for i in 0..len {
        let t = m.write_cycle(d, i);
        let a = reg.use_at(t);
        reg.advance(1);
        if a == first + i as u64 {
            continue;
        }
        let set = |op| WordHit { written: true, ..WordHit::read(Some(d), dst, dst_offset + i, op) };
        if src_reg {
            // Word i comes from whatever lives at the wrong source address.
            let op = m.holder(hs.mem, a, t).map_or(WordSource::Bits(0), |(b, y)| WordSource::Copy(b, y));
            hits.push(set(op));
            continue;
        }
        // The intended word keeps what it held before; the value lands at `a`.
        let stale = m.holder(hd.mem, first + i as u64, t.saturating_sub(1)).filter(|&(b, _)| b != dst);
        hits.push(set(stale.map_or(WordSource::Bits(0), |(b, y)| WordSource::Copy(b, y))));
        let moved = WordSource::Copy(src, src_offset + i);
        if a >= hd.base && a - hd.base < m.p.buffers[dst.index()].len as u64 {
            let y = (a - hd.base) as usize;
            hits.push(WordHit { written: true, ..WordHit::read(Some(d), dst, y, moved) });
        } else if let Some((b, y)) = m.holder(hd.mem, a, t) {
            hits.extend(m.reads_after(b, y, t, moved));
        }
    }
    hits
}

/// The raw value of `op` applied to `old`, reading copies from `bufs`; a weight-buffer fault
/// acts on the MXU input format's bits (the weight buffer holds converted weights).
pub fn apply(op: WordSource, old: u32, bufs: &[Vec<u32>], format: NumFormat) -> u32 {
    match op {
        WordSource::Fault(f) if f.event.site.unit == Unit::Wbuf => match format {
            NumFormat::Bf16 => {
                let w = faultline_num::f32_to_bf16_bits(f32::from_bits(old));
                f.apply(w) << 16
            }
            _ => f.apply(old),
        },
        WordSource::Fault(f) => f.apply(old),
        WordSource::Copy(b, y) => bufs[b.index()].get(y).copied().unwrap_or(0),
        WordSource::Bits(v) => v,
    }
}

/// The reads `hits` (each with a caller's tag, e.g. its index) change, each read once, with
/// the word's value before and after and the tag of its first hit: hits on the same read
/// (instruction, buffer, element, part, and whether it is written) apply in turn to what the
/// ones before left, so the bits of one upset in one word compose (two flips of one bit
/// cancel). In order of each read's first hit; hits on words `bufs` does not hold are dropped.
pub fn compose<'h>(
    hits: impl IntoIterator<Item = (usize, &'h WordHit)>,
    bufs: &[Vec<u32>],
    format: NumFormat,
) -> Vec<(usize, &'h WordHit, u32, u32)> {
    let mut out: Vec<(usize, &WordHit, u32, u32)> = Vec::new();
    let mut at = std::collections::HashMap::new();
    for (k, h) in hits {
        let key = (h.instr, h.buf, h.elem, h.part, h.written);
        match at.get(&key) {
            Some(&i) => {
                let e: &mut (usize, &WordHit, u32, u32) = &mut out[i];
                e.3 = apply(h.source, e.3, bufs, format);
            }
            None => {
                let Some(&old) = bufs[h.buf.index()].get(h.elem) else { continue };
                at.insert(key, out.len());
                out.push((k, h, old, apply(h.source, old, bufs, format)));
            }
        }
    }
    out
}

/// The hits of a fault on a memory or DMA site, with the DMA instruction it struck (for DMA
/// register faults). Other sites are refused (they are not memory words).
pub fn hits(m: &StepMap, f: ActiveFault) -> Result<(Option<usize>, Vec<WordHit>)> {
    Ok(match f.event.site.unit {
        Unit::Ub | Unit::Acc | Unit::Dram => (None, word_hits(m, f)),
        Unit::Wbuf => (None, wbuf_hits(m, f)?),
        Unit::Dma => match dma_hits(m, f) {
            Some((d, h)) => (Some(d), h),
            None => (None, Vec::new()),
        },
        u => return Err(TrainError::Config(format!("`{}` sites are not memory words or DMA registers", u.name()))),
    })
}
