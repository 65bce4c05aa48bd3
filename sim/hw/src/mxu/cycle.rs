//! The stepped PE array: its registers ([`PeArrayState`]), clocked one cycle at a time
//! ([`cycle_level`]), the closed-form WS state and the windowed faulty WS run.

use super::functional::functional;
use super::Schedule;
use crate::config::Dataflow;
use crate::fault::{FaultEvent, FaultSchedule, FaultSite, Register};
use crate::matrix::Matrix;
use faultline_num::MacFormat;

/// Register state of the PE array, one flat row-major array per register class.
///
/// `Clone + PartialEq`, so a golden state is a cheap checkpoint and "faulty vs golden" is a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeArrayState {
    /// Array rows.
    pub rows: usize,
    /// Array columns.
    pub cols: usize,
    /// Activation registers (input-format bits).
    pub act: Vec<u32>,
    /// Activation-valid bits.
    pub valid: Vec<u8>,
    /// WS weight-swap strobes.
    pub swap: Vec<u8>,
    /// Weight registers (input-format bits).
    pub weight: Vec<u32>,
    /// WS shadow weight registers.
    pub shadow: Vec<u32>,
    /// OS weight-valid bits.
    pub wvalid: Vec<u8>,
    /// Partial sums (accumulator-format bits).
    pub psum: Vec<u32>,
}

impl PeArrayState {
    /// The reset state: every register zero.
    pub fn new(rows: usize, cols: usize) -> PeArrayState {
        let n = rows * cols;
        PeArrayState {
            rows,
            cols,
            act: vec![0; n],
            valid: vec![0; n],
            swap: vec![0; n],
            weight: vec![0; n],
            shadow: vec![0; n],
            wvalid: vec![0; n],
            psum: vec![0; n],
        }
    }

    /// Current bits of an MXU site's register (the whole register, not just the site's bit).
    pub fn read(&self, site: &FaultSite) -> u32 {
        let i = site.instance[0] as usize * self.cols + site.instance[1] as usize;
        match site.register {
            Register::Act => self.act[i],
            Register::Valid => self.valid[i] as u32,
            Register::Swap => self.swap[i] as u32,
            Register::Weight => self.weight[i],
            Register::WeightShadow => self.shadow[i],
            Register::WeightValid => self.wvalid[i] as u32,
            Register::Psum => self.psum[i],
            // Not a PE register (`gemm` rejects non-MXU sites before this is reached).
            _ => 0,
        }
    }

    /// Applies a fault event's bit operation to the committed state.
    fn apply(&mut self, e: &FaultEvent) {
        let s = &e.site;
        let i = s.instance[0] as usize * self.cols + s.instance[1] as usize;
        let k = e.kind;
        let b = s.bit;
        let bit8 = |v: &mut u8| *v = k.apply(*v as u32, b) as u8 & 1;
        match s.register {
            Register::Act => self.act[i] = k.apply(self.act[i], b),
            Register::Valid => bit8(&mut self.valid[i]),
            Register::Swap => bit8(&mut self.swap[i]),
            Register::Weight => self.weight[i] = k.apply(self.weight[i], b),
            Register::WeightShadow => self.shadow[i] = k.apply(self.shadow[i], b),
            Register::WeightValid => bit8(&mut self.wvalid[i]),
            Register::Psum => self.psum[i] = k.apply(self.psum[i], b),
            // Not a PE register (`gemm` rejects non-MXU sites before this is reached).
            _ => {}
        }
    }
}

/// What the stepped model observed, besides the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleReport {
    /// Cycles stepped until the last accumulator write (measured, not taken from the formula).
    pub measured_cycles: u64,
    /// Accumulator writes performed.
    pub captures: u64,
}

/// Steps the array cycle by cycle from `st` (normally the reset state) through the schedule.
///
/// The sequencer drives edges and the accumulator captures at the times the schedule gives;
/// stepping stops when every output element has been written, so the cycle count is measured
/// and can be checked against the closed form.
pub fn cycle_level<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
    st: &mut PeArrayState,
) -> (Matrix, CycleReport) {
    cycle_level_observed::<F>(s, a, w, acc, faults, st, |_, _| {})
}

