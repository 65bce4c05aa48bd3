//! Every shell example in `README.md` and the user guide (`docs/src`) runs, and prints what the
//! page shows: the pages cannot drift from the tool.
//!
//! The format (also in `docs/src/contributing.md`):
//! - A fenced block whose info string is `console` is executed. A line starting `$ ` is a command
//!   (a line ending in `\` continues it); the lines after it, up to the next command, are what it
//!   prints (stdout and stderr as a terminal shows them). A command must exit 0 unless its output
//!   ends with a line `[exit N]`.
//! - Output lines compare exactly (trailing spaces ignored) except for the declared volatile
//!   fields: `[TIME]` (a wall time: `1.38 s`, `420 ms`, `2 min 15 s`), `[RATE]` (a number derived
//!   from a wall time), `[PATH]` (a path) and `[HASH]` (a hex digest or git hash); and a line
//!   `...` stands for any number of lines (a long output shown in part).
//! - A `sh`/`bash`/`shell` block is not executed and must say why on the line before it:
//!   `<!-- not run: builds the tool -->`.
//! - Each page runs in a scratch directory of its own, in page order, with `faultline` (this
//!   build) on `PATH` and the repository's `configs`, `models`, `topologies`,
//!   `traces/examples` and `reports/examples` linked in; what a page writes stays there.
//!
//! `FAULTLINE_DOCS=substring` runs only the pages whose path contains it;
//! `FAULTLINE_BLESS=1` writes what each differing example printed into its page instead of
//! failing (keeping a page line with volatile fields where it still matches; an example whose
//! page shows `...` still fails, to be edited by hand: which lines to leave out is a choice);
//! `FAULTLINE_DOCS_ROOT=dir` checks the pages of another checkout (with this build). A failure
//! prints the whole actual output, ready to paste.

use regex::Regex;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One command of a console block and what the page says it prints.
#[derive(Debug)]
struct Example {
    line: usize,
    command: String,
    expected: Vec<String>,
    /// Where `expected` starts in the page (0-based line index).
    expected_at: usize,
}

/// A page's executed examples, or the one-line reasons it is malformed.
fn parse(page: &str, text: &str) -> Result<Vec<Example>, Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut errors) = (Vec::new(), Vec::new());
    let head = Regex::new(r"\|\s*head\b").expect("a valid regex");
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let lang = info.split([' ', ',']).next().unwrap_or("").trim();
        let start = i;
        let end = (i + 1..lines.len()).find(|&j| lines[j].trim_end() == "```").unwrap_or(lines.len());
        let body = &lines[start + 1..end];
        match lang {
            "console" => {
                let mut j = 0;
                if body.first().is_some_and(|l| !l.starts_with("$ ")) {
                    errors.push(format!("{page}:{}: a console block starts with a `$ ` command", start + 2));
                }
                while j < body.len() {
                    let Some(cmd) = body[j].strip_prefix("$ ") else {
                        j += 1;
                        continue;
                    };
                    let line = start + 2 + j;
                    let mut command = cmd.to_string();
                    while command.ends_with('\\') && j + 1 < body.len() {
                        j += 1;
                        command.push('\n');
                        command.push_str(body[j]);
                    }
                    j += 1;
                    // `head` quits early; the writer then dies of SIGPIPE and, under pipefail,
                    // the example fails at random (exit 141). `sed -n 1,Np` reads everything.
                    if head.is_match(&command) {
                        errors.push(format!(
                            "{page}:{line}: `| head` makes the example flaky (the writer may die of SIGPIPE, exit 141); use `| sed -n 1,Np`"
                        ));
                    }
                    let (mut expected, expected_at) = (Vec::new(), start + 1 + j);
                    while j < body.len() && !body[j].starts_with("$ ") {
                        expected.push(body[j].trim_end().to_string());
                        j += 1;
                    }
                    out.push(Example { line, command, expected, expected_at });
                }
            }
            "sh" | "bash" | "shell" => {
                let before = lines[..start].iter().rev().find(|l| !l.trim().is_empty());
                if !before.is_some_and(|l| l.trim_start().starts_with("<!-- not run:")) {
                    errors.push(format!(
                        "{page}:{}: a `{lang}` block is not executed: make it a `console` block, or say why on the line before (`<!-- not run: why -->`)",
                        start + 1
                    ));
                }
            }
            _ => {}
        }
        i = end + 1;
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The regex one expected line stands for: literal text, with the volatile fields open.
fn line_pattern(line: &str) -> Regex {
    const FIELDS: [(&str, &str); 4] = [
        ("[TIME]", r"[0-9]+(\.[0-9]+)? ?(ns|µs|us|ms|s|min|h)( [0-9]+(\.[0-9]+)? ?(ms|s))?"),
        ("[RATE]", r"[0-9][0-9,.]*"),
        ("[PATH]", r"\S+"),
        ("[HASH]", r"[0-9a-f]{7,64}"),
    ];
    let mut pat = String::from("^");
    let mut rest = line;
    loop {
        let next = FIELDS.iter().filter_map(|(f, p)| rest.find(f).map(|at| (at, *f, *p))).min_by_key(|x| x.0);
        match next {
            Some((at, f, p)) => {
                pat.push_str(&regex::escape(&rest[..at]));
                let _ = write!(pat, "(?:{p})");
                rest = &rest[at + f.len()..];
            }
            None => {
                pat.push_str(&regex::escape(rest));
                break;
            }
        }
    }
    pat.push('$');
    Regex::new(&pat).expect("an escaped line is a valid regex")
}

