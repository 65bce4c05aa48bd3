//! Where every buffer of a program lives (its *home*), and the DMA transfers between homes.
//!
//! A lowered [`Program`] reads and writes buffers without saying where they are. [`place`]
//! gives every buffer a home, TPUv1-style:
//! * **DRAM**: what persists across steps or crosses to the host (the batch, the step counter,
//!   parameters and optimizer state, and the values the caller keeps: loss, output, the next
//!   parameters and optimizer state), plus values spilled when the SRAMs are full;
//! * **accumulators**: GEMM results (the matrix unit writes its accumulators), when they fit;
//! * **unified buffer**: everything else.
//!
//! GEMM and VPU instructions never touch DRAM. A read of a DRAM-homed buffer becomes a DMA load
//! into a staged copy in the unified buffer just before the instruction (later instructions of
//! the same graph node read that copy too); a write goes to a
//! staged copy (in the accumulators for a GEMM) that a DMA store writes back after the buffer's
//! last writer; with `placement.forward_stored` ([`faultline_hw::PlacementConfig`]) later
//! readers of a value the step keeps read that copy instead of loading the value back. SRAM
//! words are assigned by a linear scan over the instruction order: a buffer holds its words
//! from its first access to its last, then they are reused (the lowest free words first, or
//! with `placement.words: LeastRecentlyUsed` those last used the earliest, where that is
//! faster), and the buffer that reuses them records whose words it takes so the schedule does
//! not overwrite them early ([`Program::issue_times`]). When an SRAM is full, the
//! longest-lived value live there is spilled to DRAM and placement starts again. DRAM words
//! are never reused within a step.
//!
//! When one instruction's tensors do not fit even with every other value spilled, the
//! instruction is cut into tiles along its rows ([`Instr::split_rows`]: GEMM result rows, VPU
//! rows or samples), twice as many each time: a tile loads only the rows of each DRAM tensor it
//! reads (a DMA with an offset into the tensor) and stores its result rows straight back. Tiles
//! compute exactly what the whole instruction computes, so tiling changes the schedule, never
//! a value. Tiles are double-buffered where the SRAM allows: the buffers odd tiles touch first
//! are placed from the top of the SRAM, so a tile's loads need not wait for the previous tile
//! to be done with the same words; placement keeps this only if the step gets faster.

use crate::error::GraphError;
use crate::program::{Buffer, Program, Role, Tag};
use faultline_hw::isa::{BufId, Instr};
use faultline_hw::memory::dma::Direction;
use faultline_hw::{HwConfig, Unit, WordChoice};
use serde::Serialize;
use std::collections::BTreeMap;

/// Where a buffer lives: a memory and the word address of its first element (one fp32 value
/// per word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Home {
    /// `Dram`, `Ub` or `Acc`.
    pub mem: Unit,
    /// Word address of element 0.
    pub base: u64,
}

