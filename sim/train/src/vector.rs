//! Lowering of every non-MXU op onto vector-unit instructions ([`faultline_hw::vpu`]).
//!
//! Each graph op becomes a short sequence of fp32 VPU instructions (add, multiply, exp,
//! reciprocal, rsqrt, row/column reductions, fused SGD), run in the executor's [`ExecMode`], so
//! the VPU's lane registers see every value and the two modes agree bit for bit. What the VPU
//! does not compute is done exactly, or on a scalar path, and is listed here:
//! * data movement (broadcasting a row vector or a per-row scalar across lanes, im2col gathers,
//!   repeats, reshapes) is a copy, as UB addressing would do it: no arithmetic;
//! * op constants (`1/D`, learning rate, decay factors, Adam's bias corrections) are computed
//!   on the host in f64 and rounded once to fp32, as a scalar unit loads an immediate;
//! * the natural log of the per-row softmax sums in the cross-entropy *loss value* is a host
//!   f32 `ln` of `N` scalars (the VPU has no log; the gradient does not need it).
//!
//! Compositions: `x / s` is `x * recip(s)`, `sqrt(v)` is `recip(rsqrt(v))`, and
//! `tanh(u) = 1 - 2 / (exp(2u) + 1)`.

use crate::error::Result;
use faultline_graph::{Op, Window};
use faultline_hw::vpu::{self, Axis, VpuOp};
use faultline_hw::{ExecMode, FaultSchedule, HwConfig};

/// The vector unit of one machine in one mode, with a count of issued instructions.
#[derive(Debug)]
pub struct Vpu<'a> {
    cfg: &'a HwConfig,
    mode: ExecMode,
    /// VPU instructions issued so far.
    pub instructions: u64,
    /// Cycles of the instructions issued so far (from the VPU's schedule: the same in every mode).
    pub cycles: u64,
    /// A fault schedule for the instruction with this issue number (run cycle-level).
    armed: Option<(u64, FaultSchedule)>,
}