/// Whether `actual` is what `expected` shows (`...` lines match any run of lines).
fn matches(expected: &[String], actual: &[&str]) -> bool {
    let pats: Vec<Option<Regex>> = expected.iter().map(|e| (e.trim() != "...").then(|| line_pattern(e))).collect();
    // ok[i][j]: expected[i..] matches actual[j..].
    let (n, m) = (pats.len(), actual.len());
    let mut ok = vec![vec![false; m + 1]; n + 1];
    ok[n][m] = true;
    for i in (0..n).rev() {
        for j in (0..=m).rev() {
            ok[i][j] = match &pats[i] {
                None => ok[i + 1][j] || (j < m && ok[i][j + 1]),
                Some(p) => j < m && p.is_match(actual[j].trim_end()) && ok[i + 1][j + 1],
            };
        }
    }
    ok[0][0]
}

fn repo_root() -> PathBuf {
    let root = std::env::var_os("FAULTLINE_DOCS_ROOT")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."), PathBuf::from);
    root.canonicalize().expect("repository root")
}

/// README.md and every page of the guide, as paths relative to the repository root.
fn pages(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut out);
    out.sort();
    out.into_iter().map(|p| p.strip_prefix(root).expect("under the root").to_path_buf()).collect()
}

/// A scratch directory for one page, with the repository's inputs linked in.
fn scratch(root: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("scratch directory");
    for d in ["configs", "models", "topologies"] {
        std::os::unix::fs::symlink(root.join(d), dir.path().join(d)).expect("link an input directory");
    }
    for d in ["traces", "reports"] {
        std::fs::create_dir(dir.path().join(d)).expect("make an output directory");
        std::os::unix::fs::symlink(root.join(d).join("examples"), dir.path().join(d).join("examples"))
            .expect("link the shipped examples");
    }
    dir
}