/// Places `p` on `cfg`: stages every DRAM access through DMA instructions and gives every
/// buffer a [`Home`]. Errors if one instruction's on-chip tensors cannot fit even with every
/// other value spilled, or if the SRAMs cannot hold fp32 words.
pub fn place(p: &Program, cfg: &HwConfig) -> Result<Program, GraphError> {
    for (name, s) in [("unified_buffer", &cfg.memory.unified_buffer), ("accumulator", &cfg.memory.accumulator)] {
        if s.word_bits != 32 {
            return Err(GraphError::DoesNotFit {
                hw: cfg.name.clone(),
                detail: format!(
                    "training keeps fp32 values in the {name}, whose words are {} bits; memory.{name}.word_bits \
                     must be 32 to train",
                    s.word_bits
                ),
            });
        }
    }
    let mut dram: Vec<bool> = p
        .buffers
        .iter()
        .enumerate()
        .map(|(b, buf)| buf.role.is_placeholder() || p.kept.contains(&BufId(b as u32)))
        .collect();
    // Original buffers whose loaded copy is not shared by a node's instructions (each loads
    // its own, for a shorter life on chip): set when sharing would not fit.
    let mut private = vec![false; p.buffers.len()];
    // Tiles each instruction of `p` is cut into (1: whole).
    let mut parts = vec![1usize; p.instrs.len()];
    let (mut tiled, mut from) = (p.clone(), (0..p.instrs.len()).collect::<Vec<_>>());
    // K tiles of a GEMM are whole folds.
    let ku = cfg.mxu.rows;
    loop {
        let (mut q, origin, staged_for) = stage(&tiled, &dram, &private, cfg.placement.forward_stored);
        let mut on_dram = dram.clone();
        on_dram.resize(q.buffers.len(), false);
        match allocate(&q, cfg, &on_dram, Policy::FirstFit) {
            Ok(placement) => {
                q.dma_overhead = faultline_hw::memory::dma::overhead(cfg).unwrap_or(0);
                // Double buffering (alternate tiles take their words from the other end of the
                // SRAM, so a tile's loads need not wait for the previous tile to finish with
                // the same words) and the least recently used words: each kept only if it
                // fits and the step is faster.
                let tiled = q.tags.iter().any(|t| t.tile.is_some());
                let mut best = with_homes(q.clone(), placement);
                let mut cycles = static_cycles(&best, cfg);
                let lru = cfg.placement.words == WordChoice::LeastRecentlyUsed;
                for policy in [Policy::Alternate, Policy::Oldest] {
                    if (policy == Policy::Alternate && !tiled) || (policy == Policy::Oldest && !lru) {
                        continue;
                    }
                    if let Ok(placement) = allocate(&q, cfg, &on_dram, policy) {
                        let other = with_homes(q.clone(), placement);
                        let c = static_cycles(&other, cfg);
                        if c < cycles {
                            (best, cycles) = (other, c);
                        }
                    }
                }
                return Ok(best);
            }
            Err(full) => {
                // First read back what was forwarded from a stored copy (as without forwarding),
                // longest-lived first. (With forwarding, the only copies of values the step
                // keeps that are not private are the ones they were written in.)
                let forwarded = full
                    .live
                    .iter()
                    .filter(|_| cfg.placement.forward_stored)
                    .filter_map(|&(b, span)| Some((origin[b.index()]?, span)))
                    .filter(|&(o, span)| span > 0 && !private[o.index()] && p.kept.contains(&o))
                    .max_by_key(|&(o, span)| (span, std::cmp::Reverse(o)));
                if let Some((o, _)) = forwarded {
                    private[o.index()] = true;
                    continue;
                }
                // Spill the longest-lived value of the program (not a staged copy) live there.
                let victim = full
                    .live
                    .iter()
                    .filter(|&&(b, _)| b.index() < p.buffers.len() && !dram[b.index()])
                    .max_by_key(|&&(b, span)| (span, std::cmp::Reverse(b)));
                // Failing that, stop sharing the longest-lived shared loaded copy.
                let shared = || {
                    full.live
                        .iter()
                        .filter_map(|&(b, span)| Some((origin[b.index()]?, span)))
                        .filter(|&(o, span)| span > 0 && !private[o.index()])
                        .max_by_key(|&(o, span)| (span, std::cmp::Reverse(o)))
                };
                match (victim, shared()) {
                    (Some(&(b, _)), _) => dram[b.index()] = true,
                    (None, Some((o, _))) => private[o.index()] = true,
                    (None, None) => {
                        // Failing that, cut the instruction that needs the words into more tiles.
                        let i = from[staged_for[full.first]];
                        let cut = split(p, i, parts[i] * 2, ku).filter(|t| t.len() > parts[i]);
                        let Some(t) = cut else {
                            let buf = &q.buffers[full.buf.index()];
                            return Err(GraphError::DoesNotFit {
                                hw: cfg.name.clone(),
                                detail: format!(
                                    "tensor `{}` ({} words) does not fit the {} ({} words) next to what the same \
                                     instruction needs, even with every other value spilled to DRAM and the \
                                     instruction cut into {} tiles along its rows (it cannot be cut further{})",
                                    buf.name,
                                    buf.len,
                                    mem_name(full.mem),
                                    capacity(cfg, full.mem),
                                    parts[i],
                                    why_not_split(p, i, ku)
                                ),
                            });
                        };
                        parts[i] = t.len();
                        (tiled, from) = tile(p, &parts, ku);
                    }
                }
            }
        }
    }
}