/// [`cycle_level`] with an observer called after every commit (faults applied) with the cycle
/// number and the state: the hook for waveform (VCD) export and propagation tracing.
///
/// `faults` should have passed [`FaultSchedule::check`] (as [`gemm`](super::gemm) does); an event naming a
/// fold the schedule lacks is ignored rather than indexing out of bounds.
pub fn cycle_level_observed<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
    st: &mut PeArrayState,
    mut observe: impl FnMut(u64, &PeArrayState),
) -> (Matrix, CycleReport) {
    if s.dataflow == Dataflow::InputStationary {
        // The array runs the WS view on the transposed operands; the accumulators hold the
        // transposed result, read back as `M x N`.
        let acct = acc.map(Matrix::transpose);
        let (out, report) =
            cycle_level_observed::<F>(&s.as_ws(), &w.transpose(), &a.transpose(), acct.as_ref(), faults, st, observe);
        return (out.transpose(), report);
    }
    let faults = s.active(faults);
    let mut out = acc.cloned().unwrap_or_else(|| Matrix::zeros(s.m, s.n));
    let mut next = st.clone();
    let mut edge = Edge::new(s.rows, s.cols);
    let expected: u64 = s.folds.iter().map(|f| (f.mr * f.nc) as u64).sum();
    let mut captures = 0u64;
    let mut t = 0u64;
    // Generous bound: a schedule bug must end in a wrong count, not an endless loop.
    let limit = s.total_cycles.saturating_mul(2).saturating_add(16);
    while captures < expected && t < limit {
        match s.dataflow {
            // IS was turned into its WS view above.
            Dataflow::WeightStationary | Dataflow::InputStationary => {
                captures += capture_ws::<F>(s, t, st, &mut out);
                edge.drive_ws(s, a, w, t);
                step_ws::<F>(st, &mut next, &edge);
            }
            Dataflow::OutputStationary => {
                let drain = os_drain_row(s, t);
                if let Some((f, d)) = drain {
                    captures += capture_os::<F>(s, f, d, st, &mut out);
                }
                edge.drive_os(s, a, w, t);
                step_os::<F>(st, &mut next, &edge, drain.is_some());
            }
        }
        std::mem::swap(st, &mut next);
        for f in faults.iter().filter(|f| f.acts_at(t)) {
            st.apply(&f.event);
        }
        observe(t, st);
        t += 1;
    }
    (out, CycleReport { measured_cycles: t, captures })
}

/// `(u / p, u % p)` for `u = top, top - 1, ...` (`None` once below zero, and for `top`
/// `None`), with one division in all: schedule positions along a row or diagonal of the array.
fn countdown(top: Option<u64>, p: u64) -> impl Iterator<Item = Option<(u64, u64)>> {
    let mut cur = top.map(|u| (u / p, u % p));
    std::iter::repeat_with(move || {
        let now = cur;
        cur = match cur {
            Some((f, 0)) => f.checked_sub(1).map(|f| (f, p - 1)),
            Some((f, m)) => Some((f, m - 1)),
            None => None,
        };
        now
    })
}

/// WS: what row `i`'s edge gets when output row `m` of fold `f` enters it (`fm`; `None`:
/// before the first fold): activation bits, valid, swap strobe.
fn ws_input(s: &Schedule, a: &Matrix, fm: Option<(u64, u64)>, i: usize) -> (u32, u8, u8) {
    match fm.and_then(|(f, m)| Some((s.folds.get(f as usize)?, m as usize))) {
        Some((fold, m)) if m < s.m => {
            let swap = (m == 0) as u8;
            if i < fold.kr {
                (a.get(m, fold.k0 + i), 1, swap)
            } else {
                (0, 0, swap)
            }
        }
        _ => (0, 0, 0),
    }
}

/// WS: the weight fold `f` puts in PE `(i, j)` (zero outside the fold's tile).
fn ws_weight(s: &Schedule, w: &Matrix, f: usize, i: usize, j: usize) -> u32 {
    let fold = &s.folds[f];
    if i < fold.kr && j < fold.nc {
        w.get(fold.k0 + i, fold.n0 + j)
    } else {
        0
    }
}