/// Runs one page's examples in order; the failures, each a readable paragraph.
fn run_page(root: &Path, page: &Path, bin_dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(page)).expect("read the page");
    let examples = match parse(&page.display().to_string(), &text) {
        Ok(x) => x,
        Err(errors) => return errors,
    };
    if examples.is_empty() {
        return vec![];
    }
    let dir = scratch(root);
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut failures = Vec::new();
    // With FAULTLINE_BLESS, the outputs to write into the page: (first line, lines, new lines).
    let bless = std::env::var("FAULTLINE_BLESS").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut rewrites: Vec<(usize, usize, Vec<String>)> = Vec::new();
    for ex in &examples {
        let out = Command::new("timeout")
            .args(["600", "bash", "-o", "pipefail", "-c"])
            .arg(format!("{{ {}\n}} 2>&1", ex.command))
            .current_dir(dir.path())
            .env("PATH", &path)
            .env_remove("FAULTLINE")
            .output()
            .expect("run bash");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut actual: Vec<&str> = text.lines().collect();
        while actual.last().is_some_and(|l| l.trim().is_empty()) {
            actual.pop();
        }
        let code = out.status.code().unwrap_or(-1);
        let exit_line = format!("[exit {code}]");
        if code != 0 {
            actual.push(&exit_line);
        }
        let mut expected = ex.expected.clone();
        while expected.last().is_some_and(|l| l.trim().is_empty()) {
            expected.pop();
        }
        if !matches(&expected, &actual) {
            if bless && !expected.iter().any(|e| e.trim() == "...") {
                let lines = actual.iter().map(|a| blessed(&expected, a)).collect();
                rewrites.push((ex.expected_at, expected.len(), lines));
                continue;
            }
            failures.push(format!(
                "{}:{}: `{}` printed something else than the page shows.\n--- page\n{}\n--- actual\n{}\n---",
                page.display(),
                ex.line,
                ex.command,
                expected.join("\n"),
                actual.join("\n")
            ));
        }
    }
    if !rewrites.is_empty() {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        for (at, n, new) in rewrites.into_iter().rev() {
            lines.splice(at..at + n, new);
        }
        std::fs::write(root.join(page), lines.join("\n") + "\n").expect("rewrite the page");
    }
    failures
}

/// An actual output line as a blessed page shows it: the page's own line where one of the
/// expected lines stands for it (keeping its `[TIME]`-style fields), else the line itself.
fn blessed(expected: &[String], actual: &str) -> String {
    let actual = actual.trim_end();
    expected.iter().find(|e| line_pattern(e).is_match(actual)).cloned().unwrap_or_else(|| actual.to_string())
}

