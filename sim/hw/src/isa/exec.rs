//! The interpreters: one instruction executed on a table of buffers ([`execute`], at cycle
//! level with its fault-free result [`execute_faulty`], or with edited VPU operands
//! [`execute_vpu_edited`]), and the GEMM operand loads they share.

use super::{cycles, BufId, Dest, Instr, MatOperand};
use crate::error::HwError;
use crate::fault::FaultSchedule;
use crate::matrix::Matrix;
use crate::{mxu, vpu, ExecMode, HwConfig};
use faultline_num::NumFormat;
use std::borrow::Cow;

/// One fp32 word as the MXU's input converter rounds it to `format` (what [`gemm_operands`]
/// does to every operand word).
pub fn to_input(format: NumFormat, raw: u32) -> u32 {
    mxu::with_input_converter!(format, convert => convert(raw))
}

/// The `rows x cols` matrix stored at the front of `s` (transposed: stored `[cols][rows]`), with
/// every fp32 word rounded to the MXU's input format by its input converter.
fn load_matrix(format: NumFormat, s: &[u32], rows: usize, cols: usize, transposed: bool) -> Matrix {
    fn gather(s: &[u32], rows: usize, cols: usize, transposed: bool, f: impl Fn(u32) -> u32) -> Vec<u32> {
        if !transposed {
            return s[..rows * cols].iter().map(|&x| f(x)).collect();
        }
        // Transposed in square blocks, then converted in one contiguous, vectorisable pass.
        let mut data = vec![0u32; rows * cols];
        crate::matrix::untranspose_into(s, rows, cols, &mut data, |x| x);
        for x in &mut data {
            *x = f(*x);
        }
        data
    }
    let data = mxu::with_input_converter!(format, convert => gather(s, rows, cols, transposed, convert));
    Matrix { rows, cols, data }
}

/// The operands of a GEMM as the MXU receives them: `A` (`M x K`) and `B` (`K x N`) read from
/// `bufs` and rounded to the input format by the input converters; `None` for other
/// instructions. Errors if a buffer holds too few words.
pub fn gemm_operands(cfg: &HwConfig, instr: &Instr, bufs: &[Vec<u32>]) -> Result<Option<(Matrix, Matrix)>, HwError> {
    let Instr::Gemm { a, b, m, k, n, .. } = instr else { return Ok(None) };
    let src = |o: &MatOperand, rows: usize, cols: usize| -> Result<Matrix, HwError> {
        let s = operand(instr, bufs, o.buf, o.offset, rows * cols)?;
        Ok(load_matrix(cfg.mxu.input_format, s, rows, cols, o.transposed))
    };
    Ok(Some((src(a, *m, *k)?, src(b, *k, *n)?)))
}

/// What an accumulating GEMM ([`Instr::Gemm`]'s `acc`) adds to: its result's words as they are
/// (accumulator-format bits); `None` for other instructions. Errors if the buffer is too short.
pub fn accumulators(instr: &Instr, bufs: &[Vec<u32>]) -> Result<Option<Matrix>, HwError> {
    let &Instr::Gemm { out, m, n, acc: true, .. } = instr else { return Ok(None) };
    let have = bufs[out.buf.index()].len();
    let data = bufs[out.buf.index()]
        .get(out.offset..out.offset + m * n)
        .ok_or_else(|| missing(instr, "accumulated output", out.buf, out.offset + m * n, have))?;
    Ok(Some(Matrix { rows: m, cols: n, data: data.to_vec() }))
}

/// Executes `instr` on `cfg` in `mode`, reading and writing `bufs` (one word vector per buffer;
/// an empty destination buffer written from word 0 receives the output vector whole, so a
/// caller sizes a buffer first only when instructions fill it in parts). `faults` (sites of the
/// instruction's unit, times relative to its own schedule as in [`crate::mxu`] and
/// [`crate::vpu`]) need [`ExecMode::CycleLevel`]. Returns the instruction's cycles.
pub fn execute(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
) -> Result<u64, HwError> {
    match instr {
        Instr::Gemm { .. } => Ok(execute_gemm(cfg, instr, bufs, mode, faults, false)?.0),
        Instr::Vpu { .. } => execute_vpu(cfg, instr, bufs, mode, faults, None),
        Instr::Dma { src, src_offset, dst, dst_offset, len, .. } => {
            let (src, dst, len) = (*src, Dest { buf: *dst, offset: *dst_offset }, *len);
            if bufs[src.index()].len() < src_offset + len {
                return Err(missing(instr, "source", src, src_offset + len, bufs[src.index()].len()));
            }
            if src == dst.buf {
                let b = &mut bufs[src.index()];
                if b.len() < dst.offset + len {
                    return Err(missing(instr, "destination", dst.buf, dst.offset + len, b.len()));
                }
                b.copy_within(*src_offset..src_offset + len, dst.offset);
                return Ok(cycles(cfg, instr));
            }
            // The source is taken out for the copy (no temporary vector) and put back.
            let from = std::mem::take(&mut bufs[src.index()]);
            let done = put(&mut bufs[dst.buf.index()], dst.offset, Cow::Borrowed(&from[*src_offset..src_offset + len]));
            bufs[src.index()] = from;
            done.map_err(|have| missing(instr, "destination", dst.buf, dst.offset + len, have))?;
            Ok(cycles(cfg, instr))
        }
    }
}

