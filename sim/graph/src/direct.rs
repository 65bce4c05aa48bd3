//! The direct form of a placed program: the same computation with each staged copy read and
//! written where its DRAM words are, for a functional interpreter that no one watches.
//!
//! Placement ([`crate::residency`]) stages every DRAM tensor an instruction touches through an
//! on-chip copy: a DMA load copies the words in, a DMA store copies the result out. That is
//! the machine's traffic, and a fault in an SRAM word or a DMA register needs it. A fault-free
//! functional step only needs the values, and copying them is most of its time on big models
//! (tens of millions of words per step). [`Program::direct`] finds the copies that are exact
//! stand-ins for their DRAM words, points their readers and writers at those words and skips
//! their transfers; every other copy keeps its transfers. The result is the same bits in every
//! buffer the caller keeps, and the same cycles: a skipped transfer still costs its own.
//!
//! A staged buffer `S` (of `len` words) stands in for words `off..off + len` of DRAM buffer `D`
//! when
//! * every transfer of `S` moves all of `S` to or from exactly those words;
//! * it starts as their copy: its first access is a load, or (no load) `D` is computed by the
//!   step, nothing wrote those words before, and `S`'s first access only writes it;
//! * no load follows a change to `S`, and a store follows its last change if anything changed
//!   it (later reads of `S` read what the store left in those words);
//! * while `S` lives (first access to last), no other instruction touches those words.
//!
//! Then at every instruction `S` holds what those words of `D` hold in the direct form, and `D`
//! holds after `S`'s life what it holds in the placed program.

use crate::program::{releases, Program, Role};
use crate::touch::Touch;
use faultline_hw::isa::{BufId, Instr};
use faultline_hw::memory::dma::Direction;
use std::ops::Range;

/// A program's direct form ([`Program::direct`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Direct {
    /// Instruction `i` of the program with staged copies redirected to their DRAM words, or
    /// `None` for a transfer between a copy and its own words (it moves nothing; an interpreter
    /// counts its cycles, [`faultline_hw::isa::cycles`], and goes on).
    pub instrs: Vec<Option<Instr>>,
    /// `release[i]`: buffers the direct form no longer touches after instruction `i` and the
    /// caller does not keep.
    pub release: Vec<Vec<BufId>>,
    /// Staged buffers redirected (never touched by the direct form).
    pub redirected: usize,
}

/// What the analysis gathers about one staged buffer.
#[derive(Debug, Clone, Default)]
struct Staged {
    /// Its DRAM words, `(buffer, first word)`; `None` until a transfer names them.
    origin: Option<(BufId, usize)>,
    /// Disqualified: a transfer moves other words, or its accesses break the rules above.
    bad: bool,
    /// First and last instruction touching it.
    first: Option<usize>,
    last: usize,
    /// Its transfers to or from its origin, and whether each is a load.
    transfers: Vec<(usize, bool)>,
    /// First and last non-transfer write.
    writes: Option<(usize, usize)>,
    /// Whether the first access (when not a load) reads it.
    first_reads: bool,
}

impl Program {
    /// The direct form of this placed program (see the module doc): what a functional run
    /// without SRAM or DMA faults interprets. Unplaced programs have no staged copies; their
    /// direct form is themselves.
    pub fn direct(&self) -> Direct {
        let access = self.touches();
        let staged = self.staged_uses(&access);
        let alias: Vec<Option<(BufId, usize)>> = staged
            .iter()
            .enumerate()
            .map(|(s, u)| {
                let u = u.as_ref()?;
                (!u.bad && self.stands_in(BufId(s as u32), u, &access)).then_some(u.origin?)
            })
            .collect();
        let instrs: Vec<Option<Instr>> = self
            .instrs
            .iter()
            .map(|ins| {
                if let Instr::Dma { src, dst, .. } = ins {
                    if alias[src.index()].is_some() || alias[dst.index()].is_some() {
                        return None;
                    }
                }
                let mut ins = ins.clone();
                let to = |b: BufId, o: usize| alias[b.index()].map_or((b, o), |(d, off)| (d, off + o));
                ins.relocate(to, to);
                Some(ins)
            })
            .collect();
        let release = releases(instrs.iter().map(Option::as_ref), self.buffers.len(), &self.kept);
        Direct { instrs, release, redirected: alias.iter().flatten().count() }
    }

