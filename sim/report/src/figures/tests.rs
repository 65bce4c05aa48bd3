use super::*;
use crate::aggregate::{aggregate, BitProfile, Cell, Counts};
use crate::load::{load, Curve};
use faultline_fault::Outcome;
use faultline_hw::budget::HostMemory;

use super::chart::percent;
use super::curves::{loss_label, LOSS_CLIP};
use super::heatmap::{block_size, pe_ticks};
use super::shares::bit_ticks;

/// The report of the shipped fixture campaign (`tests/fixtures/tiny`).
fn fixture() -> Report {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny");
    aggregate(&load(&dir, &HostMemory::default(), |_, _| {}).expect("fixture loads"))
}

/// `report` with every figure's data removed.
fn empty(mut report: Report) -> Report {
    report.heatmaps.clear();
    report.bit_profiles.clear();
    report.by_step.clear();
    report.curves.clear();
    report.accuracy.clear();
    report
}

/// Text as plotters' SVG backend writes it.
fn escaped(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Whether `svg` draws the text `s` (the SVG backend writes each text on its own line).
fn draws(svg: &str, s: &str) -> bool {
    svg.contains(&format!("\n{}\n</text>", escaped(s)))
}

#[test]
fn every_figure_is_an_svg_with_its_title_and_a_png_file() {
    let dir = tempfile::tempdir().unwrap();
    let figures = write_figures(&fixture(), dir.path()).unwrap();
    let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "heatmap-weight",
            "heatmap-psum",
            "bits-mxu-pe-weight",
            "bits-mxu-pe-psum",
            "bits-vpu-lane-out",
            "bits-ub-word",
            "bits-seq-acc-addr",
            "bits-seq-tile",
            "outcome-vs-step",
            "loss-curves",
            "test-accuracy",
        ]
    );
    let sections: Vec<Section> = figures.iter().map(|f| f.section).collect();
    assert!(sections.windows(2).all(|w| w[0] as u8 <= w[1] as u8), "report order: {sections:?}");
    for f in &figures {
        assert!(f.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{}", f.name);
        assert!(f.svg.starts_with("<svg"), "{}: {}", f.name, &f.svg[..40]);
        assert!(f.svg.trim_end().ends_with("</svg>"), "{}", f.name);
        assert!(draws(&f.svg, &f.title), "{}: title `{}` not drawn", f.name, f.title);
        let on_disk = std::fs::read_to_string(dir.path().join(format!("figures/{}.svg", f.name))).unwrap();
        assert_eq!(on_disk, f.svg, "{}", f.name);
        let png = std::fs::read(dir.path().join(format!("figures/{}.png", f.name))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{}.png is not a PNG", f.name);
    }
    let heatmap = &figures[0];
    assert!(heatmap.title.starts_with("mxu.pe[*][*].weight \u{2014} training failure rate"), "{}", heatmap.title);
    assert!(heatmap.svg.contains("\nPE column") && draws(&heatmap.svg, "PE row"));
    let bits = &figures[3];
    for field in ["sign", "exponent", "mantissa", "bit position (MSB left)"] {
        assert!(draws(&bits.svg, field), "{} lacks `{field}`", bits.name);
    }
    let seq = &figures[6];
    assert!(!draws(&seq.svg, "mantissa"), "a class without a format has no field bands");
}

#[test]
fn the_same_report_gives_byte_identical_figures() {
    let report = fixture();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = write_figures(&report, a.path()).unwrap();
    let second = write_figures(&report, b.path()).unwrap();
    assert_eq!(first.len(), second.len());
    for (x, y) in first.iter().zip(&second) {
        assert!(x.svg == y.svg, "{} differs between runs", x.name);
        let png = |d: &Path| std::fs::read(d.join(format!("figures/{}.png", x.name))).unwrap();
        assert!(png(a.path()) == png(b.path()), "{}.png differs between runs", x.name);
    }
}

/// A 4x4 array, row-major: PE (0,0) 2 trials both failed (too few: would be the darkest
/// colour), (0,1) none, (0,2) 1 trial; (3,3) 4 trials all failed; the rest 4 trials, none
/// failed.
fn small_heatmap() -> Heatmap {
    let mut cells = vec![Cell { trials: 4, unmasked: 1, failures: 0 }; 16];
    cells[0] = Cell { trials: 2, unmasked: 2, failures: 2 };
    cells[1] = Cell::default();
    cells[2] = Cell { trials: 1, unmasked: 0, failures: 0 };
    cells[15] = Cell { trials: 4, unmasked: 4, failures: 4 };
    Heatmap { class: "mxu.pe[*][*].psum".into(), register: "psum".into(), rows: 4, cols: 4, cells }
}

/// `(x, y)` of each `<rect` filled with `color`.
fn rects(svg: &str, color: &str) -> Vec<(i32, i32)> {
    let attr = |line: &str, name: &str| -> i32 {
        let start = line.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        line[start..].split('"').next().unwrap().parse().unwrap()
    };
    svg.lines()
        .filter(|l| l.starts_with("<rect") && l.contains(&format!("fill=\"{color}\"")))
        .map(|l| (attr(l, "x"), attr(l, "y")))
        .collect()
}

#[test]
fn heatmap_greys_out_cells_with_too_few_trials_and_puts_row_0_on_top() {
    let mut report = empty(fixture());
    report.heatmaps.push(small_heatmap());
    let dir = tempfile::tempdir().unwrap();
    let figures = write_figures(&report, dir.path()).unwrap();
    assert_eq!(figures.len(), 1);
    let svg = &figures[0].svg;
    assert_eq!(figures[0].name, "heatmap-psum");
    assert!(figures[0].title.contains("per PE"), "{}", figures[0].title);
    let zero = rects(svg, "#FFFFCC"); // heat(0)
    let full = rects(svg, "#800026"); // heat(1): rate 1 at the top of a 0..100% scale
    let grey = rects(svg, "#E0E0E0");
    // 12 cells with enough trials and no failure; the too-few ones are not among them.
    assert_eq!(zero.len(), 12, "{svg}");
    assert_eq!(full.len(), 1, "only PE (3,3) is coloured as failing; PE (0,0) has too few trials");
    // The grey (hatched) array under the coloured cells, and the legend's sample.
    assert_eq!(grey.len(), 2);
    assert!(svg.contains("fewer than 3 trials"));
    // PE (3,3) is the bottom-right cell: row 0 is at the top.
    assert!(zero.iter().all(|&(x, y)| x < full[0].0 || y < full[0].1), "{zero:?} vs {full:?}");
    assert!(zero.iter().any(|&(x, y)| x < full[0].0 && y < full[0].1));
}

#[test]
fn sparse_heatmaps_are_drawn_in_blocks_of_pes() {
    let sparse = |per_cell: &dyn Fn(usize) -> u64| Heatmap {
        class: "mxu.pe[*][*].act".into(),
        register: "act".into(),
        rows: 32,
        cols: 32,
        cells: (0..1024).map(|i| Cell { trials: per_cell(i), unmasked: 0, failures: 0 }).collect(),
    };
    // 3 trials per PE: per PE.
    assert_eq!(block_size(&sparse(&|_| 3)), 1);
    // One trial in every 4th PE: 2x2 blocks still have 1-2, 4x4 blocks have 4.
    assert_eq!(block_size(&sparse(&|i| (i % 4 == 0) as u64)), 4);
    // Almost nothing: never coarser than 4 cells per side.
    assert_eq!(block_size(&sparse(&|i| (i == 0) as u64)), 8);
    let mut report = empty(fixture());
    report.heatmaps.push(sparse(&|i| (i % 4 == 0) as u64));
    let dir = tempfile::tempdir().unwrap();
    let figures = write_figures(&report, dir.path()).unwrap();
    assert!(figures[0].title.contains("per 4x4 PE block"), "{}", figures[0].title);
    assert_eq!(rects(&figures[0].svg, "#FFFFCC").len(), 64);
}

#[test]
fn figures_without_data_are_left_out() {
    let mut report = empty(fixture());
    // Inference campaigns have no loss curve; a heatmap of a class with no trials says nothing.
    report.golden_losses.clear();
    report.heatmaps.push(Heatmap { cells: vec![Cell::default(); 16], ..small_heatmap() });
    report.bit_profiles.push(BitProfile {
        class: "x.y".into(),
        format: None,
        bits: vec![Counts::default(); 8],
        share: 1.0,
    });
    let dir = tempfile::tempdir().unwrap();
    assert!(write_figures(&report, dir.path()).unwrap().is_empty());
}

#[test]
fn loss_curves_clip_huge_losses_and_mark_non_finite_ones() {
    let mut report = empty(fixture());
    let golden = report.golden_losses.clone();
    report.curves = vec![
        // A blow-up: 1e30 then non-finite.
        Curve { trial: 1, step: 4, outcome: Outcome::ShortTermInfNan, loss_delta: vec![0.0, 1e30, f64::NAN] },
        Curve { trial: 2, step: 4, outcome: Outcome::Benign, loss_delta: vec![0.01; 8] },
    ];
    let dir = tempfile::tempdir().unwrap();
    let figures = write_figures(&report, dir.path()).unwrap();
    assert_eq!(figures.len(), 1);
    let svg = &figures[0].svg;
    assert!(svg.contains("log scale"), "1e30 against a loss of ~2 needs a log axis");
    assert!(svg.contains("non-finite loss") && svg.contains("golden max (clipped)"));
    assert!(draws(svg, "ShortTermInfNan") && draws(svg, "Benign") && !draws(svg, "SlowDegrade"));
    // The axis stops 100x above golden, not at 1e30.
    assert!(!svg.contains("e30") && !svg.contains("e29"), "axis not clipped");
    let top = golden.iter().copied().fold(0.0, f64::max) * LOSS_CLIP;
    assert!(draws(svg, &loss_label(10f64.powf(top.log10().floor()), false)), "no tick at the decade below the clip");
    // Small losses only: linear.
    report.curves.remove(0);
    let figures = write_figures(&report, dir.path()).unwrap();
    assert!(!figures[0].svg.contains("log scale") && !figures[0].svg.contains("non-finite"));
}

#[test]
fn slugs_are_lowercase_filesystem_safe_and_unique() {
    assert_eq!(slug("mxu.pe[*][*].weight_shadow"), "mxu-pe-weight-shadow");
    assert_eq!(slug("ub.word[*]"), "ub-word");
    assert_eq!(slug("DMA.src_addr"), "dma-src-addr");
    let mut report = empty(fixture());
    let profile = |class: &str| BitProfile {
        class: class.into(),
        format: Some("int8".into()),
        bits: vec![Counts { outcomes: [1; Outcome::ALL.len()] }; 8],
        share: 1.0,
    };
    report.bit_profiles = vec![profile("a.b_c"), profile("a.b.c"), profile("a.b-c")];
    let names: Vec<String> = plan(&report).into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["bits-a-b-c", "bits-a-b-c-2", "bits-a-b-c-3"]);
}