/// [`execute`] for a GEMM: its cycles and, with `golden`, its fault-free result (from the run
/// itself when it computed it on the way, [`mxu::GemmOutput::golden`], else from a functional
/// run on the same operands).
fn execute_gemm(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
    golden: bool,
) -> Result<(u64, Option<Vec<u32>>), HwError> {
    let &Instr::Gemm { a, b, out, m, k, n, acc } = instr else { unreachable!("execute_gemm runs GEMMs") };
    if mode == ExecMode::Functional && faults.is_empty() && !golden && out.buf != a.buf && out.buf != b.buf {
        return Ok((gemm_in_place(cfg, instr, bufs, (a, b, out), (m, k, n), acc)?, None));
    }
    let (am, bm) = gemm_operands(cfg, instr, bufs)?.expect("a GEMM has operands");
    let acc = accumulators(instr, bufs)?;
    let res = mxu::gemm_into(cfg, &am, &bm, acc.as_ref(), mode, faults)?;
    let fault_free = match (golden, res.golden) {
        (false, _) => None,
        (true, Some(g)) => Some(g.data),
        (true, None) => {
            Some(mxu::gemm_into(cfg, &am, &bm, acc.as_ref(), ExecMode::Functional, &FaultSchedule::none())?.out.data)
        }
    };
    write_result(instr, bufs, out, res.out.data)?;
    Ok((res.stats.total_cycles, fault_free))
}

/// A fault-free functional GEMM read from its operands' buffers and written into its output's
/// ([`mxu::functional_in_place`]): the same bits and errors as loading the operands
/// ([`gemm_operands`]) and writing the result ([`write_result`]), without the copies. The
/// output is another buffer than the operands'. Returns its cycles.
fn gemm_in_place(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    (a, b, out): (MatOperand, MatOperand, Dest),
    (m, k, n): (usize, usize, usize),
    acc: bool,
) -> Result<u64, HwError> {
    let mut dst = std::mem::take(&mut bufs[out.buf.index()]);
    let run = |dst: &mut Vec<u32>| {
        let src = |o: &MatOperand, len: usize| {
            Ok::<_, HwError>(mxu::Raw {
                words: &operand(instr, bufs, o.buf, o.offset, len)?[..len],
                transposed: o.transposed,
            })
        };
        let (ar, br) = (src(&a, m * k)?, src(&b, k * n)?);
        // Accumulators must hold their words already: an empty buffer is filled only for a
        // plain result.
        let what = if acc { "accumulated output" } else { "output" };
        let region = destination(instr, dst, out, m * n, what, !acc)?;
        Ok(mxu::functional_in_place(cfg, ar, br, (m, k, n), region, acc)?.total_cycles)
    };
    let res = run(&mut dst);
    bufs[out.buf.index()] = dst;
    res
}

/// [`execute`] at cycle level with `faults`, also returning what each destination's written
/// words ([`Instr::dests`] order, `out_len` each) would be without them: from the run itself
/// when it computed them (a windowed faulty GEMM), else from a functional run first.
pub fn execute_faulty(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    faults: &FaultSchedule,
) -> Result<(u64, Vec<Vec<u32>>), HwError> {
    if matches!(instr, Instr::Gemm { .. }) {
        let (c, golden) = execute_gemm(cfg, instr, bufs, ExecMode::CycleLevel, faults, true)?;
        return Ok((c, golden.into_iter().collect()));
    }
    let (dests, len) = (instr.dests(), instr.out_len());
    let before: Vec<Vec<u32>> = dests.iter().map(|d| bufs[d.buf.index()].clone()).collect();
    execute(cfg, instr, bufs, ExecMode::Functional, &FaultSchedule::none())?;
    let mut golden = Vec::with_capacity(dests.len());
    for (d, b) in dests.iter().zip(before) {
        let all = std::mem::replace(&mut bufs[d.buf.index()], b);
        golden.push(all[d.offset..d.offset + len].to_vec());
    }
    let c = execute(cfg, instr, bufs, ExecMode::CycleLevel, faults)?;
    Ok((c, golden))
}

