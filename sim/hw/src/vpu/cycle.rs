//! The stepped lanes: their registers ([`LaneState`]) clocked one cycle at a time.

use super::lane::{combine, tree_stage};
use super::schedule::VpuSchedule;
use super::{lane_op, Axis, VpuOp};
use crate::config::HwConfig;
use crate::fault::{ActiveFault, FaultSchedule, FaultSite, Register};

/// Register state of the lanes, one array per register class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneState {
    /// Operand registers `a, b, c, d`, each `lanes` long.
    pub opnd: [Vec<u32>; 4],
    /// Reduction accumulators.
    pub acc: Vec<u32>,
    /// Result registers.
    pub out: Vec<u32>,
}

impl LaneState {
    /// The reset state: every register zero.
    pub fn new(lanes: usize) -> LaneState {
        LaneState { opnd: std::array::from_fn(|_| vec![0; lanes]), acc: vec![0; lanes], out: vec![0; lanes] }
    }

    /// Current bits of a VPU site's register (the whole register, not just the site's bit);
    /// 0 for a site that is not a lane register.
    pub fn read(&self, site: &FaultSite) -> u32 {
        let l = site.instance[0] as usize;
        let r = match site.register {
            Register::OpA => &self.opnd[0],
            Register::OpB => &self.opnd[1],
            Register::OpC => &self.opnd[2],
            Register::OpD => &self.opnd[3],
            Register::LaneAcc => &self.acc,
            Register::LaneOut => &self.out,
            _ => return 0,
        };
        r.get(l).copied().unwrap_or(0)
    }

    fn apply(&mut self, f: &ActiveFault) {
        let l = f.event.site.instance[0] as usize;
        let r = match f.event.site.register {
            Register::OpA => &mut self.opnd[0][l],
            Register::OpB => &mut self.opnd[1][l],
            Register::OpC => &mut self.opnd[2][l],
            Register::OpD => &mut self.opnd[3][l],
            Register::LaneAcc => &mut self.acc[l],
            Register::LaneOut => &mut self.out[l],
            _ => return,
        };
        *r = f.apply(*r);
    }
}

/// Steps the lanes cycle by cycle, calling `observe` after each commit (faults applied).
pub(super) fn cycle_level(
    cfg: &HwConfig,
    op: &VpuOp,
    inputs: &[&[u32]],
    n: usize,
    s: &VpuSchedule,
    faults: &FaultSchedule,
    mut observe: impl FnMut(u64, &LaneState),
) -> Vec<Vec<u32>> {
    let active: Vec<ActiveFault> = faults.events.iter().map(|e| e.activate(s.issue(e.at.tile as u64))).collect();
    let mut st = LaneState::new(cfg.vpu.lanes);
    let mut run_faults = |st: &mut LaneState, t: u64| {
        for f in active.iter().filter(|f| f.acts_at(t)) {
            st.apply(f);
        }
        observe(t, st);
    };
    match op.reduction() {
        None => elementwise_cycles(cfg, op, inputs, n, s, &mut st, &mut run_faults),
        Some((cols, axis, is_max)) => {
            reduce_cycles(cfg, op, inputs[0], n, cols, axis, is_max, s, &mut st, &mut run_faults)
        }
    }
}

