//! `faultline vcd` end to end: the shipped all-classes campaign (`configs/campaign-mlp-all.ron`)
//! is run once into a scratch directory, trials of each kind it samples are replayed, and
//! each VCD is read back with the `vcd` crate's parser. What is checked comes from outside the
//! replay: the record's fault, cycle, bit and corrupted count (from the campaign's own trial),
//! the functional model, and the executor's injected run of the same instruction.

use faultline_fault::{Campaign, CampaignSpec, RunOptions, Shard, TrialMode};
use faultline_hw::budget::HostMemory;
use faultline_hw::isa;
use faultline_hw::{ExecMode, FaultSchedule};
use faultline_report::vcd::{replay, Replay, VcdRequest};
use faultline_train::inject;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn spec_file() -> PathBuf {
    repo().join("configs/campaign-mlp-all.ron")
}

/// The campaign's directory, run once for every test of this file.
fn campaign() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vcd-mlp-all");
        let _ = std::fs::remove_dir_all(&out);
        let spec = CampaignSpec::load(&spec_file()).unwrap();
        let c = Campaign::prepare(spec, &spec_file(), &HostMemory::default()).unwrap();
        let opts = RunOptions { threads: 2, shard: Shard::ALL, resume: false, mode: TrialMode::Hybrid };
        c.run(&out, opts, |_| {}).unwrap();
        out
    })
}