/// Staged program `q` with the homes and reuse edges of `placement` (DMA instructions name
/// the SRAM their on-chip side lives in).
fn with_homes(mut q: Program, (homes, reuses): Placement) -> Program {
    for ins in &mut q.instrs {
        if let Instr::Dma { dir, sram, src, dst, .. } = ins {
            let chip = if *dir == Direction::Load { *dst } else { *src };
            *sram = homes[chip.index()].mem;
        }
    }
    q.homes = homes;
    q.reuses = reuses;
    q
}

/// The step's cycles for placed program `q` on `cfg` (its static schedule).
fn static_cycles(q: &Program, cfg: &HwConfig) -> u64 {
    q.timeline(&q.costs(cfg)).total
}

/// Instruction `i` of `p` cut into `parts` tiles (K tiles a multiple of `k_unit`), if it can
/// be and no other instruction writes its outputs (a tile stores its rows straight to DRAM,
/// which a tensor written in parts by several instructions would overwrite).
fn split(p: &Program, i: usize, parts: usize, k_unit: usize) -> Option<Vec<Instr>> {
    let shared =
        p.instrs[i].writes().iter().any(|b| p.instrs.iter().filter(|ins| ins.writes().contains(b)).count() > 1);
    if shared {
        return None;
    }
    p.instrs[i].split_rows(parts, k_unit)
}

/// Why [`split`] cannot cut instruction `i` of `p` further (K tiles a multiple of `ku`).
fn why_not_split(p: &Program, i: usize, ku: usize) -> &'static str {
    let ins = &p.instrs[i];
    match ins.split_rows(2, ku) {
        None => match ins {
            Instr::Gemm { .. } => ": a GEMM reading both operands transposed",
            Instr::Dma { .. } => ": a DMA transfer",
            Instr::Vpu { .. } => ": an operand whose pattern does not repeat by rows",
        },
        Some(_) if split(p, i, 2, ku).is_none() => ": other instructions write parts of the same output",
        Some(_) => ": each tile is one row",
    }
}

/// `p` with instruction `i` cut into `parts[i]` tiles (K tiles a multiple of `ku`), and for
/// each instruction of the result the instruction of `p` it is (a tile of).
fn tile(p: &Program, parts: &[usize], ku: usize) -> (Program, Vec<usize>) {
    let mut q = Program { instrs: Vec::new(), tags: Vec::new(), ..p.clone() };
    let mut from = Vec::new();
    for (i, (ins, tag)) in p.instrs.iter().zip(&p.tags).enumerate() {
        let tiles = match parts[i] {
            1 => vec![ins.clone()],
            n => split(p, i, n, ku).expect("a cut that was possible stays possible"),
        };
        let count = tiles.len();
        for (k, t) in tiles.into_iter().enumerate() {
            q.instrs.push(t);
            q.tags.push(Tag { tile: (count > 1).then_some((k, count)), ..tag.clone() });
            from.push(i);
        }
    }
    q.release = crate::program::releases(q.instrs.iter().map(Some), q.buffers.len(), &q.kept);
    (q, from)
}

fn mem_name(mem: Unit) -> &'static str {
    match mem {
        Unit::Acc => "accumulator SRAM",
        Unit::Ub => "unified buffer",
        _ => "DRAM",
    }
}

fn capacity(cfg: &HwConfig, mem: Unit) -> u64 {
    cfg.memory.sram(mem).map_or(cfg.dram.bytes / 4, |s| s.words())
}

