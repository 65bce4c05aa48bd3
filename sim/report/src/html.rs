//! `index.html`: the report's blocks as one self-contained page (inline CSS and SVG, no
//! scripts, no network), readable offline and attachable to a design review.

use crate::aggregate::{Heatmap, MIN_CELL_TRIALS};
use crate::document::Block;

/// The page's style: print-friendly, wide tables scroll instead of overflowing.
const STYLE: &str = "
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #bbb; margin-top: 2em; }
code { background: #f3f3f3; padding: 0 .2em; border-radius: 3px; font-size: 90%; }
td code { white-space: nowrap; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; }
th { background: #f0f0f0; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.strong td { font-weight: bold; background: #fafafa; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 13px; color: #555; }
table.grid { border-collapse: separate; border-spacing: 1px; }
table.grid td { width: var(--cell); height: var(--cell); padding: 0; border: none; }
/* Too few trials to colour: the grid's cells and the legend's swatch. */
.few { background: repeating-linear-gradient(45deg, #ddd, #ddd 2px, #f7f7f7 2px, #f7f7f7 4px); }
table.grid th { background: none; border: none; font-size: 9px; font-weight: normal; color: #777; padding: 0 2px; }
.legend span { display: inline-block; width: 14px; height: 14px; vertical-align: middle; margin: 0 2px; }
";

/// `s` with HTML's special characters escaped.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Escaped text with `code` spans for backtick-quoted parts and bold for `**`-quoted ones
/// (the Markdown the blocks are written in).
fn inline(s: &str) -> String {
    let spans = |s: &str, mark: &str, tag: &str| -> String {
        s.split(mark)
            .enumerate()
            .map(|(i, part)| if i % 2 == 1 { format!("<{tag}>{part}</{tag}>") } else { part.to_string() })
            .collect()
    };
    spans(&spans(&escape(s), "`", "code"), "**", "strong")
}

/// CSS colour of rate `p` on a scale topping at `vmax` (the figures' colour map).
fn rate_color(p: f64, vmax: f64) -> String {
    let c = crate::figures::heat(p / vmax);
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// A PE grid: one cell per PE with its counts in a hover title.
fn grid(h: &Heatmap) -> String {
    // As the figure does, the scale tops out at the highest rate shown (at least 5%, rounded
    // up to 5%), so low rates still differ.
    let rate = |x: &crate::aggregate::Cell| x.failures as f64 / x.trials as f64;
    let highest = h.cells.iter().filter(|x| x.trials >= MIN_CELL_TRIALS).map(rate).fold(0.0, f64::max);
    let vmax = (highest.max(0.05) * 20.0).ceil() / 20.0;
    // Cells as large as fit ~600 px: an 8x8 array reads as well as a 128x128 one.
    let px = (600 / h.cols.max(1)).clamp(4, 36);
    let mut s = format!("<div class=\"scroll\"><table class=\"grid\" style=\"--cell: {px}px\"><tr><th></th>");
    for c in 0..h.cols {
        s.push_str(&format!("<th>{c}</th>"));
    }
    s.push_str("</tr>\n");
    for r in 0..h.rows {
        s.push_str(&format!("<tr><th>{r}</th>"));
        for c in 0..h.cols {
            let x = h.cells[r * h.cols + c];
            let title = format!(
                "pe[{r}][{c}].{}: {} trials, {} unmasked, {} failed{}",
                h.register,
                x.trials,
                x.unmasked,
                x.failures,
                if x.trials < MIN_CELL_TRIALS {
                    " (too few trials to estimate)".to_string()
                } else {
                    format!(" ({:.1}% failure)", 100.0 * x.failures as f64 / x.trials as f64)
                }
            );
            if x.trials < MIN_CELL_TRIALS {
                s.push_str(&format!("<td class=\"few\" title=\"{}\"></td>", escape(&title)));
            } else {
                s.push_str(&format!(
                    "<td style=\"background:{}\" title=\"{}\"></td>",
                    rate_color(rate(&x), vmax),
                    escape(&title)
                ));
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table></div>\n<p class=\"legend\">failure rate: ");
    for i in 0..=4 {
        let p = vmax * i as f64 / 4.0;
        let label = (1e4 * p).round() / 100.0;
        s.push_str(&format!("<span style=\"background:{}\"></span>{label}% ", rate_color(p, vmax)));
    }
    s.push_str(&format!(
        "&nbsp; <span class=\"few\"></span> fewer than {MIN_CELL_TRIALS} trials (hover a cell for its counts)</p>\n"
    ));
    s
}

/// Renders `blocks` as a self-contained HTML page titled `title`.
pub fn render(title: &str, blocks: &[Block]) -> String {
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(title)
    );
    for b in blocks {
        match b {
            Block::Heading(level, text) => out.push_str(&format!("<h{level}>{}</h{level}>\n", inline(text))),
            Block::Para(text) => out.push_str(&format!("<p>{}</p>\n", inline(text))),
            Block::List(items) => {
                out.push_str("<ul>\n");
                for i in items {
                    out.push_str(&format!("<li>{}</li>\n", inline(i)));
                }
                out.push_str("</ul>\n");
            }
            Block::Table { head, rows, text_columns } => {
                out.push_str("<div class=\"scroll\"><table>\n<tr>");
                for h in head {
                    out.push_str(&format!("<th>{}</th>", inline(h)));
                }
                out.push_str("</tr>\n");
                for r in rows {
                    out.push_str(if r.strong { "<tr class=\"strong\">" } else { "<tr>" });
                    for (i, c) in r.cells.iter().enumerate() {
                        let class = if i >= *text_columns { " class=\"n\"" } else { "" };
                        out.push_str(&format!("<td{class}>{}</td>", inline(c)));
                    }
                    out.push_str("</tr>\n");
                }
                out.push_str("</table></div>\n");
            }
            Block::Figure(f) => {
                // plotters writes a whole SVG document; inline SVG takes the element alone.
                let svg = f.svg.trim_start_matches(|c| c != '<');
                let svg = if svg.starts_with("<?xml") { svg.split_once("?>").map_or(svg, |(_, s)| s) } else { svg };
                out.push_str(&format!(
                    "<figure>\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
                    svg.trim(),
                    inline(&f.title)
                ));
            }
            Block::Grid(h, _) => out.push_str(&grid(h)),
        }
    }
    out.push_str("</body>\n</html>\n");
    out
}
