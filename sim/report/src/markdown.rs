//! `report.md`: the report's blocks as GitHub-flavoured Markdown, figures linked as files.

use crate::document::Block;

/// A table cell: pipes escaped, so a cell never splits.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// Renders `blocks` as Markdown.
pub fn render(blocks: &[Block]) -> String {
    let mut out = String::new();
    for b in blocks {
        match b {
            Block::Heading(level, text) => out.push_str(&format!("{} {text}\n\n", "#".repeat(*level as usize))),
            Block::Para(text) => out.push_str(&format!("{text}\n\n")),
            Block::List(items) => {
                for i in items {
                    out.push_str(&format!("- {i}\n"));
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
            Block::Figure(f) => out.push_str(&format!("![{}](figures/{}.svg)\n\n", f.title, f.name)),
            Block::Grid(_, Some(f)) => out.push_str(&format!("![{}](figures/{}.svg)\n\n", f.title, f.name)),
            Block::Grid(_, None) => {}
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}