/// `p` with every access to a buffer marked in `dram` staged through a DMA load or store
/// (loaded copies shared by a node's instructions unless `private`), for each buffer of the
/// result the original buffer it is a loaded copy of, and for each instruction of the result
/// the instruction of `p` it is or is staged for.
///
/// A tile (an instruction cut along its rows) stages only the words it touches: it loads the
/// rows of each DRAM tensor it reads into a copy of their size, and stores its result rows
/// right after it runs.
fn stage(p: &Program, dram: &[bool], private: &[bool], forward: bool) -> (Program, Vec<Option<BufId>>, Vec<usize>) {
    let n = p.buffers.len();
    let mut q = Program {
        instrs: Vec::new(),
        tags: Vec::new(),
        buffers: p.buffers.clone(),
        release: Vec::new(),
        kept: p.kept.clone(),
        observed: p.observed.clone(),
        homes: Vec::new(),
        reuses: Vec::new(),
        dma_overhead: 0,
        node_buf: p.node_buf.clone(),
    };
    let mut staged_for = Vec::new();
    let mut last_writer = vec![None; n];
    for (i, ins) in p.instrs.iter().enumerate() {
        for b in ins.writes() {
            last_writer[b.index()] = Some(i);
        }
    }
    // The staged copy of a DRAM-homed buffer that is being written (in parts) and not yet stored.
    let mut open: Vec<Option<BufId>> = vec![None; n];
    // The staged copy a DRAM-homed value was written in and stored from: it still holds the
    // value, so with `forward` later readers read it there instead of loading it back. Only
    // for values the step keeps (a spilled value went to DRAM to free its words) and that are
    // not `private`.
    let mut stored: Vec<Option<BufId>> = vec![None; n];
    let forwards = |b: BufId| forward && !private[b.index()] && p.kept.contains(&b);
    // The copies loaded for the current graph node, by the words they hold: its other
    // instructions read them too.
    let mut loaded: BTreeMap<(BufId, usize, usize), BufId> = BTreeMap::new();
    let mut origin: Vec<Option<BufId>> = vec![None; n];
    for (i, (ins, tag)) in p.instrs.iter().zip(&p.tags).enumerate() {
        if i > 0 && p.tags[i - 1].node != tag.node {
            loaded.clear();
        }
        let mut ins = ins.clone();
        let tile = tag.tile.is_some();
        // Per DRAM buffer read: the copy read and the buffer word its word 0 holds.
        let mut staged: BTreeMap<BufId, (BufId, usize)> = BTreeMap::new();
        // The words to load of each other DRAM buffer read, in operand order: a tile's copy
        // holds the rows its operands read, any other copy the whole tensor.
        let mut ranges: Vec<(BufId, (usize, usize))> = Vec::new();
        for (b, r) in ins.read_ranges().into_iter().filter(|(b, _)| dram[b.index()]) {
            if let Some(s) = open[b.index()].or(stored[b.index()]) {
                staged.insert(b, (s, 0));
                continue;
            }
            let whole = (0, q.buffers[b.index()].len);
            match ranges.iter_mut().find(|(c, _)| *c == b) {
                Some((_, e)) if tile => *e = (e.0.min(r.start), e.1.max(r.end)),
                Some(_) => {}
                None => ranges.push((b, if tile { (r.start, r.end) } else { whole })),
            }
        }
        for (b, (lo, hi)) in ranges {
            let s = match loaded.get(&(b, lo, hi)) {
                Some(&s) => s,
                None => {
                    let s = q.staged_copy(b, i, hi - lo);
                    q.instrs.push(Instr::Dma {
                        dir: Direction::Load,
                        sram: Unit::Ub,
                        src: b,
                        src_offset: lo,
                        dst: s,
                        dst_offset: 0,
                        len: hi - lo,
                    });
                    q.tags.push(tag.clone());
                    staged_for.push(i);
                    if !private[b.index()] {
                        loaded.insert((b, lo, hi), s);
                    }
                    origin.resize(q.buffers.len(), None);
                    origin[s.index()] = Some(b);
                    s
                }
            };
            staged.insert(b, (s, lo));
        }
        // Writes: a tile's rows go to a copy of their size, stored right after it; other
        // writes to the tensor's staged copy, stored after its last writer.
        let mut stores = Vec::new();
        let mut written: BTreeMap<BufId, (BufId, usize)> = BTreeMap::new();
        for d in ins.dests().into_iter().filter(|d| dram[d.buf.index()]) {
            let b = d.buf;
            if tile && open[b.index()].is_none() {
                // An accumulating tile adds to the rows it loaded, in place.
                let len = ins.out_len();
                let (s, lo) = staged.get(&b).copied().unwrap_or_else(|| (q.staged_copy(b, i, len), d.offset));
                written.insert(b, (s, lo));
                stores.push((s, d.offset - lo, b, d.offset, len));
                continue;
            }
            let s = open[b.index()].unwrap_or_else(|| q.staged_copy(b, i, q.buffers[b.index()].len));
            open[b.index()] = Some(s);
            written.insert(b, (s, 0));
            let len = q.buffers[b.index()].len;
            if last_writer[b.index()] == Some(i) && !stores.iter().any(|&(t, ..)| t == s) {
                open[b.index()] = None;
                stores.push((s, 0, b, 0, len));
                if forwards(b) {
                    stored[b.index()] = Some(s);
                    origin.resize(q.buffers.len(), None);
                    origin[s.index()] = Some(b);
                }
            }
        }
        let moved = |m: &BTreeMap<BufId, (BufId, usize)>, b: BufId, off: usize| match m.get(&b) {
            Some(&(s, lo)) => (s, off - lo),
            None => (b, off),
        };
        ins.relocate(|b, off| moved(&staged, b, off), |b, off| moved(&written, b, off));
        q.instrs.push(ins);
        q.tags.push(tag.clone());
        staged_for.push(i);
        for (s, src_offset, b, dst_offset, len) in stores {
            q.instrs.push(Instr::Dma {
                dir: Direction::Store,
                sram: Unit::Ub,
                src: s,
                src_offset,
                dst: b,
                dst_offset,
                len,
            });
            q.tags.push(tag.clone());
            staged_for.push(i);
        }
    }
    q.release = crate::program::releases(q.instrs.iter().map(Some), q.buffers.len(), &q.kept);
    origin.resize(q.buffers.len(), None);
    (q, origin, staged_for)
}

