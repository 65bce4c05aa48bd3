//! The report's content as a list of blocks (headings, paragraphs, tables, figures, PE
//! grids), built once from a [`Report`] and rendered by [`crate::markdown`] and [`crate::html`]:
//! both files say the same thing by construction.

use crate::aggregate::{bit_field, Counts, GroupRow, Heatmap, Report, MIN_CELL_TRIALS, NOT_SIMULATED};
use crate::figures::{Figure, Section};
use crate::load::Trace;
use faultline_fault::record::CampaignInfo;
use faultline_fault::spec::Mode;
use faultline_fault::stats::Estimate;
use faultline_fault::Outcome;
use serde::Serialize;

/// A table row; `strong` rows are totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Cell texts (inline code in backticks).
    pub cells: Vec<String>,
    /// Shown bold.
    pub strong: bool,
}

/// One block of the report.
#[derive(Debug, Clone)]
pub enum Block {
    /// A heading of level 1-3.
    Heading(u8, String),
    /// A paragraph (inline code in backticks).
    Para(String),
    /// A bulleted list.
    List(Vec<String>),
    /// A table: header, rows; columns after the first `text_columns` are right-aligned numbers.
    Table {
        /// Column names.
        head: Vec<String>,
        /// Rows.
        rows: Vec<Row>,
        /// Leading text columns.
        text_columns: usize,
    },
    /// A figure (Markdown links the file, HTML inlines the SVG).
    Figure(Figure),
    /// A PE array (HTML: a grid of cells with hover titles; Markdown: its figure).
    Grid(Heatmap, Option<Figure>),
}

/// Share as a percentage with its 95% interval: `12.3 [9.1, 16.2]`.
pub fn pct(e: [f64; 3]) -> String {
    format!("{:.1} [{:.1}, {:.1}]", 100.0 * e[0], 100.0 * e[1], 100.0 * e[2])
}

/// [`pct`] of an estimate.
pub fn pct_of(e: Estimate) -> String {
    pct([e.p, e.lo, e.hi])
}

/// A FIT figure with three significant digits.
pub fn fit(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    }
}

/// A spec value in the spec's own RON syntax.
fn ron<T: Serialize>(v: &T) -> String {
    ron::to_string(v).unwrap_or_else(|e| format!("({e})"))
}

/// `path` relative to the working directory when it lies inside it (campaign.json records the
/// spec file's absolute path; a report reads better, and moves better, with the short one).
fn shown(path: &str) -> String {
    let p = std::path::Path::new(path);
    std::env::current_dir()
        .ok()
        .and_then(|cwd| p.strip_prefix(cwd).ok().map(|r| r.display().to_string()))
        .unwrap_or_else(|| path.to_string())
}

/// The run description: everything needed to reproduce the campaign.
fn run_description(info: &CampaignInfo, dir: &str) -> Vec<String> {
    let s = &info.spec;
    let spec_file = shown(&info.spec_file);
    let t = &s.train;
    let mut v = vec![
        format!("campaign `{}` ({:?}), spec file `{spec_file}`", s.name, s.mode),
        format!("model `{}`, machine `{}` (`{}`)", s.model.display(), info.hw, s.hw.display()),
        format!(
            "training: batch {}, optimizer {}, lr {}, precision {}, seed {}, data {}",
            t.batch,
            ron(&t.optimizer),
            t.lr.map_or("default".into(), |x| x.to_string()),
            t.precision.map_or("the machine's".into(), |p| p.to_string()),
            t.seed,
            t.data.as_ref().map_or("built-in".into(), |d| format!("`{}`", d.display())),
        ),
        format!(
            "golden run: {} steps, {} cycles and {} instructions per step, final test accuracy {:.4}, state checksum `{}`",
            s.golden_steps,
            info.cycles_per_step,
            info.instructions_per_step,
            info.golden.test_accuracy,
            info.golden.final_checksum
        ),
        format!("sites `{}`", s.sites.join("`, `")),
        format!(
            "fault `{}`, injection steps `{}`, sampling `{}` ({} trials), campaign seed {}",
            ron(&s.fault),
            ron(&s.inject_steps),
            ron(&s.sampling),
            info.trials,
            s.seed
        ),
        format!(
            "judging: follow-up {} steps, thresholds `{}`, dead faults skipped: {} (every {}th run to check)",
            s.follow_up,
            ron(&s.thresholds),
            s.skip_dead,
            s.verify_dead_every
        ),
        format!("raw FIT per bit: {}", s.fit_per_bit.map_or("not given (no FIT columns)".into(), |f| f.to_string())),
        format!("code: {}", info.code),
        format!("reproduce: `faultline campaign {spec_file} --out {dir}`, then `faultline report {dir} --out DIR`"),
    ];
    if s.mode == Mode::Inference {
        v.retain(|l| !l.starts_with("judging"));
    }
    v
}