    /// What the touches `access` ([`Program::touches`]) say about each staged buffer
    /// (`None` for other buffers).
    fn staged_uses(&self, access: &[Vec<Touch>]) -> Vec<Option<Staged>> {
        let is_staged = |b: BufId| self.buffers[b.index()].role == Role::Staged;
        let staged = |len: usize, accesses: &[Touch]| {
            let mut u = Staged::default();
            for a in accesses {
                let i = a.instr;
                let dma = match self.instrs[i] {
                    Instr::Dma { dir, src, src_offset, dst, dst_offset, len: moved, .. } => {
                        // (the DRAM end and its offset, the staged end's offset)
                        let (d, off, s_off) = match dir {
                            Direction::Load => (src, src_offset, dst_offset),
                            Direction::Store => (dst, dst_offset, src_offset),
                        };
                        let whole = !is_staged(d) && s_off == 0 && moved == len;
                        // This buffer must be the staged end: a load writes it, a store reads it;
                        // a DMA between two staged copies, or within one, has no DRAM end.
                        if !whole || a.write != (dir == Direction::Load) || u.origin.is_some_and(|o| o != (d, off)) {
                            u.bad = true;
                        }
                        u.origin = Some((d, off));
                        u.transfers.push((i, dir == Direction::Load));
                        true
                    }
                    _ => false,
                };
                if u.first.is_none() {
                    u.first = Some(i);
                    u.first_reads = !dma && !a.write;
                }
                u.last = i;
                if a.write && !dma {
                    u.writes = Some((u.writes.map_or(i, |w| w.0), i));
                }
            }
            u
        };
        self.buffers
            .iter()
            .zip(access)
            .map(|(b, accesses)| (b.role == Role::Staged).then(|| staged(b.len, accesses)))
            .collect()
    }

