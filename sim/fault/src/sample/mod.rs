//! The space a campaign samples, (bit, cycle, step) over its site classes, and the trial plan:
//! trial `t`'s anchor is a pure function of the campaign seed and `t` (ChaCha8), so any shard,
//! thread or resumed run draws the same faults.
//!
//! Under a protection plan, the check bits a code adds to a selected class are sites too: one
//! more stratum per coded class (`ub.word.check`), after every data class, so the data
//! classes' trials are the unprotected campaign's very draws under stratified sampling.

use crate::error::{FaultError, Result};
use crate::model::Anchor;
use crate::protect::EccInfo;
use crate::spec::{CampaignSpec, FaultModel, Sampling, MAX_TRIALS};
use faultline_graph::StepSchedule;
use faultline_hw::fault::glob_match;
use faultline_hw::{HwConfig, SiteClass};
use faultline_train::inject::space::{windows, LiveWindow};
use faultline_train::{Executor, StepFault};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::{Arc, RwLock};

pub use region::Region;

mod region;

/// One selected class, or the check bits a code adds to one: its bits and the windows in which
/// they may be live.
#[derive(Debug, Clone)]
pub struct ClassSpace {
    /// The class.
    pub class: SiteClass,
    /// Bits in it.
    pub bits: u64,
    /// Its possibly live (element, cycle) windows in a step ([`faultline_train::inject::space`]); a
    /// code's check bits are live when their word's data is.
    pub live: Vec<LiveWindow>,
    /// For the stratum of a code's check bits: check bits per element; 0 for the data bits.
    pub check_bits: u32,
}

impl ClassSpace {
    /// The stratum's name in records and summaries: the class's pattern, with `.check` for a
    /// code's check bits.
    pub fn pattern(&self) -> String {
        check_pattern(self.class, self.check_bits)
    }

    /// Bits per element sampled in this stratum.
    pub fn width(&self, hw: &HwConfig) -> u32 {
        if self.check_bits > 0 {
            self.check_bits
        } else {
            self.class.width(hw)
        }
    }
}

/// The name of `class`'s data bits (`check_bits` 0) or of the check bits a code adds to it.
pub fn check_pattern(class: SiteClass, check_bits: u32) -> String {
    if check_bits > 0 {
        format!("{}.check", class.pattern())
    } else {
        class.pattern()
    }
}

/// The sampled space: the selected classes over every injection step's cycles.
#[derive(Debug, Clone)]
pub struct Space {
    /// Selected classes, in `faultline sites` order.
    pub classes: Vec<ClassSpace>,
    /// Injection steps.
    pub steps: Vec<u64>,
    /// Cycles sampled in one step: all of them (every step runs the same program), or 1 for
    /// faults covering whole steps.
    pub cycles: u64,
    /// How trials are drawn.
    pub sampling: Sampling,
    /// Campaign seed.
    pub seed: u64,
    /// Under `Adaptive`: the strata (a class's bit field each), class after class.
    pub strata: Vec<FieldStratum>,
    /// Under `Adaptive`, per class: the (element, cycle) pairs where its faults are sampled,
    /// those whose upset may be live (with `skip_dead: false`, all of them).
    pub reach: Vec<Arc<Region>>,
    /// Under `Adaptive`: the trials of each stratum in each round planned so far; trials are
    /// numbered round after round, stratum after stratum ([`Space::plan_round`]).
    pub rounds: Arc<RwLock<Vec<Vec<u64>>>>,
}

/// A stratum of adaptive sampling: the bits of one field of one class's elements, at the
/// (element, cycle) pairs where a fault may be live ([`Space::reach`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldStratum {
    /// Index of the class in [`Space::classes`].
    pub class: usize,
    /// The field ([`field_of`]).
    pub field: &'static str,
    /// Its bit positions in an element (of the class's sampled width).
    pub positions: Vec<u32>,
    /// Its share of the whole sampled space (bits x cycles x steps of every class): the
    /// shares sum to the live share, the rest being provably dead and masked.
    pub weight: f64,
}

