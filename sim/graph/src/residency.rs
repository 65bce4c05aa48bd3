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
//! last writer. SRAM words are assigned by a linear scan over the instruction order: a buffer
//! holds its words from its first access to its last, then they are reused, and the buffer
//! that reuses them records whose words it takes so the schedule does not overwrite them early
//! ([`Program::issue_times`]). When an SRAM is full, the longest-lived value live there is
//! spilled to DRAM and placement starts again. DRAM words are never reused within a step.

use crate::error::GraphError;
use crate::program::{Buffer, Program, Role};
use faultline_hw::dma::Direction;
use faultline_hw::isa::{BufId, Instr};
use faultline_hw::{HwConfig, Unit};
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
    loop {
        let (mut q, origin) = stage(p, &dram, &private);
        let mut on_dram = dram.clone();
        on_dram.resize(q.buffers.len(), false);
        match allocate(&q, cfg, &on_dram) {
            Ok((homes, reuses)) => {
                for ins in &mut q.instrs {
                    if let Instr::Dma { dir, sram, src, dst, .. } = ins {
                        let chip = if *dir == Direction::Load { *dst } else { *src };
                        *sram = homes[chip.index()].mem;
                    }
                }
                q.homes = homes;
                q.reuses = reuses;
                q.dma_overhead = faultline_hw::dma::overhead(cfg).unwrap_or(0);
                return Ok(q);
            }
            Err(full) => {
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
                        let buf = &q.buffers[full.buf.index()];
                        return Err(GraphError::DoesNotFit {
                            hw: cfg.name.clone(),
                            detail: format!(
                                "tensor `{}` ({} words) does not fit the {} ({} words) next to what the same \
                                 instruction needs, even with every other value spilled to DRAM; splitting a \
                                 tensor across transfers (tiling) is not implemented",
                                buf.name,
                                buf.len,
                                mem_name(full.mem),
                                capacity(cfg, full.mem)
                            ),
                        });
                    }
                }
            }
        }
    }
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
/// (loaded copies shared by a node's instructions unless `private`), and for each buffer of
/// the result the original buffer it is a loaded copy of.
fn stage(p: &Program, dram: &[bool], private: &[bool]) -> (Program, Vec<Option<BufId>>) {
    let n = p.buffers.len();
    let mut q = Program {
        instrs: Vec::new(),
        tags: Vec::new(),
        buffers: p.buffers.clone(),
        release: Vec::new(),
        kept: p.kept.clone(),
        homes: Vec::new(),
        reuses: Vec::new(),
        dma_overhead: 0,
        node_buf: p.node_buf.clone(),
    };
    let mut last_writer = vec![None; n];
    for (i, ins) in p.instrs.iter().enumerate() {
        for b in ins.writes() {
            last_writer[b.index()] = Some(i);
        }
    }
    // The staged copy of a DRAM-homed buffer that is being written (in parts) and not yet stored.
    let mut open: Vec<Option<BufId>> = vec![None; n];
    // The copy loaded for the current graph node: its other instructions read it too.
    let mut loaded: BTreeMap<BufId, BufId> = BTreeMap::new();
    let mut origin: Vec<Option<BufId>> = vec![None; n];
    for (i, (ins, tag)) in p.instrs.iter().zip(&p.tags).enumerate() {
        if i > 0 && p.tags[i - 1].node != tag.node {
            loaded.clear();
        }
        let mut ins = ins.clone();
        let mut staged: BTreeMap<BufId, BufId> = BTreeMap::new();
        for b in ins.reads().into_iter().filter(|b| dram[b.index()]) {
            if staged.contains_key(&b) {
                continue;
            }
            let s = match open[b.index()].or_else(|| loaded.get(&b).copied()) {
                Some(s) => s,
                None => {
                    let s = q.staged_copy(b, i);
                    let len = q.buffers[b.index()].len;
                    q.instrs.push(Instr::Dma { dir: Direction::Load, sram: Unit::Ub, src: b, dst: s, len });
                    q.tags.push(tag.clone());
                    if !private[b.index()] {
                        loaded.insert(b, s);
                    }
                    origin.resize(q.buffers.len(), None);
                    origin[s.index()] = Some(b);
                    s
                }
            };
            staged.insert(b, s);
        }
        let mut stores = Vec::new();
        for b in ins.writes().into_iter().filter(|b| dram[b.index()]) {
            let s = match open[b.index()] {
                Some(s) => s,
                None => q.staged_copy(b, i),
            };
            open[b.index()] = Some(s);
            if last_writer[b.index()] == Some(i) && !stores.contains(&(s, b)) {
                stores.push((s, b));
            }
        }
        let written: BTreeMap<BufId, BufId> =
            ins.writes().into_iter().filter_map(|b| Some((b, open[b.index()]?))).collect();
        ins.rename(|b| staged.get(&b).copied().unwrap_or(b), |b| written.get(&b).copied().unwrap_or(b));
        q.instrs.push(ins);
        q.tags.push(tag.clone());
        for (s, b) in stores {
            open[b.index()] = None;
            let len = q.buffers[b.index()].len;
            q.instrs.push(Instr::Dma { dir: Direction::Store, sram: Unit::Ub, src: s, dst: b, len });
            q.tags.push(tag.clone());
        }
    }
    q.release = crate::program::releases(&q.instrs, q.buffers.len(), &q.kept);
    origin.resize(q.buffers.len(), None);
    (q, origin)
}

