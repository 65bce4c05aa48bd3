//! Folding a trace's trials back onto the hardware: per class and unit, per PE, per bit, per
//! phase, layer, instruction and step. Everything the report shows is computed here, once;
//! the writers only format it.

use crate::load::{Curve, Trace};
use faultline_fault::record::{summarize, ClassInfo, OutcomeShare, PhaseRecord, Summary};
use faultline_fault::spec::Mode;
use faultline_fault::stats::{stratified, Estimate};
use faultline_fault::Outcome;
use std::collections::BTreeMap;

/// Heatmap cells with fewer trials than this are marked "too few", not coloured.
pub const MIN_CELL_TRIALS: u64 = 3;

/// Outcome counts of a group of trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Trials per outcome, [`Outcome::ALL`] order.
    pub outcomes: [u64; Outcome::ALL.len()],
}

impl Counts {
    /// Counts one trial.
    pub fn add(&mut self, o: Outcome) {
        self.outcomes[o.index()] += 1;
    }

    /// The counts behind a summary's outcome shares.
    pub fn of_shares(shares: &[OutcomeShare]) -> Counts {
        let mut c = Counts::default();
        for s in shares {
            c.outcomes[s.outcome.index()] = s.share.k;
        }
        c
    }

    /// Trials counted.
    pub fn trials(&self) -> u64 {
        self.outcomes.iter().sum()
    }

    /// Trials of outcome `o`.
    pub fn of(&self, o: Outcome) -> u64 {
        self.outcomes[o.index()]
    }

    fn matching(&self, f: fn(Outcome) -> bool) -> u64 {
        Outcome::ALL.iter().filter(|&&o| f(o)).map(|&o| self.of(o)).sum()
    }

    /// Share not masked (the vulnerability factor), with its Wilson interval.
    pub fn unmasked(&self) -> Estimate {
        Estimate::of(self.matching(Outcome::unmasked), self.trials())
    }

    /// Share that made training (or inference) fail, with its Wilson interval.
    pub fn failure(&self) -> Estimate {
        Estimate::of(self.matching(Outcome::failure), self.trials())
    }
}

/// One site class's row of the vulnerability table.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassRow {
    /// What the campaign recorded about the class.
    pub info: ClassInfo,
    /// Its trials' outcomes.
    pub counts: Counts,
    /// Trials skipped as provably dead.
    pub skipped: u64,
    /// Vulnerability: the summary's, so under `Adaptive` sampling its bit fields weigh by
    /// their bits (else the share of its trials).
    pub unmasked: Estimate,
    /// Failure share, as `unmasked` is.
    pub failure: Estimate,
    /// `fit_per_bit x bits x unmasked` (lo, p, hi), when the campaign gives a raw FIT.
    pub fit_unmasked: Option<[f64; 3]>,
    /// `fit_per_bit x bits x failure` (lo, p, hi).
    pub fit_failure: Option<[f64; 3]>,
}

/// A unit's total over its classes (bit-weighted: each class's rate counts by its bits).
#[derive(Debug, Clone, PartialEq)]
pub struct UnitRow {
    /// Display name (`MXU`, `VPU`, `unified buffer`, ..., `control`).
    pub unit: String,
    /// Bits of its selected classes.
    pub bits: u64,
    /// Trials.
    pub trials: u64,
    /// Vulnerability factor (p, lo, hi).
    pub unmasked: [f64; 3],
    /// Training-failure share (p, lo, hi).
    pub failure: [f64; 3],
    /// Failure FIT (sum over its classes), when the campaign gives a raw FIT.
    pub fit_failure: Option<f64>,
}

/// Trials and outcomes of one PE of one register kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cell {
    /// Trials anchored in the PE.
    pub trials: u64,
    /// Of which unmasked.
    pub unmasked: u64,
    /// Of which training failed.
    pub failures: u64,
}

/// The PE array of one register kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// Class pattern, e.g. `mxu.pe[*][*].psum`.
    pub class: String,
    /// Register name.
    pub register: String,
    /// Array rows.
    pub rows: usize,
    /// Array columns.
    pub cols: usize,
    /// Row-major cells.
    pub cells: Vec<Cell>,
}