/// The field of bit `bit` in a value of `format`: `sign`, `exponent` or `mantissa` for floats,
/// `sign` or `magnitude` for two's-complement integers; `""` without a format.
pub fn bit_field(format: Option<&str>, bit: u32) -> &'static str {
    let (sign, exponent_lo) = match format {
        Some("fp32") => (31, Some(23)),
        Some("bf16") => (15, Some(7)),
        Some("int8") => (7, None),
        Some("int32") => (31, None),
        _ => return "",
    };
    match exponent_lo {
        _ if bit == sign => "sign",
        Some(lo) if bit >= lo => "exponent",
        Some(_) => "mantissa",
        None => "magnitude",
    }
}

/// The stratum field of bit `bit` of a `width`-bit register holding `format`: its
/// [`bit_field`] when the format fills the register, else the register's `high bits` or `low
/// bits` half (`all bits` for one bit): flips of high address or counter bits go further.
pub fn field_of(format: Option<&str>, width: u32, bit: u32) -> &'static str {
    let fills = matches!((format, width), (Some("fp32" | "int32"), 32) | (Some("bf16"), 16) | (Some("int8"), 8));
    match () {
        _ if fills => bit_field(format, bit),
        _ if width < 2 => "all bits",
        _ if bit >= width / 2 => "high bits",
        _ => "low bits",
    }
}

/// The bit fields an adaptive campaign stratifies a class by: its [`fields`], or for a code's
/// check bits (`check`) one field of all of them. The one layout the sampler, the summary
/// and the rounds of a merge all read.
pub fn strata_fields(format: Option<&str>, width: u32, check: bool) -> Vec<(&'static str, Vec<u32>)> {
    if check {
        vec![("check bits", (0..width).rev().collect())]
    } else {
        fields(format, width)
    }
}