/// [`execute`] for a VPU instruction whose operands, as the lanes read them (operand `o`'s
/// element `e`: `inputs[o][e]`, after the view's gather), `edit` may change first.
pub fn execute_vpu_edited(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
    edit: &mut OperandEdit<'_>,
) -> Result<u64, HwError> {
    execute_vpu(cfg, instr, bufs, mode, faults, Some(edit))
}

/// A change to a VPU instruction's gathered operands (see [`execute_vpu_edited`]).
pub type OperandEdit<'a> = dyn FnMut(&mut [Vec<u32>]) + 'a;

fn execute_vpu(
    cfg: &HwConfig,
    instr: &Instr,
    bufs: &mut [Vec<u32>],
    mode: ExecMode,
    faults: &FaultSchedule,
    edit: Option<&mut OperandEdit<'_>>,
) -> Result<u64, HwError> {
    let Instr::Vpu { op, n, ins, outs, acc } = instr else { unreachable!("execute_vpu runs VPU instructions") };
    let n = *n;
    let apart = outs
        .iter()
        .enumerate()
        .all(|(j, d)| !ins.iter().any(|o| o.buf == d.buf) && !outs[..j].iter().any(|e| e.buf == d.buf));
    if mode == ExecMode::Functional && faults.is_empty() && edit.is_none() && !*acc && apart {
        return vpu_in_place(cfg, instr, bufs);
    }
    let mut inputs = Vec::with_capacity(ins.len());
    for o in ins {
        inputs.push(o.view.gather(operand(instr, bufs, o.buf, o.offset, o.view.span(n))?, n));
    }
    if let (true, Some(d), Some(x)) = (*acc, outs.first(), inputs.first_mut()) {
        // The output's words enter first, as a row before the input's.
        let len = instr.out_len();
        let Some(init) = bufs[d.buf.index()].get(d.offset..d.offset + len) else {
            return Err(missing(instr, "accumulated output", d.buf, d.offset + len, bufs[d.buf.index()].len()));
        };
        *x = Cow::Owned(init.iter().chain(x.iter()).copied().collect());
    }
    let res = match edit {
        None => {
            let refs: Vec<&[u32]> = inputs.iter().map(|c| c.as_ref()).collect();
            vpu::run(cfg, *op, &refs, mode, faults)?
        }
        Some(edit) => {
            let mut owned: Vec<Vec<u32>> = inputs.into_iter().map(|c| c.into_owned()).collect();
            edit(&mut owned);
            let refs: Vec<&[u32]> = owned.iter().map(|c| c.as_slice()).collect();
            vpu::run(cfg, *op, &refs, mode, faults)?
        }
    };
    for (d, v) in outs.iter().zip(res.out) {
        write_result(instr, bufs, *d, v)?;
    }
    Ok(res.stats.cycles)
}