impl Program {
    /// A new staged (on-chip) copy of `len` words of DRAM-homed buffer `b` for instruction `i`
    /// of the unplaced program, named `<b>@<i>`.
    fn staged_copy(&mut self, b: BufId, i: usize, len: usize) -> BufId {
        let src = &self.buffers[b.index()];
        let buf = Buffer { name: format!("{}@{i}", src.name), len, role: Role::Staged, node: src.node };
        self.buffers.push(buf);
        BufId(self.buffers.len() as u32 - 1)
    }
}

/// An SRAM is full when buffer `buf` needs words in it.
struct Full {
    buf: BufId,
    /// The instruction that first touches `buf`.
    first: usize,
    mem: Unit,
    /// Every buffer then live in that memory, with the length of its live range.
    live: Vec<(BufId, usize)>,
}

/// Words of one memory, handed out first-fit, or (`oldest`) from the free range whose words
/// were last used the earliest.
struct Arena {
    /// Free `(start, len, last used)` ranges, sorted by start; "last used" is the instruction
    /// that last touched the words (0 for words never used; a merged range takes its latest
    /// part's, so a fresh region next to a just-freed buffer counts as just used: cautious).
    free: Vec<(u64, u64, usize)>,
    /// Prefer the least recently used free words to the lowest.
    oldest: bool,
}

impl Arena {
    fn new(words: u64, oldest: bool) -> Arena {
        Arena { free: vec![(0, words, 0)], oldest }
    }

    /// `len` words from the first free range that fits, or the least recently used one
    /// (`high`: the last words of the last one, so buffers placed from both ends stay apart).
    fn alloc(&mut self, len: u64, high: bool) -> Option<u64> {
        let fits = |&(_, l, _): &(u64, u64, usize)| l >= len;
        let i = if self.oldest {
            self.free.iter().enumerate().filter(|(_, r)| fits(r)).min_by_key(|(_, r)| r.2).map(|(i, _)| i)
        } else if high {
            self.free.iter().rposition(fits)
        } else {
            self.free.iter().position(fits)
        }?;
        let (start, l, used) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = if high { (start, l - len, used) } else { (start + len, l - len, used) };
        }
        Some(if high { start + l - len } else { start })
    }

    /// Frees `len` words from `start`, last used by instruction `used`.
    fn release(&mut self, start: u64, len: u64, used: usize) {
        let i = self.free.partition_point(|&(s, ..)| s < start);
        self.free.insert(i, (start, len, used));
        // Merge with the neighbours (a merged range was last used when its latest part was).
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            let (_, l, u) = self.free.remove(i + 1);
            self.free[i].1 += l;
            self.free[i].2 = self.free[i].2.max(u);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            let (_, l, u) = self.free.remove(i);
            self.free[i - 1].1 += l;
            self.free[i - 1].2 = self.free[i - 1].2.max(u);
        }
    }
}