/// The fields of a `width`-bit register holding `format`, most significant first, with their
/// bit positions.
pub fn fields(format: Option<&str>, width: u32) -> Vec<(&'static str, Vec<u32>)> {
    let mut out: Vec<(&'static str, Vec<u32>)> = Vec::new();
    for bit in (0..width).rev() {
        let f = field_of(format, width, bit);
        match out.iter_mut().find(|(g, _)| *g == f) {
            Some((_, v)) => v.push(bit),
            None => out.push((f, vec![bit])),
        }
    }
    out
}

impl Space {
    /// The classes of `exec`'s machine that the spec's site globs select (each glob must
    /// select one), then the check bits of those under a code of `ecc`, over its injection
    /// steps of schedule `sched` (every cycle, or only cycle 0 for faults that cover whole
    /// steps). `file` names the spec in errors.
    pub fn new(
        exec: &Executor,
        sched: &StepSchedule,
        spec: &CampaignSpec,
        file: &Path,
        ecc: &[EccInfo],
    ) -> Result<Space> {
        let (globs, sampling, seed) = (&spec.sites, spec.sampling, spec.seed);
        let hw = &exec.hw;
        let all: Vec<SiteClass> = SiteClass::all(hw).into_iter().filter(|c| c.bit_count(hw) > 0).collect();
        for g in globs {
            if !all.iter().any(|c| glob_match(g, &c.pattern())) {
                let names: Vec<String> = all.iter().map(|c| c.pattern()).collect();
                return Err(FaultError::Invalid {
                    file: file.into(),
                    field: "sites".into(),
                    value: format!("{g:?}"),
                    allowed: format!("globs over the classes of {}: {}", hw.name, names.join(", ")),
                });
            }
        }
        let live = windows(exec, sched);
        let mut classes: Vec<ClassSpace> = all
            .into_iter()
            .filter(|c| globs.iter().any(|g| glob_match(g, &c.pattern())))
            .map(|class| ClassSpace {
                class,
                bits: class.bit_count(hw),
                live: live.iter().filter(|w| w.class == class).cloned().collect(),
                check_bits: 0,
            })
            .collect();
        let checks: Vec<ClassSpace> = (classes.iter())
            .filter_map(|c| {
                let e = ecc.iter().find(|e| e.class == c.class.pattern())?;
                Some(ClassSpace {
                    bits: c.class.elements(hw) * e.check_bits as u64,
                    check_bits: e.check_bits,
                    ..c.clone()
                })
            })
            .collect();
        classes.extend(checks);
        let cycles = if spec.fault.whole_steps() { 1 } else { sched.total_cycles };
        let reach: Vec<Arc<Region>> = match sampling {
            Sampling::Adaptive { .. } => {
                classes.iter().map(|c| Arc::new(reach(hw, spec.fault, spec.skip_dead, c, cycles))).collect()
            }
            _ => Vec::new(),
        };
        let total: f64 = classes.iter().map(|c| c.bits as f64 * cycles as f64).sum();
        let strata = match sampling {
            Sampling::Adaptive { .. } => (classes.iter().enumerate())
                .flat_map(|(i, c)| {
                    let format = c.class.format(hw).filter(|_| c.check_bits == 0).map(|f| f.name());
                    let fs = strata_fields(format, c.width(hw), c.check_bits > 0);
                    let area = reach[i].area() as f64;
                    fs.into_iter().map(move |(field, positions): (&'static str, Vec<u32>)| FieldStratum {
                        class: i,
                        field,
                        weight: area * positions.len() as f64 / total,
                        positions,
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let space = Space {
            classes,
            steps: spec.inject_steps.steps(),
            cycles,
            sampling,
            seed,
            strata,
            reach,
            rounds: Arc::default(),
        };
        if let Sampling::Adaptive { budget, floor, .. } = sampling {
            let first = floor.saturating_mul(space.strata.len() as u64);
            if first > budget {
                return Err(FaultError::Invalid {
                    file: file.into(),
                    field: "sampling.budget".into(),
                    value: budget.to_string(),
                    allowed: format!(
                        "at least the first round, floor x strata = {floor} x {} = {first} trials",
                        space.strata.len()
                    ),
                });
            }
        }
        let trials = space.trials_unchecked();
        if !(1..=MAX_TRIALS as u128).contains(&trials) {
            return Err(FaultError::Invalid {
                file: file.into(),
                field: "sampling".into(),
                value: format!("{sampling:?}"),
                allowed: format!(
                    "at most {MAX_TRIALS} trials; this plan has {trials} (Exhaustive enumerates every bit, cycle \
                     and step: use Uniform or Stratified for large spaces)"
                ),
            });
        }
        Ok(space)
    }

    /// Total bits of the selected classes.
    pub fn bits(&self) -> u64 {
        self.classes.iter().map(|c| c.bits).sum()
    }

    /// Share of the sampled space that class `i` holds (its bits over all selected bits): the
    /// class's weight in a combined estimate.
    pub fn weight(&self, i: usize) -> f64 {
        self.classes[i].bits as f64 / self.bits() as f64
    }

    fn trials_unchecked(&self) -> u128 {
        match self.sampling {
            Sampling::Exhaustive => self.bits() as u128 * self.cycles as u128 * self.steps.len() as u128,
            Sampling::Uniform { n } => n as u128,
            Sampling::Stratified { per_class } => per_class as u128 * self.classes.len() as u128,
            Sampling::Adaptive { budget, .. } => budget as u128,
        }
    }

    /// Under `Adaptive`: plans one more round, `per_stratum` trials in each stratum, and
    /// returns its trial ids.
    pub fn plan_round(&self, per_stratum: Vec<u64>) -> std::ops::Range<u64> {
        let mut rounds = self.rounds.write().expect("no thread panics holding the rounds");
        let start: u64 = rounds.iter().flatten().sum();
        let end = start + per_stratum.iter().sum::<u64>();
        rounds.push(per_stratum);
        start..end
    }

    /// Under `Adaptive`: the stratum of trial `t` of the rounds planned so far.
    pub fn stratum_of(&self, t: u64) -> Option<usize> {
        let rounds = self.rounds.read().expect("no thread panics holding the rounds");
        let mut start = 0;
        for round in rounds.iter() {
            for (s, &n) in round.iter().enumerate() {
                if t < start + n {
                    return Some(s);
                }
                start += n;
            }
        }
        None
    }

    /// Trials the plan runs (under `Adaptive`, at most).
    pub fn trials(&self) -> u64 {
        self.trials_unchecked() as u64
    }

    /// Trial `t`'s anchor.
    pub fn anchor(&self, hw: &HwConfig, t: u64) -> Anchor {
        // A check bit is numbered after the data bits, as in the code's codeword.
        let at = |class: usize, idx: u64, step: usize, cycle: u64| {
            let c = &self.classes[class];
            let w = c.width(hw) as u64;
            let first = if c.check_bits > 0 { c.class.width(hw) } else { 0 };
            Anchor {
                class: c.class,
                elem: idx / w,
                bit: first + (idx % w) as u32,
                step: self.steps[step],
                cycle,
                check_bits: c.check_bits,
            }
        };
        // Bit `idx` of class `class`, then a uniform step and cycle.
        let draw = |rng: &mut ChaCha8Rng, (class, idx): (usize, u64)| {
            let step = rng.gen_range(0..self.steps.len());
            at(class, idx, step, rng.gen_range(0..self.cycles))
        };
        match self.sampling {
            Sampling::Exhaustive => {
                // Class-major, then bit, step, cycle.
                let per_bit = self.cycles * self.steps.len() as u64;
                let ((class, bit), rest) = (self.locate(t / per_bit), t % per_bit);
                at(class, bit, (rest / self.cycles) as usize, rest % self.cycles)
            }
            Sampling::Uniform { .. } => {
                let mut rng = trial_rng(self.seed, t);
                // A class with probability proportional to its bits: uniform over all bits.
                let bit = self.locate(rng.gen_range(0..self.bits()));
                draw(&mut rng, bit)
            }
            Sampling::Stratified { per_class } => {
                let (mut rng, class) = (trial_rng(self.seed, t), (t / per_class) as usize);
                let idx = rng.gen_range(0..self.classes[class].bits);
                draw(&mut rng, (class, idx))
            }
            Sampling::Adaptive { .. } => {
                // A bit of the stratum's field at a uniform (element, cycle) of its reach.
                let s = &self.strata[self.stratum_of(t).expect("trial of a planned round")];
                let mut rng = trial_rng(self.seed, t);
                let n = s.positions.len() as u64;
                let k = rng.gen_range(0..self.reach[s.class].area() * n);
                let ((elem, cycle), pos) = (self.reach[s.class].at(k / n), s.positions[(k % n) as usize]);
                let w = self.classes[s.class].width(hw) as u64;
                at(s.class, elem * w + pos as u64, rng.gen_range(0..self.steps.len()), cycle)
            }
        }
    }

    /// Under `Adaptive`: the share of class `i`'s faults whose anchor lies in its reach.
    pub fn reach_share(&self, hw: &HwConfig, i: usize) -> Option<f64> {
        let elements = self.classes[i].class.elements(hw);
        self.reach.get(i).map(|r| r.area() as f64 / (elements as f64 * self.cycles as f64))
    }

    /// Bit `idx` of the selected classes' bits taken class after class: its class and its
    /// index there.
    fn locate(&self, mut idx: u64) -> (usize, u64) {
        let mut class = 0;
        while idx >= self.classes[class].bits {
            idx -= self.classes[class].bits;
            class += 1;
        }
        (class, idx)
    }

    /// Whether every bit of an upset is provably dead for its whole duration: outside every
    /// live window of its class.
    pub fn dead(&self, hw: &HwConfig, upset: &[StepFault]) -> bool {
        upset.iter().all(|f| {
            let class = f.site.class();
            let elem = class.element_of(hw, &f.site);
            let (from, to) = (f.cycle, f.cycle.saturating_add(f.duration));
            self.classes
                .iter()
                .filter(|c| c.class == class)
                .flat_map(|c| &c.live)
                .all(|w| !(w.elems.contains(&elem) && w.cycles.start < to && from < w.cycles.end))
        })
    }
}

/// Class `c`'s reach: the (element, cycle) anchors whose upset under the spec's fault model
/// may strike a live window ([`crate::model`]'s `reach` of each window), or every anchor when
/// the spec runs dead faults too (`skip_dead: false`: nothing is taken as masked unseen).
fn reach(hw: &HwConfig, fault: FaultModel, skip_dead: bool, c: &ClassSpace, cycles: u64) -> Region {
    let elements = c.bits / c.width(hw) as u64;
    if !skip_dead {
        return Region::all(elements, cycles);
    }
    Region::union(c.live.iter().map(|w| {
        let (e, k) = fault.reach(&w.elems, &w.cycles, elements);
        (e, k.start.min(cycles)..k.end.min(cycles))
    }))
}

/// The RNG of trial `t` of a campaign with seed `seed`: ChaCha8 keyed by both, independent of
/// which thread, shard or run draws it.
pub fn trial_rng(seed: u64, t: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&t.to_le_bytes());
    key[16..24].copy_from_slice(b"faultln1");
    ChaCha8Rng::from_seed(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Along, Lasts};
    use faultline_hw::{Dataflow, Register, Unit};
    use faultline_num::Precision;
    use proptest::prelude::*;

    proptest! {
        /// An anchor outside its class's reach gives a provably dead upset under every fault
        /// model, so an adaptive campaign that samples only the reach loses no live fault.
        #[test]
        fn anchors_outside_the_reach_are_dead(
            windows in prop::collection::vec((0u64..24, 1u64..8, 0u64..40, 1u64..12), 0..5),
            anchors in prop::collection::vec((0u64..24, 0u32..16, 0u64..50), 64),
        ) {
            let hw = HwConfig::test_config(4, 6, Dataflow::WeightStationary, Precision::Bf16Fp32);
            let class = SiteClass::all(&hw).into_iter().find(|c| c.unit == Unit::Mxu && c.register == Register::Weight).unwrap();
            let elements = class.elements(&hw);
            let live: Vec<LiveWindow> = (windows.into_iter())
                .map(|(e, de, c, dc)| LiveWindow { class, elems: e.min(elements - 1)..(e + de).min(elements), cycles: c..c + dc })
                .collect();
            let cs = ClassSpace { class, bits: class.bit_count(&hw), live, check_bits: 0 };
            let models = [
                FaultModel::Flip,
                FaultModel::MultiBit { bits: 2, along: Along::Bits },
                FaultModel::MultiBit { bits: 3, along: Along::Elements },
                FaultModel::StuckAt { value: 1, lasts: Lasts::Cycles(5) },
                FaultModel::StuckAt { value: 0, lasts: Lasts::Step },
            ];
            for fault in models {
                let cycles = if fault.whole_steps() { 1 } else { 50 };
                let region = reach(&hw, fault, true, &cs, cycles);
                let space = Space {
                    classes: vec![cs.clone()],
                    steps: vec![1],
                    cycles,
                    sampling: Sampling::Uniform { n: 1 },
                    seed: 0,
                    strata: Vec::new(),
                    reach: Vec::new(),
                    rounds: Arc::default(),
                };
                for &(elem, bit, cycle) in &anchors {
                    let (elem, bit, cycle) = (elem % elements, bit % class.width(&hw), cycle % cycles);
                    let a = Anchor { class, elem, bit, step: 1, cycle, check_bits: 0 };
                    if !region.contains(elem, cycle) {
                        prop_assert!(space.dead(&hw, &fault.upset(&hw, &a, 50)), "{fault:?} at {a:?}");
                    }
                }
            }
        }
    }
}