/// WS: the fault-free array state at the start of cycle `t`, in closed form, except the partial
/// sums (left zero: stepping `i + 1` cycles from here makes row `i`'s exact, as each is
/// computed from the row above's one cycle earlier and row 0 adds to zero). Activations, valid
/// bits and swap strobes are the edge inputs of `j + 1` cycles ago; the shadow register holds
/// the last fold whose bus write (at `f * p + i + j`) has landed, the weight register the last
/// fold whose swap (committed at `f * p + i + j + 1`) has passed.
fn ws_state_at(s: &Schedule, a: &Matrix, w: &Matrix, t: u64) -> PeArrayState {
    let (r, c, p) = (s.rows, s.cols, s.period);
    let mut st = PeArrayState::new(r, c);
    let last = s.folds.len().saturating_sub(1) as u64;
    // Everything but the activation's row index depends on the anti-diagonal `d = i + j` only:
    // `(f, m)` of `t - 2 - d` (the row passing, and the last swap) and of `t - 1 - d` (the
    // last bus write).
    let passing: Vec<_> = countdown(t.checked_sub(2), p).take(r + c).collect();
    let written: Vec<_> = countdown(t.checked_sub(1), p).take(r + c).collect();
    for i in 0..r {
        for j in 0..c {
            let (x, d) = (i * c + j, i + j);
            (st.act[x], st.valid[x], st.swap[x]) = ws_input(s, a, passing[d], i);
            if let Some((f, _)) = passing[d] {
                st.weight[x] = ws_weight(s, w, f.min(last) as usize, i, j);
            }
            if let Some((f, _)) = written[d] {
                st.shadow[x] = ws_weight(s, w, f.min(last) as usize, i, j);
            }
        }
    }
    st
}

/// Whether two WS array states hold the same values in every register a WS clock uses (the OS
/// weight-valid bits are not among them).
fn same_ws(x: &PeArrayState, y: &PeArrayState) -> bool {
    x.psum == y.psum
        && x.act == y.act
        && x.weight == y.weight
        && x.shadow == y.shadow
        && x.valid == y.valid
        && x.swap == y.swap
}

/// WS: the fold, output row and column that column `j` of the accumulators captures at cycle
/// `t` (`t = 1 + f * p + m + R + j`), if any.
fn ws_capture(s: &Schedule, t: u64, j: usize) -> Option<(usize, usize, usize)> {
    let u = t.checked_sub(1 + s.rows as u64 + j as u64)?;
    let (f, m) = ((u / s.period) as usize, (u % s.period) as usize);
    let fold = s.folds.get(f)?;
    (m < s.m && j < fold.nc).then_some((f, m, fold.n0 + j))
}

/// An accumulator capture a fault changed: ((fold, output row, output column), faulty sum).
pub(super) type ChangedCapture = ((usize, usize, usize), u32);