impl Program {
    /// A new staged (on-chip) copy of DRAM-homed buffer `b` for instruction `i` of the
    /// unplaced program, named `<b>@<i>`.
    fn staged_copy(&mut self, b: BufId, i: usize) -> BufId {
        let src = &self.buffers[b.index()];
        let buf = Buffer { name: format!("{}@{i}", src.name), len: src.len, role: Role::Staged, node: src.node };
        self.buffers.push(buf);
        BufId(self.buffers.len() as u32 - 1)
    }
}

/// An SRAM is full when buffer `buf` needs words in it.
struct Full {
    buf: BufId,
    mem: Unit,
    /// Every buffer then live in that memory, with the length of its live range.
    live: Vec<(BufId, usize)>,
}

/// Words of one memory, handed out first-fit.
struct Arena {
    /// Free `(start, len)` ranges, sorted by start.
    free: Vec<(u64, u64)>,
}

impl Arena {
    fn new(words: u64) -> Arena {
        Arena { free: vec![(0, words)] }
    }

    fn alloc(&mut self, len: u64) -> Option<u64> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    fn release(&mut self, start: u64, len: u64) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free.remove(i + 1).1;
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free.remove(i).1;
        }
    }
}

type Placement = (Vec<Home>, Vec<Vec<BufId>>);

/// Linear-scan homes for the buffers of staged program `q` (`dram[b]`: lives in DRAM), and for
/// each buffer the earlier buffers whose SRAM words it reuses.
fn allocate(q: &Program, cfg: &HwConfig, dram: &[bool]) -> Result<Placement, Full> {
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
    let mut ub = Arena::new(cfg.memory.unified_buffer.words());
    let mut acc = Arena::new(cfg.memory.accumulator.words());
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
                arena.release(h.base, q.buffers[o].len as u64);
                false
            } else {
                true
            }
        });
        let base = match gemm_out[b].then(|| acc.alloc(len)).flatten() {
            Some(a) => Some((Unit::Acc, a)),
            None => ub.alloc(len).map(|a| (Unit::Ub, a)),
        };
        let Some((mem, base)) = base else {
            let mem = if gemm_out[b] { Unit::Acc } else { Unit::Ub };
            let live = live.iter().chain([&b]).map(|&o| (BufId(o as u32), last[o] - first[o])).collect();
            return Err(Full { buf: BufId(b as u32), mem, live });
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
