//! What every figure shares: the outcome palette and series colours, the heat colour scale,
//! the figure sizes and the bundled font.

use crate::error::{ReportError, Result};
use faultline_fault::Outcome;
use plotters::prelude::*;
use std::sync::OnceLock;

/// The fixed colour of each outcome, shared by every figure and the HTML tables (Okabe-Ito
/// based: distinguishable with the common colour-vision deficiencies; masked outcomes grey).
pub fn outcome_color(o: Outcome) -> RGBColor {
    match o {
        Outcome::HwMasked => RGBColor(0xA6, 0xA6, 0xA6),
        Outcome::Masked => RGBColor(0x6E, 0x6E, 0x6E),
        Outcome::Benign | Outcome::SdcBenign => RGBColor(0x00, 0x9E, 0x73),
        Outcome::ImmediateInfNan | Outcome::Due => RGBColor(0xD5, 0x5E, 0x00),
        Outcome::ShortTermInfNan => RGBColor(0xE6, 0x9F, 0x00),
        Outcome::SharpDegrade | Outcome::SdcCritical => RGBColor(0xCC, 0x79, 0xA7),
        Outcome::SharpSlowDegrade => RGBColor(0x88, 0x22, 0x55),
        Outcome::SlowDegrade => RGBColor(0x00, 0x72, 0xB2),
        Outcome::LowTestAccuracy => RGBColor(0x56, 0xB4, 0xE9),
        // Caught by protection: blue-greys, apart from the masked greys.
        Outcome::Corrected => RGBColor(0xB7, 0xD7, 0xE8),
        Outcome::DetectedRecovered => RGBColor(0x7F, 0xA7, 0xC0),
        Outcome::Detected => RGBColor(0x33, 0x5C, 0x81),
    }
}

/// Series colour of "share not masked".
pub(super) const UNMASKED: RGBColor = RGBColor(0x00, 0x72, 0xB2);
/// Series colour of "share failing".
pub(super) const FAILURE: RGBColor = RGBColor(0xD5, 0x5E, 0x00);
/// Fill of heatmap cells with too few trials to colour (distinct from every scale colour).
pub(super) const TOO_FEW: RGBColor = RGBColor(0xE0, 0xE0, 0xE0);
/// Their hatch line.
pub(super) const TOO_FEW_HATCH: RGBColor = RGBColor(0x99, 0x99, 0x99);
/// Lines between heatmap cells.
pub(super) const CELL_EDGE: RGBColor = RGBColor(0xC4, 0xC4, 0xC4);
/// Grid lines.
pub(crate) const GRID: RGBColor = RGBColor(0xE4, 0xE4, 0xE4);

/// Pixel size of the heatmaps (square-ish plot plus a colour bar) and of the other figures.
pub(super) const HEATMAP_SIZE: (u32, u32) = (680, 600);
pub(crate) const FIGURE_SIZE: (u32, u32) = (800, 500);

/// Font family every text uses: the bundled font is registered under this name.
pub(crate) const FONT: &str = "sans-serif";

/// Registers the bundled font once per process (plotters has no font without it).
pub(crate) fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FONT, FontStyle::Normal, include_bytes!("../../assets/DejaVuSans.ttf"))
                .map_err(|_| "the bundled DejaVuSans.ttf is not a valid font".to_string())
        })
        .clone()
        .map_err(|why| ReportError::Figure { name: "(font)".into(), why })
}

pub(crate) fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font())
}

/// Sequential colour (ColorBrewer YlOrRd) of `t` in [0, 1]: pale yellow at 0, dark red at 1
/// (the HTML grids use it too, so both show a rate in one colour).
pub fn heat(t: f64) -> RGBColor {
    const STOPS: [(u8, u8, u8); 9] = [
        (0xFF, 0xFF, 0xCC),
        (0xFF, 0xED, 0xA0),
        (0xFE, 0xD9, 0x76),
        (0xFE, 0xB2, 0x4C),
        (0xFD, 0x8D, 0x3C),
        (0xFC, 0x4E, 0x2A),
        (0xE3, 0x1A, 0x1C),
        (0xBD, 0x00, 0x26),
        (0x80, 0x00, 0x26),
    ];
    let x = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}