/// Outcome rates per bit position of one class.
#[derive(Debug, Clone, PartialEq)]
pub struct BitProfile {
    /// Class pattern.
    pub class: String,
    /// Number format of its values, if any (`fp32`, `bf16`, `int8`, `int32`).
    pub format: Option<String>,
    /// Per bit (index = bit): counts.
    pub bits: Vec<Counts>,
    /// The share of the class's faults its trials were drawn from: 1, or under `Adaptive`
    /// sampling its live share (the rest is provably dead: masked).
    pub share: f64,
}

impl BitProfile {
    /// A rate among this class's trials as a rate over all its faults: the trials' rate times
    /// [`BitProfile::share`]. Exact per bit, since a class's live share is the same for each
    /// of its bits.
    pub fn over_all(&self, e: Estimate) -> Estimate {
        Estimate { p: e.p * self.share, lo: e.lo * self.share, hi: e.hi * self.share, ..e }
    }
}

/// One row of a breakdown (by phase, layer, instruction or step).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRow {
    /// The group's name.
    pub name: String,
    /// Its trials' outcomes.
    pub counts: Counts,
}

/// One class's place in the protection ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank {
    /// Class pattern.
    pub class: String,
    /// Bits protecting it would cover.
    pub bits: u64,
    /// Training-failure probability per faulty bit (the class's failure share).
    pub failure_per_bit: f64,
    /// That probability's Wilson 95% interval `[lo, hi]`.
    pub failure_ci: [f64; 2],
    /// Trials that failed, of [`Rank::trials`]: what the estimate rests on.
    pub failures: u64,
    /// Trials of the class.
    pub trials: u64,
    /// Its share of the selected classes' total failure rate (bits x failure, normalised).
    pub share: f64,
    /// Failure FIT it contributes, when the campaign gives a raw FIT.
    pub fit_failure: Option<f64>,
    /// Failure FIT removed per protected bit (= raw FIT x failure share).
    pub fit_per_protected_bit: Option<f64>,
}

/// A faulty trial's test accuracy at the end of its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyPoint {
    /// Injection step.
    pub step: u64,
    /// Test accuracy (golden's at the window end plus the trial's delta).
    pub accuracy: f64,
    /// The trial's outcome.
    pub outcome: Outcome,
}

/// Everything a report shows, computed from one trace.
#[derive(Debug, Clone)]
pub struct Report {
    /// The summary `faultline campaign` writes, recomputed from the records.
    pub summary: Summary,
    /// Outcomes that can occur in this campaign's mode, in table order.
    pub outcomes: Vec<Outcome>,
    /// Per class, grouped by unit in the campaign's order.
    pub classes: Vec<ClassRow>,
    /// Per unit.
    pub units: Vec<UnitRow>,
    /// Per MXU register kind.
    pub heatmaps: Vec<Heatmap>,
    /// Per class with more than one bit.
    pub bit_profiles: Vec<BitProfile>,
    /// By training phase of the instruction struck (not-simulated trials apart).
    pub by_phase: Vec<GroupRow>,
    /// By layer.
    pub by_layer: Vec<GroupRow>,
    /// By instruction kind.
    pub by_op: Vec<GroupRow>,
    /// By injection step (every trial: the step is known for skipped ones too).
    pub by_step: Vec<GroupRow>,
    /// Classes ranked by failure contribution per protected bit.
    pub ranking: Vec<Rank>,
    /// Golden loss per step (step `s` at `s - 1`).
    pub golden_losses: Vec<f64>,
    /// Sampled faulty loss curves.
    pub curves: Vec<Curve>,
    /// Golden test accuracy at each injection step's window end.
    pub golden_accuracy: Vec<(u64, f64)>,
    /// Faulty trials' test accuracy at their window end.
    pub accuracy: Vec<AccuracyPoint>,
}

/// The name of the row of trials not simulated (provably dead: masked by construction).
pub const NOT_SIMULATED: &str = "not simulated (provably dead)";

/// Display name of a unit's totals row: control registers (sequencer, DMA) are one group.
pub fn unit_name(unit: &str) -> &'static str {
    match unit {
        "mxu" => "MXU",
        "vpu" => "VPU",
        "ub" => "unified buffer",
        "acc" => "accumulator SRAM",
        "wbuf" => "weight buffer",
        "dram" => "DRAM",
        _ => "control",
    }
}

pub use faultline_fault::sample::bit_field;