/// Every record of the campaign.
fn records() -> Vec<Json> {
    let text = std::fs::read_to_string(campaign().join("records.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The first record of a single-bit flip in a class starting with `class` that ran (not
/// skipped) and changed its instruction's outputs (or reads).
fn pick(class: &str) -> Json {
    records()
        .into_iter()
        .find(|r| {
            r["class"].as_str().unwrap().starts_with(class)
                && r["model"] == "flip"
                && r["skipped"] == false
                && r["injection"]["corrupted"].as_u64().is_some_and(|c| c > 0)
        })
        .unwrap_or_else(|| panic!("the campaign has an unmasked {class} flip"))
}

fn replay_to(trial: u64, name: &str) -> (Replay, PathBuf) {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("vcd-{name}-{trial}.vcd"));
    let r = replay(&VcdRequest::new(campaign(), trial, &out), &HostMemory::default(), |_| {}).unwrap();
    (r, out)
}

/// A VCD file read back: every variable by dotted name, and its changes over time.
struct Waves {
    vars: HashMap<String, (vcd::IdCode, u32)>,
    changes: HashMap<vcd::IdCode, Vec<(u64, Option<u64>)>>,
    first: u64,
    last: u64,
}

impl Waves {
    fn read(path: &Path) -> Waves {
        let mut p = vcd::Parser::new(BufReader::new(File::open(path).unwrap()));
        let header = p.parse_header().unwrap();
        assert_eq!(header.timescale, Some((1, vcd::TimescaleUnit::NS)));
        let mut vars = HashMap::new();
        fn walk(items: &[vcd::ScopeItem], at: &str, vars: &mut HashMap<String, (vcd::IdCode, u32)>) {
            for i in items {
                match i {
                    vcd::ScopeItem::Scope(s) => walk(&s.items, &format!("{at}{}.", s.identifier), vars),
                    vcd::ScopeItem::Var(v) => {
                        vars.insert(format!("{at}{}", v.reference), (v.code, v.size));
                    }
                    _ => {}
                }
            }
        }
        walk(&header.items, "", &mut vars);
        let (mut changes, mut t, mut first, mut last) = (HashMap::new(), 0, None, 0);
        for cmd in p {
            let (id, v) = match cmd.unwrap() {
                vcd::Command::Timestamp(x) => {
                    t = x;
                    first.get_or_insert(x);
                    last = x;
                    continue;
                }
                vcd::Command::ChangeScalar(id, v) => (id, bits(std::iter::once(v))),
                vcd::Command::ChangeVector(id, v) => (id, bits(v.iter())),
                _ => continue,
            };
            changes.entry(id).or_insert_with(Vec::new).push((t, v));
        }
        Waves { vars, changes, first: first.unwrap(), last }
    }

    /// The value of `name` at time `t` (`None`: unknown, `x`).
    fn at(&self, name: &str, t: u64) -> Option<u64> {
        let (id, _) = self.vars.get(name).unwrap_or_else(|| panic!("the file has {name}"));
        let ch = &self.changes[id];
        ch[..ch.partition_point(|&(u, _)| u <= t)].last().and_then(|&(_, v)| v)
    }

    fn width(&self, name: &str) -> u32 {
        self.vars[name].1
    }
}

/// The value of VCD bits, most significant first (`None` if any is `x` or `z`).
fn bits(vals: impl Iterator<Item = vcd::Value>) -> Option<u64> {
    let mut acc = 0u64;
    for v in vals {
        acc = match v {
            vcd::Value::V0 => acc << 1,
            vcd::Value::V1 => acc << 1 | 1,
            _ => return None,
        };
    }
    Some(acc)
}

/// `mxu.pe[3][5].psum[30]` -> (`mxu.pe_3_5.psum`, 30): the signal a site's register is.
fn signal_of(fault: &str) -> (String, u32) {
    let site = fault.split_once(':').unwrap().1.split_once('@').unwrap().0;
    let (reg, bit) = site.rsplit_once('[').unwrap();
    let signal = reg.replace("][", "_").replace('[', "_").replace(']', "");
    (signal, bit.trim_end_matches(']').parse().unwrap())
}

/// The register the record's flip strikes is equal in both copies before the record's cycle,
/// differs in exactly the flipped bit at it, and `trial.fault` marks that cycle alone.
fn check_flip_in_file(w: &Waves, rec: &Json) {
    let (signal, bit) = signal_of(rec["fault"].as_str().unwrap());
    let cycle = rec["cycle"].as_u64().unwrap();
    let (g, f) = (format!("golden.{signal}"), format!("faulty.{signal}"));
    assert!(w.first < cycle && cycle < w.last, "the window {}..{} holds cycle {cycle}", w.first, w.last);
    for t in w.first..cycle {
        assert_eq!(w.at(&g, t), w.at(&f, t), "{signal} at {t}, before the fault at {cycle}");
    }
    let (gv, fv) = (w.at(&g, cycle).unwrap(), w.at(&f, cycle).unwrap());
    assert_eq!(gv ^ fv, 1 << bit, "{signal} at {cycle}: golden {gv:#x}, faulty {fv:#x}, bit {bit}");
    assert!(bit < w.width(&g));
    for t in w.first..w.last {
        assert_eq!(w.at("trial.fault", t), Some((t == cycle) as u64), "trial.fault at {t}");
    }
    assert_eq!(w.at("trial.diverged", cycle), Some(1));
    assert_eq!(w.at("trial.diverged", w.first), Some(0));
}

/// The replay's outputs against the functional model and the executor's injected run,
/// computed here through the public APIs, and its corrupted count against the record.
fn check_outputs(r: &Replay, rec: &Json) {
    let o = r.trace.outputs.as_ref().expect("a register replay has outputs");
    assert_eq!(o.golden, o.functional, "the fault-free replay is the functional model's result");
    assert_eq!(o.faulty, o.executor, "the faulty replay is the executor's");
    assert_ne!(o.golden, o.faulty);
    assert_eq!(r.trace.corrupted as u64, rec["injection"]["corrupted"].as_u64().unwrap(), "as the campaign recorded");
    assert_eq!(r.trace.instr as u64, rec["injection"]["instr"].as_u64().unwrap());

    // The same instruction on the same operands, through the executor's own path.
    let spec = CampaignSpec::load(&spec_file()).unwrap();
    let c = Campaign::prepare(spec, &spec_file(), &HostMemory::default()).unwrap();
    let (_, upset) = c.upset(r.trial);
    let mut tr = c.trainer();
    tr.restore_snapshot(c.golden_before(r.step).unwrap());
    let (inj, _) = inject::resolve_upset(&tr.exec, &tr.schedule, &upset).unwrap();
    let faults = inj.unwrap().register_faults(r.trace.instr).unwrap().clone();
    let ins = &tr.exec.program().instrs[r.trace.instr];
    let words = |bufs: &[Vec<u32>]| -> Vec<u32> {
        let len = ins.out_len();
        ins.dests().iter().flat_map(|d| bufs[d.buf.index()][d.offset..d.offset + len].to_vec()).collect()
    };
    let mut bufs = tr.buffers_before(r.trace.instr).unwrap();
    let mut functional = bufs.clone();
    isa::execute(&tr.exec.hw, ins, &mut functional, ExecMode::Functional, &FaultSchedule::none()).unwrap();
    assert_eq!(words(&functional), o.golden);
    isa::execute(&tr.exec.hw, ins, &mut bufs, ExecMode::CycleLevel, &faults).unwrap();
    assert_eq!(words(&bufs), o.faulty);
}

#[test]
fn an_mxu_pe_flip_shows_its_bit_at_its_cycle_and_the_outputs_the_trial_computed() {
    let rec = pick("mxu.pe[*][*].psum");
    let trial = rec["trial"].as_u64().unwrap();
    let (r, out) = replay_to(trial, "mxu");
    let w = Waves::read(&out);
    check_flip_in_file(&w, &rec);
    check_outputs(&r, &rec);
    // The faulted PE's row and column, every register kind of a WS array, both copies.
    assert_eq!(r.shown.len(), (32 + 32 - 1) * 6);
    assert_eq!(r.signals, 2 * r.shown.len() + 4);
    assert_eq!(w.vars.len(), r.signals);
    let d = r.trace.first_divergence.as_ref().unwrap();
    assert_eq!(d.cycle, rec["cycle"].as_u64().unwrap());
    assert_eq!(d.count, 1, "a flip changes one register at its cycle");
    // The register differs in the whole array exactly where the file says so.
    assert_eq!(w.at("trial.diff_regs", d.cycle), Some(1));
    assert_eq!(w.at("trial.diff_regs", d.cycle - 1), Some(0));
}

#[test]
fn an_mxu_act_flip_spreads_along_its_row() {
    let rec = pick("mxu.pe[*][*].act");
    let trial = rec["trial"].as_u64().unwrap();
    let (r, out) = replay_to(trial, "act");
    let w = Waves::read(&out);
    check_flip_in_file(&w, &rec);
    check_outputs(&r, &rec);
    // An activation moves one PE right per cycle: the faulty one reaches the next PE at once.
    let (signal, _) = signal_of(rec["fault"].as_str().unwrap());
    let (row, col): (u32, u32) = {
        let i: Vec<u32> = signal.split('.').nth(1).unwrap()[3..].split('_').map(|x| x.parse().unwrap()).collect();
        (i[0], i[1])
    };
    let cycle = rec["cycle"].as_u64().unwrap();
    if col + 1 < 32 {
        let next = format!("mxu.pe_{row}_{}.act", col + 1);
        assert_ne!(w.at(&format!("golden.{next}"), cycle + 1), w.at(&format!("faulty.{next}"), cycle + 1));
    }
}

#[test]
fn a_vpu_lane_flip_shows_its_bit_at_its_cycle_and_the_outputs_the_trial_computed() {
    let rec = pick("vpu.lane");
    let trial = rec["trial"].as_u64().unwrap();
    let (r, out) = replay_to(trial, "vpu");
    let w = Waves::read(&out);
    check_flip_in_file(&w, &rec);
    check_outputs(&r, &rec);
    assert_eq!(r.shown.len(), 6, "the lane's a, b, c, d, acc, out");
}

#[test]
fn a_memory_word_flip_shows_the_word_from_the_fault_to_its_reader() {
    for class in ["ub.word", "acc.word", "wbuf.word"] {
        let rec = pick(class);
        let trial = rec["trial"].as_u64().unwrap();
        let (r, out) = replay_to(trial, class);
        let w = Waves::read(&out);
        let (signal, bit) = signal_of(rec["fault"].as_str().unwrap());
        let cycle = rec["cycle"].as_u64().unwrap();
        let (g, f) = (format!("golden.{signal}"), format!("faulty.{signal}"));
        // Before the fault the word's contents are not tracked: unknown, not made up.
        assert_eq!((w.at(&g, cycle - 1), w.at(&f, cycle - 1)), (None, None), "{class}");
        let (gv, fv) = (w.at(&g, cycle).unwrap(), w.at(&f, cycle).unwrap());
        assert_eq!(gv ^ fv, 1 << bit, "{class}: golden {gv:#x}, faulty {fv:#x}");
        assert_eq!(w.at("trial.fault", cycle), Some(1));
        assert_eq!(w.at("trial.fault", cycle + 1), Some(0));
        // The first reader (a GEMM may read the word fold by fold while it runs) is marked
        // at its schedule's cycles, and the window runs to its end.
        let (start, end) = r.trace.span;
        assert!(end > cycle, "{class}: reader {start}..{end}, fault at {cycle}");
        assert_eq!(w.last, end, "{class}: the window ends with the reader");
        assert_eq!(w.at("trial.reader", start.max(w.first)), Some(1), "{class}");
        if start > w.first {
            assert_eq!(w.at("trial.reader", start - 1), Some(0), "{class}");
        }
        assert_eq!(r.trace.instr as u64, rec["injection"]["instr"].as_u64().unwrap(), "{class}: the first reader");
        assert_eq!(r.trace.corrupted as u64, rec["injection"]["corrupted"].as_u64().unwrap(), "{class}");
    }
}

#[test]
fn what_cannot_be_replayed_is_an_error_that_says_why() {
    let err = |req: VcdRequest| replay(&req, &HostMemory::default(), |_| {}).unwrap_err().to_string();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vcd-error.vcd");
    let e = err(VcdRequest::new(campaign(), 1_000_000, &out));
    assert!(e.contains("trial 1000000 is out of range") && e.contains("3800 trials"), "{e}");
    let e = err(VcdRequest::new(campaign().join("missing"), 1, &out));
    assert!(e.contains("missing/campaign.json"), "{e}");
    let seq = records().into_iter().find(|r| r["class"] == "seq.tile").unwrap();
    let e = err(VcdRequest::new(campaign(), seq["trial"].as_u64().unwrap(), &out));
    assert!(e.contains("sequencer register") && e.contains("PE, lane and memory-word sites"), "{e}");
    // A flip while the MXU runs nothing has no register to show.
    let idle = records()
        .into_iter()
        .find(|r| r["class"] == "mxu.pe[*][*].psum" && r["injection"]["unit_busy"] == false)
        .unwrap();
    let e = err(VcdRequest::new(campaign(), idle["trial"].as_u64().unwrap(), &out));
    assert!(e.contains("nothing to show") && e.contains("holds no operand"), "{e}");
    let pe = pick("mxu.pe[*][*].psum")["trial"].as_u64().unwrap();
    let e = err(VcdRequest { sites: vec!["vpu.lane[*].a".into()], ..VcdRequest::new(campaign(), pe, &out) });
    assert!(e.contains("--sites `vpu.lane[*].a` names no register of the MXU"), "{e}");
    let other = repo().join("configs/campaign-mlp-mxu.ron");
    let e = err(VcdRequest { spec: Some(other), ..VcdRequest::new(campaign(), pe, &out) });
    assert!(e.contains("differs from the spec") && e.contains("changed since it ran"), "{e}");
}

#[test]
fn sites_globs_add_registers_and_a_window_cuts_around_the_fault() {
    let rec = pick("mxu.pe[*][*].psum");
    let trial = rec["trial"].as_u64().unwrap();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vcd-sites.vcd");
    let req =
        VcdRequest { sites: vec!["mxu.pe[0][*].psum".into()], window: 16, ..VcdRequest::new(campaign(), trial, &out) };
    let r = replay(&req, &HostMemory::default(), |_| {}).unwrap();
    let w = Waves::read(&out);
    let (signal, _) = signal_of(rec["fault"].as_str().unwrap());
    let row: u32 = signal.split('.').nth(1).unwrap()[3..].split('_').next().unwrap().parse().unwrap();
    // Row 0's partial sums (31 new unless the fault is in row 0 or its column), and 16 cycles.
    let added = if row == 0 { 0 } else { 31 };
    assert_eq!(r.shown.len(), (32 + 32 - 1) * 6 + added);
    assert!(w.vars.contains_key("golden.mxu.pe_0_17.psum") && w.vars.contains_key("faulty.mxu.pe_0_31.psum"));
    assert!(r.trace.cut && r.trace.window.1 - r.trace.window.0 + 1 == 16, "{:?}", r.trace.window);
    let cycle = rec["cycle"].as_u64().unwrap();
    assert!(r.trace.window.0 <= cycle && cycle <= r.trace.window.1);
    check_flip_in_file(&w, &rec);
}