fn elementwise_cycles(
    cfg: &HwConfig,
    op: &VpuOp,
    inputs: &[&[u32]],
    n: usize,
    s: &VpuSchedule,
    st: &mut LaneState,
    faults: &mut impl FnMut(&mut LaneState, u64),
) -> Vec<Vec<u32>> {
    let l = cfg.vpu.lanes;
    let d = cfg.vpu.pipeline_depth;
    let k = op.outputs() as u64;
    let nvec = s.vectors;
    let mut out = vec![vec![0u32; n]; k as usize];
    // ALU pipeline: results computed at cycle t latch into `out` at the end of t + D - 1.
    let mut pipe: Vec<Vec<u32>> = vec![vec![0; l]; d as usize];
    let elems = |v: u64| (v as usize * l)..((v as usize + 1) * l).min(n);
    for t in 0..s.cycles {
        // Reads of committed state.
        if t > d {
            let u = t - 1 - d;
            let (v, j) = (u / k, (u % k) as usize);
            if v < nvec {
                for (lane, e) in elems(v).enumerate() {
                    out[j][e] = st.out[lane];
                }
            }
        }
        // The ALU reads the committed operands; its result latches D - 1 cycles later.
        if t >= 1 {
            let u = t - 1;
            let (v, j) = (u / k, (u % k) as usize);
            if v < nvec {
                let p = &mut pipe[(t % d) as usize];
                for (lane, r) in p.iter_mut().enumerate().take(elems(v).len()) {
                    let x = [st.opnd[0][lane], st.opnd[1][lane], st.opnd[2][lane], st.opnd[3][lane]];
                    *r = lane_op(op, j, x);
                }
            }
        }
        // Commit: `out` latches the value computed at t - D + 1 (ring slot (t + 1) % D).
        if t >= d {
            let v = (t - d) / k;
            if v < nvec {
                let cnt = elems(v).len();
                let slot = ((t + 1) % d) as usize;
                st.out[..cnt].copy_from_slice(&pipe[slot][..cnt]);
            }
        }
        if t % k == 0 && t / k < nvec {
            let v = t / k;
            for (lane, e) in elems(v).enumerate() {
                for (i, inp) in inputs.iter().enumerate() {
                    st.opnd[i][lane] = inp[e];
                }
            }
        }
        faults(st, t);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn reduce_cycles(
    cfg: &HwConfig,
    op: &VpuOp,
    x: &[u32],
    n: usize,
    cols: usize,
    axis: Axis,
    is_max: bool,
    s: &VpuSchedule,
    st: &mut LaneState,
    faults: &mut impl FnMut(&mut LaneState, u64),
) -> Vec<Vec<u32>> {
    let l = cfg.vpu.lanes;
    let rows = n / cols;
    let groups = cols.div_ceil(l);
    // Per cycle: what the vector issued at t carries, what the accumulators do at t, what `out`
    // latches at t, and which output element is written back at t.
    #[derive(Clone, Copy)]
    enum AccAct {
        /// Lanes `0..cnt` load (first = true) or combine operand `a`.
        Vec { first: bool, cnt: usize },
        /// Tree stage over `valid` lanes.
        Stage { s: u32, valid: usize },
    }
    let total = s.cycles as usize;
    let mut issue: Vec<Option<(usize, usize)>> = vec![None; total]; // (first element, count)
    let mut acc_act: Vec<Option<AccAct>> = vec![None; total];
    let mut out_latch: Vec<Option<usize>> = vec![None; total]; // lanes to latch
    let mut wb: Vec<Option<(usize, usize, usize)>> = vec![None; total]; // (out index, lanes, stride)
    let mut out = vec![0u32; if axis == Axis::Col { cols } else { rows }];
    match axis {
        Axis::Col => {
            let mut t = 0usize;
            for g in 0..groups {
                let c0 = g * l;
                let cnt = l.min(cols - c0);
                for r in 0..rows {
                    issue[t] = Some((r * cols + c0, cnt));
                    acc_act[t + 1] = Some(AccAct::Vec { first: r == 0, cnt });
                    t += 1;
                }
                // Last vector issued at t-1: acc latched at t, out latches at t+1, written at t+2.
                out_latch[t + 1] = Some(cnt);
                wb[t + 2] = Some((c0, cnt, 1));
            }
        }
        Axis::Row => {
            let nv = cols.div_ceil(l);
            let valid = cols.min(l);
            let per = nv + s.stages as usize;
            for r in 0..rows {
                let t0 = r * per;
                for i in 0..nv {
                    let c0 = i * l;
                    let cnt = l.min(cols - c0);
                    issue[t0 + i] = Some((r * cols + c0, cnt));
                    acc_act[t0 + i + 1] = Some(AccAct::Vec { first: i == 0, cnt });
                }
                for st_i in 0..s.stages {
                    acc_act[t0 + nv + 1 + st_i as usize] = Some(AccAct::Stage { s: st_i, valid });
                }
                let te = t0 + nv + s.stages as usize;
                out_latch[te + 1] = Some(1);
                wb[te + 2] = Some((r, 1, 1));
            }
        }
    }
    for t in 0..total {
        if let Some((o0, cnt, _)) = wb[t] {
            out[o0..o0 + cnt].copy_from_slice(&st.out[..cnt]);
        }
        // Next state from committed state.
        let new_out = out_latch[t].map(|cnt| st.acc[..cnt].to_vec());
        let new_acc = acc_act[t].map(|a| {
            let mut acc = st.acc.clone();
            match a {
                AccAct::Vec { first, cnt } => {
                    for (lane, v) in acc.iter_mut().enumerate().take(cnt) {
                        let a = st.opnd[0][lane];
                        *v = if first { lane_op(op, 0, [a, 0, 0, 0]) } else { combine(is_max, *v, a) };
                    }
                }
                AccAct::Stage { s, valid } => tree_stage(&mut acc, valid, s, is_max),
            }
            acc
        });
        if let Some(v) = new_out {
            st.out[..v.len()].copy_from_slice(&v);
        }
        if let Some(a) = new_acc {
            st.acc = a;
        }
        if let Some((e0, cnt)) = issue[t] {
            st.opnd[0][..cnt].copy_from_slice(&x[e0..e0 + cnt]);
        }
        faults(st, t as u64);
    }
    vec![out]
}