impl<'a> Vpu<'a> {
    /// The VPU of `cfg`, executed in `mode`.
    pub fn new(cfg: &'a HwConfig, mode: ExecMode) -> Vpu<'a> {
        Vpu { cfg, mode, instructions: 0, cycles: 0, armed: None }
    }

    /// Injects `faults` into the instruction with issue number `at` (counted from 0 over the
    /// life of this `Vpu`); that instruction runs cycle-level.
    pub fn arm(&mut self, at: u64, faults: FaultSchedule) {
        self.armed = Some((at, faults));
    }

    /// Cancels [`Vpu::arm`].
    pub fn disarm(&mut self) {
        self.armed = None;
    }

    /// Runs one instruction and returns its first output.
    fn op(&mut self, op: VpuOp, ins: &[&[f32]]) -> Result<Vec<f32>> {
        Ok(self.op_all(op, ins)?.swap_remove(0))
    }

    fn op_all(&mut self, op: VpuOp, ins: &[&[f32]]) -> Result<Vec<Vec<f32>>> {
        let n = self.instructions;
        self.instructions += 1;
        let (out, stats) = match &self.armed {
            Some((at, faults)) if *at == n => vpu::run_f32(self.cfg, op, ins, ExecMode::CycleLevel, faults)?,
            _ => vpu::run_f32(self.cfg, op, ins, self.mode, &FaultSchedule::none())?,
        };
        self.cycles += stats.cycles;
        Ok(out)
    }

    fn add(&mut self, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
        self.op(VpuOp::Add, &[a, b])
    }
    fn sub(&mut self, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
        self.op(VpuOp::Sub, &[a, b])
    }
    fn mul(&mut self, a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
        self.op(VpuOp::Mul, &[a, b])
    }
    fn muls(&mut self, a: &[f32], s: f64) -> Result<Vec<f32>> {
        self.op(VpuOp::MulScalar(s as f32), &[a])
    }
    fn adds(&mut self, a: &[f32], s: f64) -> Result<Vec<f32>> {
        self.op(VpuOp::AddScalar(s as f32), &[a])
    }
    fn un(&mut self, op: VpuOp, a: &[f32]) -> Result<Vec<f32>> {
        self.op(op, &[a])
    }
    /// One sum per row of `cols`.
    fn row_sum(&mut self, x: &[f32], cols: usize) -> Result<Vec<f32>> {
        self.op(VpuOp::ReduceSum { cols, axis: Axis::Row }, &[x])
    }
    /// One maximum per row of `cols`.
    fn row_max(&mut self, x: &[f32], cols: usize) -> Result<Vec<f32>> {
        self.op(VpuOp::ReduceMax { cols, axis: Axis::Row }, &[x])
    }
    /// One sum per column of a row-major matrix with `cols` columns.
    fn col_sum(&mut self, x: &[f32], cols: usize) -> Result<Vec<f32>> {
        self.op(VpuOp::ReduceSum { cols, axis: Axis::Col }, &[x])
    }

    /// `1 - 2 / (exp(2u) + 1)`: saturates to ±1 without overflow trouble.
    fn tanh(&mut self, u: &[f32]) -> Result<Vec<f32>> {
        let u2 = self.muls(u, 2.0)?;
        let e = self.un(VpuOp::Exp, &u2)?;
        let e1 = self.adds(&e, 1.0)?;
        let r = self.un(VpuOp::Recip, &e1)?;
        let m = self.muls(&r, -2.0)?;
        self.adds(&m, 1.0)
    }

    fn softmax(&mut self, x: &[f32], c: usize) -> Result<Vec<f32>> {
        let m = self.row_max(x, c)?;
        let s = self.sub(x, &per_row(&m, c))?;
        let e = self.un(VpuOp::Exp, &s)?;
        let se = self.row_sum(&e, c)?;
        let r = self.un(VpuOp::Recip, &se)?;
        self.mul(&e, &per_row(&r, c))
    }

    /// `(x - mean, 1 / sqrt(var + eps))` per row of `d`.
    fn centre_and_inv_std(&mut self, x: &[f32], d: usize, eps: f64) -> Result<(Vec<f32>, Vec<f32>)> {
        let s = self.row_sum(x, d)?;
        let mean = self.muls(&s, 1.0 / d as f64)?;
        let xc = self.sub(x, &per_row(&mean, d))?;
        let sq = self.mul(&xc, &xc)?;
        let ss = self.row_sum(&sq, d)?;
        let var = self.muls(&ss, 1.0 / d as f64)?;
        let ve = self.adds(&var, eps)?;
        let inv = self.un(VpuOp::Rsqrt, &ve)?;
        Ok((xc, inv))
    }

    /// `u = sqrt(2/pi) * (x + 0.044715 x^3)` for GELU and its derivative.
    fn gelu_arg(&mut self, x: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let x2 = self.mul(x, x)?;
        let x3 = self.mul(&x2, x)?;
        let ax3 = self.muls(&x3, GELU_A)?;
        let inner = self.add(x, &ax3)?;
        Ok((x2, self.muls(&inner, GELU_C)?))
    }

    /// Computes one non-MXU op. `ins` are the input values with their shapes. Placeholders
    /// and `MatMul` are not VPU ops (`None`).
    pub fn apply(&mut self, op: &Op, ins: &[(&[f32], &[usize])], out_shape: &[usize]) -> Result<Option<Vec<f32>>> {
        let x = ins.first().map(|i| i.0).unwrap_or(&[]);
        let y = ins.get(1).map(|i| i.0).unwrap_or(&[]);
        let xs = ins.first().map(|i| i.1).unwrap_or(&[]);
        let last = *xs.last().unwrap_or(&1);
        Ok(Some(match op {
            Op::Input | Op::Label | Op::Step | Op::Param | Op::OptState | Op::MatMul { .. } => return Ok(None),
            Op::Im2Col { window } => im2col(x, xs, window, out_shape),
            Op::Col2Im { window, image } => self.col2im(x, window, image)?,
            Op::Reshape { .. } => x.to_vec(),
            Op::BiasAdd => self.add(x, &tile(y, x.len()))?,
            Op::RowScale => self.mul(x, &tile(y, x.len()))?,
            Op::Add => self.add(x, y)?,
            Op::Mul => self.mul(x, y)?,
            Op::Scale { factor } => self.muls(x, *factor)?,
            Op::SumToShape { shape } => self.col_sum(x, shape.iter().product())?,
            Op::Relu => self.un(VpuOp::Relu, x)?,
            Op::ReluGrad => self.op(VpuOp::ReluGrad, &[x, y])?,
            Op::Gelu => {
                let (_, u) = self.gelu_arg(x)?;
                let t = self.tanh(&u)?;
                let t1 = self.adds(&t, 1.0)?;
                let hx = self.muls(x, 0.5)?;
                self.mul(&hx, &t1)?
            }
            Op::GeluGrad => {
                // dy * (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2))
                let (x2, u) = self.gelu_arg(x)?;
                let t = self.tanh(&u)?;
                let t1 = self.adds(&t, 1.0)?;
                let left = self.muls(&t1, 0.5)?;
                let tt = self.mul(&t, &t)?;
                let ntt = self.muls(&tt, -1.0)?;
                let sech2 = self.adds(&ntt, 1.0)?;
                let p = self.muls(&x2, 3.0 * GELU_A)?;
                let p1 = self.adds(&p, 1.0)?;
                let hx = self.muls(x, 0.5 * GELU_C)?;
                let r1 = self.mul(&sech2, &p1)?;
                let right = self.mul(&hx, &r1)?;
                let d = self.add(&left, &right)?;
                self.mul(y, &d)?
            }
            Op::Softmax => self.softmax(x, last)?,
            Op::SoftmaxGrad => {
                let p = self.mul(y, x)?;
                let s = self.row_sum(&p, last)?;
                let d = self.sub(y, &per_row(&s, last))?;
                self.mul(x, &d)?
            }
            Op::LayerNorm { eps } => {
                let (xc, inv) = self.centre_and_inv_std(x, last, *eps)?;
                self.mul(&xc, &per_row(&inv, last))?
            }
            Op::LayerNormGrad { eps } => {
                let d = last;
                let (xc, inv) = self.centre_and_inv_std(x, d, *eps)?;
                let inv_b = per_row(&inv, d);
                let yn = self.mul(&xc, &inv_b)?;
                let sdy = self.row_sum(y, d)?;
                let mdy = self.muls(&sdy, 1.0 / d as f64)?;
                let dyy = self.mul(y, &yn)?;
                let sdyy = self.row_sum(&dyy, d)?;
                let mdyy = self.muls(&sdyy, 1.0 / d as f64)?;
                let a = self.sub(y, &per_row(&mdy, d))?;
                let b = self.mul(&yn, &per_row(&mdyy, d))?;
                let t = self.sub(&a, &b)?;
                self.mul(&t, &inv_b)?
            }
            Op::MeanPool => {
                let (n, t, d) = (xs[0], xs[1], xs[2]);
                let mut s = Vec::with_capacity(n * d);
                for ni in 0..n {
                    s.extend(self.col_sum(&x[ni * t * d..(ni + 1) * t * d], d)?);
                }
                self.muls(&s, 1.0 / t as f64)?
            }
            Op::MeanPoolGrad { len } => {
                let v = self.muls(x, 1.0 / *len as f64)?;
                repeat_rows(&v, xs[1], *len)
            }
            Op::SoftmaxCrossEntropy => vec![self.cross_entropy(x, y, last)?],
            Op::SoftmaxCrossEntropyGrad => {
                let p = self.softmax(x, last)?;
                let sy = self.row_sum(y, last)?;
                let t = self.mul(&p, &per_row(&sy, last))?;
                let d = self.sub(&t, y)?;
                self.muls(&d, 1.0 / (x.len() / last) as f64)?
            }
            Op::Mse => {
                let d = self.sub(x, y)?;
                let sq = self.mul(&d, &d)?;
                let s = self.row_sum(&sq, sq.len())?;
                self.muls(&s, 1.0 / x.len() as f64)?
            }
            Op::MseGrad => {
                let d = self.sub(x, y)?;
                self.muls(&d, 2.0 / x.len() as f64)?
            }
            Op::SgdUpdate { lr } => self.op(VpuOp::Sgd { lr: *lr as f32 }, &[x, y])?,
            Op::MomentumVelocity { momentum } => {
                let mv = self.muls(x, *momentum)?;
                self.add(&mv, y)?
            }
            Op::AdamMoment { beta } => {
                let a = self.muls(x, *beta)?;
                let b = self.muls(y, 1.0 - beta)?;
                self.add(&a, &b)?
            }
            Op::AdamSecondMoment { beta } => {
                let a = self.muls(x, *beta)?;
                let gg = self.mul(y, y)?;
                let b = self.muls(&gg, 1.0 - beta)?;
                self.add(&a, &b)?
            }
            Op::AdamUpdate { lr, beta1, beta2, eps } => {
                let t = ins[3].0.first().copied().unwrap_or(1.0) as f64;
                let mh = self.muls(y, 1.0 / (1.0 - beta1.powf(t)))?;
                let vh = self.muls(ins[2].0, 1.0 / (1.0 - beta2.powf(t)))?;
                let rs = self.un(VpuOp::Rsqrt, &vh)?;
                let sq = self.un(VpuOp::Recip, &rs)?;
                let den = self.adds(&sq, *eps)?;
                let rd = self.un(VpuOp::Recip, &den)?;
                let q = self.mul(&mh, &rd)?;
                let step = self.muls(&q, *lr)?;
                self.sub(x, &step)?
            }
        }))
    }

    /// `-(1/N) sum y * (z - max - ln(sum exp(z - max)))`; the `ln` of the N row sums is scalar.
    fn cross_entropy(&mut self, z: &[f32], y: &[f32], c: usize) -> Result<f32> {
        let m = self.row_max(z, c)?;
        let s = self.sub(z, &per_row(&m, c))?;
        let e = self.un(VpuOp::Exp, &s)?;
        let se = self.row_sum(&e, c)?;
        let lse: Vec<f32> = se.iter().map(|v| v.ln()).collect();
        let logp = self.sub(&s, &per_row(&lse, c))?;
        let t = self.mul(y, &logp)?;
        let total = self.row_sum(&t, t.len())?;
        Ok(self.muls(&total, -1.0 / (z.len() / c) as f64)?[0])
    }

    /// col2im: for each kernel offset, the entries it copied form one image-sized vector of
    /// contributions (a gather); the `KH*KW` vectors are summed with VPU adds in offset order.
    fn col2im(&mut self, cols: &[f32], w: &Window, img: &[usize]) -> Result<Vec<f32>> {
        let c = img[3];
        let ncols = w.kh * w.kw * c;
        let mut contrib = vec![vec![0f32; img.iter().product()]; w.kh * w.kw];
        w.for_each_im2col_pixel(img, |row, off, src| {
            let from = row * ncols + off * c;
            contrib[off][src..src + c].copy_from_slice(&cols[from..from + c]);
        });
        let mut offsets = contrib.into_iter();
        let first = offsets.next().unwrap_or_default();
        offsets.try_fold(first, |acc, v| self.add(&acc, &v))
    }
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_A: f64 = 0.044715;

/// Each of `v`'s values repeated `c` times (a per-row scalar broadcast across a row).
fn per_row(v: &[f32], c: usize) -> Vec<f32> {
    v.iter().flat_map(|&s| std::iter::repeat_n(s, c)).collect()
}

/// `b` repeated to length `n` (a row vector broadcast over leading dimensions).
fn tile(b: &[f32], n: usize) -> Vec<f32> {
    b.iter().copied().cycle().take(n).collect()
}

/// Rows of `d` values, each repeated `t` times: `[N, D] -> [N, T, D]`.
fn repeat_rows(v: &[f32], d: usize, t: usize) -> Vec<f32> {
    v.chunks(d).flat_map(|row| std::iter::repeat_n(row, t).flatten().copied()).collect()
}

/// im2col gather (exact: a copy with zeros in the padding), as the graph's `Im2Col` defines it.
pub fn im2col(x: &[f32], img: &[usize], w: &Window, out_shape: &[usize]) -> Vec<f32> {
    let (cols, c) = (out_shape[1], img[3]);
    let mut out = vec![0f32; out_shape.iter().product()];
    w.for_each_im2col_pixel(img, |row, off, src| {
        let dst = row * cols + off * c;
        out[dst..dst + c].copy_from_slice(&x[src..src + c]);
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultline_graph::Tensor;

    /// Every VPU lowering agrees with the f64 reference op to fp32 accuracy, in both modes
    /// bit-identically.
    #[test]
    fn lowerings_match_reference_ops() {
        let cfg =
            HwConfig::test_config(4, 4, faultline_hw::Dataflow::WeightStationary, faultline_num::Precision::Fp32Fp32);
        let vals =
            |n: usize, s: u32| -> Vec<f32> { (0..n).map(|i| (((i as u32 * 7 + s) % 13) as f32 - 6.0) / 4.0).collect() };
        let win = Window { kh: 2, kw: 2, stride: 1, padding: 1 };
        let probs: Vec<f32> = {
            let p = vals(12, 1).iter().map(|v| v.exp()).collect::<Vec<_>>();
            p.chunks(4)
                .flat_map(|r| {
                    let s: f32 = r.iter().sum();
                    r.iter().map(move |v| v / s)
                })
                .collect()
        };
        let onehot: Vec<f32> = (0..12).map(|i| if i % 4 == i / 4 { 1.0 } else { 0.0 }).collect();
        type Args = Vec<(Vec<f32>, Vec<usize>)>;
        let cases: Vec<(Op, Args)> = vec![
            (Op::BiasAdd, vec![(vals(12, 0), vec![3, 4]), (vals(4, 1), vec![4])]),
            (Op::RowScale, vec![(vals(12, 0), vec![3, 4]), (vals(4, 1), vec![4])]),
            (Op::Scale { factor: 0.3 }, vec![(vals(12, 0), vec![3, 4])]),
            (Op::SumToShape { shape: vec![4] }, vec![(vals(12, 0), vec![3, 4])]),
            (Op::Relu, vec![(vals(12, 0), vec![3, 4])]),
            (Op::ReluGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
            (Op::Gelu, vec![(vals(12, 0), vec![3, 4])]),
            (Op::GeluGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
            (Op::Softmax, vec![(vals(12, 0), vec![3, 4])]),
            (Op::SoftmaxGrad, vec![(probs.clone(), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
            (Op::LayerNorm { eps: 1e-5 }, vec![(vals(12, 0), vec![3, 4])]),
            (Op::LayerNormGrad { eps: 1e-5 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 3), vec![3, 4])]),
            (Op::MeanPool, vec![(vals(24, 0), vec![2, 3, 4])]),
            (Op::MeanPoolGrad { len: 3 }, vec![(vals(8, 0), vec![2, 4])]),
            (Op::SoftmaxCrossEntropy, vec![(vals(12, 0), vec![3, 4]), (onehot.clone(), vec![3, 4])]),
            (Op::SoftmaxCrossEntropyGrad, vec![(vals(12, 0), vec![3, 4]), (onehot, vec![3, 4])]),
            (Op::Mse, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
            (Op::MseGrad, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
            (Op::SgdUpdate { lr: 0.1 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
            (Op::MomentumVelocity { momentum: 0.9 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
            (Op::AdamMoment { beta: 0.9 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
            (Op::AdamSecondMoment { beta: 0.999 }, vec![(vals(12, 0), vec![3, 4]), (vals(12, 5), vec![3, 4])]),
            (
                Op::AdamUpdate { lr: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
                vec![
                    (vals(12, 0), vec![3, 4]),
                    (vals(12, 5), vec![3, 4]),
                    (vals(12, 2).iter().map(|v| v * v).collect(), vec![3, 4]),
                    (vec![3.0], vec![1]),
                ],
            ),
            (Op::Im2Col { window: win }, vec![(vals(18, 0), vec![1, 3, 3, 2])]),
            (Op::Col2Im { window: win, image: vec![1, 3, 3, 2] }, vec![(vals(16 * 8, 0), vec![16, 8])]),
        ];
        for (op, ins) in cases {
            let shapes: Vec<&[usize]> = ins.iter().map(|(_, s)| s.as_slice()).collect();
            let out_shape = op.output_shape(&shapes).unwrap();
            let tens: Vec<Tensor> =
                ins.iter().map(|(d, s)| Tensor::new(s, d.iter().map(|&v| v as f64).collect()).unwrap()).collect();
            let want = faultline_graph::reference::apply(&op, &tens.iter().collect::<Vec<_>>(), &out_shape);
            let args: Vec<(&[f32], &[usize])> = ins.iter().map(|(d, s)| (d.as_slice(), s.as_slice())).collect();
            let got = Vpu::new(&cfg, ExecMode::Functional).apply(&op, &args, &out_shape).unwrap().unwrap();
            let cyc = Vpu::new(&cfg, ExecMode::CycleLevel).apply(&op, &args, &out_shape).unwrap().unwrap();
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                cyc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{op:?}"
            );
            assert_eq!(got.len(), want.len(), "{op:?}");
            for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "{op:?}[{k}]: {g} vs {w}");
            }
        }
    }
}