/// The outcomes some trial had, in table order: the per-group tables' columns.
fn present(r: &Report) -> Vec<Outcome> {
    r.outcomes.iter().copied().filter(|&o| r.classes.iter().any(|c| c.counts.of(o) > 0)).collect()
}

/// A row of outcome counts with the two shares.
fn counts_cells(r: &Report, c: &Counts) -> Vec<String> {
    let mut v = vec![c.trials().to_string()];
    v.extend(present(r).iter().map(|&o| c.of(o).to_string()));
    v.push(pct_of(c.unmasked()));
    v.push(pct_of(c.failure()));
    v
}

/// Header of [`counts_cells`] after `first` columns.
fn counts_head(r: &Report, first: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = first.iter().map(|s| s.to_string()).collect();
    v.push("trials".into());
    v.extend(present(r).iter().map(|o| o.name().to_string()));
    v.push("vulnerability % [95% CI]".into());
    v.push("failure % [95% CI]".into());
    v
}

/// A breakdown table.
fn breakdown(r: &Report, what: &str, rows: &[GroupRow]) -> Block {
    Block::Table {
        head: counts_head(r, &[what]),
        rows: rows
            .iter()
            .map(|g| {
                let mut cells = vec![g.name.clone()];
                cells.extend(counts_cells(r, &g.counts));
                Row { cells, strong: g.name == NOT_SIMULATED }
            })
            .collect(),
        text_columns: 1,
    }
}

/// The report's blocks: its sections in order.
pub fn build(trace: &Trace, r: &Report, figures: &[Figure]) -> Vec<Block> {
    // FIT columns only when the spec gives a raw FIT per bit.
    let fit_given = trace.info.spec.fit_per_bit.is_some();
    let mut b = overview(trace, r);
    b.extend(outcomes(r));
    b.extend(by_unit(fit_given, r));
    b.extend(by_class(fit_given, r));
    b.extend(ranking(fit_given, r));
    b.extend(pe_array(r, figures));
    b.extend(bit_position(r, figures));
    b.extend(landing(&trace.info, r, figures));
    b.extend(curves(figures));
    b
}

/// The figures of section `sec`, in order.
fn figures_of(figures: &[Figure], sec: Section) -> impl Iterator<Item = Figure> + '_ {
    figures.iter().filter(move |f| f.section == sec).cloned()
}

/// The title, what the trials were and what the rates mean, and the run's description.
fn overview(trace: &Trace, r: &Report) -> Vec<Block> {
    let info = &trace.info;
    let s = &r.summary;
    let mut b = vec![Block::Heading(1, format!("Faultline report: {}", info.spec.name))];
    let verb = if info.spec.mode == Mode::Training { "training" } else { "inference" };
    b.push(Block::Para(format!(
        "{} trials of one {} each during {verb} ({} simulated; {} provably dead, so not run and counted \
         `HwMasked`; {} dead ones run anyway, every one masked){}. Vulnerability is the share of faults \
         that changed the {} state; failure the share that made {verb} fail (non-finite values, a degraded \
         model{}).",
        s.trials,
        ron(&info.spec.fault),
        s.simulated,
        s.skipped_dead,
        s.verified_dead,
        if s.trials < info.trials {
            format!(" out of {} planned: the campaign is incomplete", info.trials)
        } else {
            String::new()
        },
        if info.spec.mode == Mode::Training { "training" } else { "output" },
        if info.spec.mode == Mode::Training { "" } else { ", changed predictions" },
    )));
    if trace.partial_last_line {
        b.push(Block::Para("The last line of `records.jsonl` was half-written and is not counted.".into()));
    }
    b.push(Block::Heading(2, "Run".into()));
    b.push(Block::List(run_description(info, &trace.dir.display().to_string())));
    b
}