type Placement = (Vec<Home>, Vec<Vec<BufId>>);

/// How [`allocate`] picks a buffer's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// The lowest free words that fit.
    FirstFit,
    /// First fit, with the buffers odd tiles of an instruction touch first placed from the top
    /// (double buffering).
    Alternate,
    /// The free words last used the earliest: a buffer does not take words an instruction
    /// still in flight (a store reading them out) holds, so it need not wait for it.
    Oldest,
}

/// Linear-scan homes for the buffers of staged program `q` (`dram[b]`: lives in DRAM), and for
/// each buffer the earlier buffers whose SRAM words it reuses; `policy` picks the words.
fn allocate(q: &Program, cfg: &HwConfig, dram: &[bool], policy: Policy) -> Result<Placement, Full> {
    let (alternate, oldest) = (policy == Policy::Alternate, policy == Policy::Oldest);
    let n = q.buffers.len();
    let (mut first, mut last) = (vec![usize::MAX; n], vec![0usize; n]);
    let mut gemm_out = vec![false; n];
    for (i, ins) in q.instrs.iter().enumerate() {
        for b in ins.reads().into_iter().chain(ins.writes()) {
            first[b.index()] = first[b.index()].min(i);
            last[b.index()] = i;
        }
        if let Instr::Gemm { out, .. } = ins {
            gemm_out[out.buf.index()] = true;
        }
    }
    let mut homes = vec![Home { mem: Unit::Dram, base: 0 }; n];
    let mut next_dram = 0u64;
    for b in 0..n {
        if dram[b] || first[b] == usize::MAX {
            homes[b].base = next_dram;
            next_dram += q.buffers[b].len as u64;
        }
    }
    let mut reuses = vec![Vec::new(); n];
    let mut ub = Arena::new(cfg.memory.unified_buffer.words(), oldest);
    let mut acc = Arena::new(cfg.memory.accumulator.words(), oldest);
    // Buffers by first access; live ones by last access.
    let mut order: Vec<usize> = (0..n).filter(|&b| !dram[b] && first[b] != usize::MAX).collect();
    order.sort_by_key(|&b| (first[b], b));
    let mut live: Vec<usize> = Vec::new();
    // Per memory word range, the last buffer that held it (for the reuse edges).
    let mut held: BTreeMap<(Unit, u64), (u64, usize)> = BTreeMap::new();
    for b in order {
        let len = q.buffers[b].len as u64;
        live.retain(|&o| {
            if last[o] < first[b] {
                let h = homes[o];
                let arena = if h.mem == Unit::Acc { &mut acc } else { &mut ub };
                arena.release(h.base, q.buffers[o].len as u64, last[o]);
                false
            } else {
                true
            }
        });
        let high = alternate && q.tags[first[b]].tile.is_some_and(|(k, _)| k % 2 == 1);
        let base = match gemm_out[b].then(|| acc.alloc(len, high)).flatten() {
            Some(a) => Some((Unit::Acc, a)),
            None => ub.alloc(len, high).map(|a| (Unit::Ub, a)),
        };
        let Some((mem, base)) = base else {
            let mem = if gemm_out[b] { Unit::Acc } else { Unit::Ub };
            let live = live.iter().chain([&b]).map(|&o| (BufId(o as u32), last[o] - first[o])).collect();
            return Err(Full { buf: BufId(b as u32), first: first[b], mem, live });
        };
        homes[b] = Home { mem, base };
        // Earlier occupants of any of these words must be done before `b` is written.
        let overlapping: Vec<((Unit, u64), (u64, usize))> = held
            .range((mem, 0)..(mem, base + len))
            .filter(|(&(_, s), &(l, _))| s + l > base)
            .map(|(&k, &v)| (k, v))
            .collect();
        let mut prev: Vec<BufId> = overlapping.iter().map(|&(_, (_, o))| BufId(o as u32)).collect();
        prev.sort();
        prev.dedup();
        reuses[b] = prev;
        for (k, (l, o)) in overlapping {
            // Keep the parts of the old range outside `b`'s words.
            held.remove(&k);
            if k.1 < base {
                held.insert(k, (base - k.1, o));
            }
            if k.1 + l > base + len {
                held.insert((mem, base + len), (k.1 + l - base - len, o));
            }
        }
        held.insert((mem, base), (len, b));
        live.push(b);
    }
    Ok((homes, reuses))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelSpec, OptimizerSpec, TrainGraph};
    use faultline_hw::PlacementConfig;
    use std::path::Path;

    /// `model`'s step on shipped config `hw` with `placement`, placed.
    fn placed(model: &str, hw: &str, optimizer: OptimizerSpec, placement: PlacementConfig) -> (Program, HwConfig) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let spec = ModelSpec::load(root.join(format!("models/{model}.ron"))).unwrap();
        let mut cfg = HwConfig::load(root.join(format!("configs/{hw}.ron"))).unwrap();
        cfg.placement = placement;
        let tg = TrainGraph::build(&spec, 32, optimizer).unwrap();
        (Program::step(&tg).place(&cfg).unwrap(), cfg)
    }

    const FORWARD: PlacementConfig = PlacementConfig { forward_stored: true, words: WordChoice::FirstFit };
    const LRU: PlacementConfig = PlacementConfig { forward_stored: false, words: WordChoice::LeastRecentlyUsed };

    /// With `forward_stored`, a value the step keeps (the logits, Adam's moments) is written to
    /// an on-chip copy and stored, and later readers read that copy: no DMA load reads DRAM
    /// words the step stored. Without it they load it back.
    #[test]
    fn with_forwarding_values_the_step_stores_are_read_where_they_were_written() {
        let adam = OptimizerSpec::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
        let reloads = |q: &Program| {
            let mut stored = vec![false; q.buffers.len()];
            let mut n = 0;
            for ins in &q.instrs {
                match ins {
                    Instr::Dma { dir: Direction::Store, dst, .. } => stored[dst.index()] = true,
                    Instr::Dma { src, .. } => n += usize::from(stored[src.index()]),
                    _ => {}
                }
            }
            n
        };
        for (model, hw) in [("mlp-digits", "tpu-8x8"), ("transformer-tiny", "tpu-32x32"), ("cnn-small", "tpu-32x32")] {
            let (q, _) = placed(model, hw, adam, PlacementConfig::default());
            assert!(reloads(&q) > 0, "{model}: nothing loaded back without forwarding");
            let (q, _) = placed(model, hw, adam, FORWARD);
            // DRAM buffers stored so far, and the copies they were stored from.
            let (mut stored, mut copies) = (vec![false; q.buffers.len()], vec![false; q.buffers.len()]);
            let mut forwarded = 0;
            for ins in &q.instrs {
                match ins {
                    Instr::Dma { dir: Direction::Store, src, dst, .. } => {
                        stored[dst.index()] = true;
                        copies[src.index()] = true;
                    }
                    Instr::Dma { src, .. } => {
                        assert!(!stored[src.index()], "{model}: `{}` loaded back", q.buffers[src.index()].name)
                    }
                    _ => forwarded += ins.reads().iter().filter(|b| copies[b.index()]).count(),
                }
            }
            assert!(forwarded > 0, "{model}: no value read after its store");
        }
    }

    /// On tpu-128x128, placing buffers in the least recently used words removes waits for
    /// stores still reading the words a buffer would take: resnet-mini's step is faster than
    /// with first fit, and placement never keeps a slower one.
    #[test]
    fn least_recently_used_words_make_the_step_faster_where_stores_are_in_flight() {
        let momentum = OptimizerSpec::Momentum { lr: 0.05, momentum: 0.9 };
        let (q, cfg) = placed("resnet-mini", "tpu-128x128", momentum, LRU);
        let dram: Vec<bool> = q.homes.iter().map(|h| h.mem == Unit::Dram).collect();
        let Ok(first_fit) = allocate(&q, &cfg, &dram, Policy::FirstFit) else { panic!("first fit fits") };
        let first_fit = static_cycles(&with_homes(q.clone(), first_fit), &cfg);
        let chosen = static_cycles(&q, &cfg);
        assert!(chosen * 10 < first_fit * 9, "{chosen} cycles against first fit's {first_fit}");
        let (q, cfg) = placed("mlp-digits", "tpu-8x8", OptimizerSpec::Sgd { lr: 0.1 }, LRU);
        let dram: Vec<bool> = q.homes.iter().map(|h| h.mem == Unit::Dram).collect();
        for policy in [Policy::FirstFit, Policy::Oldest] {
            if let Ok(p) = allocate(&q, &cfg, &dram, policy) {
                assert!(static_cycles(&q, &cfg) <= static_cycles(&with_homes(q.clone(), p), &cfg), "{policy:?}");
            }
        }
    }

    /// cnn-small at batch 128 on tpu-8x8 is tiled; placement double-buffers its tiles: the
    /// copies consecutive tiles of one instruction load are in disjoint words, and the step is
    /// faster than with every tile reusing the same words (first fit).
    #[test]
    fn consecutive_tiles_load_into_different_words_and_the_step_is_faster() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let spec = ModelSpec::load(root.join("models/cnn-small.ron")).unwrap();
        let cfg = HwConfig::load(root.join("configs/tpu-8x8.ron")).unwrap();
        let tg = TrainGraph::build(&spec, 128, OptimizerSpec::Sgd { lr: 0.1 }).unwrap();
        let q = Program::step(&tg).place(&cfg).unwrap();
        // Per (node, tile): the SRAM words (memory, first, end) of the copies its loads fill.
        type Words = Vec<(Unit, u64, u64)>;
        let mut loads: BTreeMap<(String, usize), Words> = BTreeMap::new();
        for (ins, tag) in q.instrs.iter().zip(&q.tags) {
            if let (Instr::Dma { dir: Direction::Load, dst, len, .. }, Some((k, _))) = (ins, tag.tile) {
                let h = q.homes[dst.index()];
                let name = tg.graph.node(tag.node).name.clone();
                loads.entry((name, k)).or_default().push((h.mem, h.base, h.base + *len as u64));
            }
        }
        let overlap = |a: &[(Unit, u64, u64)], b: &[(Unit, u64, u64)]| {
            a.iter().any(|x| b.iter().any(|y| x.0 == y.0 && x.1 < y.2 && y.1 < x.2))
        };
        // Consecutive tiles share words only when their copies could not both fit the SRAM.
        let words = |a: &[(Unit, u64, u64)]| a.iter().filter(|x| x.0 == Unit::Ub).map(|x| x.2 - x.1).sum::<u64>();
        let ub = cfg.memory.unified_buffer.words();
        let mut disjoint = 0;
        for ((n, k), a) in &loads {
            let Some(b) = loads.get(&(n.clone(), k + 1)) else { continue };
            if overlap(a, b) {
                assert!(words(a) + words(b) > ub, "{n} tiles {k} and {} share words: {a:?} {b:?}", k + 1);
            } else {
                disjoint += 1;
            }
        }
        assert!(disjoint >= 8, "{disjoint} double-buffered tile pairs");
        // The same staged program with first-fit words is slower.
        let dram: Vec<bool> = q.homes.iter().map(|h| h.mem == Unit::Dram).collect();
        let Ok(first_fit) = allocate(&q, &cfg, &dram, Policy::FirstFit) else { panic!("first fit fits") };
        let single = with_homes(q.clone(), first_fit);
        assert!(static_cycles(&q, &cfg) < static_cycles(&single, &cfg));
    }
}