/// For each of `intervals` (`[p, lo, hi]`, in rank order), the other ranks (0-based) whose
/// intervals overlap its own: the ones this campaign cannot tell it apart from. Overlapping
/// 95% intervals are a conservative reading (two rates can differ while their intervals
/// still touch), so a rank listed apart is apart, and a tie says "not shown to differ".
pub fn ties(intervals: &[[f64; 3]]) -> Vec<Vec<usize>> {
    let overlap = |a: &[f64; 3], b: &[f64; 3]| a[1] <= b[2] && b[1] <= a[2];
    intervals
        .iter()
        .enumerate()
        .map(|(i, a)| (0..intervals.len()).filter(|&j| j != i && overlap(a, &intervals[j])).collect())
        .collect()
}

/// `[p, lo, hi]` of an estimate.
fn pih(e: Estimate) -> [f64; 3] {
    [e.p, e.lo, e.hi]
}

/// Folds `trace` into a [`Report`].
pub fn aggregate(trace: &Trace) -> Report {
    let info = &trace.info;
    // Per-class counts are the summary's: `faultline campaign` computes it the same way.
    let summary = summarize(info, trace.keys());
    let mut bits: Vec<Vec<Counts>> = info.classes.iter().map(|c| vec![Counts::default(); c.width as usize]).collect();
    let mut cells: Vec<Vec<Cell>> = info
        .classes
        .iter()
        .map(|c| {
            if c.unit == "mxu" && c.dims[1] > 1 {
                vec![Cell::default(); c.dims[0] as usize * c.dims[1] as usize]
            } else {
                Vec::new()
            }
        })
        .collect();
    let mut by_phase = [Counts::default(); PhaseRecord::ALL.len()];
    let mut by_layer = vec![Counts::default(); trace.layers.len()];
    let mut by_op = vec![Counts::default(); trace.ops.len()];
    let mut dead = Counts::default();
    let mut by_step: BTreeMap<u64, Counts> = BTreeMap::new();
    let window_acc: BTreeMap<u64, f64> = info.golden.window_accuracy.iter().copied().collect();
    let mut accuracy = Vec::new();
    for t in &trace.trials {
        let c = t.class as usize;
        if let Some(b) = bits[c].get_mut(t.bit as usize) {
            b.add(t.outcome);
        }
        if let Some(cell) = cells[c].get_mut(t.element as usize) {
            cell.trials += 1;
            cell.unmasked += t.outcome.unmasked() as u64;
            cell.failures += t.outcome.failure() as u64;
        }
        match t.landed {
            Some(l) => {
                by_phase[PhaseRecord::ALL.iter().position(|&p| p == l.phase).unwrap_or(0)].add(t.outcome);
                by_layer[l.layer as usize].add(t.outcome);
                by_op[l.op as usize].add(t.outcome);
            }
            None => dead.add(t.outcome),
        }
        by_step.entry(t.step).or_default().add(t.outcome);
        if let (Some(d), Some(g)) = (t.test_accuracy_delta, window_acc.get(&t.step)) {
            accuracy.push(AccuracyPoint { step: t.step, accuracy: g + d, outcome: t.outcome });
        }
    }
    let fit = info.spec.fit_per_bit;
    let classes: Vec<ClassRow> = info
        .classes
        .iter()
        .zip(&summary.classes)
        .map(|(ci, cs)| {
            let scale = |e: Estimate| fit.map(|f| pih(e).map(|x| f * ci.bits as f64 * x));
            let counts = Counts::of_shares(&cs.outcomes);
            ClassRow {
                info: ci.clone(),
                counts,
                skipped: cs.skipped_dead,
                unmasked: cs.unmasked,
                failure: cs.failure,
                fit_unmasked: scale(cs.unmasked),
                fit_failure: scale(cs.failure),
            }
        })
        .collect();
    let mut units: Vec<UnitRow> = Vec::new();
    for name in classes.iter().map(|c| unit_name(&c.info.unit)) {
        if units.iter().any(|u| u.unit == name) {
            continue;
        }
        let rows: Vec<&ClassRow> = classes.iter().filter(|c| unit_name(&c.info.unit) == name).collect();
        let ubits: u64 = rows.iter().map(|c| c.info.bits).sum();
        let combine = |f: fn(&ClassRow) -> Estimate| {
            // One class: its own interval; several: the bit-weighted combination.
            if let [c] = rows[..] {
                return pih(f(c));
            }
            let strata: Vec<(f64, Estimate)> =
                rows.iter().map(|c| (c.info.bits as f64 / ubits.max(1) as f64, f(c))).collect();
            let (p, lo, hi) = stratified(&strata);
            [p, lo, hi]
        };
        units.push(UnitRow {
            unit: name.to_string(),
            bits: ubits,
            trials: rows.iter().map(|c| c.counts.trials()).sum(),
            unmasked: combine(|c| c.unmasked),
            failure: combine(|c| c.failure),
            fit_failure: fit.map(|_| rows.iter().filter_map(|c| c.fit_failure.map(|f| f[0])).sum()),
        });
    }
    let heatmaps = info
        .classes
        .iter()
        .zip(cells)
        .filter(|(_, cells)| !cells.is_empty())
        .map(|(ci, cells)| Heatmap {
            class: ci.class.clone(),
            register: ci.register.clone(),
            rows: ci.dims[0] as usize,
            cols: ci.dims[1] as usize,
            cells,
        })
        .collect();
    let bit_profiles = info
        .classes
        .iter()
        .zip(bits)
        .filter(|(ci, _)| ci.width > 1)
        .map(|(ci, bits)| BitProfile {
            class: ci.class.clone(),
            format: ci.format.clone(),
            bits,
            share: ci.sampled_share.unwrap_or(1.0),
        })
        .collect();
    let rows = |names: &[String], counts: &[Counts]| -> Vec<GroupRow> {
        names.iter().zip(counts).map(|(n, &counts)| GroupRow { name: n.clone(), counts }).collect()
    };
    let with_dead = |mut v: Vec<GroupRow>| {
        if dead.trials() > 0 {
            v.push(GroupRow { name: NOT_SIMULATED.to_string(), counts: dead });
        }
        v
    };
    let phases: Vec<String> = PhaseRecord::ALL.iter().map(|p| p.name().to_string()).collect();
    let mut by_layer = rows(&trace.layers, &by_layer);
    by_layer.sort_by(|a, b| a.name.cmp(&b.name));
    let mut by_op = rows(&trace.ops, &by_op);
    by_op.sort_by(|a, b| b.counts.trials().cmp(&a.counts.trials()).then(a.name.cmp(&b.name)));
    let total_rate: f64 = classes.iter().map(|c| c.info.bits as f64 * c.failure.p).sum();
    let mut ranking: Vec<Rank> = classes
        .iter()
        .map(|c| {
            let e = c.failure;
            let p = e.p;
            Rank {
                class: c.info.class.clone(),
                bits: c.info.bits,
                failure_per_bit: p,
                failure_ci: [e.lo, e.hi],
                failures: e.k,
                trials: e.n,
                share: if total_rate > 0.0 { c.info.bits as f64 * p / total_rate } else { 0.0 },
                fit_failure: c.fit_failure.map(|f| f[0]),
                fit_per_protected_bit: fit.map(|f| f * p),
            }
        })
        .collect();
    ranking.sort_by(|a, b| {
        b.failure_per_bit.total_cmp(&a.failure_per_bit).then(b.share.total_cmp(&a.share)).then(a.class.cmp(&b.class))
    });
    // Protection's outcomes appear only in a protected campaign's tables.
    let shown = |o: &Outcome| info.protection.is_some() || !o.protection_only();
    let outcomes = match info.spec.mode {
        Mode::Training => Outcome::ALL.iter().copied().filter(|o| !o.inference_only() && shown(o)).collect(),
        Mode::Inference => {
            Outcome::ALL.iter().copied().filter(|o| (o.inference_only() || !o.unmasked()) && shown(o)).collect()
        }
    };
    Report {
        summary,
        outcomes,
        classes,
        units,
        heatmaps,
        bit_profiles,
        by_phase: with_dead(rows(&phases, &by_phase)),
        by_layer: with_dead(by_layer),
        by_op: with_dead(by_op),
        by_step: by_step.into_iter().map(|(s, counts)| GroupRow { name: s.to_string(), counts }).collect(),
        ranking,
        golden_losses: info.golden.losses.clone(),
        curves: trace.curves.clone(),
        golden_accuracy: info.golden.window_accuracy.clone(),
        accuracy,
    }
}