/// Each outcome's share of the trials, and the combined estimates.
fn outcomes(r: &Report) -> Vec<Block> {
    let s = &r.summary;
    let all = Counts::of_shares(&s.outcomes);
    vec![
        Block::Heading(2, "Outcomes".into()),
        Block::Table {
            head: vec!["outcome".into(), "trials".into(), "share of the trials % [95% CI]".into()],
            rows: r
                .outcomes
                .iter()
                .map(|&o| Row {
                    cells: vec![o.name().into(), all.of(o).to_string(), pct_of(Estimate::of(all.of(o), all.trials()))],
                    strong: false,
                })
                .collect(),
            text_columns: 1,
        },
        Block::Para(format!(
            "Shares of the trials as sampled (a stratified plan over-samples small classes). The selected \
             classes as the machine holds them ({} estimate): vulnerability {} %, failure {} %.",
            s.unmasked.method,
            pct([s.unmasked.p, s.unmasked.lo, s.unmasked.hi]),
            pct([s.failure.p, s.failure.lo, s.failure.hi])
        )),
    ]
}

/// Rates per unit (with its failure FIT when the spec gives a FIT per bit: `fit_given`).
fn by_unit(fit_given: bool, r: &Report) -> Vec<Block> {
    let mut head: Vec<String> =
        ["unit", "bits", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"].map(String::from).to_vec();
    if fit_given {
        head.push("failure FIT".into());
    }
    vec![
        Block::Heading(2, "Vulnerability by unit".into()),
        Block::Para(
            "Each unit's rates weight its classes by their bits (a stratified estimate), so a unit reads the \
             same whatever share of the trials each class got."
                .into(),
        ),
        Block::Table {
            head,
            rows: r
                .units
                .iter()
                .map(|u| {
                    let mut cells =
                        vec![u.unit.clone(), u.bits.to_string(), u.trials.to_string(), pct(u.unmasked), pct(u.failure)];
                    cells.extend(u.fit_failure.map(fit));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 1,
        },
    ]
}

/// Outcome counts and rates per site class.
fn by_class(fit_given: bool, r: &Report) -> Vec<Block> {
    let mut head = counts_head(r, &["class", "kind", "format", "bits"]);
    head.insert(5, "dead (not run)".into());
    if fit_given {
        head.push("failure FIT [95% CI]".into());
    }
    vec![
        Block::Heading(2, "Vulnerability by site class".into()),
        Block::Table {
            head,
            rows: r
                .classes
                .iter()
                .map(|c| {
                    let mut cells = vec![
                        format!("`{}`", c.info.class),
                        format!("{:?}", c.info.kind),
                        c.info.format.clone().unwrap_or_else(|| "-".into()),
                        c.info.bits.to_string(),
                    ];
                    cells.extend(counts_cells(r, &c.counts));
                    cells.insert(5, c.skipped.to_string());
                    cells.extend(c.fit_failure.map(|f| format!("{} [{}, {}]", fit(f[0]), fit(f[1]), fit(f[2]))));
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 3,
        },
    ]
}

/// Classes ranked by the failures one protected bit removes.
fn ranking(fit_given: bool, r: &Report) -> Vec<Block> {
    let mut head: Vec<String> =
        ["rank", "class", "bits", "failure per faulty bit %", "share of failures %"].map(String::from).to_vec();
    if fit_given {
        head.extend(["failure FIT".into(), "FIT removed per protected bit".into()]);
    }
    vec![
        Block::Heading(2, "Where protection buys the most".into()),
        Block::Para(
            "Classes ranked by the training failures one protected bit removes: the failure probability of a \
             fault in one of its bits (times the raw FIT per bit, when given). `share` is the class's part of \
             the selected classes' failure rate; protecting the top rows first removes the most failures per \
             bit of protection."
                .into(),
        ),
        Block::Table {
            head,
            rows: r
                .ranking
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let mut cells = vec![
                        (i + 1).to_string(),
                        format!("`{}`", k.class),
                        k.bits.to_string(),
                        format!("{:.2}", 100.0 * k.failure_per_bit),
                        format!("{:.1}", 100.0 * k.share),
                    ];
                    cells.extend(k.fit_failure.map(fit));
                    cells.extend(
                        k.fit_per_protected_bit.map(|x| if x == 0.0 { "0".into() } else { format!("{x:.2e}") }),
                    );
                    Row { cells, strong: false }
                })
                .collect(),
            text_columns: 2,
        },
    ]
}

/// A PE grid per register kind with its heatmap figure (nothing without PE classes).
fn pe_array(r: &Report, figures: &[Figure]) -> Vec<Block> {
    if r.heatmaps.is_empty() {
        return Vec::new();
    }
    let mut b = vec![
        Block::Heading(2, "PE array".into()),
        Block::Para(format!(
            "Training-failure rate of the faults anchored in each PE, per register kind (row 0 at the top). \
             Cells with fewer than {MIN_CELL_TRIALS} trials are marked, not coloured: too few to estimate."
        )),
    ];
    for h in &r.heatmaps {
        let fig = figures
            .iter()
            .find(|f| {
                f.section == Section::Heatmap
                    && (f.name == format!("heatmap-{}", h.register) || f.title.contains(&h.class))
            })
            .cloned();
        b.push(Block::Heading(3, format!("`{}`", h.class)));
        b.push(Block::Grid(h.clone(), fig));
    }
    b
}

/// Rates per field of each class's number format (sign, exponent, mantissa), with the bit
/// figures.
fn bit_position(r: &Report, figures: &[Figure]) -> Vec<Block> {
    let mut rows = Vec::new();
    for p in &r.bit_profiles {
        for (f, c, nbits) in bit_fields(p.format.as_deref(), &p.bits) {
            rows.push(Row {
                cells: vec![
                    format!("`{}`", p.class),
                    p.format.clone().unwrap_or_else(|| "-".into()),
                    f.to_string(),
                    nbits.to_string(),
                    c.trials().to_string(),
                    pct_of(c.unmasked()),
                    pct_of(c.failure()),
                ],
                strong: false,
            });
        }
    }
    let mut b = vec![
        Block::Heading(2, "Bit position".into()),
        Block::Para(
            "Which bits of a value matter: the share of faults in each field of the format (sign, exponent, \
             mantissa for floats; sign, magnitude for integers)."
                .into(),
        ),
        Block::Table {
            head: ["class", "format", "field", "bits", "trials", "vulnerability % [95% CI]", "failure % [95% CI]"]
                .map(String::from)
                .to_vec(),
            rows,
            text_columns: 3,
        },
    ];
    b.extend(figures_of(figures, Section::Bits).map(Block::Figure));
    b
}

/// The per-bit counts `bits` of a value in `format`, summed per field of the format: (field,
/// counts, bits in it), most significant field first, as a value's bits are written.
fn bit_fields<'a>(format: Option<&str>, bits: &'a [Counts]) -> Vec<(&'a str, Counts, u32)> {
    let mut fields: Vec<(&str, Counts, u32)> = Vec::new();
    for (bit, c) in bits.iter().enumerate().rev() {
        let f = bit_field(format, bit as u32);
        let f = if f.is_empty() { "all bits" } else { f };
        match fields.iter_mut().find(|x| x.0 == f) {
            Some(x) => {
                x.2 += 1;
                for (a, y) in x.1.outcomes.iter_mut().zip(c.outcomes) {
                    *a += y;
                }
            }
            None => fields.push((f, *c, 1)),
        }
    }
    fields
}

/// Where simulated faults struck: by phase (training), layer, instruction kind and step, with
/// the step figures.
fn landing(info: &CampaignInfo, r: &Report, figures: &[Figure]) -> Vec<Block> {
    let training = info.spec.mode == Mode::Training;
    let mut b = vec![
        Block::Heading(2, "When and where faults landed".into()),
        Block::Para(format!(
            "The instruction a simulated fault struck, by its graph node's phase and layer and by instruction \
             kind. Provably dead faults were not simulated, so the instruction is not resolved: they form the \
             `{NOT_SIMULATED}` row (all `HwMasked`)."
        )),
    ];
    if training {
        b.push(Block::Heading(3, "By training phase".into()));
        b.push(breakdown(r, "phase", &r.by_phase));
    }
    b.push(Block::Heading(3, "By layer".into()));
    b.push(breakdown(r, "layer", &r.by_layer));
    b.push(Block::Heading(3, "By instruction kind".into()));
    b.push(breakdown(r, "instruction", &r.by_op));
    b.push(Block::Heading(3, if training { "By injection step" } else { "By test batch" }.into()));
    b.push(breakdown(r, "step", &r.by_step));
    b.extend(figures_of(figures, Section::Step).map(Block::Figure));
    b
}

/// The golden run against a sample of faulty trials' curves (nothing without curve figures).
fn curves(figures: &[Figure]) -> Vec<Block> {
    let curves: Vec<Figure> = figures_of(figures, Section::Curves).collect();
    if curves.is_empty() {
        return Vec::new();
    }
    let mut b = vec![
        Block::Heading(2, "Training curves".into()),
        Block::Para(format!(
            "The golden run against a sample of faulty trials (up to {} per outcome, the first recorded): loss \
             from the injection step through the follow-up window, and test accuracy at the window's end.",
            crate::load::CURVES_PER_OUTCOME
        )),
    ];
    b.extend(curves.into_iter().map(Block::Figure));
    b
}