#[test]
fn ticks_and_labels_are_round() {
    let shares: Vec<String> = ticks(0.0, 1.0, 5).into_iter().map(|t| percent(t, 0.2)).collect();
    assert_eq!(shares, ["0%", "20%", "40%", "60%", "80%", "100%"]);
    assert_eq!(ticks(1.0, 40.0, 10), [5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0]);
    let mut fp32 = bit_ticks(32, Some("fp32"));
    fp32.sort_unstable();
    assert_eq!(fp32, [0, 4, 8, 12, 16, 20, 23, 28, 31]);
    assert_eq!(bit_ticks(8, Some("int8")), (0..8).collect::<Vec<_>>());
    assert_eq!(percent(0.25, 0.05), "25%");
    assert_eq!(percent(0.005, 0.002), "0.5%");
    assert_eq!(loss_label(2f64.log10(), true), "2");
    assert_eq!(loss_label(-1.0, true), "0.1");
    assert_eq!(loss_label(30.0, true), "1e30");
    assert_eq!(loss_label(0.25, false), "0.25");
    assert_eq!(pe_ticks(32, 1), [0.5, 4.5, 8.5, 12.5, 16.5, 20.5, 24.5, 28.5, 31.5]);
    assert_eq!(pe_ticks(32, 4), [0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0]);
}

#[test]
fn outcome_colours_are_distinct_within_a_mode() {
    let training: Vec<RGBColor> =
        Outcome::ALL.iter().filter(|o| !o.inference_only()).map(|&o| outcome_color(o)).collect();
    let inference: Vec<RGBColor> =
        Outcome::ALL.iter().filter(|o| o.inference_only() || !o.unmasked()).map(|&o| outcome_color(o)).collect();
    assert_eq!(training.len(), 12);
    for colors in [training, inference] {
        for (i, a) in colors.iter().enumerate() {
            assert!(colors[i + 1..].iter().all(|b| b != a), "{a:?} used twice");
        }
    }
}