/// The accumulator captures `faults` change in a WS GEMM at cycle level, as ((fold, row,
/// column), faulty partial sum) sorted by key, stepping only the cycles the faults can matter
/// in (see [`windowed_ws`]); `None` if more than `budget` change.
pub(super) fn ws_changed_captures<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    faults: &FaultSchedule,
    budget: usize,
) -> Option<Vec<ChangedCapture>> {
    let active = s.active(faults);
    let (Some(first), Some(over)) = (active.iter().map(|f| f.start).min(), active.iter().map(|f| f.end).max()) else {
        return Some(Vec::new());
    };
    // A fault in row `i` never reaches the rows above it, whose sums it meets as they flow
    // down: those must be exact from its time on. Row `i`'s sums are exact `i + 1` cycles after
    // stepping starts; until then they are equally wrong in both copies and flow out unchanged.
    let from = active.iter().map(|f| f.start.saturating_sub(f.event.site.instance[0] as u64)).min().unwrap_or(first);
    let mut edge = Edge::new(s.rows, s.cols);
    let mut golden = ws_state_at(s, a, w, from);
    let mut next = golden.clone();
    for t in from..first {
        edge.drive_ws(s, a, w, t);
        step_ws::<F>(&golden, &mut next, &edge);
        std::mem::swap(&mut golden, &mut next);
    }
    let (mut faulty, mut faulty_next) = (golden.clone(), next.clone());
    let mut changed = Vec::new();
    let bottom = (s.rows - 1) * s.cols;
    let mut t = first;
    while t < s.total_cycles {
        for j in 0..s.cols {
            let (fv, gv) = (faulty.psum[bottom + j], golden.psum[bottom + j]);
            if fv != gv {
                if let Some(key) = ws_capture(s, t, j) {
                    changed.push((key, fv));
                }
            }
        }
        edge.drive_ws(s, a, w, t);
        step_ws::<F>(&golden, &mut next, &edge);
        step_ws::<F>(&faulty, &mut faulty_next, &edge);
        std::mem::swap(&mut golden, &mut next);
        std::mem::swap(&mut faulty, &mut faulty_next);
        for f in active.iter().filter(|f| f.acts_at(t)) {
            faulty.apply(&f.event);
        }
        t += 1;
        if changed.len() > budget {
            return None;
        }
        if t >= over && same_ws(&faulty, &golden) {
            break;
        }
    }
    // In capture order; sorted by key for lookups (keys are unique).
    changed.sort_unstable_by_key(|&(k, _)| k);
    Some(changed)
}

/// A faulty WS GEMM at cycle level, stepping only the cycles the faults can matter in; the
/// same bits as [`cycle_level`] from the reset state.
///
/// Before the first fault the array is fault-free, so its state there is rebuilt in closed
/// form ([`ws_state_at`]; the partial sums by stepping from as many cycles earlier as the
/// faulted row is deep). From the first fault a faulty
/// and a fault-free copy step side by side and every accumulator capture is compared; once the
/// faults are over and the two states are equal, every later capture is fault-free too.
/// Returns the result and the fault-free one. The result is the functional twin's, with each
/// output whose captures differed recomputed through its folds in order from the faulty
/// captures and fault-free fold sums.
pub(super) fn windowed_ws<F: MacFormat>(
    s: &Schedule,
    a: &Matrix,
    w: &Matrix,
    acc: Option<&Matrix>,
    faults: &FaultSchedule,
) -> (Matrix, Matrix) {
    let fault_free = functional::<F>(s, a, w, acc);
    // More changed captures than outputs (a fault changing most of the result for a long
    // time): stepping the whole GEMM is as cheap, and bounds the memory this needs.
    let Some(changed) = ws_changed_captures::<F>(s, a, w, faults, s.m.saturating_mul(s.n)) else {
        return (cycle_level::<F>(s, a, w, acc, faults, &mut PeArrayState::new(s.rows, s.cols)).0, fault_free);
    };
    let mut out = fault_free.clone();
    let mut elements: Vec<(usize, usize)> = changed.iter().map(|&((_, m, n), _)| (m, n)).collect();
    elements.sort_unstable();
    elements.dedup();
    for (m, n) in elements {
        let mut v = acc.map_or(0, |c| c.get(m, n));
        for (f, fold) in s.folds.iter().enumerate().filter(|(_, f)| (f.n0..f.n0 + f.nc).contains(&n)) {
            let hit = changed.binary_search_by_key(&(f, m, n), |&(k, _)| k).ok();
            let ps = hit.map(|x| changed[x].1).unwrap_or_else(|| {
                (0..fold.kr).fold(PSUM_ZERO, |ps, i| F::mac(ps, a.get(m, fold.k0 + i), w.get(fold.k0 + i, n)))
            });
            v = if fold.overwrite { ps } else { F::add(v, ps) };
        }
        out.set(m, n, v);
    }
    (out, fault_free)
}