/// A fault-free functional VPU instruction that reads no buffer it writes (and writes each
/// buffer once, not accumulating): its results computed straight into their destinations
/// ([`vpu::run_into`]). The same bits and errors as [`execute_vpu`]'s copying path. Returns its
/// cycles.
fn vpu_in_place(cfg: &HwConfig, instr: &Instr, bufs: &mut [Vec<u32>]) -> Result<u64, HwError> {
    let Instr::Vpu { op, n, ins, outs, .. } = instr else { unreachable!("vpu_in_place runs VPU instructions") };
    let len = instr.out_len();
    // The destinations leave the table while the operands are read from it.
    let mut dsts: Vec<Vec<u32>> = outs.iter().map(|d| std::mem::take(&mut bufs[d.buf.index()])).collect();
    let run = |dsts: &mut [Vec<u32>]| {
        if let ([o], [d], [dst], 1, None) = (&ins[..], &outs[..], &mut dsts[..], op.inputs(), op.reduction()) {
            if o.view != super::View::Whole {
                // One input through a gathered view (an im2col, a repeat): gathered straight
                // into the destination, where the op then runs in place.
                let s = operand(instr, bufs, o.buf, o.offset, o.view.span(*n))?;
                let region = destination(instr, dst, *d, len, "output", true)?;
                o.view.gather_into(s, *n, region);
                return Ok(vpu::run_in_place(cfg, *op, region)?.cycles);
            }
        }
        let mut regions = Vec::with_capacity(outs.len());
        for (d, dst) in outs.iter().zip(dsts.iter_mut()) {
            regions.push(destination(instr, dst, *d, len, "output", true)?);
        }
        if op.reduction().is_none() && ins.iter().any(|o| o.view != super::View::Whole) {
            // An elementwise op reading through a view (a bias's broadcast, a col2im tap):
            // gathered a chunk at a time into cache, not into a whole-length copy.
            let mut srcs = Vec::with_capacity(ins.len());
            for o in ins {
                srcs.push((&o.view, operand(instr, bufs, o.buf, o.offset, o.view.span(*n))?));
            }
            let gathers: Vec<_> =
                srcs.iter().map(|&(v, s)| move |e0: usize, out: &mut [u32]| v.gather_range(s, e0, out)).collect();
            let chunked: Vec<vpu::Chunked<'_>> = srcs
                .iter()
                .zip(&gathers)
                .map(|(&(v, s), g)| match v {
                    super::View::Whole => vpu::Chunked::Words(s),
                    _ => vpu::Chunked::Gathered(g),
                })
                .collect();
            return Ok(vpu::run_into_gathered(cfg, *op, *n, &chunked, &mut regions)?.cycles);
        }
        let mut inputs = Vec::with_capacity(ins.len());
        for o in ins {
            inputs.push(o.view.gather(operand(instr, bufs, o.buf, o.offset, o.view.span(*n))?, *n));
        }
        let refs: Vec<&[u32]> = inputs.iter().map(|c| c.as_ref()).collect();
        Ok(vpu::run_into(cfg, *op, &refs, &mut regions)?.cycles)
    };
    let res = run(&mut dsts);
    for (d, dst) in outs.iter().zip(dsts) {
        bufs[d.buf.index()] = dst;
    }
    res
}

/// The words of operand buffer `b` of `instr` from `offset`, at least `need` of them.
fn operand<'a>(
    instr: &Instr,
    bufs: &'a [Vec<u32>],
    b: BufId,
    offset: usize,
    need: usize,
) -> Result<&'a [u32], HwError> {
    let s = bufs[b.index()].get(offset..).unwrap_or(&[]);
    if s.len() < need {
        return Err(missing(instr, "operand", b, offset + need, offset + s.len()));
    }
    Ok(s)
}

/// Words `d.offset..d.offset + len` of `dst`, destination `d` of `instr` (taken out of the
/// table), for a result written in place (`what`: which output, for the error). With `fill`,
/// an empty buffer written from word 0 first becomes `len` zeros: it becomes the result, as
/// in [`execute`].
fn destination<'a>(
    instr: &Instr,
    dst: &'a mut Vec<u32>,
    d: Dest,
    len: usize,
    what: &str,
    fill: bool,
) -> Result<&'a mut [u32], HwError> {
    if fill && dst.is_empty() && d.offset == 0 {
        *dst = vec![0; len];
    }
    let have = dst.len();
    dst.get_mut(d.offset..d.offset + len).ok_or_else(|| missing(instr, what, d.buf, d.offset + len, have))
}

/// The error for a buffer `b` of `instr` holding `have` words where it needs `need`.
fn missing(instr: &Instr, what: &str, b: BufId, need: usize, have: usize) -> HwError {
    HwError::Shape {
        op: instr.name().to_string(),
        detail: format!("{what} buffer {} holds {have} words, the instruction needs {need}", b.0),
    }
}

/// Writes `v`, one result of `instr` (`out_len` words), at `d` (see [`execute`] for how an
/// empty destination is filled). Errors if the destination holds too few words.
pub fn write_result(instr: &Instr, bufs: &mut [Vec<u32>], d: Dest, mut v: Vec<u32>) -> Result<(), HwError> {
    let len = instr.out_len();
    v.truncate(len);
    put(&mut bufs[d.buf.index()], d.offset, Cow::Owned(v))
        .map_err(|have| missing(instr, "output", d.buf, d.offset + len, have))
}

/// Writes `v` at word `offset` of `buf`; an empty buffer written from word 0 takes `v` whole.
/// `Err(words held)` if the buffer is too short.
fn put(buf: &mut Vec<u32>, offset: usize, v: Cow<'_, [u32]>) -> Result<(), usize> {
    if buf.is_empty() && offset == 0 {
        *buf = v.into_owned();
        return Ok(());
    }
    let have = buf.len();
    buf.get_mut(offset..offset + v.len()).ok_or(have)?.copy_from_slice(&v);
    Ok(())
}
