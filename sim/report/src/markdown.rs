//! `report.md`: the report's blocks as GitHub-flavoured Markdown, figures linked as files.

use crate::document::Block;

/// Text with every `<` that could open an HTML tag, comment or declaration (`<` before a
/// letter, `/`, `!` or `?`) escaped outside `code` spans: names from a campaign file (a
/// campaign called `<script>`) are shown, never interpreted, by a Markdown renderer, while
/// prose such as `<20%` stays as written; inside backticks text is shown as it is already.
fn text(s: &str) -> String {
    let escape = |part: &str| {
        let mut out = String::with_capacity(part.len());
        let mut chars = part.chars().peekable();
        while let Some(c) = chars.next() {
            let opens = c == '<' && chars.peek().is_some_and(|n| n.is_ascii_alphabetic() || "/!?".contains(*n));
            if opens {
                out.push_str("&lt;");
            } else {
                out.push(c);
            }
        }
        out
    };
    s.split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { part.to_string() } else { escape(part) })
        .collect::<Vec<_>>()
        .join("`")
}

/// A table cell: text escaped and pipes too, so a cell never splits.
fn cell(s: &str) -> String {
    text(s).replace('|', "\\|")
}

/// Renders `blocks` as Markdown.
pub fn render(blocks: &[Block]) -> String {
    let mut out = String::new();
    render_into(&mut out, blocks);
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Appends `blocks` to `out`.
fn render_into(out: &mut String, blocks: &[Block]) {
    for b in blocks {
        match b {
            Block::Heading(level, t) => out.push_str(&format!("{} {}\n\n", "#".repeat(*level as usize), text(t))),
            Block::Para(t) => out.push_str(&format!("{}\n\n", text(t))),
            Block::List(items) => {
                for i in items {
                    out.push_str(&format!("- {}\n", text(i)));
                }
                out.push('\n');
            }
            Block::Table { head, rows, text_columns } => {
                let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
                out.push_str(&line(head.iter().map(|h| cell(h)).collect()));
                out.push_str(&line(
                    (0..head.len()).map(|i| if i < *text_columns { "---".into() } else { "---:".into() }).collect(),
                ));
                for r in rows {
                    let strong =
                        |c: &String| if r.strong && !c.is_empty() { format!("**{}**", cell(c)) } else { cell(c) };
                    out.push_str(&line(r.cells.iter().map(strong).collect()));
                }
                out.push('\n');
            }
            Block::Figure(f) => out.push_str(&format!("![{}](figures/{}.svg)\n\n", text(&f.title), f.name)),
            Block::Grid(_, Some(f), _) => out.push_str(&format!("![{}](figures/{}.svg)\n\n", text(&f.title), f.name)),
            Block::Grid(_, None, _) => {}
            Block::Section { blocks, .. } => render_into(out, blocks),
        }
    }
}