/// Values the sequencer drives into the array's edges in one cycle.
struct Edge {
    /// Per row: activation bits, valid, swap.
    act: Vec<u32>,
    valid: Vec<u8>,
    swap: Vec<u8>,
    /// Per column: weight-bus write (row to write, bits) in WS; top weight input in OS.
    wrow: Vec<Option<usize>>,
    wbits: Vec<u32>,
    wvalid: Vec<u8>,
    /// The partial sums entering row 0: all zero.
    zero_row: Vec<u32>,
}

impl Edge {
    fn new(rows: usize, cols: usize) -> Edge {
        Edge {
            act: vec![0; rows],
            valid: vec![0; rows],
            swap: vec![0; rows],
            wrow: vec![None; cols],
            wbits: vec![0; cols],
            wvalid: vec![0; cols],
            zero_row: vec![PSUM_ZERO; cols],
        }
    }

    /// WS: row `i` gets `A[m][k0+i]` at `T_f + m + i`; column `j`'s bus writes row `i` at
    /// `T_f + j - 1 + i` (with `T_f = fold.start + 1`).
    fn drive_ws(&mut self, s: &Schedule, a: &Matrix, w: &Matrix, t: u64) {
        // Row i: (f, m) of t - 1 - i; column j's bus: (f, row) of t - j.
        for (i, fm) in countdown(t.checked_sub(1), s.period).take(s.rows).enumerate() {
            (self.act[i], self.valid[i], self.swap[i]) = ws_input(s, a, fm, i);
        }
        for (j, fi) in countdown(Some(t), s.period).take(s.cols).enumerate() {
            self.wrow[j] = None;
            if let Some((f, i)) = fi.map(|(f, i)| (f as usize, i as usize)) {
                if f < s.folds.len() && i < s.rows {
                    self.wrow[j] = Some(i);
                    self.wbits[j] = ws_weight(s, w, f, i, j);
                }
            }
        }
    }

    /// OS: row `i` gets `A[m0+i][k]` and column `j` gets `W[k][n0+j]` at `S_f + k + i` / `+ j`.
    fn drive_os(&mut self, s: &Schedule, a: &Matrix, w: &Matrix, t: u64) {
        let p = s.period;
        let (f, off) = ((t / p) as usize, t % p);
        let fold = s.folds.get(f);
        for i in 0..s.rows {
            self.act[i] = 0;
            self.valid[i] = 0;
            if let Some(fold) = fold {
                if off >= i as u64 && i < fold.mr {
                    let k = (off - i as u64) as usize;
                    if k < s.k {
                        self.act[i] = a.get(fold.m0 + i, k);
                        self.valid[i] = 1;
                    }
                }
            }
        }
        for j in 0..s.cols {
            self.wbits[j] = 0;
            self.wvalid[j] = 0;
            if let Some(fold) = fold {
                if off >= j as u64 && j < fold.nc {
                    let k = (off - j as u64) as usize;
                    if k < s.k {
                        self.wbits[j] = w.get(k, fold.n0 + j);
                        self.wvalid[j] = 1;
                    }
                }
            }
        }
    }
}

/// Canonical bits of the zero partial sum entering row 0 (`+0` / `0`).
const PSUM_ZERO: u32 = 0;

/// `next` = `cur` moved one PE right (row-major rows of `c`), column 0 of row `i` taking
/// `edge[i]`: one copy of the whole array, then the edge column.
#[inline(always)]
fn shift_right<T: Copy>(cur: &[T], next: &mut [T], edge: &[T], c: usize) {
    if let Some(last) = cur.len().checked_sub(1) {
        next[1..].copy_from_slice(&cur[..last]);
        for (i, &v) in edge.iter().enumerate() {
            next[i * c] = v;
        }
    }
}