#[test]
fn every_example_prints_what_its_page_shows() {
    let root = repo_root();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_faultline"));
    let bin_dir = bin.parent().expect("the binary's directory").to_path_buf();
    let only = std::env::var("FAULTLINE_DOCS").ok();
    let pages: Vec<PathBuf> =
        pages(&root).into_iter().filter(|p| only.as_ref().is_none_or(|o| p.to_string_lossy().contains(o))).collect();
    assert!(!pages.is_empty(), "no page to check");
    // Pages are independent (a scratch directory each): run them side by side.
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = pages.iter().map(|p| s.spawn(|| run_page(&root, p, &bin_dir))).collect();
        handles.into_iter().flat_map(|h| h.join().expect("a page's thread")).collect()
    });
    assert!(failures.is_empty(), "{} example(s) differ from their pages:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// The ids mdBook gives a page's headings: the heading's text, lower-cased, spaces to `-`,
/// only letters, digits, `-` and `_` kept; a repeated id gets `-1`, `-2`, ...
fn heading_ids(text: &str) -> Vec<String> {
    let link = Regex::new(r"\[([^\]]*)\]\([^)]*\)").expect("link pattern");
    // mdBook counts repeats of the bare id (as `seen`), not of the suffixed ones.
    let (mut ids, mut seen, mut fenced) = (Vec::<String>::new(), Vec::<String>::new(), false);
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let Some(h) = line.strip_prefix('#').filter(|_| !fenced) else { continue };
        let h = link.replace_all(h.trim_start_matches('#').trim(), "$1");
        let id: String = h
            .chars()
            .filter_map(|c| match c {
                c if c.is_whitespace() => Some('-'),
                c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        let n = seen.iter().filter(|x| **x == id).count();
        ids.push(if n == 0 { id.clone() } else { format!("{id}-{n}") });
        seen.push(id);
    }
    ids
}

/// Every relative link in the README and the guide reaches a file, and a `page.md#heading`
/// link a heading of that page. The book's build checks its pages' files but neither the
/// README (not a page of the book) nor headings (mdbook-linkcheck checks files only).
#[test]
fn every_relative_link_resolves() {
    let root = repo_root();
    let link = Regex::new(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)").expect("link pattern");
    let mut broken = Vec::new();
    for page in pages(&root) {
        let text = std::fs::read_to_string(root.join(&page)).expect("read the page");
        // Links are in the prose: a code block's `](` is shell or output, not a link.
        let mut fenced = false;
        let prose: Vec<&str> = text
            .lines()
            .filter(|l| {
                fenced ^= l.starts_with("```");
                !fenced && !l.starts_with("```")
            })
            .collect();
        for c in link.captures_iter(&prose.join("\n")) {
            let (file, anchor) = (&c[1], c.get(2).map(|m| m.as_str()));
            if file.contains("://") || (file.is_empty() && anchor.is_none()) {
                continue;
            }
            let target = if file.is_empty() {
                root.join(&page)
            } else {
                root.join(&page).parent().expect("a page's folder").join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {file}: no such file", page.display()));
                continue;
            }
            let Some(anchor) = anchor.filter(|_| target.extension().is_some_and(|x| x == "md")) else { continue };
            let t = std::fs::read_to_string(&target).expect("read the linked page");
            if !heading_ids(&t).iter().any(|id| id == anchor) {
                broken.push(format!("{}: {file}#{anchor}: no such heading", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to missing files or headings:\n{}", broken.join("\n"));
}

#[test]
fn heading_ids_are_mdbooks() {
    let page = "# Outcomes: masked\n## Outcomes\n## `faultline gemm`: one GEMM\n```\n# not a heading\n```\n## Outcomes\n### [Sampling](x.md)\n";
    let ids = heading_ids(page);
    assert_eq!(ids, ["outcomes-masked", "outcomes", "faultline-gemm-one-gemm", "outcomes-1", "sampling"]);
}

#[test]
fn a_one_character_change_in_an_output_fails() {
    let page = "```console\n$ echo 'gemm 16x8x8: 12 corrupted in 1.38 s'\ngemm 16x8x8: 12 corrupted in [TIME]\n```\n";
    let ex = parse("t.md", page).expect("a well-formed page");
    assert_eq!(ex.len(), 1);
    let actual = ["gemm 16x8x8: 12 corrupted in 1.38 s"];
    assert!(matches(&ex[0].expected, &actual));
    // One character off, anywhere outside a volatile field, is a failure.
    assert!(!matches(&ex[0].expected, &["gemm 16x8x8: 13 corrupted in 1.38 s"]));
    assert!(!matches(&ex[0].expected, &["gemm 16x8x8: 12 corrupted in 1.38 s", "extra"]));
    // A volatile field is only what it declares: a wall time is not any text.
    assert!(!matches(&ex[0].expected, &["gemm 16x8x8: 12 corrupted in fast"]));
}

#[test]
fn elisions_and_exit_codes() {
    let exp: Vec<String> = ["first", "...", "last", "[exit 2]"].iter().map(|s| s.to_string()).collect();
    assert!(matches(&exp, &["first", "a", "b", "last", "[exit 2]"]));
    assert!(matches(&exp, &["first", "last", "[exit 2]"]));
    assert!(!matches(&exp, &["first", "a", "last"]));
    let page = "text\n```sh\ncargo build\n```\n";
    assert!(parse("t.md", page).is_err(), "an unexplained sh block is refused");
    let page = "<!-- not run: builds the tool -->\n```sh\ncargo build\n```\n";
    assert!(parse("t.md", page).unwrap().is_empty());
    let page = "```console\n$ faultline a \\\n    --b 1\nout\n```\n";
    let ex = parse("t.md", page).unwrap();
    assert_eq!(ex[0].command, "faultline a \\\n    --b 1");
    assert_eq!(ex[0].expected, ["out"]);
    let page = "```console\n$ faultline sites | head -n 3\nout\n```\n";
    assert!(parse("t.md", page).is_err(), "a `| head` pipeline is refused");
    let page = "```console\n$ faultline sites | sed -n 1,3p | header\nout\n```\n";
    assert!(parse("t.md", page).is_ok(), "`header` is not `head`");
}
