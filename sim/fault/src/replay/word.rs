//! The replay of a memory-word fault: not stepped; the word's golden and faulty values from
//! the fault through its first reader, from the buffers before that reader.

use super::{fail, memory, Divergence, Options, Shown, Source, Summary, Trace, Wave};
use crate::Result;
use faultline_hw::Unit;
use faultline_num::NumFormat;
use faultline_train::{Injection, StepFault};

/// Cycles of a memory word shown before the fault (as unknown: the word's earlier contents
/// are not tracked), so that a viewer shows the fault arriving.
const WORD_LEAD: u64 = 16;

/// Replays a memory-word fault: the word's golden and faulty value from the fault through its
/// first reader.
pub(super) fn replay(opts: &Options, src: &Source, upset: &[StepFault], inj: &Injection) -> Result<Trace> {
    if !opts.sites.is_empty() {
        return Err(fail(format!(
            "--sites adds PE or lane registers; this trial's fault is in a memory word ({}), whose replay shows \
             the word",
            upset[0].site
        )));
    }
    let (exec, sched) = (src.exec(), src.sched());
    let (hw, p) = (&exec.hw, exec.program());
    let site = upset[0].site;
    let hits = inj.hits();
    let h0 = *hits.iter().find(|h| h.instr == Some(inj.instr())).unwrap_or(&hits[0]);
    let reader = h0.instr;
    let bufs = src.buffers_before(reader.unwrap_or(p.instrs.len()))?;
    let fmt = hw.mxu.input_format;
    // The first read of the element, every bit of the upset composed.
    let same = hits
        .iter()
        .enumerate()
        .filter(|(_, h)| (h.instr, h.buf, h.elem, h.part) == (h0.instr, h0.buf, h0.elem, h0.part));
    let Some(&(_, _, old, new)) = memory::compose(same, &bufs, fmt).first() else {
        return Err(fail(format!(
            "buffer {} holds no element {} when it is read",
            p.buffers[h0.buf.index()].name,
            h0.elem
        )));
    };
    let shown = Shown::new(hw, site);
    // The word holds what its format stores: the weight buffer, converted MXU inputs.
    let (gw, fw) = if site.unit == Unit::Wbuf && fmt == NumFormat::Bf16 {
        (faultline_num::f32_to_bf16_bits(f32::from_bits(old)), new >> 16)
    } else {
        (old, new)
    };
    let mask = if shown.width >= 32 { u32::MAX } else { (1 << shown.width) - 1 };
    let (gw, fw) = (gw & mask, fw & mask);
    let f = upset[0].on_step_clock();
    let step_end = sched.total_cycles;
    let span = |i: usize| (sched.instrs[i].start, sched.instrs[i].start + sched.instrs[i].cycles);
    let mut readers: Vec<usize> = hits.iter().filter_map(|h| h.instr).collect();
    readers.sort_unstable();
    readers.dedup();
    let end = reader.map_or(step_end, |r| span(r).1).max(f.start + 1);
    let from = f.start.saturating_sub(WORD_LEAD);
    let to = end.min(from + opts.window.max(WORD_LEAD + 1));
    let len = (to - from) as usize;
    let known = |t: u64| t >= f.start;
    let golden: Vec<Option<u32>> = (from..to).map(|t| known(t).then_some(gw)).collect();
    let faulty: Vec<Option<u32>> = (from..to).map(|t| known(t).then_some(fw)).collect();
    let fault = (from..to).map(|t| Some(f.acts_at(t) as u32)).collect();
    let reading =
        (from..to).map(|t| Some(readers.iter().any(|&r| (span(r).0..span(r).1).contains(&t)) as u32)).collect();
    let mut wave = Wave { first: from, len, shown: vec![shown.clone()], golden, faulty, markers: Vec::new() };
    let diverged = wave.diverged();
    wave.markers = vec![("fault".into(), 1, fault), ("diverged".into(), 1, diverged), ("reader".into(), 1, reading)];
    // Every read the fault changes, with the values the buffers hold before the first reader
    // (a read word keeps its element's value until the element is written again).
    let all = memory::compose(hits.iter().enumerate(), &bufs, fmt);
    let corrupted = all.iter().filter(|(_, _, o, n)| o != n).count();
    let elements: std::collections::BTreeSet<(u32, usize)> = hits.iter().map(|h| (h.buf.0, h.elem)).collect();
    let mut notes = Vec::new();
    if elements.len() > 1 {
        notes.push(format!(
            "the fault lasts while {} buffer elements live in the word; the file shows the first",
            elements.len()
        ));
    }
    let instr = reader.unwrap_or(inj.instr());
    let more: Vec<String> =
        readers.iter().filter(|&&r| r != instr).map(|&r| format!("{r}: {}", src.describe(r))).collect();
    if !more.is_empty() {
        notes.push(format!("read again by instruction{} {}", if more.len() > 1 { "s" } else { "" }, more.join("; ")));
    }
    if hits.iter().any(|h| h.instr.is_none()) {
        notes.push("read by the host after the step (a value the step keeps)".into());
    }
    let first = (gw != fw).then(|| Divergence {
        cycle: f.start,
        registers: vec![shown.name.clone()],
        count: 1,
        golden: shown.show(gw),
        faulty: shown.show(fw),
        bits: (0..32).filter(|b| (gw ^ fw) >> b & 1 == 1).collect(),
    });
    Ok(Trace {
        wave,
        summary: Summary {
            inference: false,
            instr,
            instr_name: src.describe(instr),
            span: span(instr),
            fault_cycles: (f.start, f.end.min(step_end)),
            lands: format!("the word holds element {} of buffer `{}`", h0.elem, p.buffers[h0.buf.index()].name),
            window: (from, to - 1),
            cut: to < end,
            first_divergence: first,
            last_divergence: None,
            peak: 1,
            touched: 1,
            unit: "word".into(),
            outputs: None,
            elements: hits.len(),
            corrupted,
            clock_mhz: hw.clock_mhz,
            notes,
        },
    })
}