/// One WS clock: next state from current state and edge inputs (D/Q). Compiled for AVX2 as
/// well (same IEEE operations per PE, so the same bits), picked at run time.
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn step_ws<F: MacFormat>(cur: &PeArrayState, next: &mut PeArrayState, e: &Edge) {
    let c = cur.cols;
    // Activations, valid bits and swap strobes move one PE right; the edge feeds column 0.
    // Whole-array shifts: three copies a clock instead of three per row.
    shift_right(&cur.act, &mut next.act, &e.act, c);
    shift_right(&cur.valid, &mut next.valid, &e.valid, c);
    shift_right(&cur.swap, &mut next.swap, &e.swap, c);
    for i in 0..cur.rows {
        let r = i * c..(i + 1) * c;
        let above: &[u32] = if i == 0 { &e.zero_row } else { &cur.psum[(i - 1) * c..i * c] };
        let (na, nv, ns) = (&next.act[r.clone()], &next.valid[r.clone()], &next.swap[r.clone()]);
        let (cw, csh) = (&cur.weight[r.clone()], &cur.shadow[r.clone()]);
        let nw = &mut next.weight[r.clone()];
        let np = &mut next.psum[r];
        // Two loops of few slices each: LLVM vectorises a loop only if it can rule out aliasing
        // between its slices with a bounded number of run-time checks. Branch-free selects
        // (masks from the 0/1 control bits) keep both loops straight-line.
        ws_row::<F>(nw, np, cw, csh, ns, above, na, nv);
    }
    // Shadow registers hold their value unless the weight bus writes them (next state; the swap
    // above read the current one).
    next.shadow.copy_from_slice(&cur.shadow);
    for (j, row) in e.wrow.iter().enumerate() {
        if let Some(i) = *row {
            next.shadow[i * c + j] = e.wbits[j];
        }
    }
}

/// One WS row's clock. The slices are arguments (so the compiler knows they do not alias) and
/// the loops are branch-free selects (masks from the 0/1 control bits), so both vectorise.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn ws_row<F: MacFormat>(
    nw: &mut [u32],
    np: &mut [u32],
    cw: &[u32],
    csh: &[u32],
    ns: &[u8],
    above: &[u32],
    na: &[u32],
    nv: &[u8],
) {
    for (((w, &cw), &csh), &ns) in nw.iter_mut().zip(cw).zip(csh).zip(ns) {
        // The arriving swap strobe makes this clock's MAC use the shadow weight.
        let swap = 0u32.wrapping_sub(ns as u32);
        *w = (csh & swap) | (cw & !swap);
    }
    for ((((p, &above), &a), &w), &v) in np.iter_mut().zip(above).zip(na).zip(&*nw).zip(nv) {
        let valid = 0u32.wrapping_sub(v as u32);
        let mac = F::mac(above, a, w);
        *p = (mac & valid) | (above & !valid);
    }
}

/// One OS clock. In drain cycles partial sums shift down and nothing is computed. Compiled for
/// AVX2 as well, like [`step_ws`].
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn step_os<F: MacFormat>(cur: &PeArrayState, next: &mut PeArrayState, e: &Edge, drain: bool) {
    let (c, n) = (cur.cols, cur.psum.len());
    shift_right(&cur.act, &mut next.act, &e.act, c);
    shift_right(&cur.valid, &mut next.valid, &e.valid, c);
    // Weights (and their valid bits) come from the row above, or from the top edge.
    next.weight[c..].copy_from_slice(&cur.weight[..n - c]);
    next.weight[..c].copy_from_slice(&e.wbits);
    next.wvalid[c..].copy_from_slice(&cur.wvalid[..n - c]);
    next.wvalid[..c].copy_from_slice(&e.wvalid);
    if drain {
        next.psum[c..].copy_from_slice(&cur.psum[..n - c]);
        next.psum[..c].fill(PSUM_ZERO);
        return;
    }
    for i in 0..cur.rows {
        let r = i * c..(i + 1) * c;
        let (na, nv) = (&next.act[r.clone()], &next.valid[r.clone()]);
        let (w_above, wv_above) = (&next.weight[r.clone()], &next.wvalid[r.clone()]);
        let cp = &cur.psum[r.clone()];
        let np = &mut next.psum[r];
        for j in 0..c {
            // Branch-free select, as in `step_ws`.
            let go = 0u32.wrapping_sub((nv[j] & wv_above[j]) as u32);
            let mac = F::mac(cp[j], na[j], w_above[j]);
            np[j] = (mac & go) | (cp[j] & !go);
        }
    }
}

