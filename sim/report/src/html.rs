//! `index.html`: the report's blocks as one self-contained page (inline CSS and SVG, no
//! scripts, no network), readable offline and attachable to a design review.

use crate::aggregate::{Heatmap, MIN_CELL_TRIALS};
use crate::document::Block;
use crate::figures::{block_size, blocks, HeatScale};

/// The page's style: print-friendly; tables fit a 1,280-px page (long names and headers wrap),
/// and only a PE grid wider than the page scrolls.
const STYLE: &str = "
body { font-family: DejaVu Sans, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { border-bottom: 1px solid #bbb; margin-top: 2em; }
code { background: #f3f3f3; padding: 0 .2em; border-radius: 3px; font-size: 90%; }
section.summary { background: #f6f8fb; border: 1px solid #c9d3e0; border-left: 5px solid #0072b2; padding: .2em 1.2em .4em; margin: 1em 0 2em; }
section.summary h2 { border: none; margin-top: .6em; }
section.summary li { margin: .45em 0; line-height: 1.4; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: 3px 6px; }
th { background: #f0f0f0; font-weight: 600; vertical-align: bottom; }
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
    let code = |s: &str| -> String {
        s.split('`')
            .enumerate()
            .map(|(i, part)| if i % 2 == 1 { format!("<code>{}</code>", breakable(part)) } else { part.to_string() })
            .collect()
    };
    spans(&code(&escape(s)), "**", "strong")
}

/// Code text (escaped) with break opportunities after `.` before a letter, `/` and `,`, so
/// that long site names and paths wrap in a narrow column instead of widening it.
fn breakable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        let next_letter = chars.peek().is_some_and(|n| n.is_ascii_alphabetic());
        if (c == '.' && next_letter) || ((c == '/' || c == ',') && chars.peek().is_some()) {
            out.push_str("<wbr>");
        }
    }
    out
}

/// A header's text with break opportunities inside CamelCase names (`Short<wbr>Term<wbr>InfNan`),
/// so that outcome columns are as narrow as their numbers.
fn header(s: &str) -> String {
    let text = inline(s);
    let mut out = String::with_capacity(text.len());
    let mut prev_lower = false;
    let mut in_tag = false;
    for c in text.chars() {
        if c == '<' {
            in_tag = true;
        }
        if !in_tag && prev_lower && c.is_ascii_uppercase() {
            out.push_str("<wbr>");
        }
        prev_lower = !in_tag && c.is_ascii_lowercase();
        if c == '>' {
            in_tag = false;
        }
        out.push(c);
    }
    out
}

/// CSS colour of rate `p` on a scale topping at `vmax` (the figures' colour map).
fn rate_color(p: f64, vmax: f64) -> String {
    let c = crate::figures::heat(p / vmax);
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// A PE grid on the report's colour scale: one cell per PE, or per square block of PEs
/// pooling their trials when single PEs have too few (as the heatmap figure draws it), each
/// with its counts in a hover title.
fn grid(h: &Heatmap, scale: &HeatScale) -> String {
    let b = block_size(h);
    let cells = blocks(h, b);
    let cols = h.cols.div_ceil(b);
    // Cells as large as fit ~600 px: an 8x8 array reads as well as a 128x128 one, and a
    // block of PEs is drawn as large as the PEs it pools.
    let px = (600 / cols.max(1)).clamp(4, 36 * b);
    let label = |i: usize, n: usize| {
        if b == 1 {
            i.to_string()
        } else {
            format!("{}\u{2013}{}", i * b, ((i + 1) * b).min(n) - 1)
        }
    };
    let mut s = format!("<div class=\"scroll\"><table class=\"grid\" style=\"--cell: {px}px\"><tr><th></th>");
    for c in 0..cols {
        s.push_str(&format!("<th>{}</th>", label(c, h.cols)));
    }
    s.push_str("</tr>\n");
    for (r, row) in cells.chunks(cols).enumerate() {
        s.push_str(&format!("<tr><th>{}</th>", label(r, h.rows)));
        for x in row {
            let pes = |a: usize, z: usize| if z - a == 1 { a.to_string() } else { format!("{a}..{}", z - 1) };
            let title = format!(
                "pe[{}][{}].{}: {} {}, {} not masked, {} failed{}",
                pes(x.r0, x.r1),
                pes(x.c0, x.c1),
                h.register,
                x.trials,
                if x.trials == 1 { "trial" } else { "trials" },
                x.unmasked,
                x.failures,
                if x.trials < MIN_CELL_TRIALS {
                    " (too few trials to estimate)".to_string()
                } else {
                    format!(" ({:.1}% failure)", 100.0 * x.rate())
                }
            );
            if x.trials < MIN_CELL_TRIALS {
                s.push_str(&format!("<td class=\"few\" title=\"{}\"></td>", escape(&title)));
            } else {
                s.push_str(&format!(
                    "<td style=\"background:{}\" title=\"{}\"></td>",
                    rate_color(x.rate(), scale.top),
                    escape(&title)
                ));
            }
        }
        s.push_str("</tr>\n");
    }
    let cell = if b == 1 { "one PE".to_string() } else { format!("a block of {b}x{b} PEs, their trials pooled") };
    s.push_str(&format!(
        "</table></div>\n<p class=\"legend\">a cell is {cell}; failure rate (the report's one scale): "
    ));
    for &p in &scale.ticks {
        let label = (1e4 * p).round() / 100.0;
        let more = if (p - scale.top).abs() < 1e-12 { " or more" } else { "" };
        s.push_str(&format!("<span style=\"background:{}\"></span>{label}%{more} ", rate_color(p, scale.top)));
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
    render_into(&mut out, blocks);
    out.push_str("</body>\n</html>\n");
    out
}

/// Appends `blocks` as HTML to `out`.
fn render_into(out: &mut String, blocks: &[Block]) {
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
                    out.push_str(&format!("<th>{}</th>", header(h)));
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
            Block::Grid(h, _, scale) => out.push_str(&grid(h, scale)),
            Block::Section { id, blocks } => {
                let id = escape(id);
                out.push_str(&format!("<section id=\"{id}\" class=\"{id}\">\n"));
                render_into(out, blocks);
                out.push_str("</section>\n");
            }
        }
    }
}