    /// Whether staged buffer `s`, accessed as `u` says, stands in for its origin's words;
    /// `access[d]` lists every access to buffer `d`.
    fn stands_in(&self, s: BufId, u: &Staged, access: &[Vec<Touch>]) -> bool {
        let (Some((d, off)), Some(first)) = (u.origin, u.first) else { return false };
        let words = off..off + self.buffers[s.index()].len;
        // An access to those words by an instruction in `during` other than `s`'s transfers.
        let touched = |during: Range<usize>, writes_only: bool| {
            access[d.index()].iter().any(|a| {
                during.contains(&a.instr)
                    && (a.write || !writes_only)
                    && a.words.start < words.end
                    && words.start < a.words.end
                    && !u.transfers.iter().any(|t| t.0 == a.instr)
            })
        };
        let loads: Vec<usize> = u.transfers.iter().filter(|t| t.1).map(|t| t.0).collect();
        let starts = if loads.is_empty() {
            !self.buffers[d.index()].role.is_placeholder() && !u.first_reads && !touched(0..first, true)
        } else {
            loads[0] == first
        };
        let no_reload = u.writes.is_none_or(|(w, _)| loads.iter().all(|&l| l < w));
        // Stored after its last change; reads after the store see what the DRAM words hold.
        let stored = u.writes.is_none_or(|(_, w)| u.transfers.iter().any(|&(t, load)| t > w && !load));
        starts && no_reload && stored && !touched(first..u.last + 1, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::Buffer;
    use crate::NodeIndex;
    use faultline_hw::isa::{self, Dest, Operand};
    use faultline_hw::vpu::VpuOp;
    use faultline_hw::{ExecMode, FaultSchedule, HwConfig, Unit};

    const N: usize = 4;

    /// A program over buffers of `N` words: `d` (a DRAM value the caller keeps, holding
    /// `1, 2, 3, 4`), `e` (another, kept), `s` and `t` (staged copies).
    fn program(instrs: Vec<Instr>) -> Program {
        let buf = |name: &str, role| Buffer { name: name.into(), len: N, role, node: NodeIndex::new(0) };
        Program {
            instrs,
            tags: Vec::new(),
            buffers: vec![buf("d", Role::Input), buf("e", Role::Value), buf("s", Role::Staged), buf("t", Role::Staged)],
            release: Vec::new(),
            kept: vec![BufId(0), BufId(1)],
            observed: Vec::new(),
            homes: Vec::new(),
            reuses: Vec::new(),
            dma_overhead: 0,
            node_buf: Vec::new(),
        }
    }
    const D: BufId = BufId(0);
    const E: BufId = BufId(1);
    const S: BufId = BufId(2);
    const T: BufId = BufId(3);

    fn dma(dir: Direction, src: BufId, dst: BufId) -> Instr {
        Instr::Dma { dir, sram: Unit::Ub, src, src_offset: 0, dst, dst_offset: 0, len: N }
    }
    /// `to = x + x` on the VPU.
    fn double(x: BufId, to: BufId) -> Instr {
        Instr::Vpu {
            op: VpuOp::Add,
            n: N,
            ins: vec![Operand::whole(x), Operand::whole(x)],
            outs: vec![Dest::whole(to)],
            acc: false,
        }
    }

    /// The kept buffers after interpreting `instrs` (`None`: skipped).
    fn run<'a>(instrs: impl Iterator<Item = Option<&'a Instr>>) -> Vec<Vec<u32>> {
        let hw = HwConfig::test_config(
            4,
            4,
            faultline_hw::config::Dataflow::WeightStationary,
            faultline_num::Precision::Fp32Fp32,
        );
        let mut bufs = vec![Vec::new(); 4];
        bufs[0] = (1..=N).map(|v| (v as f32).to_bits()).collect();
        bufs[1] = vec![0; N];
        for ins in instrs.flatten() {
            isa::execute(&hw, ins, &mut bufs, ExecMode::Functional, &FaultSchedule::none()).unwrap();
        }
        bufs[..2].to_vec()
    }

    /// Direct forms redirect the copies that stand in for their words and keep the others'
    /// transfers; either way the kept buffers end as the placed program leaves them.
    #[test]
    fn copies_are_redirected_only_where_they_stand_in_for_their_words() {
        use Direction::{Load, Store};
        let cases: [(&str, Vec<Instr>, usize); 7] = [
            // Loaded, doubled into a copy that is stored: both stand in.
            ("load, compute, store", vec![dma(Load, D, S), double(S, T), dma(Store, T, E)], 2),
            // Changed in place and stored back: stands in.
            ("read-modify-write", vec![dma(Load, D, S), double(S, S), dma(Store, S, D)], 1),
            // Changed and never stored: `d` must keep its words.
            ("changed, not stored", vec![dma(Load, D, S), double(S, S), double(S, T), dma(Store, T, E)], 1),
            // Loaded again after a change: the reload must see `d`'s words, not the change.
            (
                "reloaded after a change",
                vec![dma(Load, D, S), double(S, S), dma(Load, D, S), double(S, T), dma(Store, T, E)],
                1,
            ),
            // Reloaded between two changes and stored: the second change must start again
            // from `d`'s words.
            (
                "reloaded between changes",
                vec![dma(Load, D, S), double(S, S), dma(Load, D, S), double(S, S), dma(Store, S, D)],
                0,
            ),
            // `d`'s words are overwritten while `s` still holds their old copy.
            (
                "source overwritten while loaded",
                vec![dma(Load, D, S), double(S, T), dma(Store, T, D), double(S, T), dma(Store, T, E)],
                0,
            ),
            // `s` is never loaded but written over a placeholder's words: stands in only if
            // those words start as zeros, which a placeholder's do not.
            ("stored over a placeholder", vec![double(E, S), dma(Store, S, D)], 0),
        ];
        for (name, instrs, redirected) in cases {
            let p = program(instrs);
            let d = p.direct();
            assert_eq!(d.redirected, redirected, "{name}");
            assert_eq!(run(d.instrs.iter().map(Option::as_ref)), run(p.instrs.iter().map(Some)), "{name}");
        }
    }
}