/// WS accumulator: at cycle `t` column `j` captures output `m = t - T_f - R - j` of fold `f`.
fn capture_ws<F: MacFormat>(s: &Schedule, t: u64, st: &PeArrayState, out: &mut Matrix) -> u64 {
    let mut n = 0;
    let bottom = &st.psum[(s.rows - 1) * s.cols..];
    for (j, &ps) in bottom.iter().enumerate() {
        let Some((f, m, col)) = ws_capture(s, t, j) else { continue };
        let v = if s.folds[f].overwrite { ps } else { F::add(out.get(m, col), ps) };
        out.set(m, col, v);
        n += 1;
    }
    n
}

/// OS: the drain of fold `f` occupies the last R cycles of its period; returns `(f, d)` for
/// drain cycle `d`.
fn os_drain_row(s: &Schedule, t: u64) -> Option<(usize, usize)> {
    let p = s.period;
    let (f, off) = ((t / p) as usize, t % p);
    let drain_start = p - s.rows as u64;
    (f < s.folds.len() && off >= drain_start).then(|| (f, (off - drain_start) as usize))
}

/// OS accumulator: drain cycle `d` captures the bottom row, which holds original row `R-1-d`.
fn capture_os<F: MacFormat>(s: &Schedule, f: usize, d: usize, st: &PeArrayState, out: &mut Matrix) -> u64 {
    let fold = &s.folds[f];
    let i = s.rows - 1 - d;
    if i >= fold.mr {
        return 0;
    }
    let bottom = &st.psum[(s.rows - 1) * s.cols..];
    for (j, &ps) in bottom.iter().enumerate().take(fold.nc) {
        let (m, n) = (fold.m0 + i, fold.n0 + j);
        let v = if fold.overwrite { ps } else { F::add(out.get(m, n), ps) };
        out.set(m, n, v);
    }
    fold.nc as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HwConfig;
    use faultline_num::{Bf16Fp32, Precision};
    use proptest::prelude::*;

    proptest! {
        /// The closed-form WS state equals the stepped one at every cycle of a GEMM, every
        /// register of every PE but the partial sums, and those too in rows `0..d` after `d`
        /// cycles of stepping from it (what lets a faulty run start at its fault).
        #[test]
        fn the_closed_form_ws_state_is_the_stepped_state(
            rows in 1usize..=6, cols in 1usize..=6, m in 1usize..=12, k in 1usize..=14, n in 1usize..=14,
            seed in any::<u32>(), d in 0usize..=6,
        ) {
            let cfg = HwConfig::test_config(rows, cols, Dataflow::WeightStationary, Precision::Bf16Fp32);
            let bits = |i: usize, salt: u32| ((i as u32).wrapping_mul(2654435761) ^ salt ^ seed) >> 16 & 0x7fff;
            let a = Matrix::from_fn(m, k, |i, j| bits(i * k + j, 1));
            let w = Matrix::from_fn(k, n, |i, j| bits(i * n + j, 2));
            let s = Schedule::new(&cfg.mxu, m, k, n).unwrap();
            let step = |st: &mut PeArrayState, t: u64| {
                let (mut edge, mut next) = (Edge::new(rows, cols), st.clone());
                edge.drive_ws(&s, &a, &w, t);
                step_ws::<Bf16Fp32>(st, &mut next, &edge);
                *st = next;
            };
            let d = d.min(rows);
            let mut st = PeArrayState::new(rows, cols);
            for t in 0..s.total_cycles {
                let mut want = ws_state_at(&s, &a, &w, t);
                want.psum.clone_from(&st.psum);
                prop_assert!(same_ws(&st, &want), "cycle {t}: stepped {st:?}, closed form {want:?}");
                if t >= d as u64 {
                    let mut warm = ws_state_at(&s, &a, &w, t - d as u64);
                    (t - d as u64..t).for_each(|u| step(&mut warm, u));
                    prop_assert_eq!(&warm.psum[..d * cols], &st.psum[..d * cols], "cycle {}", t);
                }
                step(&mut st, t);
            }
        }
    }
}
